// The decoder-only transformer swarm runs (Llama / Qwen2 / Qwen3 / Mistral blocks) on libtorch:
// embeddings, RMSNorm, RoPE (with scaling), GQA attention, SwiGLU MLP, tied or separate LM head.
// One implementation of the math serves both the trainer (forward_full: padded batch, no cache,
// autograd) and the engine (forward_step: packed sequences over a paged KV cache).
// Device-agnostic torch ops only, so the same code runs on CPU and CUDA.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "inference/training_forward.hpp"
#include "model/model_config.hpp"
#include "model/safetensors.hpp"

namespace swarm {

class KvCache;

/// Sets the number of intra-op threads libtorch uses for the model's ops (at::set_num_threads).
/// libtorch defaults to 1 on this machine: the engine sets it deliberately at start-up.
void set_compute_threads(int n);

/// What configure_compute_threads chose.
struct ThreadPlan {
  int torch_threads = 1;     // at::set_num_threads (OpenMP: our kernels, elementwise ops, the split GEMMs)
  int openblas_threads = 0;  // OpenBLAS's own pool; 0 = not found / left alone
  bool gemm_splits = false;  // fp32 (and widened bf16) GEMMs split over libtorch's threads
};

/// Threads for a model computing in `compute` on the CPU with `n` threads in all. libtorch's
/// OpenMP pool and OpenBLAS's pthread pool are separate, and both busy-wait: giving both n
/// threads oversubscribes the cores (measured: fp32 decode at batch 32 fell from ~250 to ~80
/// tokens/s). So one pool does everything: libtorch n threads and OpenBLAS one, every GEMM split
/// into one range per OpenMP thread, each a single-threaded OpenBLAS call (cpu_gemm_splits,
/// widening_linear_torch.hpp); attention, norms and activations run on all n cores too (fp32:
/// 1.2-2x faster than with OpenBLAS's pool holding the cores). Its idle workers spin only
/// briefly (bound_openmp_spin_wait, common/openmp_wait.hpp), so processes sharing the cores do
/// not starve each other. SWARM_GEMM_SPLIT=0 splits no GEMM: fp32 then gives OpenBLAS's pool
/// the n threads and libtorch one (the plan before 2026-11-27), bf16 keeps libtorch n.
ThreadPlan configure_compute_threads(int n, DType compute);

/// Keeps the large, short-lived activation buffers of a forward pass in the malloc heap
/// instead of fresh mmap'ed pages every step (glibc maps blocks above a threshold and unmaps
/// them on free; the page faults of re-mapping cost more than the arithmetic at decode sizes).
/// Process-wide, idempotent; loading a model calls it.
void tune_memory_allocator();

/// The compute dtype for a DType (F32 -> kFloat, BF16 -> kBFloat16; anything else throws).
c10::ScalarType compute_scalar_type(DType compute);

/// The new tokens of one sequence in a forward_step.
struct StepInput {
  int64_t seq_slot = 0;         // the sequence's key in the KvCache
  std::vector<int32_t> tokens;  // a prefill chunk, or the one token to decode
  int64_t start_pos = 0;        // tokens of this sequence already in the cache
};

/// The tokens of a training forward pass. Packed: samples laid end to end in one row (`ids` [N]
/// int64, `lengths` per sample, summing to N); each sample's positions restart at 0 and no
/// attention crosses a boundary. Padded: right-padded rows (`ids` [B, T], `lengths` the real
/// tokens of each row, each in [0, T]).
struct TrainingTokens {
  torch::Tensor ids;
  std::vector<int64_t> lengths;
  bool packed = true;
};

/// Padded TrainingTokens from ids [B, T] and lengths [B] (any device; int64).
TrainingTokens padded_tokens(const torch::Tensor& ids, const torch::Tensor& lengths);

struct CheckpointedDecoderLayer;

/// A loaded decoder model. Its weights are owned tensors in the compute dtype on its device.
/// Math as Hugging Face: RMSNorm statistics in fp32, rotate-half RoPE from tables computed in
/// fp32 as transformers computes them, GQA, attention scores and softmax in fp32, SwiGLU. The
/// layers that ModelConfig::layer_window gives a window (Mistral: all; Qwen2/3: per
/// layer_types / max_window_layers) attend to the last `window` positions (i - j < window).
///
/// Thread-compatible: const methods may run concurrently only while nobody replaces or writes
/// the parameters; the engine calls it from its one scheduling thread, the trainer from its.
class DecoderModel {
  struct Private {};

 public:
  /// Loads DIR (config.json + safetensors), checking the tensors against the config, and casts
  /// every weight to `compute` (F32 or BF16) on `device`. Tied embeddings may be stored under
  /// either name. Throws SwarmError(INVALID_ARGUMENT) on a bad directory or an unsupported
  /// config (dynamic RoPE scaling is not supported yet).
  static std::shared_ptr<DecoderModel> load(const std::filesystem::path& dir, DType compute = DType::F32,
                                            torch::Device device = torch::kCPU);
  /// A model from a config and a state dict (Hugging Face names); the tensors are copied.
  static std::shared_ptr<DecoderModel> from_state_dict(const ModelConfig& config,
                                                       const std::map<std::string, torch::Tensor>& state,
                                                       DType compute = DType::F32,
                                                       torch::Device device = torch::kCPU);

  DecoderModel(Private, ModelConfig config, DType compute, torch::Device device);

  const ModelConfig& config() const noexcept { return config_; }
  DType compute_dtype() const noexcept { return compute_; }
  c10::ScalarType scalar_type() const noexcept { return scalar_type_; }
  torch::Device device() const noexcept { return device_; }

  /// The weights by Hugging Face name, in checkpoint order. With tied embeddings the head is
  /// model.embed_tokens.weight (there is no separate lm_head.weight entry). The forward pass reads
  /// the tensors from this list on every call, so a caller may replace one (same shape, dtype and
  /// device), flip requires_grad on it, or copy_ new values into it in place (weight sync).
  std::vector<std::pair<std::string, torch::Tensor>>& parameters() noexcept { return params_; }
  const std::vector<std::pair<std::string, torch::Tensor>>& parameters() const noexcept { return params_; }
  /// The parameter called `name`; throws SwarmError(NOT_FOUND) when there is none.
  const torch::Tensor& parameter(const std::string& name) const;

  /// A model with the same config and layout whose weights are `tensors` (one per entry of
  /// parameters(), same order, shapes and device; of this model's dtype, or of `compute`'s when
  /// given: the model then computes in that dtype, as the trainer does in fp32 for a bf16 serving
  /// model on CPUs without bf16 dot products). The tensors are used as given, not copied: the
  /// trainer passes views of its flat weight buffer with requires_grad set, so autograd sees
  /// them as leaves. Throws INVALID_ARGUMENT on a count, shape, dtype or device mismatch.
  std::shared_ptr<DecoderModel> with_parameters(std::vector<torch::Tensor> tensors,
                                                std::optional<DType> compute = std::nullopt) const;
  /// A serving model over `tensors` (as with_parameters, this model's dtype): where a layer's
  /// q/k/v (gate/up) weights and biases lie one after another in memory, as in a flat buffer
  /// laid out in merged_order(), its merged projections are views of that memory, so the
  /// serving path runs one GEMM for them without a copy (otherwise that layer runs them apart).
  std::shared_ptr<DecoderModel> with_serving_parameters(std::vector<torch::Tensor> tensors) const;
  /// The parameter indices with each layer's q/k/v weights (and biases) and gate/up weights
  /// (and biases) side by side, in the order the merged projections stack them; every other
  /// parameter where it is.
  std::vector<size_t> merged_order() const;

  /// Logits [B, T, vocab] (fp32) of a right-padded batch `input_ids` [B, T] (int64) whose rows
  /// hold lengths[b] real tokens (`lengths` [B], int64, each in [0, T]). Attention is causal and
  /// ignores padding; the logits at padded positions are finite but meaningless. No cache; runs
  /// under whatever grad mode the caller has (the trainer calls it with grad enabled), and never
  /// modifies the weights in place.
  torch::Tensor forward_full(const torch::Tensor& input_ids, const torch::Tensor& lengths) const;
  /// forward_full in two halves, so a caller can apply the LM head to selected positions only
  /// (the trainer needs logits at response tokens, not at the prompt): final_hidden returns the
  /// residual stream after the last layer [B, T, hidden] (compute dtype), head_logits applies the
  /// final norm and the LM head to any [..., hidden] tensor and returns fp32 logits.
  /// forward_full(ids, lengths) == head_logits(final_hidden(ids, lengths)).
  torch::Tensor final_hidden(const torch::Tensor& input_ids, const torch::Tensor& lengths) const;
  /// The trainer's forward to the last layer: [N, hidden] for packed tokens, [B, T, hidden] for
  /// padded rows (compute dtype), with `how`'s attention (kernels/cpu/blockwise_attention_torch.hpp;
  /// scaled_dot_product_attention on a GPU) and, under autograd, per-layer activation
  /// checkpointing (the layer's input kept, its activations recomputed in the backward: the same
  /// ops, so the same gradients). The plain final_hidden above is this with padded rows and
  /// eager attention. The model must outlive the backward of what this returns.
  torch::Tensor final_hidden(const TrainingTokens& tokens, const TrainingForward& how) const;
  torch::Tensor head_logits(const torch::Tensor& hidden) const;
  /// The two parts of head_logits, for a caller that computes the LM head itself (the trainer's
  /// row-chunked log-softmax): the final RMSNorm of `hidden` (compute dtype), and the LM head
  /// weight [vocab, hidden] (the embedding with tied embeddings; no bias).
  /// head_logits(h) == at::linear(final_norm(h), head_weight()).to(kFloat).
  torch::Tensor final_norm(const torch::Tensor& hidden) const;
  const torch::Tensor& head_weight() const { return p(head_); }

  /// One serving step over several sequences, packed: every sequence's new tokens go through the
  /// projections and MLP together as one [N, hidden] activation; attention runs per sequence over
  /// its cached K/V plus the new tokens (causal). The new tokens' K/V are written into `cache`,
  /// which must already have capacity for start_pos + tokens.size() of each sequence
  /// (KvCache::ensure_capacity). Slots must be distinct within a step. Returns fp32 logits of the
  /// last new token of each sequence [B, vocab], or of every new token [N, vocab] in input order
  /// when `all_logits`. Runs in inference mode (no autograd): the result is an inference tensor,
  /// so sample from it with out-of-place ops or inside c10::InferenceMode.
  torch::Tensor forward_step(const std::vector<StepInput>& seqs, KvCache& cache,
                             bool all_logits = false) const;

  /// The RoPE tables [max_position_embeddings, head_dim], fp32 (cos and sin of the angle,
  /// computed in double, repeated over both halves like Hugging Face's rotate-half layout).
  const torch::Tensor& rope_cos() const noexcept { return cos_f32_; }
  const torch::Tensor& rope_sin() const noexcept { return sin_f32_; }

 private:
  friend struct CheckpointedDecoderLayer;
  /// What every layer of one training forward shares (final_hidden(TrainingTokens, ...)).
  struct TrainingLayout {
    int64_t rows = 0, cols = 0;               // x is [rows, cols, hidden]: [1, N] packed, [B, T] padded
    torch::Tensor cos, sin;                   // [1 or rows, cols, 1, head_dim], compute dtype
    torch::Tensor blocked, blocked_windowed;  // eager attention's masks [rows, cols, cols]
    std::vector<int64_t> cu_seqlens;          // sample (packed) or row (padded) boundaries in [0, rows·cols]
    enum class Kernel { EAGER, BLOCKWISE, SDPA };  // SDPA: scaled_dot_product_attention (libtorch 2.x)
    Kernel attention = Kernel::EAGER;
    int64_t block = 0;  // the blockwise kernel's block
  };
  /// Decoder layer `l` of a training forward: x [rows, cols, hidden] -> the same.
  torch::Tensor training_layer(size_t l, const torch::Tensor& x, const TrainingLayout& layout) const;
  /// Attention of layer `l` of a training forward: q [rows, cols, heads, hd], k/v [.., kv_heads,
  /// hd] -> [rows, cols, heads * hd].
  torch::Tensor training_attention(size_t l, const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const TrainingLayout& layout) const;

  struct LayerParams {  // indices into params_, -1 when absent
    int q_w = -1, q_b = -1, k_w = -1, k_b = -1, v_w = -1, v_b = -1, o_w = -1, o_b = -1;
    int q_norm = -1, k_norm = -1;
    int gate_w = -1, gate_b = -1, up_w = -1, up_b = -1, down_w = -1, down_b = -1;
    int in_norm = -1, post_norm = -1;
  };

  /// The serving path's merged projections of one layer: q/k/v stacked into one weight (and
  /// gate/up into another), with the parameters() entries made views into them, so one GEMM
  /// replaces three (two) and an in-place weight sync updates both. Undefined when not merged.
  struct Merged {
    torch::Tensor qkv_w, qkv_b, gate_up_w, gate_up_b;
  };

  const torch::Tensor& p(int index) const { return params_[static_cast<size_t>(index)].second; }
  /// Stacks each layer's q/k/v and gate/up weights (load time, not with_parameters models).
  void merge_projections();
  /// Whether the parameters of `layer` are still the views merge_projections made (a caller may
  /// have replaced one tensor in parameters()).
  bool qkv_merged(size_t layer) const;
  bool gate_up_merged(size_t layer) const;
  /// An optional parameter (a bias): undefined when `index` < 0.
  torch::Tensor bias(int index) const { return index < 0 ? torch::Tensor() : p(index); }
  void build_rope_tables();
  torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight) const;
  // The serving step's building blocks take an optional `out`: a buffer the CPU kernels write
  // the result into (see output_tensor, serving_ops_torch.hpp); where libtorch ops compute it
  // instead, it is ignored and a new tensor returned. Callers use what is returned.
  /// rms_norm for the serving step: one fused pass on the CPU (serving_ops_torch.hpp).
  torch::Tensor serving_rms_norm(const torch::Tensor& x, const torch::Tensor& weight,
                                 const torch::Tensor& out = {}) const;
  /// The serving step's residual add and the next norm: x += delta, then rms_norm(x) (one
  /// fused pass on the CPU).
  torch::Tensor serving_add_rms_norm(torch::Tensor& x, const torch::Tensor& delta,
                                     const torch::Tensor& weight, const torch::Tensor& out = {}) const;
  torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) const;
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& allowed) const;
  /// x · Wᵀ + b; `serving` (forward_step, no autograd) may use the small-row CPU kernel, and its
  /// `out` buffer (as serving_linear).
  torch::Tensor proj(const torch::Tensor& x, int w, int b, bool serving, const torch::Tensor& out = {}) const;
  /// The serving projection: x · wᵀ (+ b when defined), through small_linear for a few rows on
  /// the CPU. float_out: the result in fp32 (as .to(kFloat) of it), for the logits.
  torch::Tensor serving_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                               bool float_out = false, const torch::Tensor& out = {}) const;
  torch::Tensor mlp(const LayerParams& layer, const torch::Tensor& x, bool serving = false) const;
  /// The serving MLP of layer l (through the merged gate/up weight when there is one); the
  /// activation (silu(gate) * up) goes to act_out when it can.
  torch::Tensor serving_mlp(size_t l, const torch::Tensor& x, const torch::Tensor& act_out = {},
                            const torch::Tensor& out = {}) const;
  torch::Tensor logits(const torch::Tensor& x) const;

  ModelConfig config_;
  DType compute_;
  c10::ScalarType scalar_type_;
  torch::Device device_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<LayerParams> layers_;
  std::vector<Merged> merged_;  // per layer, or empty
  int embed_ = -1, final_norm_ = -1, head_ = -1;
  torch::Tensor cos_f32_, sin_f32_;  // [max_pos, head_dim] fp32
  torch::Tensor cos_, sin_;          // the same in the compute dtype, on the device
};

}  // namespace swarm
