// The model's matmuls on the CPU, split over the OpenMP threads libtorch and our kernels share.
//
// One pool for every op: the thread plan (configure_compute_threads) sets OpenBLAS's own pool
// to one thread and gives libtorch's OpenMP pool every core; each GEMM here is split into one
// range of output features (or rows, or batch items) per OpenMP thread, each running OpenBLAS
// single-threaded. Two busy-waiting pools on the same cores cost 1.5-3x wherever our kernels ran
// next to OpenBLAS's GEMMs (history in docs/benchmarks-history.md), which is why fp32 once gave
// attention, norms and activations a single thread.
//
// bf16 matmuls on CPUs without bf16 dot products (no AVX512_BF16): from AVX2 on the forward
// (widening_linear) runs the packed bf16 GEMM (packed_gemm.hpp: both operands widened to fp32
// as they are packed into cache-sized panels, the results rounded as they leave its register
// tile); the backward's GEMMs, attention's matmuls and CPUs without AVX2 widen P weight rows at
// a time into an fp32 panel that the fp32 GEMM (OpenBLAS) consumes.
//
// libtorch's bf16 GEMM (oneDNN) has no fast path there: measured on a 2-core AVX2 EPYC it runs
// at ~5 GFLOP/s against ~100 for fp32, so every bf16 matmul fell off a 15-30x cliff. Here the
// weights stay in bf16 (the memory people chose bf16 for), are read from memory once per
// matmul, in bf16, and the arithmetic runs at fp32 GEMM speed (the packed GEMM: 0.93-1.00x
// OpenBLAS's fp32 time at 512 rows of SmolLM2's projections, where the widened panels took
// 1.08-1.16x: the widening, the rounding and OpenBLAS's own packing were three passes).
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>

namespace swarm {

/// Whether fp32 GEMMs on the CPU are split over the OpenMP threads (set by the thread plan,
/// configure_compute_threads, when it puts OpenBLAS's own pool at one thread; off by default, so
/// a process that never sets a plan keeps OpenBLAS's threading).
bool cpu_gemm_splits();
void set_cpu_gemm_splits(bool on);

/// Whether x's fp32 matmuls take the split path: an fp32 CPU tensor while cpu_gemm_splits().
bool splits(const at::Tensor& x);

/// y = x · wᵀ (+ bias) for fp32 CPU tensors, x [..., in], w [out, in]: the output features split
/// over the OpenMP threads, each a single-threaded OpenBLAS GEMM. No autograd.
at::Tensor split_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);

/// Whether bf16 matmuls on this CPU take the widening path: the CPU (or SWARM_CPU_LEVEL) has no
/// AVX512_BF16. Computed once per process.
bool bf16_matmul_widens();

/// What runs bf16 matmuls here, for logs and benchmark headers: "on AVX512_BF16 dot products",
/// "on the packed bf16 GEMM (no AVX512_BF16; fp32 accumulation)" from AVX2 on, else "widened
/// to fp32 GEMM (no AVX512_BF16, no AVX2)".
std::string bf16_matmul_path();

/// The level of ATen's own vectorised CPU kernels ("NO AVX", "AVX2", "AVX512"; ATEN_CPU_CAPABILITY
/// forces it), as libtorch reports it.
std::string aten_cpu_capability();

/// The instruction set oneDNN (libtorch's bf16 GEMMs) runs ("avx2", "avx512_core_bf16", ...;
/// DNNL_MAX_CPU_ISA caps it), or "not loaded" where this libtorch has no oneDNN.
std::string onednn_cpu_isa();

/// Whether `t` is a bf16 CPU tensor on such a CPU: its matmuls take the widening path.
bool widens(const at::Tensor& t);

/// y = x · wᵀ (+ bias) for bf16 CPU tensors, x [..., in], w [out, in], bias [out] or undefined:
/// accumulated in fp32 (the packed bf16 GEMM from AVX2 on, else widened panels through
/// OpenBLAS), rounded once to bf16. `float_out` returns the results rounded
/// to bf16 and held in fp32 (what .to(kFloat) of the bf16 result gives). No autograd.
at::Tensor widening_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                           bool float_out = false);

/// The model's linear layer, any device and dtype: widening_linear when widens(x), split_linear
/// when splits(x), else at::linear; differentiable in every case (the backward's
/// grad_x = grad_y · w and grad_w = grad_yᵀ · x are split, and widened, the same way).
at::Tensor model_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

/// a · b as at::matmul (attention's scores and probabilities · values): widened to fp32 and
/// rounded once when widens(a); when the GEMMs split (cpu_gemm_splits) and a [..., M, K] and
/// b [..., K, N] have the same batch dimensions, the batch items are split over the threads.
/// Differentiable.
at::Tensor model_matmul(const at::Tensor& a, const at::Tensor& b);

/// Linear's backward GEMMs for hand-written backward passes: grad_y [M, out] · w [out, in], and
/// grad_yᵀ · x [M, in], in grad_y's dtype; widened when widens(grad_y), split when the GEMMs split.
at::Tensor linear_grad_input(const at::Tensor& grad_y, const at::Tensor& w);
at::Tensor linear_grad_weight(const at::Tensor& grad_y, const at::Tensor& x);

}  // namespace swarm
