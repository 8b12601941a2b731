// Small builders the integration tests share: quick client back-off, rewards, tasks.
#pragma once

#include <chrono>
#include <string>

#include "swarm/swarm.hpp"

namespace swarm::testing {

/// Claims retry fast in tests (the defaults back off for seconds).
inline SwarmClientOptions fast_client() {
  SwarmClientOptions o;
  o.backoff_initial = std::chrono::milliseconds(5);
  o.backoff_max = std::chrono::milliseconds(50);
  return o;
}

inline WorkflowOutput reward(double r) {
  WorkflowOutput out;
  out.reward = r;
  return out;
}

/// A task with this id and a query derived from it.
inline Task task(const std::string& id) {
  Task t;
  t.task_id = id;
  t.main_query = "say " + id;
  return t;
}

}  // namespace swarm::testing
