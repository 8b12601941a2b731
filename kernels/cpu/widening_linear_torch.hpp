// bf16 matmuls on CPUs without bf16 dot products (no AVX512_BF16): widened to fp32 and run by
// the fp32 GEMM (OpenBLAS), a panel of weight rows at a time.
//
// libtorch's bf16 GEMM (oneDNN) has no fast path there: measured on a 2-core AVX2 EPYC it runs
// at ~5 GFLOP/s against ~100 for fp32, so every bf16 matmul fell off a 15-30x cliff. Here the
// weights stay in bf16 (the memory people chose bf16 for) and each matmul converts P weight
// rows at a time into a small fp32 panel that stays in cache while the fp32 GEMM consumes it:
// the weights are read from memory once, in bf16, and the arithmetic runs at fp32 GEMM speed.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace swarm {

/// Whether bf16 matmuls on this CPU take the widening path: the CPU (or SWARM_CPU_LEVEL) has no
/// AVX512_BF16. Computed once per process.
bool bf16_matmul_widens();

/// Whether `t` is a bf16 CPU tensor on such a CPU: its matmuls take the widening path.
bool widens(const at::Tensor& t);

/// y = x · wᵀ (+ bias) for bf16 CPU tensors, x [..., in], w [out, in], bias [out] or undefined:
/// accumulated in fp32 (OpenBLAS), rounded once to bf16. `float_out` returns the results rounded
/// to bf16 and held in fp32 (what .to(kFloat) of the bf16 result gives). No autograd.
at::Tensor widening_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool float_out = false);

/// The model's linear layer, any device and dtype: at::linear, or widening_linear when widens(x),
/// differentiable in both cases (the widening backward computes grad_x = grad_y · w and
/// grad_w = grad_yᵀ · x widened the same way).
at::Tensor model_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

/// a · b as at::matmul (any batch shape), widened to fp32 and rounded once when widens(a)
/// (attention's probabilities · values). Differentiable.
at::Tensor model_matmul(const at::Tensor& a, const at::Tensor& b);

/// Linear's backward GEMMs for hand-written backward passes: grad_y [M, out] · w [out, in], and
/// grad_yᵀ · x [M, in], in grad_y's dtype; widened when widens(grad_y).
at::Tensor linear_grad_input(const at::Tensor& grad_y, const at::Tensor& w);
at::Tensor linear_grad_weight(const at::Tensor& grad_y, const at::Tensor& x);

}  // namespace swarm
