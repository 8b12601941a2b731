// Compiled grammars by their source, shared by every request that asks for the same one.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "grammar/grammar.hpp"
#include "grammar/lru_cache.hpp"

namespace swarm::grammar {

/// Compiled grammars by source text (e.g. "schema:" + a schema's compact dump), least recently
/// used out first beyond `max_entries` or `max_bytes` (each entry costs its grammar's tables,
/// Grammar::memory_bytes(), plus its source text). A grammar handed out is shared: eviction
/// only drops the cache's reference. Thread-safe; compiling runs outside the lock.
class GrammarCache {
 public:
  static constexpr size_t kDefaultEntries = 64;

  explicit GrammarCache(size_t max_entries = kDefaultEntries, size_t max_bytes = kDefaultGrammarCacheBytes)
      : cache_(max_entries, max_bytes) {}

  /// The grammar of `key`, compiled by `build()` (returning a Grammar) when not cached; what
  /// build() throws goes to the caller and nothing is cached.
  template <class Build>
  std::shared_ptr<const Grammar> get(const std::string& key, Build&& build) {
    {
      std::lock_guard lk(mu_);
      if (auto g = cache_.find(key)) return g;
    }
    auto g = std::make_shared<const Grammar>(build());
    const size_t bytes = g->memory_bytes();
    std::lock_guard lk(mu_);
    if (auto cached = cache_.find(key)) return cached;  // compiled meanwhile by another thread
    return cache_.insert(key, std::move(g), bytes);
  }

  size_t size() const {
    std::lock_guard lk(mu_);
    return cache_.size();
  }
  /// Estimated bytes held: at most max_bytes.
  size_t bytes() const {
    std::lock_guard lk(mu_);
    return cache_.bytes();
  }
  size_t evictions() const {
    std::lock_guard lk(mu_);
    return cache_.evictions();
  }

 private:
  mutable std::mutex mu_;
  LruCache<std::string, Grammar> cache_;
};

}  // namespace swarm::grammar
