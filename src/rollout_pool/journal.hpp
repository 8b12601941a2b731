// Where the pool makes finished episodes durable (the episode store implements it; the pool
// knows nothing of SQLite). No torch, no I/O here.
#pragma once

#include <string>
#include <vector>

#include "rollout_pool/types.hpp"

namespace swarm {

class EpisodeJournal {
 public:
  virtual ~EpisodeJournal() = default;
  /// Returns once `episode` is durable; throws SwarmError (UNAVAILABLE) when it could not be
  /// stored. Called outside the pool's lock, before end_episode answers success.
  virtual void record(const FinishedEpisode& episode) = 0;
  /// The episodes were dropped and will never train (safety valve, staleness): forget them.
  /// Called under the pool's lock: must not block on I/O.
  virtual void forget(std::vector<std::string> episode_uuids) = 0;
};

}  // namespace swarm
