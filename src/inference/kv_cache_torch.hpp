// Paged KV cache: a fixed pool of blocks allocated up front, handed to sequences block by
// block, so the memory the cache uses is known when the engine starts and a request that does
// not fit waits instead of failing.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "inference/block_allocator.hpp"

namespace swarm {

struct ModelConfig;

/// Tensors one forward step leaves for the next (DecoderModel::forward_step's activations at
/// decode sizes): at a few rows, allocating and freeing a tensor per op costs as much as a small
/// model's arithmetic. A slot's tensor is reused while the next step asks for the same shape
/// and dtype, and replaced otherwise, so what is held is one step's activations at most.
class StepBuffers {
 public:
  /// Slot `slot`'s tensor, shaped `sizes`, of `dtype` on `device`: the previous one when it
  /// matches, else a new (uninitialised) one that replaces it.
  const torch::Tensor& get(size_t slot, c10::IntArrayRef sizes, c10::ScalarType dtype, torch::Device device);
  /// Bytes held.
  int64_t bytes() const noexcept;

 private:
  std::vector<torch::Tensor> tensors_;
};

/// The K and V of every layer for every cached token, stored in `num_blocks` blocks of
/// `block_size` tokens: per layer, K and V are [num_blocks, block_size, kv_heads, head_dim] in
/// the compute dtype, all carved out of one allocation made (and zeroed) by the constructor.
///
/// Thread-compatible, not thread-safe: it is owned and used by the inference engine's single
/// scheduling thread (the one that runs DecoderModel::forward_step), which needs no locking.
class KvCache {
 public:
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
          c10::ScalarType dtype, torch::Device device = torch::kCPU);
  /// A cache shaped for `config` (layers, kv heads, head_dim).
  static KvCache for_model(const ModelConfig& config, int64_t num_blocks, int64_t block_size,
                           c10::ScalarType dtype, torch::Device device = torch::kCPU);
  /// Bytes one block takes across all layers (K and V), to size a pool from a memory budget.
  static int64_t bytes_per_block(const ModelConfig& config, int64_t block_size, c10::ScalarType dtype);

  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  // ---- block accounting (see BlockAllocator)
  bool ensure_capacity(int64_t seq_slot, int64_t total_tokens) {
    return blocks_.ensure_capacity(seq_slot, total_tokens);
  }
  bool can_fit(int64_t seq_slot, int64_t total_tokens) const noexcept {
    return blocks_.can_fit(seq_slot, total_tokens);
  }
  void release(int64_t seq_slot) { blocks_.release(seq_slot); }
  int64_t free_blocks() const noexcept { return blocks_.free_blocks(); }
  int64_t num_blocks() const noexcept { return blocks_.num_blocks(); }
  int64_t block_size() const noexcept { return blocks_.block_size(); }
  int64_t capacity(int64_t seq_slot) const noexcept { return blocks_.capacity(seq_slot); }
  const std::vector<int64_t>& block_table(int64_t seq_slot) const noexcept {
    return blocks_.block_table(seq_slot);
  }
  const BlockAllocator& allocator() const noexcept { return blocks_; }
  /// The blocks, for the prefix cache's calls (match, attach, publish, drop_cached).
  BlockAllocator& allocator() noexcept { return blocks_; }

  // ---- storage
  int64_t num_layers() const noexcept { return num_layers_; }
  int64_t num_kv_heads() const noexcept { return num_kv_heads_; }
  int64_t head_dim() const noexcept { return head_dim_; }
  c10::ScalarType dtype() const noexcept { return dtype_; }
  torch::Device device() const noexcept { return device_; }
  /// Bytes of the pool (all layers, K and V); 0 while released.
  int64_t bytes() const noexcept {
    return storage_.defined() ? storage_.numel() * static_cast<int64_t>(storage_.element_size()) : 0;
  }
  /// Frees the pool's memory (and the step buffers') while no sequence holds a block (the
  /// trainer's step, docs/concepts.md "Memory of a training step"); allocate_storage() makes it
  /// again, zeroed, with the same blocks, the prefix cache emptied. Nothing may read or write
  /// the cache in between.
  void release_storage();
  void allocate_storage();
  bool has_storage() const noexcept { return storage_.defined(); }
  /// Layer `layer`'s K or V, [num_blocks, block_size, kv_heads, head_dim] (views of the pool).
  const torch::Tensor& keys(int64_t layer) const { return keys_.at(static_cast<size_t>(layer)); }
  const torch::Tensor& values(int64_t layer) const { return values_.at(static_cast<size_t>(layer)); }

  /// The step buffers of whoever runs steps on this cache (the cache and they have one owner).
  StepBuffers& step_buffers() noexcept { return step_buffers_; }

 private:
  int64_t num_layers_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
  BlockAllocator blocks_;
  c10::ScalarType dtype_;
  torch::Device device_;
  torch::Tensor
      storage_;  // [layers, 2, num_blocks, block_size, kv_heads, head_dim]; undefined while released
  std::vector<torch::Tensor> keys_;
  std::vector<torch::Tensor> values_;
  StepBuffers step_buffers_;
};

}  // namespace swarm
