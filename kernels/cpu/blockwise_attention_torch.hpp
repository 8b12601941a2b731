// Attention for training without the [heads, T, T] matrix: blockwise, with an online softmax.
//
// The forward walks each sequence in query blocks; per query block it visits the key blocks the
// causal mask (and a sliding window) leave, keeping per query row the running maximum m, the
// running sum l of exp(s - m) and the running sum of exp(s - m)·v, rescaling them whenever m
// grows (the online softmax). What it keeps for the backward is the output and, per query row,
// lse = m + log l: O(T) per head. The backward recomputes each block's probabilities from
// q, k and lse (P = exp(q·kᵀ·scale - lse)) and accumulates dQ, dK, dV block by block, with
// D = rowsum(dO ∘ O) standing in for the softmax's Jacobian. So memory grows with
// T · block rather than T², and the arithmetic is that of the plain formula (scores, softmax and
// sums in fp32 whatever the inputs' dtype).
//
// Packed rows: `cu_seqlens` gives the samples laid end to end along the token dimension
// (0 = s_0 < s_1 < ... < s_n = N); a query attends to keys of its own sample only, at or before
// it, and with `window` > 0 to the last `window` of them (i - j < window). So no attention crosses
// a sample boundary, exactly.
//
// ATen ops only (fp32 matmuls through model_matmul, split over the OpenMP threads on the CPU), so
// the same kernel runs on a GPU, where the decoder model prefers scaled_dot_product_attention
// (libtorch 2.x) and keeps this one for windowed layers.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace swarm {

/// The query and key block (rows) of blockwise_attention: [heads, 512, 512] fp32 scores are
/// 9 MiB for SmolLM2's 9 heads, while a sequence of up to 512 tokens is one block (as fast as the
/// plain formula there).
constexpr int64_t kAttentionBlock = 512;

/// Causal attention of packed samples. q [N, heads, head_dim], k and v [N, kv_heads, head_dim]
/// (heads a multiple of kv_heads: query head h reads kv head h / (heads / kv_heads)), one dtype
/// (fp32 or bf16), any device; `cu_seqlens` as above (host integers); `window` 0 = none; `scale`
/// multiplies q·kᵀ. Returns [N, heads, head_dim] in q's dtype. Differentiable in q, k and v (a
/// custom autograd function: the backward recomputes blocks, nothing [T, T] is kept).
/// INVALID_ARGUMENT on inconsistent shapes or boundaries.
at::Tensor blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<int64_t>& cu_seqlens, int64_t window, double scale,
                               int64_t block = kAttentionBlock);

/// The forward alone, without autograd: the output and lse [heads, N] fp32 (tests).
struct BlockwiseAttentionOutput {
  at::Tensor out, lse;
};
BlockwiseAttentionOutput blockwise_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v,
                                                     const std::vector<int64_t>& cu_seqlens, int64_t window,
                                                     double scale, int64_t block = kAttentionBlock);

/// The backward alone: dq, dk, dv (the inputs' dtypes) from the upstream gradient `dout` and what
/// the forward returned.
struct BlockwiseAttentionGrads {
  at::Tensor dq, dk, dv;
};
BlockwiseAttentionGrads blockwise_attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                                     const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse,
                                                     const std::vector<int64_t>& cu_seqlens, int64_t window,
                                                     double scale, int64_t block = kAttentionBlock);

}  // namespace swarm
