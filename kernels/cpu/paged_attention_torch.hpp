// Attention straight out of the paged KV cache, on the CPU: each query token attends over its
// sequence's cached keys up to its own position by walking the block table, with no gather of
// the context into a padded tensor, no mask and no per-head batched-matmul dispatch. A
// decoding sequence is one query; a prompt chunk is one query per token, sharing the table
// (so causal attention costs only the keys below the diagonal). Scores, softmax and the
// weighted sum of values accumulate in fp32 whatever the cache dtype (fp32 or bf16).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace swarm {

/// Where each sequence's context lives in the cache.
struct PagedContext {
  std::vector<int64_t> block_ids;     // every block table, concatenated
  std::vector<int64_t> table_offset;  // [tables + 1]: table t is block_ids[offset[t], offset[t+1])
  std::vector<int64_t> lengths;       // [B]: keys 0..length-1 (the query's own key included)
  /// [B] or empty: query b reads table table_index[b]; empty: table b (one table per query).
  /// Several queries share a table when they are tokens of one sequence (a prompt chunk: the
  /// token at position p is a query with length p + 1).
  std::vector<int64_t> table_index;

  /// Where query b's block table starts.
  const int64_t* table(int64_t b) const {
    const size_t t = table_index.empty() ? static_cast<size_t>(b)
                                         : static_cast<size_t>(table_index[static_cast<size_t>(b)]);
    return block_ids.data() + table_offset[t];
  }
};

/// q [B, heads, head_dim] (contiguous, fp32 or bf16), one query token per row; k_cache / v_cache
/// [num_blocks, block_size, kv_heads, head_dim] (contiguous, the same dtype as q). Query
/// head h reads kv head h / (heads / kv_heads). Key j of query b is visible when
/// j < lengths[b] and lengths[b] - 1 - j < window. Returns [B, heads * head_dim] in q's dtype.
/// CPU tensors only; parallel over (query, kv head) units with at::parallel_for, cut into one
/// run of about equal keys per thread (each unit is computed by one thread, in the same order
/// whatever the split). A query with more than 1024 visible keys has each kv head's keys split
/// into parts of at most 1024 (units of their own, merged after): the parts depend on its key
/// count alone, so its result is the same bits alone, in any batch, on any thread count.
/// out: see output_tensor (serving_ops_torch.hpp).
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const PagedContext& context, int64_t window, double scale,
                                  const at::Tensor& out = {});

}  // namespace swarm
