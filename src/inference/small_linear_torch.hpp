// y = x · Wᵀ (+ b) for a handful of rows on the CPU: the decode-time shape of every projection.
// BLAS GEMM packs the whole weight matrix for each call, which at one to a few rows costs more
// than reading the weights; this kernel streams each weight row once and computes every input
// row's dot product with it while it is in L1, so it runs at memory bandwidth.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace swarm {

/// Largest number of rows small_linear takes. Measured here (fp32, 1536x576, 1 thread): the
/// kernel beats at::linear (OpenBLAS GEMM) up to 4 rows (4x at one row) and loses at 8.
constexpr int64_t kSmallLinearMaxRows = 4;

/// For bf16 oneDNN's GEMM is faster at every size measured: callers use this for fp32.
/// x [M, in] (fp32 or bf16), w [out, in] of x's dtype, bias [out] or undefined; contiguous
/// CPU tensors, 1 <= M <= kSmallLinearMaxRows. Accumulates in fp32; returns [M, out] in x's
/// dtype. No autograd (serving only). Parallel over output rows with at::parallel_for.
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);

}  // namespace swarm
