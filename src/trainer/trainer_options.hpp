// What the policy trainer is told: the optimizer, the loss and the off-policy correction, as a
// job sets them (engine/job_options.hpp converts a Job). No torch.
#pragma once

#include <cstdint>
#include <string>

#include "inference/training_forward.hpp"
#include "trainer/grpo_batch.hpp"

namespace swarm {

/// AdamW's settings for one flat parameter buffer (flat_parameters_torch.hpp).
struct AdamWOptions {
  double weight_decay = 0.01;
  double grad_clip = 1.0;  // max global gradient norm; 0 = no clipping
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

/// How tokens sampled by older weights than the trainer's are corrected (job key
/// off_policy_correction; docs/concepts.md "Asynchronous training").
enum class OffPolicyCorrection {
  NONE,       // PPO ratio against the recomputed old policy; behaviour log-probs only reported
  TIS,        // ... times min(pi_old / pi_behaviour, is_cap) per token (truncated importance sampling)
  DECOUPLED,  // AReaL: clipped around pi_prox (= the recomputed old policy), times pi_prox / pi_behaviour;
              // tokens whose weight exceeds is_cap get weight 0
};
OffPolicyCorrection parse_off_policy_correction(const std::string& name);

// How a model's flat parameters are split over ranks (docs/concepts.md "Memory of a training
// step"): the fp32 master weights and AdamW moments always per rank (ZeRO-1); at stage 2 the fp32
// gradients too, reduce-scattered bucket by bucket while the backward runs.
struct ShardingOptions {
  int zero_stage = 2;  // 1 or 2 (job key zero_stage)
  int64_t bucket_elements = int64_t{16}
                            << 20;  // one gradient bucket, all ranks' pieces (job key reduce_bucket_mb)
};

struct TrainerOptions {
  double learning_rate = 1e-6;
  std::string lr_schedule = "constant";
  int64_t lr_warmup_steps = 0;
  int64_t total_training_steps = 0;
  double weight_decay = 0.01;
  double grad_clip = 1.0;  // max global gradient norm; 0 = no clipping
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  AdvantageEstimator advantage_estimator = AdvantageEstimator::GRPO;
  GroupBy group_by = GroupBy::TASK;
  double clip_ratio_low = 0.2;
  double clip_ratio_high = 0.28;
  LossAggregation loss_aggregation = LossAggregation::TOKEN_MEAN;
  bool use_kl_loss = false;
  double kl_coef = 0.001;
  KlEstimator kl_estimator = KlEstimator::K3;
  int64_t ppo_epochs = 1;
  int64_t ppo_mini_batch_size = 0;  // task groups per optimizer step; 0 = all
  int64_t micro_batch_max_tokens = 8192;
  // PPO (algorithm: ppo, advantage_estimator: GAE): the critic and GAE.
  bool ppo = false;
  double gamma = 1.0;
  double lam = 1.0;
  double critic_learning_rate = 1e-5;
  double cliprange_value = 0.5;
  int64_t critic_warmup = 0;
  OffPolicyCorrection off_policy = OffPolicyCorrection::NONE;
  double is_cap = 2.0;
  // A bf16 model on a CPU without bf16 dot products (kernels/cpu/widening_linear_torch.hpp)
  // trains in fp32: its weights are the fp32 masters themselves, its activations fp32, and the
  // serving model stays bf16 (weight sync rounds). Every matmul there is an fp32 GEMM either
  // way; bf16 compute only added the widening and roundings (0.78-0.90x fp32's step on a 2-core
  // AVX2 EPYC). false keeps bf16 compute (tests of that path).
  bool fp32_compute_without_bf16_dot = true;
  // The training forward (docs/concepts.md "Memory"): attention, and per-layer activation
  // checkpointing (job keys training_attention, gradient_checkpointing).
  TrainingForward forward;
  // Samples packed end to end into one row per micro-batch of at most micro_batch_max_tokens
  // tokens (no padding; attention stays within each sample), or right-padded rows (false).
  bool sequence_packing = true;
  ShardingOptions sharding;
  // One weight copy (synchronous training): the serving model becomes views of the trainer's flat
  // weights (laid out in DecoderModel::merged_order) when their dtypes agree, and the weight sync
  // a version bump. The caller must keep generation off the weights while a step runs (the torch
  // backend pauses its serving engine); false keeps a serving copy that only the sync writes.
  bool share_serving_weights = false;

  AdamWOptions adamw() const { return {weight_decay, grad_clip, adam_beta1, adam_beta2, adam_eps}; }
};

}  // namespace swarm
