// The engine's side of swarm experience sharing (SAPO, docs/sapo.md): a trained batch's local
// task groups as messages, and a received group re-encoded into this node's samples.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exchange/sapo_message.hpp"
#include "rollout_pool/types.hpp"

namespace swarm {

class Backend;

/// The local task groups of a batch whose episodes carry their calls as text (exchange_calls),
/// one SapoGroup per task, in batch order. Episodes without text are left out.
std::vector<SapoGroup> sapo_groups_of_batch(const TrainBatch& batch, const std::string& node_id,
                                            const std::string& model, int64_t policy_step, double created);

/// Re-encodes a group from another node for this one: each chat call's messages rendered with
/// this node's chat template and its completion tokenized with this node's tokenizer (loss mask
/// on the completion tokens only); completion calls' text encoded as it is. Log-probs are NaN
/// (the trainer recomputes them; the samples count as on-policy at `version`). The episodes'
/// task id is "sapo/<node>/<task_id>", so the group gets its own advantages. Throws SwarmError
/// when the template rejects it or a call does not fit `max_context` tokens.
std::vector<FinishedEpisode> reencode_sapo_group(const SapoGroup& group, const Backend& backend,
                                                 int64_t version, int64_t max_context);

}  // namespace swarm
