#include "inference/block_allocator.hpp"

#include <algorithm>
#include <string>

#include "common/error.hpp"

namespace swarm {

namespace {
const std::vector<int64_t> kNoBlocks;

// splitmix64's finaliser: every input bit reaches every output bit.
uint64_t mix(uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
}  // namespace

uint64_t kv_block_hash(uint64_t parent, const int32_t* tokens, int64_t n) noexcept {
  uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ull) ^ static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) h = mix(h + static_cast<uint32_t>(tokens[i]) + 0x632be59bd9b4e019ull);
  return h == 0 ? 1 : h;
}

uint64_t kv_chain_root(int64_t weights_version) noexcept {
  const uint64_t h = mix(static_cast<uint64_t>(weights_version) ^ 0x5851f42d4c957f2dull);
  return h == 0 ? 1 : h;
}

BlockAllocator::BlockAllocator(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  SWARM_REQUIRE(num_blocks > 0 && block_size > 0, ErrorKind::INVALID_ARGUMENT,
                "KV cache needs num_blocks > 0 and block_size > 0, got " + std::to_string(num_blocks) +
                    " and " + std::to_string(block_size));
  free_.reserve(static_cast<size_t>(num_blocks));
  // Pushed in reverse so that a fresh pool hands out blocks 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  const auto n = static_cast<size_t>(num_blocks);
  refs_.assign(n, 0);
  key_.assign(n, 0);
  parent_.assign(n, 0);
  lru_pos_.resize(n);
}

bool BlockAllocator::can_fit(int64_t seq_slot, int64_t total_tokens) const noexcept {
  const int64_t have = static_cast<int64_t>(block_table(seq_slot).size());
  const int64_t need = blocks_for(total_tokens < 0 ? 0 : total_tokens);
  return need - have <= free_blocks();
}

int64_t BlockAllocator::take_block() {
  if (!free_.empty()) {
    const int64_t b = free_.back();
    free_.pop_back();
    return b;
  }
  const int64_t b = lru_.front();  // callers checked free_blocks()
  lru_.pop_front();
  uncache(b);
  return b;
}

void BlockAllocator::uncache(int64_t b) {
  const auto i = static_cast<size_t>(b);
  if (key_[i] == 0) return;
  auto it = by_hash_.find(key_[i]);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  key_[i] = 0;
}

bool BlockAllocator::ensure_capacity(int64_t seq_slot, int64_t total_tokens) {
  SWARM_REQUIRE(total_tokens >= 0, ErrorKind::INVALID_ARGUMENT,
                "ensure_capacity: negative token count " + std::to_string(total_tokens));
  if (!can_fit(seq_slot, total_tokens)) return false;
  std::vector<int64_t>& table = tables_[seq_slot];
  const int64_t need = blocks_for(total_tokens);
  while (static_cast<int64_t>(table.size()) < need) {
    const int64_t b = take_block();
    refs_[static_cast<size_t>(b)] = 1;
    table.push_back(b);
  }
  return true;
}

void BlockAllocator::release(int64_t seq_slot) {
  auto it = tables_.find(seq_slot);
  if (it == tables_.end()) return;
  // Last block first: a private block goes onto the free stack so that low ids come back first
  // after a full drain, and a cached one onto the LRU list ahead of the blocks before it (a
  // conversation's later blocks are evicted before its shared beginning).
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) {
    const auto i = static_cast<size_t>(*b);
    if (--refs_[i] > 0) continue;
    if (key_[i] != 0) {
      lru_pos_[i] = lru_.insert(lru_.end(), *b);
    } else {
      free_.push_back(*b);
    }
  }
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

std::vector<int64_t> BlockAllocator::match(uint64_t root, const std::vector<uint64_t>& hashes,
                                           const int32_t* tokens, int64_t max_blocks) const {
  std::vector<int64_t> out;
  const int64_t n = std::min<int64_t>(max_blocks, static_cast<int64_t>(hashes.size()));
  const auto bs = static_cast<size_t>(block_size_);
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_hash_.find(hashes[static_cast<size_t>(i)]);
    if (it == by_hash_.end()) break;
    const auto b = static_cast<size_t>(it->second);
    const uint64_t parent = i == 0 ? root : hashes[static_cast<size_t>(i - 1)];
    if (parent_[b] != parent ||
        !std::equal(tokens + i * block_size_, tokens + (i + 1) * block_size_, tokens_.begin() + b * bs))
      break;  // a hash collision: not the same content
    out.push_back(it->second);
  }
  return out;
}

int64_t BlockAllocator::unreferenced(const std::vector<int64_t>& blocks) const noexcept {
  int64_t n = 0;
  for (int64_t b : blocks) n += refs_[static_cast<size_t>(b)] == 0 ? 1 : 0;
  return n;
}

bool BlockAllocator::attach(int64_t seq_slot, const std::vector<int64_t>& blocks, int64_t total_tokens) {
  SWARM_CHECK(!has_sequence(seq_slot),
              "attach: sequence " + std::to_string(seq_slot) + " already holds blocks");
  const int64_t rest = blocks_for(total_tokens) - static_cast<int64_t>(blocks.size());
  if (rest > free_blocks() - unreferenced(blocks)) return false;
  std::vector<int64_t>& table = tables_[seq_slot];
  for (int64_t b : blocks) {
    const auto i = static_cast<size_t>(b);
    SWARM_CHECK(key_[i] != 0, "attach: block " + std::to_string(b) + " is not cached");
    if (refs_[i]++ == 0) lru_.erase(lru_pos_[i]);
    table.push_back(b);
  }
  const bool grown = ensure_capacity(seq_slot, total_tokens);
  SWARM_CHECK(grown, "attach: the pool could not hold what it said it could");
  return true;
}

bool BlockAllocator::publish(int64_t seq_slot, int64_t index, uint64_t hash, uint64_t parent,
                             const int32_t* tokens) {
  const std::vector<int64_t>& table = block_table(seq_slot);
  SWARM_CHECK(index >= 0 && index < static_cast<int64_t>(table.size()),
              "publish: sequence " + std::to_string(seq_slot) + " has no block " + std::to_string(index));
  const int64_t b = table[static_cast<size_t>(index)];
  const auto i = static_cast<size_t>(b);
  if (key_[i] != 0 || by_hash_.count(hash) != 0) return false;
  if (tokens_.empty()) tokens_.resize(static_cast<size_t>(num_blocks_ * block_size_));
  key_[i] = hash;
  parent_[i] = parent;
  std::copy(tokens, tokens + block_size_, tokens_.begin() + static_cast<int64_t>(i) * block_size_);
  by_hash_.emplace(hash, b);
  return true;
}

void BlockAllocator::drop_cached() {
  for (int64_t b : lru_) {
    key_[static_cast<size_t>(b)] = 0;
    free_.push_back(b);
  }
  lru_.clear();
  for (const auto& [hash, b] : by_hash_) key_[static_cast<size_t>(b)] = 0;
  by_hash_.clear();
}

}  // namespace swarm
