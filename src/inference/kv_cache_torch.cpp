#include "inference/kv_cache_torch.hpp"

#include <string>

#include "common/error.hpp"
#include "model/model_config.hpp"

namespace swarm {

namespace {
const std::vector<int64_t> kNoBlocks;
}  // namespace

BlockAllocator::BlockAllocator(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  SWARM_REQUIRE(num_blocks > 0 && block_size > 0, ErrorKind::INVALID_ARGUMENT,
                "KV cache needs num_blocks > 0 and block_size > 0, got " + std::to_string(num_blocks) +
                    " and " + std::to_string(block_size));
  free_.reserve(static_cast<size_t>(num_blocks));
  // Pushed in reverse so that a fresh pool hands out blocks 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

bool BlockAllocator::can_fit(int64_t seq_slot, int64_t total_tokens) const noexcept {
  const int64_t have = static_cast<int64_t>(block_table(seq_slot).size());
  const int64_t need = blocks_for(total_tokens < 0 ? 0 : total_tokens);
  return need - have <= free_blocks();
}

bool BlockAllocator::ensure_capacity(int64_t seq_slot, int64_t total_tokens) {
  SWARM_REQUIRE(total_tokens >= 0, ErrorKind::INVALID_ARGUMENT,
                "ensure_capacity: negative token count " + std::to_string(total_tokens));
  if (!can_fit(seq_slot, total_tokens)) return false;
  std::vector<int64_t>& table = tables_[seq_slot];
  const int64_t need = blocks_for(total_tokens);
  while (static_cast<int64_t>(table.size()) < need) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockAllocator::release(int64_t seq_slot) {
  auto it = tables_.find(seq_slot);
  if (it == tables_.end()) return;
  // Reverse order keeps the stack handing out low block ids first after a full drain.
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) free_.push_back(*b);
  tables_.erase(it);
}

int64_t BlockAllocator::capacity(int64_t seq_slot) const noexcept {
  return static_cast<int64_t>(block_table(seq_slot).size()) * block_size_;
}

const std::vector<int64_t>& BlockAllocator::block_table(int64_t seq_slot) const noexcept {
  auto it = tables_.find(seq_slot);
  return it == tables_.end() ? kNoBlocks : it->second;
}

int64_t BlockAllocator::slot_of(int64_t seq_slot, int64_t pos) const {
  const std::vector<int64_t>& table = block_table(seq_slot);
  SWARM_CHECK(pos >= 0 && pos / block_size_ < static_cast<int64_t>(table.size()),
              "position " + std::to_string(pos) + " is beyond the KV capacity of sequence " +
                  std::to_string(seq_slot) + " (" + std::to_string(capacity(seq_slot)) + " tokens)");
  return table[static_cast<size_t>(pos / block_size_)] * block_size_ + pos % block_size_;
}

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
