// A least-recently-used cache bounded both in entries and in estimated bytes, for the caches of
// structured outputs: compiled grammars by their source (GrammarCache) and token masks by
// grammar state (TokenMasker).
//
// Values are held by shared ownership: dropping an entry only drops the cache's reference, so a
// value handed out — a mask a batch applies during a step, a grammar a request decodes with —
// stays valid for as long as its holder keeps it, whatever the cache evicts meanwhile.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace swarm::grammar {

/// What a cache of structured outputs may hold, by default: compiled grammars with their source
/// text, or one engine's grammars in use with their parse tables and masks.
inline constexpr size_t kDefaultGrammarCacheBytes = size_t{256} << 20;

/// Not thread-safe: the owner serialises calls.
template <class Key, class Value, class Hash = std::hash<Key>>
class LruCache {
 public:
  /// Bookkeeping per entry on top of the value's own bytes: the list and hash nodes and the
  /// shared_ptr control block (an estimate; a std::string key adds its text, held twice).
  static constexpr size_t kEntryOverhead =
      sizeof(std::pair<const Key, std::shared_ptr<const Value>>) + 4 * sizeof(void*) + 32;

  /// At least one entry; `max_bytes` bounds the sum of the entries' costs (see insert).
  LruCache(size_t max_entries, size_t max_bytes)
      : max_entries_(max_entries == 0 ? 1 : max_entries), max_bytes_(max_bytes) {}

  /// The key's value, now the most recent; nullptr when it is not cached.
  std::shared_ptr<const Value> find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->value;
  }

  /// Caches `value` (replacing the key's old value) as the most recent, costing `value_bytes`
  /// plus the entry's bookkeeping, then drops least recently used entries until both bounds
  /// hold — the new one too when it alone is over the byte bound. Returns `value`.
  std::shared_ptr<const Value> insert(const Key& key, std::shared_ptr<const Value> value,
                                      size_t value_bytes) {
    if (auto it = index_.find(key); it != index_.end()) erase(it->second);
    const size_t cost = value_bytes + kEntryOverhead + key_bytes(key);
    lru_.push_front(Entry{key, value, cost});
    index_.emplace(key, lru_.begin());
    bytes_ += cost;
    while (!lru_.empty() && (lru_.size() > max_entries_ || bytes_ > max_bytes_)) {
      erase(std::prev(lru_.end()));
      ++evictions_;
    }
    return value;
  }

  void clear() {
    index_.clear();
    lru_.clear();
    bytes_ = 0;
  }

  size_t size() const { return lru_.size(); }
  /// The estimated bytes of the entries held (at most max_bytes()).
  size_t bytes() const { return bytes_; }
  size_t max_entries() const { return max_entries_; }
  size_t max_bytes() const { return max_bytes_; }
  /// Entries dropped to keep the bounds (replacements and clear() are not counted).
  size_t evictions() const { return evictions_; }

 private:
  struct Entry {
    Key key;
    std::shared_ptr<const Value> value;
    size_t cost;
  };
  using Iterator = typename std::list<Entry>::iterator;

  static size_t key_bytes(const Key& key) {
    if constexpr (std::is_same_v<Key, std::string>)
      return 2 * key.size();  // in the list and the index
    else
      return 0;
  }
  void erase(Iterator it) {
    bytes_ -= it->cost;
    index_.erase(it->key);
    lru_.erase(it);
  }

  size_t max_entries_, max_bytes_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<Key, Iterator, Hash> index_;
  size_t bytes_ = 0;
  size_t evictions_ = 0;
};

}  // namespace swarm::grammar
