// The parameters of one trained model as one flat buffer with its AdamW state (docs/design.md), shared
// by the policy and the PPO critic.
//
// Every parameter lives in one flat buffer in the compute dtype (`weights`); a model built on
// view(i) sees its parameters as leaves, and the optimizer updates them with one pass over a flat
// vector. fp32 master weights and the AdamW moments are kept for this rank's shard of that vector
// only (the whole vector on one rank). The flat vector is cut into buckets of `piece` elements
// per rank; rank r owns the r-th piece of every bucket (one bucket at ZeRO stage 1: each rank a
// contiguous shard). Gradients reach the buffers through gradient_sinks(): at stage 1 (and on one
// rank) they are summed into a full fp32 buffer over micro-batches and reduce-scattered at the
// step; at stage 2 each bucket is reduce-scattered into this rank's fp32 shard as soon as the
// backward has produced all of it, so no rank holds a full fp32 gradient. The step clips by the
// global norm, applies AdamW to the shard, and all-gathers the updated pieces back into `weights`
// (in fp32 on one rank the master weights *are* `weights`).
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
  /// `order`: the parameter indices in the order they lie in the flat buffer (a permutation;
  /// empty: their own order). DecoderModel::merged_order() puts each layer's q/k/v and gate/up
  /// side by side, so the serving model's merged projections can be views of the buffer.
  FlatParameters(const std::vector<std::pair<std::string, torch::Tensor>>& initial, torch::ScalarType compute,
                 torch::Device device, std::shared_ptr<Collectives> comm,
                 const std::vector<std::pair<std::string, torch::Tensor>>* master_init = nullptr,
                 const ShardingOptions& sharding = {}, std::vector<size_t> order = {});

  size_t size() const noexcept { return names_.size(); }
  const std::string& name(size_t i) const { return names_[i]; }
  /// Parameter i as a view into the flat weights (its shape; no autograd flags).
  torch::Tensor view(size_t i) const;
  /// Views of every parameter, as autograd leaves (for DecoderModel::with_parameters).
  std::vector<torch::Tensor> leaves() const;
  /// `leaves` (this object's leaves() or views of them, in order) passed through an identity whose
  /// backward hands each parameter's gradient to accumulate() instead of the leaf's .grad: build
  /// the model a micro-batch trains on from these, and call finish_micro_batch() after its
  /// backward. The leaves then never hold a gradient.
  std::vector<torch::Tensor> gradient_sinks(const std::vector<torch::Tensor>& leaves);
  /// Adds `grad` (parameter i's gradient in the current micro-batch, any float dtype): into the
  /// flat fp32 gradient, or (stage 2 on several ranks) kept until every parameter of its bucket
  /// has arrived, then reduce-scattered into this rank's shard.
  void accumulate(size_t i, const torch::Tensor& grad);
  /// Ends a micro-batch's gradients: stage 2 on several ranks reduce-scatters every bucket not
  /// yet sent (a parameter that got no gradient counts as 0). Every rank must finish the same
  /// number of micro-batches per step (an empty one: finish_micro_batch() alone).
  void finish_micro_batch();
  /// Whether gradients cross ranks during the backward (stage 2 on several ranks): the ranks
  /// must then run the same number of micro-batches per optimizer step.
  bool reduces_in_backward() const noexcept { return zero2_; }
  void zero_gradients();
  /// Parameter i's accumulated gradient (a view, fp32). Not at stage 2 on several ranks, where
  /// no rank holds it (CONFLICT).
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
  /// Elements per rank per bucket (the shard is `buckets` of them): shards_in_flat_order's
  /// `piece`, and the 4th number of the state's layout.
  int64_t piece() const noexcept { return piece_; }
  const Collectives& collectives() const noexcept { return *comm_; }
  /// Bytes this rank holds: the compute-dtype weights, the fp32 gradient buffers (the full
  /// buffer, or at stage 2 the shard and one bucket), the AdamW moments of its shard, and its
  /// fp32 master shard (0 where it is the weights themselves).
  struct Memory {
    int64_t weights = 0, gradients = 0, optimizer = 0, master = 0;
  };
  Memory memory() const;
  /// A 1-element tensor on the flat buffers' device (for flags exchanged between ranks).
  torch::TensorOptions grad_options() const { return grad_.options(); }

  /// This rank's optimizer state (master shard, moments, step counter, layout: parameters, world
  /// size, rank, piece; and the flat order when it is not the parameters' own) as named tensors.
  std::map<std::string, torch::Tensor> state() const;
  /// Restores what state() returned (same world size and parameters); also refreshes the
  /// compute-dtype weights from the master shard. State saved with another piece size (ZeRO
  /// stage, bucket size) or flat order is re-cut: every rank's shards gathered, put in this
  /// layout, and each rank keeps its own pieces (a collective: every rank calls it).
  /// INVALID_ARGUMENT naming `what` on a mismatch of parameters, world size or rank.
  void load_state(const std::map<std::string, torch::Tensor>& state, const std::string& what);

 private:
  void refresh_weights_from_master();
  // Calls fn(flat offset, shard offset, length) for each piece this rank owns, in order.
  template <typename Fn>
  void for_each_owned(Fn&& fn) const;
  void send_bucket(int64_t k);

  std::shared_ptr<Collectives> comm_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_;  // per parameter, into the flat buffers
  std::vector<size_t> order_;     // the parameters in flat order (empty: their own order)
  int64_t numel_ = 0;
  int64_t piece_ = 0;      // elements per rank per bucket
  int64_t buckets_ = 1;    // buckets in the flat vector (padded to buckets_ × piece_ × world)
  int64_t shard_ = 0;      // elements per rank: buckets_ × piece_
  bool zero2_ = false;     // gradients reduce-scattered in the backward (stage 2, world > 1)
  torch::Tensor weights_;  // [shard_ × world] compute dtype
  torch::Tensor grad_;     // [shard_ × world] fp32; [shard_] at stage 2
  // Stage 2: this micro-batch's gradients not yet sent, by parameter; how many parameters each
  // bucket still waits for; the next bucket to send (buckets go last to first, the backward's order).
  std::vector<torch::Tensor> pending_;
  std::vector<int64_t> waiting_;
  std::vector<char> arrived_;
  int64_t next_bucket_ = -1;
  bool started_ = false;                // a micro-batch's gradients are arriving
  torch::Tensor bucket_, received_;     // [piece_ × world], [piece_] fp32
  torch::Tensor master_;                // [shard_] fp32 (aliases weights_ in fp32 on one rank)
  bool master_in_state_ = false;        // state() stores master_ even where it aliases weights_
  torch::Tensor exp_avg_, exp_avg_sq_;  // [shard_] fp32
  int64_t adam_steps_ = 0;
};

/// The flat vector from every rank's shard (state()'s master or moments, rank order) of a layout
/// with `piece` elements per rank per bucket (the layout's 4th number; a 3-number layout is one
/// bucket: piece = the shard's size).
torch::Tensor shards_in_flat_order(const std::vector<torch::Tensor>& shards, int64_t piece);

}  // namespace swarm
