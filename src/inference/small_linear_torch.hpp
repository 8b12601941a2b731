// y = x · Wᵀ (+ b) for a handful of rows on the CPU: the decode-time shape of every projection.
// BLAS GEMM packs the whole weight matrix for each call, which at one to a few rows costs more
// than reading the weights; this kernel streams each weight row once and computes every input
// row's dot product with it while it is in L1, so it runs at memory bandwidth.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace swarm {

/// Largest number of rows small_linear takes. Measured here with the AVX-512 copy (SmolLM2
/// decode, 2 cores): it beats at::linear up to 8 rows in fp32 (OpenBLAS) and up to 4 in bf16
/// (oneDNN); DecoderModel uses it within those limits.
constexpr int64_t kSmallLinearMaxRows = 8;

/// x [M, in] (fp32 or bf16), w [out, in] of x's dtype, bias [out] or undefined; contiguous
/// CPU tensors, 1 <= M <= kSmallLinearMaxRows. Accumulates in fp32; returns [M, out] in x's
/// dtype. No autograd (serving only). Parallel over output rows with at::parallel_for.
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);

}  // namespace swarm
