#include "trainer/policy_trainer_torch.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>

#include <malloc.h>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/error.hpp"
#include "inference/decoder_model_torch.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"
#include "model/safetensors_torch.hpp"
#include "trainer/allocation_tracker_torch.hpp"
#include "trainer/gae.hpp"
#include "swarm/job.hpp"

namespace swarm {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rows of the [N, vocab] fp32 work of the LM head handled at a time: 64 x 49152 x 4 B = 12 MiB,
// small enough to stay in the malloc heap and mostly in cache.
constexpr int64_t kHeadChunkRows = 64;
// Every step allocates and frees the same large temporaries (activations, their gradients, the
// LM head's work). glibc serves blocks above its mmap threshold (32 MiB at most) with fresh
// mappings and unmaps them on free, so each step first-touches gigabytes of new pages (measured:
// 350-450k minor faults, 3-4.5 s of kernel time per step). Keeping every block in the heap lets
// the next step reuse the same memory. The end of a backward pass frees more than the 1 GiB
// trim threshold of tune_memory_allocator at once (the saved activations), which would hand the
// top of the heap back and fault it in again next step, so the trainer turns trimming off
// (-1, mallopt(3)): the next step needs the same memory. Process-wide and idempotent.
void tune_allocator_for_training() {
  tune_memory_allocator();
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);
  });
}

// One chunk of rows of the logits in fp32, divided by each row's sampling temperature when the
// rows have one (`temperature` [N] fp32, undefined = all 1): x / t, as the sampler computes it
// (src/inference/sampler_torch.hpp), so the trainer's log-probs are the recorded ones' definition.
torch::Tensor scaled_chunk(const torch::Tensor& logits, const torch::Tensor& temperature, int64_t r,
                           int64_t c) {
  torch::Tensor x = logits.narrow(0, r, c).to(torch::kFloat);
  if (temperature.defined()) x = x / temperature.narrow(0, r, c).unsqueeze(1);
  return x;
}

// log_softmax(logits / T)[target] and, optionally, the entropy of that softmax, for every row of
// `logits` [N, vocab] (compute dtype), `kHeadChunkRows` rows at a time: the fp32 log-softmax
// never exists for all rows at once. Per row the same ops as on the whole matrix.
torch::Tensor chunked_selected_logprobs(const torch::Tensor& logits, const torch::Tensor& targets,
                                        const torch::Tensor& temperature, torch::Tensor* entropy) {
  const int64_t n = logits.size(0);
  torch::Tensor lp = torch::empty({n}, logits.options().dtype(torch::kFloat));
  if (entropy != nullptr) *entropy = torch::empty({n}, lp.options());
  for (int64_t r = 0; r < n; r += kHeadChunkRows) {
    const int64_t c = std::min(kHeadChunkRows, n - r);
    const torch::Tensor logp = torch::log_softmax(scaled_chunk(logits, temperature, r, c), -1);
    lp.narrow(0, r, c).copy_(logp.gather(1, targets.narrow(0, r, c).unsqueeze(1)).squeeze(1));
    if (entropy != nullptr) entropy->narrow(0, r, c).copy_(-(logp.exp() * logp).sum(-1));
  }
  return lp;
}

// The trained tokens' log-probs from the final-normed hidden states x [N, H] and the LM head
// weight w [vocab, H], with an exact backward that never holds [N, vocab] fp32 tensors: the
// forward keeps the logits (compute dtype) and the backward recomputes each chunk's
// log-softmax from them. The gradient of the logits is, per element, what autograd computes
// for division by T, log_softmax and gather ((g·1[target] - exp(logp)·g) / T, then cast to the
// compute dtype), and the two GEMMs are linear's backward on the whole matrix, so results match
// the unchunked graph. `temperature` [N] fp32 (undefined = all 1) is not differentiated.
// Outputs: log-probs [N] fp32, entropy [N] fp32 (not differentiable).
// Each row's sampling temperature for ChunkedHeadLogprobs ([N] fp32, or undefined when all are
// 1), passed as a plain argument: an autograd input must be a defined tensor.
struct RowTemperatures {
  torch::Tensor t;
};

struct ChunkedHeadLogprobs : public torch::autograd::Function<ChunkedHeadLogprobs> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& w, const torch::Tensor& targets,
                                                const RowTemperatures& rows) {
    const torch::Tensor& temperature = rows.t;
    const torch::Tensor logits = model_linear(x, w);  // [N, vocab], compute dtype
    torch::Tensor entropy;
    const torch::Tensor lp = chunked_selected_logprobs(logits, targets, temperature, &entropy);
    ctx->save_for_backward({x, w});
    ctx->saved_data["logits"] = logits;
    ctx->saved_data["targets"] = targets;
    ctx->saved_data["temperature"] = temperature;
    ctx->mark_non_differentiable({entropy});
    return {lp, entropy};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor logits = ctx->saved_data["logits"].toTensor();
    const torch::Tensor targets = ctx->saved_data["targets"].toTensor();
    const c10::IValue saved_temperature = ctx->saved_data["temperature"];
    const torch::Tensor temperature =
        saved_temperature.isTensor() ? saved_temperature.toTensor() : torch::Tensor();
    const int64_t n = logits.size(0);
    torch::Tensor g = grads[0];
    if (!g.defined()) g = torch::zeros({n}, logits.options().dtype(torch::kFloat));
    g = g.to(torch::kFloat).contiguous();
    torch::Tensor glogits = torch::empty_like(logits);  // compute dtype, as linear's output
    for (int64_t r = 0; r < n; r += kHeadChunkRows) {
      const int64_t c = std::min(kHeadChunkRows, n - r);
      const torch::Tensor gc = g.narrow(0, r, c).unsqueeze(1);
      const torch::Tensor logp = torch::log_softmax(scaled_chunk(logits, temperature, r, c), -1);
      torch::Tensor d = logp.exp_().mul_(-gc);                                      // -exp(logp)·g
      d.scatter_add_(1, targets.narrow(0, r, c).unsqueeze(1), gc);                  // + g at the target
      if (temperature.defined()) d.div_(temperature.narrow(0, r, c).unsqueeze(1));  // d(x / t) / dx
      glogits.narrow(0, r, c).copy_(d);
    }
    // linear(x, w) = mm(x, wᵀ); mm's backward for a row-major x and a column-major wᵀ:
    // dx = dl·w, dw = dlᵀ·x.
    torch::Tensor dx, dw;
    if (x.requires_grad()) dx = linear_grad_input(glogits, w);
    if (w.requires_grad()) dw = linear_grad_weight(glogits, x);
    return {dx, dw, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

NamedTensors checkpoint_tensors(const std::filesystem::path& dir, const DecoderModel& model) {
  const std::map<std::string, torch::Tensor> state = load_state_dict(SafetensorsModel::open(dir));
  NamedTensors out;
  for (const auto& [name, p] : model.parameters()) {
    auto it = state.find(name);
    if (it == state.end() && name == "model.embed_tokens.weight" && model.config().tie_word_embeddings)
      it = state.find("lm_head.weight");
    SWARM_REQUIRE(it != state.end(), ErrorKind::INVALID_ARGUMENT,
                  "checkpoint '" + dir.string() + "' has no tensor '" + name + "'");
    SWARM_REQUIRE(it->second.sizes() == p.sizes() && it->second.is_floating_point(),
                  ErrorKind::INVALID_ARGUMENT,
                  "checkpoint '" + dir.string() + "': tensor '" + name + "' does not match the model");
    out.emplace_back(name, it->second);
  }
  return out;
}

torch::Tensor kl_penalty(const torch::Tensor& logprobs, const torch::Tensor& ref_logprobs,
                         KlEstimator estimator) {
  if (estimator == KlEstimator::K1) return logprobs - ref_logprobs;
  // k3 = exp(d) - d - 1 with d = ref - lp overflows for a token the reference likes and the
  // policy no longer does (d = 100: e^100); bounded as verl's low_var_kl: d to ±20, k3 to ±10
  // (the gradient is zero beyond either bound).
  const torch::Tensor d = torch::clamp(ref_logprobs - logprobs, -kKlLogRatioBound, kKlLogRatioBound);
  return torch::clamp(torch::exp(d) - d - 1.0, -kKlValueBound, kKlValueBound);
}

void LossSums::add(const LossSums& o) {
  loss += o.loss;
  pg_loss += o.pg_loss;
  kl += o.kl;
  entropy += o.entropy;
  clipped_low += o.clipped_low;
  clipped_high += o.clipped_high;
  mismatch_sum += o.mismatch_sum;
  mismatch_max = std::max(mismatch_max, o.mismatch_max);
  is_weight_sum += o.is_weight_sum;
  is_ratio_sum += o.is_ratio_sum;
  is_ratio_max = std::max(is_ratio_max, o.is_ratio_max);
  is_capped += o.is_capped;
  tokens += o.tokens;
  sequence_tokens += o.sequence_tokens;
  slots += o.slots;
}

// The tensors of one micro-batch (packed into one row, or right-padded rows), and where its
// trained tokens are.
struct PolicyTrainer::MicroBatchInputs {
  TrainingTokens tokens;  // ids [N] packed or [B, T] padded (0 in the padding)
  torch::Tensor
      positions;          // [N] int64: the flattened position whose logits predict each trained token (t - 1)
  torch::Tensor targets;  // [N] int64: the trained tokens
  torch::Tensor advantage;      // [N] fp32
  torch::Tensor rollout;        // [N] fp32: log-probs at sampling time
  torch::Tensor weight;         // [N] fp32: 1 (token-mean) or 1/tokens of its sequence (seq-mean-token-mean)
  torch::Tensor temperature;    // [N] fp32: each token's sampling temperature; undefined when all are 1
  std::vector<int64_t> counts;  // trained tokens per sequence
  int64_t tokens_real = 0;      // real tokens
  int64_t slots = 0;            // token slots computed (real + padding)
};

PolicyTrainer::PolicyTrainer(std::shared_ptr<DecoderModel> serving_model, TrainerOptions options,
                             std::shared_ptr<Collectives> comm, const NamedTensors* master_values,
                             const DecoderModel* critic_source, const NamedTensors* critic_master,
                             const DecoderModel* reference_source)
    : serving_(std::move(serving_model)), options_(std::move(options)), comm_(std::move(comm)) {
  SWARM_CHECK(serving_ != nullptr, "PolicyTrainer needs a model");
  if (!comm_) comm_ = make_single_process_collectives();
  SWARM_REQUIRE(options_.micro_batch_max_tokens >= 1 && options_.ppo_epochs >= 1, ErrorKind::INVALID_ARGUMENT,
                "micro_batch_max_tokens and ppo_epochs must be >= 1");
  SWARM_REQUIRE(options_.ppo == (options_.advantage_estimator == AdvantageEstimator::GAE),
                ErrorKind::INVALID_ARGUMENT,
                "PPO trains with advantage_estimator gae, and gae needs PPO's critic");
  tune_allocator_for_training();
  if (serving_->device().is_cpu()) track_cpu_allocations();  // activations_peak_bytes
  torch::NoGradGuard no_grad;
  SWARM_REQUIRE(master_values == nullptr || master_values->size() == serving_->parameters().size(),
                ErrorKind::INVALID_ARGUMENT, "the master weights have a different parameter list");
  // The training dtype: a model's own, except bf16 on a CPU whose bf16 matmuls widen to fp32
  // anyway (TrainerOptions::fp32_compute_without_bf16_dot); the same rule for the critic.
  const auto trains_in_fp32 = [&](const DecoderModel& m) {
    return options_.fp32_compute_without_bf16_dot && m.scalar_type() == torch::kBFloat16 &&
           m.device().is_cpu() && bf16_matmul_widens();
  };
  const bool fp32_compute = trains_in_fp32(*serving_);
  const torch::ScalarType compute = fp32_compute ? torch::kFloat : serving_->scalar_type();
  const std::optional<DType> model_dtype = fp32_compute ? std::optional<DType>(DType::F32) : std::nullopt;
  if (fp32_compute)
    spdlog::info(
        "trainer: bf16 model trained in fp32 (fp32 weights = masters, fp32 activations; serving stays bf16): "
        "this CPU has no bf16 dot products, so bf16 matmuls would widen to fp32 GEMMs anyway");
  spdlog::info("trainer: {} rows, {} attention, activation checkpointing {}",
               options_.sequence_packing ? "packed" : "padded",
               training_attention_name(options_.forward.attention),
               options_.forward.checkpoint_layers ? "on" : "off");
  // One weight copy: the flat buffer laid out so that each layer's merged projections are
  // contiguous, and the serving model rebuilt over views of it (the loaded one is then dropped).
  const bool share = options_.share_serving_weights && compute == serving_->scalar_type();
  if (options_.share_serving_weights && !share)
    spdlog::info(
        "trainer: the serving engine keeps its own weights: it serves {} and the trainer computes in {}",
        c10::toString(serving_->scalar_type()), c10::toString(compute));
  policy_ = std::make_unique<FlatParameters>(serving_->parameters(), compute, serving_->device(), comm_,
                                             master_values, options_.sharding,
                                             share ? serving_->merged_order() : std::vector<size_t>{});
  policy_->set_master_in_state(fp32_compute);  // the checkpoint's model files hold them rounded
  if (share) {
    std::vector<torch::Tensor> views;
    for (size_t i = 0; i < policy_->size(); ++i) views.push_back(policy_->view(i));
    serving_ = serving_->with_serving_parameters(std::move(views));
    shares_serving_weights_ = true;
    spdlog::info(
        "trainer: one weight copy: the serving engine reads the trainer's weights (the weight sync is a "
        "version change)");
  }
  train_model_ = serving_->with_parameters(policy_->leaves(), model_dtype);
  if (options_.use_kl_loss) {
    if (reference_source != nullptr) {
      const auto& theirs = reference_source->parameters();
      const auto& ours = serving_->parameters();
      SWARM_REQUIRE(theirs.size() == ours.size(), ErrorKind::INVALID_ARGUMENT,
                    "the KL reference model has " + std::to_string(theirs.size()) +
                        " parameters, the trained model " + std::to_string(ours.size()));
      for (size_t i = 0; i < ours.size(); ++i) {
        SWARM_REQUIRE(theirs[i].first == ours[i].first && theirs[i].second.sizes() == ours[i].second.sizes(),
                      ErrorKind::INVALID_ARGUMENT,
                      "the KL reference model's parameter " + theirs[i].first +
                          " does not match the trained model's " + ours[i].first);
        ref_weights_.push_back(theirs[i].second.to(serving_->device(), compute, false, /*copy=*/true));
      }
    } else {
      for (size_t i = 0; i < policy_->size(); ++i) ref_weights_.push_back(policy_->view(i).clone());
    }
    ref_model_ = serving_->with_parameters(ref_weights_, model_dtype);
  }
  if (options_.ppo) {
    const DecoderModel& trunk = critic_source != nullptr ? *critic_source : *serving_;
    if (critic_source != nullptr)
      SWARM_REQUIRE(critic_source->config().vocab_size == serving_->config().vocab_size &&
                        critic_source->device() == serving_->device(),
                    ErrorKind::INVALID_ARGUMENT,
                    "critic_model must have the policy's vocabulary (vocab_size " +
                        std::to_string(serving_->config().vocab_size) + ") and run on its device");
    const bool critic_fp32 = trains_in_fp32(trunk);  // a bf16 critic_model on this CPU too
    if (critic_fp32) spdlog::info("trainer: the bf16 critic trains in fp32 too (its weights = its masters)");
    critic_ = std::make_unique<Critic>(trunk, comm_, critic_source != nullptr ? critic_master : master_values,
                                       critic_fp32, options_.sharding);
  }
}

PolicyTrainer::~PolicyTrainer() = default;

PolicyTrainer::MicroBatchInputs PolicyTrainer::build_inputs(const PreparedBatch& batch,
                                                            const std::vector<size_t>& micro) const {
  MicroBatchInputs in;
  const auto B = static_cast<int64_t>(micro.size());
  const bool packed = options_.sequence_packing;
  int64_t T = 0, total = 0;
  for (size_t idx : micro) T = std::max(T, batch.sequences[idx].length), total += batch.sequences[idx].length;
  in.slots = packed ? total : B * T;
  std::vector<int64_t> ids(static_cast<size_t>(in.slots), 0), positions, targets;
  std::vector<float> adv, rollout, weight, temperature;
  bool tempered = false;
  int64_t row_start = 0;  // where this sequence's tokens start in the flattened ids
  for (int64_t b = 0; b < B; ++b) {
    const TrainSequence& seq = batch.sequences[micro[static_cast<size_t>(b)]];
    const Sample& s = *seq.sample;
    in.tokens.lengths.push_back(seq.length);
    in.tokens_real += seq.length;
    for (int64_t t = 0; t < seq.length; ++t)
      ids[static_cast<size_t>(row_start + t)] = s.token_ids[static_cast<size_t>(t)];
    const float w = options_.loss_aggregation == LossAggregation::TOKEN_MEAN
                        ? 1.0f
                        : static_cast<float>(1.0 / static_cast<double>(seq.trained_tokens));
    int64_t count = 0;
    for (int64_t t = 1; t < seq.length; ++t) {
      if (!s.loss_mask[static_cast<size_t>(t)]) continue;
      positions.push_back(row_start + t - 1);
      targets.push_back(s.token_ids[static_cast<size_t>(t)]);
      adv.push_back(seq.token_advantage.empty() ? static_cast<float>(seq.advantage)
                                                : seq.token_advantage[static_cast<size_t>(t)]);
      rollout.push_back(t < static_cast<int64_t>(s.rollout_logprobs.size())
                            ? s.rollout_logprobs[static_cast<size_t>(t)]
                            : 0.0f);
      weight.push_back(w);
      // The call that generated the token sampled at its temperature (1 without a call record).
      const int32_t call =
          t < static_cast<int64_t>(s.token_call.size()) ? s.token_call[static_cast<size_t>(t)] : -1;
      const float temp = call >= 0 && call < static_cast<int32_t>(s.calls.size())
                             ? s.calls[static_cast<size_t>(call)].temperature
                             : 1.0f;
      tempered = tempered || temp != 1.0f;
      temperature.push_back(temp);
      ++count;
    }
    in.counts.push_back(count);
    row_start += packed ? seq.length : T;
  }
  const auto dev = serving_->device();
  const auto i64 = torch::TensorOptions().dtype(torch::kLong);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  const auto N = static_cast<int64_t>(positions.size());
  in.tokens.packed = packed;
  in.tokens.ids =
      packed ? torch::from_blob(ids.data(), {in.slots}, i64).to(dev, /*non_blocking=*/false, /*copy=*/true)
             : torch::from_blob(ids.data(), {B, T}, i64).to(dev, false, true);
  in.positions = torch::from_blob(positions.data(), {N}, i64).to(dev, false, true);
  in.targets = torch::from_blob(targets.data(), {N}, i64).to(dev, false, true);
  in.advantage = torch::from_blob(adv.data(), {N}, f32).to(dev, false, true);
  in.rollout = torch::from_blob(rollout.data(), {N}, f32).to(dev, false, true);
  in.weight = torch::from_blob(weight.data(), {N}, f32).to(dev, false, true);
  if (tempered) in.temperature = torch::from_blob(temperature.data(), {N}, f32).to(dev, false, true);
  return in;
}

std::vector<std::vector<size_t>> PolicyTrainer::plan(const PreparedBatch& batch,
                                                     const std::vector<size_t>& seqs) const {
  return options_.sequence_packing ? plan_packed_micro_batches(batch, seqs, options_.micro_batch_max_tokens)
                                   : plan_micro_batches(batch, seqs, options_.micro_batch_max_tokens);
}

torch::Tensor PolicyTrainer::selected_logprobs(const DecoderModel& model, const MicroBatchInputs& in,
                                               torch::Tensor* entropy) {
  const torch::Tensor hidden = model.final_hidden(in.tokens, options_.forward);  // [N, H] or [B, T, H]
  // The LM head only where a trained token is predicted: prompts can be most of the tokens.
  const torch::Tensor h = hidden.reshape({-1, hidden.size(-1)}).index_select(0, in.positions);
  const torch::Tensor x = model.final_norm(h);
  if (!torch::GradMode::is_enabled()) {
    const torch::Tensor logits = model_linear(x, model.head_weight());
    return chunked_selected_logprobs(logits, in.targets, in.temperature, entropy);
  }
  torch::autograd::variable_list out =
      ChunkedHeadLogprobs::apply(x, model.head_weight(), in.targets, RowTemperatures{in.temperature});
  if (entropy != nullptr) *entropy = out[1];
  return out[0];
}

std::vector<torch::Tensor> PolicyTrainer::token_logprobs(const PreparedBatch& batch,
                                                         const std::vector<size_t>& seq_indices) {
  torch::NoGradGuard no_grad;
  const MicroBatchInputs in = build_inputs(batch, seq_indices);
  const torch::Tensor lp = selected_logprobs(*train_model_, in, nullptr);
  std::vector<torch::Tensor> out;
  int64_t at = 0;
  for (int64_t c : in.counts) {
    out.push_back(lp.narrow(0, at, c).clone());
    at += c;
  }
  return out;
}

LossSums PolicyTrainer::accumulate_gradients(const PreparedBatch& batch, const std::vector<size_t>& micro,
                                             const std::vector<torch::Tensor>& old_logprobs, double norm) {
  SWARM_REQUIRE(norm > 0, ErrorKind::INVALID_ARGUMENT, "loss normaliser must be > 0");
  const MicroBatchInputs in = build_inputs(batch, micro);
  // The parameters through gradient sinks: each gradient goes to the flat buffers (or, sharded,
  // to the other ranks) as the backward produces it, never to the leaves.
  std::vector<torch::Tensor> sinks;
  for (const auto& [name, leaf] : train_model_->parameters()) sinks.push_back(leaf);
  const std::shared_ptr<DecoderModel> model = train_model_->with_parameters(policy_->gradient_sinks(sinks));
  torch::Tensor entropy;
  const torch::Tensor lp = selected_logprobs(*model, in, &entropy);
  const torch::Tensor old = old_logprobs.empty() ? lp.detach() : torch::cat(old_logprobs).to(lp.device());
  SWARM_CHECK(old.numel() == lp.numel(), "old log-probs do not match the micro-batch's trained tokens");

  // The behaviour policy's log-probs; tokens that carry none (NaN: groups from other swarm
  // nodes, re-encoded here) count as on-policy, their recomputed old log-prob.
  const torch::Tensor behaviour = torch::where(torch::isnan(in.rollout), old.detach(), in.rollout);
  const torch::Tensor ratio = torch::exp(lp - old);
  const torch::Tensor pg_unclipped = -in.advantage * ratio;
  const torch::Tensor pg_clipped =
      -in.advantage * torch::clamp(ratio, 1.0 - options_.clip_ratio_low, 1.0 + options_.clip_ratio_high);
  torch::Tensor pg = torch::maximum(pg_unclipped, pg_clipped);
  // Off-policy correction: a detached per-token weight from the old (proximal) policy's and the
  // behaviour policy's log-probs (what the sampler recorded).
  torch::Tensor is_weight;
  if (options_.off_policy != OffPolicyCorrection::NONE) {
    const torch::Tensor raw = torch::exp(old.detach() - behaviour);
    if (options_.off_policy == OffPolicyCorrection::TIS) {
      is_weight = torch::clamp_max(raw, options_.is_cap);
    } else {
      is_weight = torch::where(raw > options_.is_cap, torch::zeros_like(raw), raw);
    }
    pg = pg * is_weight;
  }
  const torch::Tensor w = in.weight / norm;
  const torch::Tensor pg_loss = (pg * w).sum();
  torch::Tensor loss = pg_loss;
  torch::Tensor kl;
  if (options_.use_kl_loss) {
    torch::Tensor ref;
    {
      torch::NoGradGuard no_grad;
      ref = selected_logprobs(*ref_model_, in, nullptr);
    }
    kl = kl_penalty(lp, ref, options_.kl_estimator);
    loss = loss + options_.kl_coef * (kl * w).sum();
  }
  loss.backward();
  policy_->finish_micro_batch();

  torch::NoGradGuard no_grad;
  LossSums s;
  s.loss = loss.item<double>();
  s.pg_loss = pg_loss.item<double>();
  if (kl.defined()) s.kl = kl.detach().sum().item<double>();
  s.entropy = entropy.sum().item<double>();
  const torch::Tensor clipped = pg_clipped.detach() > pg_unclipped.detach();
  s.clipped_low = (clipped & (ratio.detach() < 1.0)).sum().item<double>();
  s.clipped_high = (clipped & (ratio.detach() > 1.0)).sum().item<double>();
  const torch::Tensor mismatch = (old - behaviour).abs();
  if (mismatch.numel() > 0) {
    s.mismatch_sum = mismatch.sum().item<double>();
    s.mismatch_max = mismatch.max().item<double>();
    const torch::Tensor raw = torch::exp(old - behaviour);  // pi_old / pi_behaviour, applied or not
    s.is_ratio_sum = raw.sum().item<double>();
    s.is_ratio_max = raw.max().item<double>();
    s.is_capped = (raw > options_.is_cap).sum().item<double>();
    s.is_weight_sum = is_weight.defined() ? is_weight.sum().item<double>() : static_cast<double>(raw.numel());
  }
  s.tokens = static_cast<double>(lp.numel());
  s.sequence_tokens = static_cast<double>(in.tokens_real);
  s.slots = static_cast<double>(in.slots);
  return s;
}

void PolicyTrainer::zero_gradients() { policy_->zero_gradients(); }

std::map<std::string, torch::Tensor> PolicyTrainer::gradients() const {
  std::map<std::string, torch::Tensor> out;
  for (size_t i = 0; i < policy_->size(); ++i) out[policy_->name(i)] = policy_->gradient(i).clone();
  return out;
}

std::map<std::string, torch::Tensor> PolicyTrainer::weights() const {
  std::map<std::string, torch::Tensor> out;
  for (size_t i = 0; i < policy_->size(); ++i) out[policy_->name(i)] = policy_->view(i);
  return out;
}

double PolicyTrainer::optimizer_step(double lr) { return policy_->step(lr, options_.adamw()); }

double PolicyTrainer::sync_to_serving(const ExclusiveRunner& exclusive) {
  const auto t0 = std::chrono::steady_clock::now();
  auto copy = [&] {
    if (shares_serving_weights_) return;  // the serving model reads the trained weights themselves
    torch::NoGradGuard no_grad;
    auto& params = serving_->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor& dst = params[i].second;
      dst.copy_(policy_->view(i));
    }
  };
  if (exclusive) {
    exclusive(copy);
  } else {
    copy();
  }
  return seconds_since(t0);
}

std::map<std::string, torch::Tensor> PolicyTrainer::optimizer_state() const { return policy_->state(); }

void PolicyTrainer::load_optimizer_state(const std::map<std::string, torch::Tensor>& state) {
  policy_->load_state(state, "optimizer state");
}

bool PolicyTrainer::stop_requested_anywhere(const std::stop_token& stop) {
  // A stop reaches one rank (rank 0 serves stop_engine); the others learn of it here, so they
  // all leave the step together instead of waiting in a collective until it times out.
  if (comm_->world_size() == 1) return stop.stop_requested();
  torch::Tensor flag = torch::full({1}, stop.stop_requested() ? 1.0 : 0.0,
                                   policy_->grad_options());  // on the collectives' device
  comm_->all_reduce_sum(flag);
  return flag.item<float>() > 0.f;
}

PolicyTrainer::GaeTargets PolicyTrainer::compute_advantages(PreparedBatch& batch) {
  SWARM_CHECK(critic_ != nullptr, "GAE needs the critic (algorithm: ppo)");
  const int rank = comm_->rank(), world = comm_->world_size();
  std::vector<size_t> mine;
  for (const auto& mb : split_mini_batches(batch, options_.ppo_mini_batch_size))
    for (size_t idx : shard_for_rank(batch, mb, rank, world)) mine.push_back(idx);
  const size_t n = batch.sequences.size();
  GaeTargets out;
  out.returns.resize(n);
  out.old_values.resize(n);
  std::vector<GaeResult> gae(n);
  std::vector<std::vector<uint8_t>> masks(n);
  for (const auto& micro : plan(batch, mine)) {
    const MicroBatchInputs in = build_inputs(batch, micro);
    torch::Tensor v;
    {
      torch::NoGradGuard no_grad;
      v = critic_->values(in.tokens, in.positions, options_.forward).to(torch::kCPU).contiguous();
    }
    const float* vp = v.data_ptr<float>();
    int64_t at = 0;
    for (size_t k = 0; k < micro.size(); ++k) {
      const size_t idx = micro[k];
      const TrainSequence& seq = batch.sequences[idx];
      const Sample& s = *seq.sample;
      masks[idx] = s.loss_mask;
      masks[idx][0] = 0;  // position 0 is never predicted (build_inputs trains t >= 1)
      std::vector<float> values(s.token_ids.size(), 0.0f);
      for (size_t t = 1; t < s.token_ids.size(); ++t)
        if (masks[idx][t]) values[t] = vp[at++];
      out.old_values[idx] = v.narrow(0, at - in.counts[k], in.counts[k]).clone();
      gae[idx] =
          compute_gae(place_rewards(s, *seq.episode), values, masks[idx], options_.gamma, options_.lam);
    }
  }
  // Whitened over the whole batch (every rank's tokens): mean 0, unit (unbiased) variance, as
  // whiten_advantages does on one rank. The sums travel on the training device (NCCL).
  const torch::Device dev = serving_->device();
  std::vector<const std::vector<float>*> my_advantages;
  std::vector<const std::vector<uint8_t>*> my_masks;
  for (size_t idx : mine) my_advantages.push_back(&gae[idx].advantages), my_masks.push_back(&masks[idx]);
  const MaskedSum local = masked_sum(my_advantages, my_masks);
  const std::vector<double> sc =
      all_reduce_sum_values(*comm_, {local.sum, static_cast<double>(local.count)}, dev);
  const double count = sc[1];
  const double mean = count > 0 ? sc[0] / count : 0.0;
  const double sq =
      all_reduce_sum_values(*comm_, {masked_squared_deviation(my_advantages, my_masks, mean)}, dev)[0];
  const double scale = whitening_scale(sq, count);
  AdvantageStats& st = batch.stats;
  bool first = true;
  double adv_sum = 0.0, adv_sq = 0.0, tokens = 0.0;
  for (size_t idx : mine) {
    TrainSequence& seq = batch.sequences[idx];
    seq.token_advantage.assign(masks[idx].size(), 0.0f);
    std::vector<float> returns;
    double seq_sum = 0.0;
    for (size_t t = 0; t < masks[idx].size(); ++t) {
      if (!masks[idx][t]) continue;
      const float a = static_cast<float>((gae[idx].advantages[t] - mean) * scale);
      seq.token_advantage[t] = a;
      returns.push_back(gae[idx].returns[t]);
      seq_sum += a;
      adv_sum += a, adv_sq += static_cast<double>(a) * a, tokens += 1.0;
      st.min = first ? a : std::min(st.min, static_cast<double>(a));
      st.max = first ? a : std::max(st.max, static_cast<double>(a));
      first = false;
    }
    seq.advantage = returns.empty() ? 0.0 : seq_sum / static_cast<double>(returns.size());
    out.returns[idx] = torch::tensor(returns, torch::TensorOptions().dtype(torch::kFloat));
  }
  if (world > 1) {  // the statistics of the whole batch, as on one rank
    const std::vector<double> sums = all_reduce_sum_values(*comm_, {adv_sum, adv_sq, tokens}, dev);
    adv_sum = sums[0], adv_sq = sums[1], tokens = sums[2];
    const double big = std::numeric_limits<double>::max();
    const std::vector<double> all =
        all_gather_values(*comm_, {first ? big : st.min, first ? -big : st.max}, dev);
    st.min = big, st.max = -big;
    for (size_t r = 0; r + 1 < all.size(); r += 2)
      st.min = std::min(st.min, all[r]), st.max = std::max(st.max, all[r + 1]);
  }
  st.mean = tokens > 0 ? adv_sum / tokens : 0.0;
  st.std = tokens > 0 ? std::sqrt(std::max(0.0, adv_sq / tokens - st.mean * st.mean)) : 0.0;
  return out;
}

std::map<std::string, double> PolicyTrainer::train(const TrainBatch& batch, int64_t step,
                                                   const ExclusiveRunner& exclusive, std::stop_token stop) {
  const auto t_start = std::chrono::steady_clock::now();
  const torch::Device device = serving_->device();
  mark_allocation_peak(device);
  const int64_t held_at_start = allocation_stats(device).current;
  std::map<std::string, double> m;
  PreparedBatch prepared = prepare_batch(batch, options_.advantage_estimator, 1e-6, options_.group_by);
  GaeTargets targets;
  double gae_seconds = 0.0;
  if (critic_ && !prepared.sequences.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    targets = compute_advantages(prepared);
    gae_seconds = seconds_since(t0);
  }
  // PPO's critic warm-up: the first critic_warmup steps train the critic only.
  const bool policy_trains = !critic_ || step > options_.critic_warmup;
  const double lr = learning_rate_at(options_.learning_rate, options_.lr_schedule, options_.lr_warmup_steps,
                                     options_.total_training_steps, step - 1);
  m["lr"] = lr;
  m["groups"] = static_cast<double>(prepared.stats.groups);
  m["groups_zero_variance"] = static_cast<double>(prepared.stats.zero_variance_groups);
  m["samples_skipped"] = static_cast<double>(prepared.stats.skipped_samples);
  m["sequences_trained"] = static_cast<double>(prepared.sequences.size());
  m["advantage_mean"] = prepared.stats.mean;
  m["advantage_std"] = prepared.stats.std;
  m["advantage_min"] = prepared.stats.min;
  m["advantage_max"] = prepared.stats.max;
  if (prepared.sequences.empty()) {
    m["optimizer_steps"] = 0;
    m["weights_updated"] = 0;
    m["weight_sync_seconds"] = 0;
    return m;
  }

  const auto minis = split_mini_batches(prepared, options_.ppo_mini_batch_size);
  const int rank = comm_->rank(), world = comm_->world_size();
  // With one epoch over one mini-batch the weights cannot change before a token's loss is
  // computed, so the old log-probs are the current ones: take them (detached) from the update's
  // own forward pass instead of a second pass.
  const bool on_policy = options_.ppo_epochs == 1 && minis.size() == 1;
  std::vector<torch::Tensor> old(prepared.sequences.size());
  double old_seconds = 0.0;
  if (!on_policy && policy_trains) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& mb : minis)
      for (const auto& micro : plan(prepared, shard_for_rank(prepared, mb, rank, world))) {
        auto lps = token_logprobs(prepared, micro);
        for (size_t k = 0; k < micro.size(); ++k) old[micro[k]] = std::move(lps[k]);
      }
    old_seconds = seconds_since(t0);
  }

  const auto t_update = std::chrono::steady_clock::now();
  LossSums sums;
  ValueLossSums value_sums;
  double grad_norm_sum = 0.0, grad_norm_max = 0.0, tokens_processed = 0.0, critic_grad_norm_sum = 0.0;
  int64_t opt_steps = 0, critic_steps = 0;
  for (int64_t epoch = 0; epoch < options_.ppo_epochs; ++epoch) {
    for (const auto& mb : minis) {
      if (stop_requested_anywhere(stop)) throw SwarmError(ErrorKind::CONFLICT, "training step cancelled");
      double norm = 0.0;
      for (size_t idx : mb)
        norm += options_.loss_aggregation == LossAggregation::TOKEN_MEAN
                    ? static_cast<double>(prepared.sequences[idx].trained_tokens)
                    : 1.0;
      const auto micros = plan(prepared, shard_for_rank(prepared, mb, rank, world));
      // Sharded gradients cross ranks in every micro-batch's backward: a rank with fewer
      // micro-batches than another finishes empty ones (zero gradients) to match.
      size_t equal_micros = micros.size();
      if (world > 1 &&
          (policy_->reduces_in_backward() || (critic_ && critic_->parameters().reduces_in_backward()))) {
        for (double n : all_gather_values(*comm_, {static_cast<double>(micros.size())}, serving_->device()))
          equal_micros = std::max(equal_micros, static_cast<size_t>(n));
      }
      if (policy_trains) {
        zero_gradients();
        for (const auto& micro : micros) {
          std::vector<torch::Tensor> olds;
          if (!on_policy)
            for (size_t idx : micro) olds.push_back(old[idx]);
          sums.add(accumulate_gradients(prepared, micro, olds, norm));
          for (size_t idx : micro) tokens_processed += static_cast<double>(prepared.sequences[idx].length);
        }
        for (size_t k = micros.size(); k < equal_micros; ++k) policy_->finish_micro_batch();
        const double gn = optimizer_step(lr);
        grad_norm_sum += gn;
        grad_norm_max = std::max(grad_norm_max, gn);
        ++opt_steps;
      }
      if (critic_) {  // the value loss over the same tokens, normalised alike
        critic_->zero_gradients();
        for (const auto& micro : micros) {
          const MicroBatchInputs in = build_inputs(prepared, micro);
          std::vector<torch::Tensor> returns, olds;
          for (size_t idx : micro)
            returns.push_back(targets.returns[idx]), olds.push_back(targets.old_values[idx]);
          const auto dev = serving_->device();
          value_sums.add(critic_->accumulate_gradients(in.tokens, in.positions, torch::cat(returns).to(dev),
                                                       torch::cat(olds).to(dev), in.weight, norm,
                                                       options_.cliprange_value, options_.forward));
        }
        for (size_t k = micros.size(); k < equal_micros; ++k) critic_->parameters().finish_micro_batch();
        critic_grad_norm_sum += critic_->optimizer_step(options_.critic_learning_rate, options_.adamw());
        ++critic_steps;
      }
    }
  }
  const double update_seconds = seconds_since(t_update);
  // The step's peak above what it started with (forward and backward of every micro-batch, the
  // critic's, the optimizer's temporaries), before the weight sync.
  const AllocationStats after = allocation_stats(device);
  activations_peak_bytes_ = held_at_start >= 0 && after.peak >= 0 ? after.peak - held_at_start : -1;
  if (activations_peak_bytes_ >= 0)
    m["activations_peak_bytes"] = static_cast<double>(activations_peak_bytes_);

  if (world > 1) {  // every rank computed a share: sum the sums, max the maxima (on the training device)
    const torch::Device dev = serving_->device();
    const std::vector<double> v = all_reduce_sum_values(
        *comm_,
        {sums.loss, sums.pg_loss, sums.kl, sums.entropy, sums.clipped_low, sums.clipped_high,
         sums.mismatch_sum, sums.tokens, tokens_processed, value_sums.loss, value_sums.clipped,
         value_sums.value_sum, value_sums.error_sum, value_sums.tokens, sums.is_weight_sum, sums.is_ratio_sum,
         sums.is_capped, sums.sequence_tokens, sums.slots},
        dev);
    sums.loss = v[0], sums.pg_loss = v[1], sums.kl = v[2], sums.entropy = v[3], sums.clipped_low = v[4];
    sums.clipped_high = v[5], sums.mismatch_sum = v[6], sums.tokens = v[7], tokens_processed = v[8];
    value_sums.loss = v[9], value_sums.clipped = v[10], value_sums.value_sum = v[11],
    value_sums.error_sum = v[12];
    value_sums.tokens = v[13], sums.is_weight_sum = v[14], sums.is_ratio_sum = v[15], sums.is_capped = v[16];
    sums.sequence_tokens = v[17], sums.slots = v[18];
    const std::vector<double> all = all_gather_values(*comm_, {sums.mismatch_max, sums.is_ratio_max}, dev);
    for (size_t r = 0; r + 1 < all.size(); r += 2)
      sums.mismatch_max = std::max(sums.mismatch_max, all[r]),
      sums.is_ratio_max = std::max(sums.is_ratio_max, all[r + 1]);
  }

  if (critic_) {
    const double vt = std::max(1.0, value_sums.tokens);
    m["critic_loss"] = value_sums.loss / static_cast<double>(std::max<int64_t>(1, critic_steps));
    m["critic_value_mean"] = value_sums.value_sum / vt;
    m["critic_value_mse"] = value_sums.error_sum / vt;
    m["critic_clip_frac"] = value_sums.clipped / vt;
    m["critic_grad_norm"] = critic_grad_norm_sum / static_cast<double>(std::max<int64_t>(1, critic_steps));
    m["critic_optimizer_steps"] = static_cast<double>(critic_steps);
    m["gae_seconds"] = gae_seconds;
  }
  if (!policy_trains) {  // critic warm-up: the policy is unchanged, nothing to sync
    m["optimizer_steps"] = 0;
    m["weights_updated"] = 0;
    m["weight_sync_seconds"] = 0;
    m["trainer_seconds"] = seconds_since(t_start);
    return m;
  }
  const double sync_seconds = sync_to_serving(exclusive);
  const double tokens = std::max(1.0, sums.tokens);
  m["loss"] = sums.loss / static_cast<double>(opt_steps);
  m["pg_loss"] = sums.pg_loss / static_cast<double>(opt_steps);
  m["kl"] = sums.kl / tokens;
  m["entropy"] = sums.entropy / tokens;
  m["clip_frac_low"] = sums.clipped_low / tokens;
  m["clip_frac_high"] = sums.clipped_high / tokens;
  m["logprob_mismatch_mean"] = sums.mismatch_sum / tokens;
  m["logprob_mismatch_max"] = sums.mismatch_max;
  // Behaviour vs proximal (the trainer's old policy): the ratio whether or not it is applied, the
  // weight the correction applied (1 with none), and the share of tokens over is_cap.
  m["is_ratio_mean"] = sums.is_ratio_sum / tokens;
  m["is_ratio_max"] = sums.is_ratio_max;
  m["is_weight_mean"] = sums.is_weight_sum / tokens;
  m["is_capped_share"] = sums.is_capped / tokens;
  m["grad_norm"] = grad_norm_sum / static_cast<double>(opt_steps);
  m["grad_norm_max"] = grad_norm_max;
  m["optimizer_steps"] = static_cast<double>(opt_steps);
  m["weights_updated"] = 1;
  m["trained_tokens"] = static_cast<double>(prepared.trained_tokens());
  m["old_logprob_seconds"] = old_seconds;
  m["update_seconds"] = update_seconds;
  m["weight_sync_seconds"] = sync_seconds;
  // The share of computed token positions that were padding (0 when packed).
  m["padding_fraction"] = sums.slots > 0 ? 1.0 - sums.sequence_tokens / sums.slots : 0.0;
  m["trainer_tokens_per_second"] = update_seconds > 0 ? tokens_processed / update_seconds : 0.0;
  m["trainer_seconds"] = seconds_since(t_start);
  return m;
}

FlatParameters::Memory PolicyTrainer::memory() const {
  FlatParameters::Memory m = policy_->memory();
  if (critic_) {
    const FlatParameters::Memory c = critic_->parameters().memory();
    m.weights += c.weights;
    m.gradients += c.gradients;
    m.optimizer += c.optimizer;
    m.master += c.master;
  }
  for (const torch::Tensor& w : ref_weights_) m.weights += w.numel() * static_cast<int64_t>(w.element_size());
  return m;
}

}  // namespace swarm
