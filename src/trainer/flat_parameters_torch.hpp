// The parameters of one trained model as one flat buffer with its AdamW state (docs/design.md), shared
// by the policy and the PPO critic.
//
// Every parameter lives in one flat buffer in the compute dtype (`weights`); a model built on
// view(i) sees its parameters as leaves, and the optimizer updates them with one pass over a flat
// vector. fp32 master weights and the AdamW moments are kept for this rank's shard of that vector
// only (the whole vector on one rank); gradients are accumulated into a flat fp32 buffer over
// micro-batches, reduce-scattered to the shards, clipped by the global norm, applied, and the
// updated shards all-gathered back into `weights` (in fp32 on one rank the master weights *are*
// `weights`).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "dist/collectives_torch.hpp"
#include "trainer/trainer_options.hpp"

namespace swarm {

/// Parameters by name, in a model's order.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class FlatParameters {
 public:
  /// `initial`: the parameters (name, value) in order; their values are copied in, converted to
  /// `compute` on `device`. `master_init`, when given, supplies the master values (same names
  /// and sizes, any float dtype and device: the checkpoint's own tensors, so bf16 training does
  /// not start from rounded weights); only this rank's shard of them is read, widened to fp32
  /// slice by slice.
  FlatParameters(const std::vector<std::pair<std::string, torch::Tensor>>& initial, torch::ScalarType compute,
                 torch::Device device, std::shared_ptr<Collectives> comm,
                 const std::vector<std::pair<std::string, torch::Tensor>>* master_init = nullptr);

  size_t size() const noexcept { return names_.size(); }
  const std::string& name(size_t i) const { return names_[i]; }
  /// Parameter i as a view into the flat weights (its shape; no autograd flags).
  torch::Tensor view(size_t i) const;
  /// Views of every parameter, as autograd leaves (for DecoderModel::with_parameters).
  std::vector<torch::Tensor> leaves() const;
  /// Adds `grad` (parameter i's gradient, any float dtype) into the flat fp32 gradient.
  void accumulate(size_t i, const torch::Tensor& grad);
  void zero_gradients();
  /// Parameter i's accumulated gradient (a view, fp32).
  torch::Tensor gradient(size_t i) const;

  /// Reduce-scatter, clip, AdamW on this rank's shard at learning rate `lr`, all-gather back.
  /// Returns the global gradient norm before clipping (a non-finite norm skips the update).
  double step(double lr, const AdamWOptions& o);

  int64_t steps() const noexcept { return adam_steps_; }
  /// state() stores the master weights (and load_state expects them) even where they are the
  /// weights themselves (fp32 on one rank): for fp32 training of a bf16 model, whose checkpointed
  /// model files hold the weights rounded to bf16.
  void set_master_in_state(bool on) noexcept { master_in_state_ = on; }
  int64_t numel() const noexcept { return numel_; }
  const Collectives& collectives() const noexcept { return *comm_; }
  /// Bytes this rank holds: the compute-dtype weights, the fp32 gradient buffer, the AdamW
  /// moments of its shard, and its fp32 master shard (0 where it is the weights themselves).
  struct Memory {
    int64_t weights = 0, gradients = 0, optimizer = 0, master = 0;
  };
  Memory memory() const;
  /// A 1-element tensor on the flat buffers' device (for flags exchanged between ranks).
  torch::TensorOptions grad_options() const { return grad_.options(); }

  /// This rank's optimizer state (master shard, moments, step counter, layout) as named tensors.
  std::map<std::string, torch::Tensor> state() const;
  /// Restores what state() returned (same world size and parameters); also refreshes the
  /// compute-dtype weights from the master shard. INVALID_ARGUMENT naming `what` on a mismatch.
  void load_state(const std::map<std::string, torch::Tensor>& state, const std::string& what);

 private:
  void refresh_weights_from_master();

  std::shared_ptr<Collectives> comm_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_;  // per parameter, into the flat buffers
  int64_t numel_ = 0;
  int64_t shard_ = 0;                   // elements per rank (flat buffers are padded to shard_ × world)
  torch::Tensor weights_;               // [shard_ × world] compute dtype
  torch::Tensor grad_;                  // [shard_ × world] fp32
  torch::Tensor master_;                // [shard_] fp32 (aliases weights_ in fp32 on one rank)
  bool master_in_state_ = false;        // state() stores master_ even where it aliases weights_
  torch::Tensor exp_avg_, exp_avg_sq_;  // [shard_] fp32
  int64_t adam_steps_ = 0;
};

}  // namespace swarm
