#include "engine/rank_router.hpp"

namespace swarm {

RankRouter::RankRouter(int ranks, size_t max_episodes) : max_episodes_(max_episodes == 0 ? 1 : max_episodes) {
  ranks_.resize(static_cast<size_t>(ranks < 1 ? 1 : ranks));
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r].rank = static_cast<int>(r);
}

int RankRouter::least_loaded_locked() const {
  int best = -1;
  for (const RankServing& r : ranks_) {
    if (!r.up) continue;
    if (best < 0) {
      best = r.rank;
      continue;
    }
    const RankServing& b = ranks_[static_cast<size_t>(best)];
    if (r.outstanding_tokens < b.outstanding_tokens ||
        (r.outstanding_tokens == b.outstanding_tokens && r.requests < b.requests))
      best = r.rank;
  }
  return best;
}

int RankRouter::route(const std::string& affinity, int64_t tokens) {
  std::lock_guard lk(mu_);
  int rank = -1;
  if (!affinity.empty()) {
    if (auto it = episodes_.find(affinity); it != episodes_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      if (ranks_[static_cast<size_t>(it->second->second)].up) rank = it->second->second;
    }
  }
  if (rank < 0) {
    rank = least_loaded_locked();
    if (rank < 0) return -1;
    if (!affinity.empty()) {
      if (auto it = episodes_.find(affinity); it != episodes_.end()) {
        it->second->second = rank;  // its rank went down: it moves
      } else {
        lru_.emplace_front(affinity, rank);
        episodes_[affinity] = lru_.begin();
        while (lru_.size() > max_episodes_) {
          episodes_.erase(lru_.back().first);
          lru_.pop_back();
        }
      }
    }
  }
  RankServing& r = ranks_[static_cast<size_t>(rank)];
  ++r.requests;
  ++r.in_flight;
  r.outstanding_tokens += tokens;
  return rank;
}

void RankRouter::finish(int rank, int64_t tokens, int64_t generated) {
  std::lock_guard lk(mu_);
  if (rank < 0 || static_cast<size_t>(rank) >= ranks_.size()) return;
  RankServing& r = ranks_[static_cast<size_t>(rank)];
  --r.in_flight;
  r.outstanding_tokens -= tokens;
  r.generated_tokens += generated;
}

void RankRouter::set_down(int rank) {
  std::lock_guard lk(mu_);
  if (rank >= 0 && static_cast<size_t>(rank) < ranks_.size()) ranks_[static_cast<size_t>(rank)].up = false;
}

std::vector<RankServing> RankRouter::counters() const {
  std::lock_guard lk(mu_);
  return ranks_;
}

size_t RankRouter::remembered_episodes() const {
  std::lock_guard lk(mu_);
  return lru_.size();
}

}  // namespace swarm
