#include "inference/kv_cache_torch.hpp"

#include <string>

#include "common/error.hpp"
#include "model/model_config.hpp"

namespace swarm {

const torch::Tensor& StepBuffers::get(size_t slot, c10::IntArrayRef sizes, c10::ScalarType dtype,
                                      torch::Device device) {
  if (slot >= tensors_.size()) tensors_.resize(slot + 1);
  torch::Tensor& t = tensors_[slot];
  if (!t.defined() || t.sizes() != sizes || t.scalar_type() != dtype || t.device() != device) {
    t = torch::Tensor();  // the old one goes first: the two are never held together
    t = torch::empty(sizes, torch::TensorOptions().dtype(dtype).device(device));
  }
  return t;
}

int64_t StepBuffers::bytes() const noexcept {
  int64_t total = 0;
  for (const torch::Tensor& t : tensors_) {
    if (t.defined()) total += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return total;
}

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                 int64_t block_size, c10::ScalarType dtype, torch::Device device)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      blocks_(num_blocks, block_size),
      dtype_(dtype),
      device_(device) {
  SWARM_REQUIRE(num_layers > 0 && num_kv_heads > 0 && head_dim > 0, ErrorKind::INVALID_ARGUMENT,
                "KV cache needs positive layers, kv heads and head_dim");
  allocate_storage();
}

void KvCache::allocate_storage() {
  if (storage_.defined()) return;
  // Zeroed, not just reserved: the pages are committed now (the footprint is real from the
  // start) and a never-written slot can never feed NaN into attention.
  storage_ =
      torch::zeros({num_layers_, 2, blocks_.num_blocks(), blocks_.block_size(), num_kv_heads_, head_dim_},
                   torch::TensorOptions().dtype(dtype_).device(device_));
  keys_.reserve(static_cast<size_t>(num_layers_));
  values_.reserve(static_cast<size_t>(num_layers_));
  for (int64_t l = 0; l < num_layers_; ++l) {
    keys_.push_back(storage_[l][0]);
    values_.push_back(storage_[l][1]);
  }
}

void KvCache::release_storage() {
  SWARM_CHECK(blocks_.num_sequences() == 0, "the KV cache's storage released while sequences hold blocks");
  blocks_.drop_cached();  // the contents go with the storage
  keys_.clear();
  values_.clear();
  storage_ = torch::Tensor();
  step_buffers_ = StepBuffers();
}

KvCache KvCache::for_model(const ModelConfig& config, int64_t num_blocks, int64_t block_size,
                           c10::ScalarType dtype, torch::Device device) {
  return KvCache(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, num_blocks,
                 block_size, dtype, device);
}

int64_t KvCache::bytes_per_block(const ModelConfig& config, int64_t block_size, c10::ScalarType dtype) {
  return config.num_hidden_layers * 2 * block_size * config.num_key_value_heads * config.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

}  // namespace swarm
