// Which tokens of a vocabulary a grammar state allows next.
//
// Byte-level BPE tokens cross grammar boundaries, so a token is allowed when all of its bytes
// can be fed to the matcher in turn. The vocabulary is kept as a byte trie: one walk over it,
// pruned where the matcher refuses a byte, finds every allowed token, and tokens sharing a
// prefix share the work. Special tokens (a tokenizer's added tokens: <|im_end|>, <tool_call>)
// are not in the trie: they are allowed only where the grammar names them (a TOKEN element),
// or as end of output (`eos_ids`) where the grammar is complete.
//
// Masks are cached by matcher state (an LRU bounded in entries and bytes, lru_cache.hpp): inside
// a JSON string or between values the state repeats, and a repeated state costs no scan. A mask
// is handed out by shared ownership, so one applied to a batch stays valid however many other
// states the same step computes (and the cache evicts).
//
// A new state is not scanned whole. Each of its stacks is cut to its top frames over a hole
// (Matcher::local_view): what the cut stack accepts without reaching the hole is the same
// wherever that stack occurs — inside the 16th character of any string of up to 16, whatever
// property it belongs to — so it is computed once and cached by the cut stack (the idea of
// xgrammar's context-independent tokens). What it accepts through the hole depends on the
// frames below; those tokens continue, after the hole, with a byte the frames below can match
// first (for string content: the closing quote), so only the trie nodes of those bytes are
// walked with the real state. The union is exactly the full scan's mask (tested against it).
#pragma once

#include <algorithm>
#include <array>
#include <compare>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.hpp"
#include "grammar/lru_cache.hpp"

namespace swarm::grammar {

class TokenTrie {
 public:
  /// `token_bytes[id]`: the bytes token `id` stands for. `special[id]`: matched only as a token.
  /// Empty byte strings (unused ids) are never allowed.
  TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& special);
  size_t vocab_size() const { return vocab_size_; }
  size_t num_nodes() const { return nodes_.size(); }
  size_t max_depth() const { return max_depth_; }  // bytes of the longest token

 private:
  friend class TokenMasker;
  // Nodes in depth-first preorder (0 = root): the subtree of node n is [n, end), so a walk is a
  // linear scan that jumps to `end` when the grammar refuses a node's byte.
  struct Node {
    uint32_t end = 0;          // one past the last node of this subtree
    uint32_t first_token = 0;  // into tokens_: ids whose bytes end here
    uint32_t num_tokens = 0;
    uint16_t depth = 0;  // bytes from the root
    uint8_t byte = 0;    // the byte leading here from the parent
  };
  std::vector<Node> nodes_;
  std::vector<uint32_t> parent_;                    // per node (root: 0)
  std::array<uint32_t, 257> child_start_{};         // first node under a root child of byte >= b
  std::array<std::vector<uint32_t>, 256> by_byte_;  // nodes of depth >= 2 whose byte is b, in preorder
  std::vector<uint32_t> tokens_;
  size_t vocab_size_ = 0;
  size_t max_depth_ = 0;
};

/// A bitmask over token ids (bit i of word i / 64).
using TokenMask = std::vector<uint64_t>;
inline bool mask_allows(const TokenMask& m, uint32_t id) { return (m[id >> 6] >> (id & 63)) & 1u; }

/// One per compiled grammar and vocabulary, shared by every sequence decoding with it (states
/// are ids in the matcher's arena, so the cache is only meaningful for one Matcher). Not
/// thread-safe: used from the thread that samples.
class TokenMasker {
 public:
  /// Both mask caches together, by default (a 152k vocabulary's mask is 19 KiB).
  static constexpr size_t kDefaultCacheBytes = size_t{32} << 20;

  /// `eos_ids` (end of output) are allowed where the state is accepting, and are the only
  /// allowed tokens once it is finished. Masks are cached by state (`cache_entries`) and by cut
  /// stack (`local_entries`), the two caches together within `cache_bytes` (two thirds for
  /// masks by state), least recently used out first.
  TokenMasker(std::shared_ptr<const TokenTrie> trie, std::vector<uint32_t> eos_ids,
              size_t cache_entries = 512, size_t local_entries = 256,
              size_t cache_bytes = kDefaultCacheBytes);

  /// The tokens allowed after `state` of `matcher`, shared with the cache: the mask stays valid
  /// and unchanged for as long as the caller holds it, whatever the cache evicts meanwhile (a
  /// batch holds its rows' masks for the whole step).
  std::shared_ptr<const TokenMask> allowed_shared(Matcher& matcher, Matcher::StateId state);
  std::shared_ptr<const TokenMask> allowed_shared(Matcher& matcher, const Matcher::State& state) {
    return allowed_shared(matcher, matcher.state_id(state));
  }
  /// The same as a reference, valid until the next call to allowed() or allowed_shared().
  const TokenMask& allowed(Matcher& matcher, const Matcher::State& state) {
    return allowed(matcher, matcher.state_id(state));
  }
  const TokenMask& allowed(Matcher& matcher, Matcher::StateId state) {
    last_ = allowed_shared(matcher, state);
    return *last_;
  }

  size_t cache_hits() const { return hits_; }
  size_t cache_misses() const { return misses_; }
  size_t local_hits() const { return local_hits_; }
  size_t local_misses() const { return local_misses_; }
  /// Masks cached by state; estimated bytes of both caches (within `cache_bytes`, bookkeeping
  /// included); entries the bounds dropped.
  size_t cached_masks() const { return cache_.size(); }
  size_t cached_bytes() const { return cache_.bytes() + local_cache_.bytes(); }
  size_t cache_evictions() const { return cache_.evictions() + local_cache_.evictions(); }
  /// Estimated heap bytes: the cached masks and the walk's tables (not the shared trie).
  size_t memory_bytes() const;

  /// The mask of a state by one scan of the whole trie (the reference the cached path is tested
  /// against; not cached).
  TokenMask scan(Matcher& matcher, Matcher::StateId state);

 private:
  void compute(Matcher& matcher, Matcher::StateId state, TokenMask& out);
  // Sets every token in the subtree of trie node `from` (whose parent is reached in `state`)
  // that the matcher accepts.
  void walk(Matcher& matcher, uint32_t from, uint32_t end, Matcher::StateId parent_state, TokenMask& out);
  std::shared_ptr<const TokenMask> local_mask(Matcher& matcher, uint32_t local_stack);
  static size_t mask_bytes(const TokenMask& m) { return sizeof(TokenMask) + m.capacity() * sizeof(uint64_t); }
  static constexpr int kLocalDepth = 2;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<uint32_t> eos_ids_;
  LruCache<Matcher::StateId, TokenMask> cache_;  // by matcher state
  std::vector<Matcher::StateId> cur_;            // per trie depth: the state after that many bytes
  LruCache<uint32_t, TokenMask> local_cache_;    // by cut stack
  std::shared_ptr<const TokenMask> last_;        // what allowed() last returned
  std::unordered_map<uint32_t, std::array<uint64_t, 4>> first_bytes_;  // by stack below a cut
  // A stack of the state being computed, cut: its view, what is below the cut, its first bytes.
  struct CutView {
    uint32_t stack, below;
    uint8_t lo, hi;
    auto operator<=>(const CutView&) const = default;
  };
  std::vector<CutView> views_;
  std::vector<uint32_t> candidates_, path_nodes_;
  std::vector<Matcher::StateId> path_states_;
  size_t hits_ = 0, misses_ = 0, local_hits_ = 0, local_misses_ = 0;
};

}  // namespace swarm::grammar
