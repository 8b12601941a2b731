// Inside swarm_job: setting one flat Job key from a YAML value, shared by the flat loader
// (job.cpp) and the mapping of AgentJet's nested config (agentjet_config.cpp).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "swarm/job.hpp"

namespace swarm::job_keys {

/// A former key, accepted with a warning and ignored: the number of ranks is a property of the
/// running server, not of the job.
inline constexpr const char* kRemovedRanksKey = "n_gpu";
inline constexpr const char* kRanksAreTheServers =
    "swarm trains on the ranks swarm-server was started with (--nproc N, or RANK/WORLD_SIZE per "
    "machine; docs/concepts.md, \"Several ranks\")";

/// A mapping key as text; ConfigError("config has a non-string key") otherwise.
std::string key_text(const YAML::Node& key);
/// True when `key` is one of the flat keys.
bool known(const std::string& key);
/// What an error says of a key that is not one: "unknown key; did you mean 'learning_rate'?
/// (see docs/configuration.md ...)" when a valid key is a typo away.
std::string unknown_key(const std::string& key);
/// Parses `value` as `key`'s type into `job`. ConfigError naming `shown_as` (the key as the
/// user wrote it, e.g. "ajet.data.train_batch_size") on a wrong type or a non-finite float.
void set(Job& job, const std::string& key, const YAML::Node& value, const std::string& shown_as);
/// YAML::Load of untrusted text, then its nesting checked (without recursion) against
/// kMaxJsonNesting (common/json_nesting.hpp) before anything walks it: ConfigError
/// "<what> is nested deeper than 128 levels", or "<what> is not valid YAML: ...".
YAML::Node load_bounded(const std::string& yaml_text, const std::string& what);
/// "int", "float", "string" or "bool".
std::string type_of(const std::string& key);
/// The key's current value as YAML text ("32", "0.5", "true", "grpo").
std::string text(const Job& job, const std::string& key);

}  // namespace swarm::job_keys
