// Inside swarm_job: AgentJet's nested job config (what AgentJetJob sends: an `ajet:` tree
// beside verl's sections) mapped onto our flat Job. The table is in docs/agentjet.md.
#pragma once

#include <yaml-cpp/yaml.h>

#include "swarm/job.hpp"

namespace swarm {

/// Maps `root` (a mapping with an `ajet:` mapping) onto a validated Job. Keys of our own
/// format under a top-level `swarm:` mapping override the mapped values. Every other
/// top-level section (verl's, `defaults`, `hydra`) is ignored. ConfigError naming the
/// AgentJet path for a value that cannot be honoured or is invalid.
Job load_agentjet_config(const YAML::Node& root, JobConfigReport& report);

}  // namespace swarm
