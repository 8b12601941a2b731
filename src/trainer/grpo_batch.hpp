// From a TrainBatch to what the GRPO update iterates over: task groups, advantages,
// mini-batches and token-budgeted micro-batches, the learning-rate schedule. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rollout_pool/types.hpp"

namespace swarm {

struct Job;

enum class AdvantageEstimator {
  GRPO,                // (r - mean) / (std + eps) within the task group
  GRPO_NO_STD,         // r - mean within the task group (Dr.GRPO)
  REINFORCE_BASELINE,  // r - mean of the whole batch (one global baseline)
  GAE,                 // PPO: per-token GAE from the critic's values (the trainer computes them)
};
enum class LossAggregation { TOKEN_MEAN, SEQ_MEAN_TOKEN_MEAN };
/// What a GRPO group is (job key `group_by`).
enum class GroupBy {
  TASK,             // every sample of a task's episodes, on the episode reward (docs/design.md)
  TASK_AGENT_TURN,  // AT-GRPO: the calls of one task, one agent, one turn index, on turn rewards
};
enum class KlEstimator { K1, K3 };

/// Job names → enums; INVALID_ARGUMENT naming the value for anything else.
AdvantageEstimator parse_advantage_estimator(const std::string& name);
GroupBy parse_group_by(const std::string& name);
LossAggregation parse_loss_aggregation(const std::string& name);
KlEstimator parse_kl_estimator(const std::string& name);

/// One training sequence (a Sample of the batch) with its advantage. Points into the batch,
/// which must outlive it.
struct TrainSequence {
  const Sample* sample = nullptr;
  const FinishedEpisode* episode = nullptr;  // AdvantageEstimator::GAE (where its rewards were earned)
  int64_t group = 0;                         // index into PreparedBatch::groups
  double advantage = 0.0;  // GroupBy::TASK_AGENT_TURN: the mean over its trained tokens (statistics)
  std::vector<float> token_advantage;  // per token when they differ within the sample (AT-GRPO); else empty
  int64_t length = 0;                  // tokens
  int64_t trained_tokens = 0;          // loss-mask-1 tokens at positions >= 1 (position 0 has no prediction)
};

struct AdvantageStats {
  int64_t groups = 0;
  int64_t zero_variance_groups = 0;  // groups without signal, left out (every advantage zero: has_signal)
  int64_t skipped_samples = 0;       // samples of those groups
  double mean = 0.0, std = 0.0, min = 0.0, max = 0.0;  // over the kept sequences
};

/// The batch, grouped by task_id in arrival order, with advantages.
struct PreparedBatch {
  std::vector<TrainSequence> sequences;     // kept sequences, grouped, in batch order
  std::vector<std::vector<size_t>> groups;  // per kept group: indices into `sequences`
  AdvantageStats stats;
  int64_t trained_tokens() const;
};

/// Groups the samples by task (all samples of all episodes of a task form one group, as
/// docs/concepts.md says), computes every sample's advantage from its reward, and leaves out the
/// groups the estimator gives no signal (they would only add zero-advantage tokens to the loss's
/// denominator; counted in stats): for grpo and grpo_no_std the groups whose rewards are all
/// equal (a group of one sample included), for reinforce_baseline the groups whose every reward
/// equals the batch's mean. Group std is the unbiased sample std (as torch.std).
/// reinforce_baseline's batch mean is over the samples with trained tokens. Samples without
/// trained tokens are dropped too.
///
/// GroupBy::TASK_AGENT_TURN (AT-GRPO, PettingLLMs): the unit is one LLM call of a sample; the
/// calls of one task made by one agent at one turn index (its n-th call in the episode) form a
/// group, each with its reward `turn_rewards[call]` (the episode's reward when the episode sent
/// none). A call's advantage applies to its completion tokens (`token_advantage`); a call whose
/// group has zero variance gets 0 (its tokens stay in the loss's denominator); a sample none of
/// whose calls is in a group with signal is left out (stats count groups and calls then).
/// reinforce_baseline's batch mean is over every call of the batch.
/// `PreparedBatch::groups` stays per task (mini-batches take whole tasks).
///
/// AdvantageEstimator::GAE: every sample with trained tokens is kept, grouped by task, with
/// advantage 0: the trainer computes per-token advantages from its critic's values (gae.hpp).
PreparedBatch prepare_batch(const TrainBatch& batch, AdvantageEstimator estimator, double eps = 1e-6,
                            GroupBy group_by = GroupBy::TASK);

/// Mini-batches (one optimizer step each): consecutive groups, `tasks_per_mini_batch` groups
/// each (0 = all groups in one). Returns indices into `batch.sequences`.
std::vector<std::vector<size_t>> split_mini_batches(const PreparedBatch& batch, int64_t tasks_per_mini_batch);

/// The share of a mini-batch one rank computes: sequences dealt longest-first to the rank with
/// the fewest tokens so far, so ranks get about the same work. Every rank computes the same plan.
std::vector<size_t> shard_for_rank(const PreparedBatch& batch, const std::vector<size_t>& mini_batch,
                                   int rank, int world_size);

/// Micro-batches of `seqs` for padded forward passes: sorted longest first, each micro-batch's
/// padded size (rows × longest row) stays within `max_tokens`; a sequence longer than the budget
/// gets a micro-batch of its own. Deterministic.
std::vector<std::vector<size_t>> plan_micro_batches(const PreparedBatch& batch,
                                                    const std::vector<size_t>& seqs, int64_t max_tokens);

/// Micro-batches of `seqs` for packed forward passes (samples end to end in one row, no
/// padding): first-fit decreasing, so each micro-batch's total tokens stay within `max_tokens`;
/// a sequence longer than the budget gets a micro-batch of its own. Deterministic.
std::vector<std::vector<size_t>> plan_packed_micro_batches(const PreparedBatch& batch,
                                                           const std::vector<size_t>& seqs,
                                                           int64_t max_tokens);

/// Learning rate of policy step `step` (0-based): linear warm-up over `warmup_steps`
/// (lr × (step+1)/warmup), then constant or cosine decay to 0 at `total_steps`.
/// Cosine needs total_steps > warmup_steps (INVALID_ARGUMENT otherwise).
double learning_rate_at(double base_lr, const std::string& schedule, int64_t warmup_steps,
                        int64_t total_steps, int64_t step);

}  // namespace swarm
