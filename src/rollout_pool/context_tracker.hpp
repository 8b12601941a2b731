// Turns an episode's recorded LLM calls into training samples (docs/design.md).
#pragma once

#include <vector>

#include "rollout_pool/types.hpp"

namespace swarm {

/// Merges the calls of one episode, in the order they were made, into timelines.
/// A call whose prompt ids begin with all the tokens of an existing timeline
/// (earlier prompt + completion, recursively) extends that timeline (the longest such
/// timeline wins; ties go to the most recent); otherwise it starts a new one.
/// Loss mask is 1 exactly on completion tokens, 0 on everything the environment or the
/// template added. Pure function, thread-safe.
std::vector<Sample> merge_calls_into_samples(const std::vector<LlmCall>& calls);

}  // namespace swarm
