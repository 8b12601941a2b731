// The engine's side of swarm experience sharing (SAPO, docs/sapo.md): the run's exchange wired
// from the job, a trained batch's local task groups as messages, and a received group
// re-encoded into this node's samples. It lives beside the engine, not in src/exchange/,
// because re-encoding needs the Backend (tokenizer and chat template).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "exchange/exchange.hpp"
#include "exchange/sapo_message.hpp"
#include "rollout_pool/types.hpp"
#include "swarm/job.hpp"

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

/// A run's experience sharing: its Exchange (connected at construction), and per trained
/// batch the publishing of its groups and the external groups it trains on. Control thread
/// only (not thread-safe), except exchange() for status.
class ExperienceSharing {
 public:
  /// `node_id_file`: where a node id drawn for a job without `node_id` is kept, so that a
  /// restart is the same node ("" = not kept). `seed` seeds the draw of external groups.
  ExperienceSharing(const Job& job, const std::string& model, const std::filesystem::path& node_id_file,
                    uint64_t seed);

  /// Publishes the batch's local groups (exchange_publish) and adds up to
  /// sapo_external_groups re-encoded external groups to it, trained at `policy_step`.
  /// Returns the step's metrics (external_groups, local_reward_mean, exchange_*).
  std::map<std::string, double> share(const Backend& backend, TrainBatch& batch, int64_t policy_step);

  const std::shared_ptr<Exchange>& exchange() const { return exchange_; }

 private:
  bool publish_;
  int64_t external_groups_;
  std::shared_ptr<Exchange> exchange_;
  std::mt19937_64 rng_;
};

}  // namespace swarm
