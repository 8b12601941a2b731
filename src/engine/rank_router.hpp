// Which rank serves a generation (docs/design.md §6): rank 0 keeps the one HTTP endpoint and
// routes every request to a rank of the job — the rank that served the episode before, so a
// multi-turn conversation stays where its KV cache is, else the one with the fewest
// outstanding tokens (prompt + max_tokens × n of the requests it serves now; ties go to the
// rank that has been given fewer requests, so an idle job takes turns). A rank whose serving
// link broke is down and gets nothing more. Torch-free and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/backend.hpp"

namespace swarm {

class RankRouter {
 public:
  /// `max_episodes`: how many episodes' ranks are remembered (least recently used go first).
  explicit RankRouter(int ranks, size_t max_episodes = size_t{1} << 16);

  /// The rank for a request costing `tokens`, now counted as in flight there; -1 when every
  /// rank is down. `affinity` empty: no episode to stick to.
  int route(const std::string& affinity, int64_t tokens);
  /// A routed request ended (`generated` tokens when it completed, 0 otherwise).
  void finish(int rank, int64_t tokens, int64_t generated);
  /// The rank serves no more (its link broke); its episodes go elsewhere.
  void set_down(int rank);

  std::vector<RankServing> counters() const;
  size_t remembered_episodes() const;

 private:
  int least_loaded_locked() const;

  mutable std::mutex mu_;
  std::vector<RankServing> ranks_;
  size_t max_episodes_;
  std::list<std::pair<std::string, int>> lru_;  // most recent first
  std::unordered_map<std::string, std::list<std::pair<std::string, int>>::iterator> episodes_;
};

}  // namespace swarm
