// Decode attention straight out of the paged KV cache, on the CPU: one query token per
// sequence attends over that sequence's cached keys by walking its block table, with no
// gather of the context into a padded tensor and no per-head batched-matmul dispatch (both
// cost far more than the arithmetic at decode sizes). Scores, softmax and the weighted sum
// of values accumulate in fp32 whatever the cache dtype (fp32 or bf16).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace swarm {

/// Where each sequence's context lives in the cache.
struct PagedContext {
  std::vector<int64_t> block_ids;      // every sequence's block table, concatenated
  std::vector<int64_t> table_offset;   // [B + 1]: sequence b uses block_ids[offset[b], offset[b+1])
  std::vector<int64_t> lengths;        // [B]: keys 0..length-1 (the new token's key included)
};

/// q [B, heads, head_dim] (contiguous, fp32 or bf16); k_cache / v_cache
/// [num_blocks, block_size, kv_heads, head_dim] (contiguous, the same dtype as q). Query
/// head h reads kv head h / (heads / kv_heads). Key j of sequence b is visible when
/// j < lengths[b] and lengths[b] - 1 - j < window. Returns [B, heads * head_dim] in q's dtype.
/// CPU tensors only; parallel over (sequence, kv head) with at::parallel_for. out: see
/// output_tensor (serving_ops_torch.hpp).
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const PagedContext& context, int64_t window, double scale,
                                  const at::Tensor& out = {});

}  // namespace swarm
