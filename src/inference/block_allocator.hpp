// The block bookkeeping of the paged KV cache, without tensors (so the mock engine can run the
// same prefix cache over token ids): a pool of block ids, a block table per sequence, and the
// prefix cache — full blocks findable by the hash chain of their tokens, shared by reference
// count, evicted least recently used (docs/concepts.md "Prefix caching").
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace swarm {

/// The key of a full block: a 64-bit hash of the block before it (`parent`; for the first
/// block, the root, which carries the weights version) and the block's own token ids. Never 0.
uint64_t kv_block_hash(uint64_t parent, const int32_t* tokens, int64_t n) noexcept;
/// The root of a hash chain: what every cached block's key depends on besides the tokens
/// (the version of the weights that computed it).
uint64_t kv_chain_root(int64_t weights_version) noexcept;

/// Free list, block tables and the prefix cache. Thread-compatible (no internal locking): one
/// owner at a time (the serving engine's scheduling thread).
///
/// A block is free, held by sequences (reference count > 0), or cached and unreferenced (on
/// the LRU list, reused only when no free block is left). free_blocks() counts the last two
/// kinds' reclaimable ones: free + cached unreferenced.
class BlockAllocator {
 public:
  BlockAllocator(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const noexcept { return num_blocks_; }
  int64_t block_size() const noexcept { return block_size_; }
  /// Blocks a sequence can take now: free ones plus cached ones no sequence holds.
  int64_t free_blocks() const noexcept { return static_cast<int64_t>(free_.size() + lru_.size()); }
  /// Blocks holding published content (held or not).
  int64_t cached_blocks() const noexcept { return static_cast<int64_t>(by_hash_.size()); }
  /// Cached blocks no sequence holds (evicted first when nothing is free).
  int64_t evictable_blocks() const noexcept { return static_cast<int64_t>(lru_.size()); }
  /// Blocks needed to hold `tokens` tokens.
  int64_t blocks_for(int64_t tokens) const noexcept { return (tokens + block_size_ - 1) / block_size_; }

  /// Grows `seq_slot`'s block table so that it holds at least `total_tokens` tokens. Returns
  /// false, changing nothing, when the pool has too few free blocks (the caller waits for other
  /// sequences to finish). Never shrinks a table. A new slot is registered on first success.
  bool ensure_capacity(int64_t seq_slot, int64_t total_tokens);
  /// True when ensure_capacity(seq_slot, total_tokens) would succeed now.
  bool can_fit(int64_t seq_slot, int64_t total_tokens) const noexcept;
  /// Drops `seq_slot`'s references and forgets the slot (no-op when unknown): a block nobody
  /// holds goes back to the free list, or, when cached, to the LRU list.
  void release(int64_t seq_slot);

  bool has_sequence(int64_t seq_slot) const noexcept { return tables_.count(seq_slot) != 0; }
  int64_t num_sequences() const noexcept { return static_cast<int64_t>(tables_.size()); }
  /// Tokens `seq_slot`'s blocks can hold (0 when unknown).
  int64_t capacity(int64_t seq_slot) const noexcept;
  /// The block ids of `seq_slot`, in position order (empty when unknown).
  const std::vector<int64_t>& block_table(int64_t seq_slot) const noexcept;
  /// Row of token `pos` of `seq_slot` in a [num_blocks * block_size, ...] view of the pool.
  /// `pos` must be below capacity(seq_slot).
  int64_t slot_of(int64_t seq_slot, int64_t pos) const;
  /// Sequences holding `block` now.
  int64_t references(int64_t block) const { return refs_.at(static_cast<size_t>(block)); }

  // ---- prefix cache
  /// The longest run of cached blocks matching the chain `hashes` (block i's key, kv_block_hash
  /// from `root`) of `tokens` from the start, at most `max_blocks` of them. Each hit is checked
  /// against the block's stored tokens and parent key, so a match is the same content.
  std::vector<int64_t> match(uint64_t root, const std::vector<uint64_t>& hashes, const int32_t* tokens,
                             int64_t max_blocks) const;
  /// How many of `blocks` (a match) no sequence holds: attaching them takes them off the LRU.
  int64_t unreferenced(const std::vector<int64_t>& blocks) const noexcept;
  /// A new sequence `seq_slot` starting with the cached `blocks` (a match made since the last
  /// change to the cache), grown to `total_tokens`. False, changing nothing, when the pool
  /// cannot hold the rest.
  bool attach(int64_t seq_slot, const std::vector<int64_t>& blocks, int64_t total_tokens);
  /// Makes block `index` of `seq_slot` (full, its K/V computed) findable by `hash` (its
  /// parent key `parent`, its tokens `tokens`). False when a cached block already holds that
  /// content or this block is cached already: it then stays as it is.
  bool publish(int64_t seq_slot, int64_t index, uint64_t hash, uint64_t parent, const int32_t* tokens);
  /// Forgets all cached content (the weights changed, the storage was freed): unreferenced
  /// cached blocks become free, held ones private to their sequences.
  void drop_cached();

 private:
  int64_t take_block();     // a free block, else the least recently used cached one (evicted)
  void uncache(int64_t b);  // b leaves the hash index

  int64_t num_blocks_;
  int64_t block_size_;
  std::vector<int64_t> free_;  // a stack: the most recently freed block is reused first
  std::unordered_map<int64_t, std::vector<int64_t>> tables_;
  std::vector<int32_t> refs_;  // per block: sequences holding it
  // Prefix cache, per block: its key (0 = not cached), its parent key and tokens; the index by
  // key; the unreferenced cached blocks, least recently used first.
  std::vector<uint64_t> key_;
  std::vector<uint64_t> parent_;
  std::vector<int32_t> tokens_;  // [num_blocks * block_size]
  std::unordered_map<uint64_t, int64_t> by_hash_;
  std::list<int64_t> lru_;
  std::vector<std::list<int64_t>::iterator> lru_pos_;  // valid while the block is on lru_
};

}  // namespace swarm
