// The GRPO trainer: policy updates of a DecoderModel from collected episodes (docs/design.md), and
// PPO's with a critic (algorithm: ppo, critic_torch.hpp).
//
// The trained parameters are one FlatParameters (flat_parameters_torch.hpp): a flat buffer in
// the compute dtype that the training model's parameters are views of, fp32 master weights and
// AdamW moments for this rank's shard.
//
// The serving model keeps its own parameter tensors: weight sync copies the trained weights into
// them while the serving engine is paused between steps (the caller's `exclusive` runner), so the
// engine never samples from half-updated weights and no file is written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include <torch/types.h>

#include "dist/collectives_torch.hpp"
#include "trainer/critic_torch.hpp"
#include "trainer/flat_parameters_torch.hpp"
#include "trainer/grpo_batch.hpp"
#include "trainer/trainer_options.hpp"

namespace swarm {

class DecoderModel;

/// The per-token KL penalty of the policy's log-probs against the reference's (job key
/// kl_estimator): k1 = lp - ref; k3 = exp(d) - d - 1 with d = ref - lp clamped to
/// ±kKlLogRatioBound and the value to ±kKlValueBound, so it never overflows (docs/concepts.md).
inline constexpr double kKlLogRatioBound = 20.0, kKlValueBound = 10.0;
torch::Tensor kl_penalty(const torch::Tensor& logprobs, const torch::Tensor& ref_logprobs,
                         KlEstimator estimator);

/// What one micro-batch's loss pass computed (sums over its tokens, for the step's metrics).
struct LossSums {
  double loss = 0.0;          // the micro-batch's share of the aggregated loss (what backward saw)
  double pg_loss = 0.0;       // same, policy-gradient part only
  double kl = 0.0;            // sum over tokens of the KL estimate (0 without KL loss)
  double entropy = 0.0;       // sum over tokens of the policy entropy
  double clipped_low = 0.0;   // tokens clipped at 1 - clip_ratio_low (negative advantage)
  double clipped_high = 0.0;  // tokens clipped at 1 + clip_ratio_high (positive advantage)
  double mismatch_sum = 0.0;  // sum |trainer old log-prob - rollout log-prob|
  double mismatch_max = 0.0;
  double is_weight_sum = 0.0;  // applied importance weights (tis / decoupled; 1 per token otherwise)
  double is_ratio_sum = 0.0;   // pi_old / pi_behaviour per token, whether applied or not
  double is_ratio_max = 0.0;
  double is_capped = 0.0;  // tokens whose ratio exceeds is_cap (truncated or left out when applied)
  double tokens = 0.0;
  double sequence_tokens = 0.0;  // every token of the micro-batch's sequences (prompt and response)
  double slots = 0.0;            // token positions computed: sequence_tokens + padding
  void add(const LossSums& o);
};

/// The tensors of the checkpoint in `dir` in `model`'s parameter order (a tied embedding stored
/// as lm_head.weight found under either name), zero-copy over the file mapping, in the files'
/// dtype, on the CPU: the trainer's master values without loading a full fp32 model.
/// INVALID_ARGUMENT on a missing or mis-shaped tensor.
NamedTensors checkpoint_tensors(const std::filesystem::path& dir, const DecoderModel& model);

/// Thread-compatible: one thread (the engine's control thread) drives it.
class PolicyTrainer {
 public:
  /// Runs `fn` while nothing generates with the serving model's weights (the serving engine's
  /// run_exclusive), or inline when there is no engine.
  using ExclusiveRunner = std::function<void(const std::function<void()>&)>;

  /// Trains the weights of `serving_model`, which keeps serving (its parameters are only written
  /// during sync). `master_values`, when given, supplies the initial master weights in the
  /// serving model's parameter order (the checkpoint's own tensors, e.g. zero-copy over its
  /// files: checkpoint_tensors; so bf16 training does not start from rounded weights, and no
  /// full fp32 copy is made: each rank widens its shard). `comm` defaults to a single process.
  /// With options.ppo a critic is made from `critic_source` (job key critic_model; its master
  /// weights from `critic_master` as for the policy), or from the serving model's weights
  /// (and `master_values`) when null.
  /// With options.use_kl_loss the frozen KL reference is `reference_source`'s weights (the job's
  /// initial model, which a resumed run loads again: the checkpoint holds trained weights and no
  /// reference), in the training dtype; when null, the initial trained weights themselves.
  PolicyTrainer(std::shared_ptr<DecoderModel> serving_model, TrainerOptions options,
                std::shared_ptr<Collectives> comm = nullptr, const NamedTensors* master_values = nullptr,
                const DecoderModel* critic_source = nullptr, const NamedTensors* critic_master = nullptr,
                const DecoderModel* reference_source = nullptr);
  ~PolicyTrainer();
  PolicyTrainer(const PolicyTrainer&) = delete;
  PolicyTrainer& operator=(const PolicyTrainer&) = delete;

  /// One policy step on `batch` (policy step `step`, 1-based): advantages, old log-probs,
  /// `ppo_epochs` × mini-batches of optimizer steps over token-budgeted micro-batches, then
  /// weight sync into the serving model through `exclusive`. Returns the step's metrics
  /// (loss, clip fractions, KL, entropy, grad norm, lr, log-prob mismatch, time split, ...).
  /// A batch without signal (every group zero-variance) skips the optimizer but still counts.
  std::map<std::string, double> train(const TrainBatch& batch, int64_t step, const ExclusiveRunner& exclusive,
                                      std::stop_token stop = {});

  // ---- lower-level pieces (parity tests and benchmarks)

  /// The trainer's log-prob of every trained token of `seq_indices` (one 1-D fp32 tensor per
  /// sequence, positions 1.. with loss mask 1, in order), without gradients.
  std::vector<torch::Tensor> token_logprobs(const PreparedBatch& batch,
                                            const std::vector<size_t>& seq_indices);
  /// Forward + backward of one micro-batch: adds its gradient into the flat gradient buffer.
  /// `old_logprobs` (per sequence of `micro`, as token_logprobs returns; empty = use the current
  /// log-probs, detached: the on-policy case) and `norm` (the mini-batch's token count for
  /// token-mean, sequence count for seq-mean-token-mean) as the update uses them.
  LossSums accumulate_gradients(const PreparedBatch& batch, const std::vector<size_t>& micro,
                                const std::vector<torch::Tensor>& old_logprobs, double norm);
  /// Zeroes the flat gradient buffer.
  void zero_gradients();
  /// The accumulated gradient of every parameter, by Hugging Face name (fp32 copies).
  std::map<std::string, torch::Tensor> gradients() const;
  /// Reduce-scatter, clip, AdamW on this rank's shard at learning rate `lr`, all-gather back.
  /// Returns the global gradient norm before clipping.
  double optimizer_step(double lr);
  /// The current trained weights by name (views into the flat buffer, compute dtype).
  std::map<std::string, torch::Tensor> weights() const;
  /// Copies the trained weights into the serving model (the weight sync; with shared weights
  /// only the exclusive section, where the version changes); returns its seconds.
  double sync_to_serving(const ExclusiveRunner& exclusive);
  /// The model generation should run on: the one given to the constructor, or (shared weights)
  /// a model over the trainer's own weights that replaces it.
  const std::shared_ptr<DecoderModel>& serving_model() const noexcept { return serving_; }
  /// Whether serving_model() reads the trainer's weights (options.share_serving_weights and the
  /// same dtype): they change during a step, so nothing may generate then.
  bool shares_serving_weights() const noexcept { return shares_serving_weights_; }

  /// GAE over every sequence of `batch` this rank trains (the union of its shards of the
  /// mini-batches): the critic's values, rewards placed where they were earned, advantages
  /// whitened over the whole batch (all ranks). Fills each sequence's token_advantage and
  /// advantage (its mean) and returns per sequence the returns and old values of its trained
  /// tokens (empty tensors for sequences of other ranks).
  struct GaeTargets {
    std::vector<torch::Tensor> returns, old_values;  // per sequence: [trained tokens] fp32
  };
  GaeTargets compute_advantages(PreparedBatch& batch);

  /// The critic (null unless options.ppo).
  Critic* critic() noexcept { return critic_.get(); }
  const Critic* critic() const noexcept { return critic_.get(); }

  // ---- state (checkpoints)
  int64_t optimizer_steps() const noexcept { return policy_->steps(); }
  int64_t parameter_count() const noexcept { return policy_->numel(); }
  /// What this rank's trainer holds, policy and critic together; the frozen KL reference
  /// counts as weights.
  FlatParameters::Memory memory() const;
  /// The most tensor memory the last train() held above what it started with (activations, their
  /// gradients, temporaries; allocation_tracker_torch.hpp), or -1 where the device is not tracked.
  int64_t activations_peak_bytes() const noexcept { return activations_peak_bytes_; }
  /// This rank's optimizer state (master shard, moments, step counter) as named fp32 tensors.
  std::map<std::string, torch::Tensor> optimizer_state() const;
  /// Restores what optimizer_state returned (same world size and model); also refreshes the
  /// compute-dtype weights from the master shard. INVALID_ARGUMENT on a mismatch.
  void load_optimizer_state(const std::map<std::string, torch::Tensor>& state);

  const TrainerOptions& options() const noexcept { return options_; }
  Collectives& collectives() noexcept { return *comm_; }
  const Collectives& collectives() const noexcept { return *comm_; }

 private:
  struct MicroBatchInputs;
  MicroBatchInputs build_inputs(const PreparedBatch& batch, const std::vector<size_t>& micro) const;
  /// The micro-batches of `seqs`: packed (options.sequence_packing) or padded.
  std::vector<std::vector<size_t>> plan(const PreparedBatch& batch, const std::vector<size_t>& seqs) const;
  torch::Tensor selected_logprobs(const DecoderModel& model, const MicroBatchInputs& in,
                                  torch::Tensor* entropy);
  void refresh_weights_from_master();
  /// True when `stop` was requested on any rank (a collective: every rank must call it).
  bool stop_requested_anywhere(const std::stop_token& stop);

  std::shared_ptr<DecoderModel> serving_;
  bool shares_serving_weights_ = false;
  std::shared_ptr<DecoderModel> train_model_;  // parameters are views into policy_
  std::shared_ptr<DecoderModel> ref_model_;    // frozen initial weights (KL loss only)
  TrainerOptions options_;
  std::shared_ptr<Collectives> comm_;
  std::unique_ptr<FlatParameters> policy_;
  std::vector<torch::Tensor> ref_weights_;  // the initial model's weights (KL loss only)
  std::unique_ptr<Critic> critic_;
  int64_t activations_peak_bytes_ = -1;
};

}  // namespace swarm
