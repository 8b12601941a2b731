// Where the pool makes finished episodes durable (the episode store implements it; the pool
// knows nothing of SQLite). No torch, no I/O here.
#pragma once

#include <exception>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "rollout_pool/types.hpp"

namespace swarm {

class EpisodeJournal {
 public:
  /// nullptr once durable; else the error (a SwarmError, UNAVAILABLE) saying why it is not.
  using Done = std::function<void(std::exception_ptr)>;
  virtual ~EpisodeJournal() = default;
  /// Makes `episode` durable and then calls `done` exactly once, from any thread (possibly
  /// before returning). Called outside the pool's lock, before end_episode answers success.
  virtual void record_async(const FinishedEpisode& episode, Done done) = 0;
  /// The episodes were dropped and will never train (safety valve, staleness): forget them.
  /// Called under the pool's lock: must not block on I/O.
  virtual void forget(std::vector<std::string> episode_uuids) = 0;

  /// record_async, waiting: returns once durable, throws the error otherwise.
  void record(const FinishedEpisode& episode) {
    std::promise<void> p;
    std::future<void> f = p.get_future();
    record_async(episode, [&p](std::exception_ptr e) {
      if (e)
        p.set_exception(e);
      else
        p.set_value();
    });
    f.get();
  }
};

}  // namespace swarm
