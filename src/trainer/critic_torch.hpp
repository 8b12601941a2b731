// The PPO critic: a value model trained beside the policy.
//
// A decoder trunk (by default a copy of the policy's own weights at the start, or another model
// directory with the same vocabulary: job key critic_model) and a value head reading its final
// (normed) hidden state: V = w · norm(h) + b, zero at the start, so the first advantages are the
// rewards themselves. The value of the state before token t is read at position t - 1, where the
// policy's logits for token t are (verl's convention). Its parameters are one FlatParameters with
// their own AdamW and learning rate; with several ranks the critic is sharded like the policy.
//
// Loss (verl's compute_value_loss): with V_old the values at rollout time (before this step's
// updates) and R the GAE returns, 0.5 · max((V - R)², (clip(V, V_old ± cliprange) - R)²),
// aggregated as the policy's loss is.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "inference/decoder_model_torch.hpp"
#include "trainer/flat_parameters_torch.hpp"

namespace swarm {

struct ValueLossSums {
  double loss = 0.0;       // the micro-batch's share of the aggregated loss
  double clipped = 0.0;    // tokens whose clipped loss was the larger
  double value_sum = 0.0;  // sum of the predicted values
  double error_sum = 0.0;  // sum of (V - R)²
  double tokens = 0.0;
  void add(const ValueLossSums& o);
};

class Critic {
 public:
  /// `trunk`: the model whose weights the critic's trunk starts from (copied). `comm` shards the
  /// optimizer state like the policy's. `master_values` as PolicyTrainer's (the trunk's; the
  /// value head starts at zero). `fp32_compute`: a bf16
  /// trunk trains in fp32 (as the policy does on a CPU without bf16 dot products): its weights
  /// are the fp32 masters, which the optimizer state then stores; weights() still gives the
  /// trunk's dtype.
  Critic(const DecoderModel& trunk, std::shared_ptr<Collectives> comm,
         const NamedTensors* master_values = nullptr, bool fp32_compute = false,
         const ShardingOptions& sharding = {});
  ~Critic();
  Critic(const Critic&) = delete;
  Critic& operator=(const Critic&) = delete;

  /// Values [N] fp32 at `positions` (indices into the flattened tokens: [N] packed, [B, T]
  /// padded), as DecoderModel::final_hidden reads `tokens` with `how`. Under the caller's grad
  /// mode.
  torch::Tensor values(const TrainingTokens& tokens, const torch::Tensor& positions,
                       const TrainingForward& how);
  /// The same for padded rows `ids` [B, T] / `lengths` [B], with eager attention.
  torch::Tensor values(const torch::Tensor& ids, const torch::Tensor& lengths,
                       const torch::Tensor& positions);
  /// Forward + backward of the clipped value loss of one micro-batch; adds the gradient into the
  /// flat gradient. `weight` [N]: each token's weight in the aggregate divided by `norm`.
  ValueLossSums accumulate_gradients(const TrainingTokens& tokens, const torch::Tensor& positions,
                                     const torch::Tensor& returns, const torch::Tensor& old_values,
                                     const torch::Tensor& weight, double norm, double cliprange,
                                     const TrainingForward& how);
  /// The same for padded rows, with eager attention.
  ValueLossSums accumulate_gradients(const torch::Tensor& ids, const torch::Tensor& lengths,
                                     const torch::Tensor& positions, const torch::Tensor& returns,
                                     const torch::Tensor& old_values, const torch::Tensor& weight,
                                     double norm, double cliprange);
  /// One AdamW step of the critic (returns the gradient norm before clipping).
  double optimizer_step(double lr, const AdamWOptions& o) { return params_->step(lr, o); }
  void zero_gradients() { params_->zero_gradients(); }

  /// The critic's weights by name (trunk names, then value_head.weight / value_head.bias), in
  /// the trunk model's dtype (rounded where the critic computes in fp32).
  std::map<std::string, torch::Tensor> weights() const;
  /// Sets the weights from what weights() returned (a checkpoint); INVALID_ARGUMENT on a
  /// missing or mis-shaped tensor.
  void load_weights(const std::map<std::string, torch::Tensor>& named);
  FlatParameters& parameters() { return *params_; }
  const FlatParameters& parameters() const { return *params_; }

 private:
  static torch::Tensor values_of(const DecoderModel& trunk, const torch::Tensor& head_w,
                                 const torch::Tensor& head_b, const TrainingTokens& tokens,
                                 const torch::Tensor& positions, const TrainingForward& how);

  std::unique_ptr<FlatParameters> params_;
  std::shared_ptr<DecoderModel> trunk_;  // parameters are views into params_
  torch::Tensor head_w_, head_b_;        // leaves: views into params_ ([hidden], [1])
  size_t trunk_params_ = 0;
  torch::ScalarType storage_;  // the trunk model's dtype: what weights() gives
};

}  // namespace swarm
