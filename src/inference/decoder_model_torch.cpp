#include "inference/decoder_model_torch.hpp"
#include "common/env.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <dlfcn.h>
#include <malloc.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <limits>
#include <numbers>
#include <unordered_map>
#include <unordered_set>

#include "common/error.hpp"
#include "inference/kv_cache_torch.hpp"
#include "kernels/cpu/blockwise_attention_torch.hpp"
#include "kernels/cpu/paged_attention_torch.hpp"
#include "kernels/cpu/serving_ops_torch.hpp"
#include "kernels/cpu/small_linear_torch.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"
#include "model/safetensors_torch.hpp"

namespace swarm {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1] (Hugging Face layout).
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

std::string shape_str(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// One batched attention call of forward_step. On the CPU, one paged call for every new token
// of the step. Elsewhere either all single-token (decode) sequences, padded to the longest
// context, or one multi-token (prefill) sequence alone, so a long prefill never pads a batch
// of decodes. Built once per step, shared by every layer.
struct AttentionGroup {
  int64_t row_begin = 0;           // the group's rows in the (reordered) packed activation
  int64_t batch = 0;               // sequences
  int64_t queries = 0;             // new tokens per sequence (1 for decode)
  int64_t keys = 0;                // context length L (padded for decode groups)
  torch::Tensor gather;            // [batch * keys] rows of the flattened cache to read K/V from
  torch::Tensor blocked;           // [batch, queries, keys] bool, true where attention is not allowed
  torch::Tensor blocked_windowed;  // the same for a layer with a sliding window (when the model has one)
  // The CPU's group reads the cache in place through the block tables instead.
  bool paged = false;
  PagedContext context;
};

}  // namespace

void set_compute_threads(int n) {
  SWARM_REQUIRE(n >= 1, ErrorKind::INVALID_ARGUMENT,
                "compute threads must be >= 1, got " + std::to_string(n));
  at::set_num_threads(n);
  set_small_linear_threads(n);
}

ThreadPlan configure_compute_threads(int n, DType compute) {
  SWARM_REQUIRE(n >= 1, ErrorKind::INVALID_ARGUMENT,
                "compute threads must be >= 1, got " + std::to_string(n));
  // OpenBLAS is whatever BLAS libtorch was linked against; look its setter up at run time.
  using SetThreads = void (*)(int);
  auto openblas_set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  ThreadPlan plan;
  set_small_linear_threads(n);
  // SWARM_GEMM_SPLIT=0: no split GEMMs (the plans before 2026-11-27: fp32 gives OpenBLAS's pool
  // the cores); unset or "1": one pool with split GEMMs for every dtype.
  static const bool splits = [] {
    const auto e = env_value("SWARM_GEMM_SPLIT");
    return !e || *e != "0";
  }();
  if (openblas_set == nullptr) {
    // No separate BLAS pool to share the cores with: its GEMMs thread on libtorch's pool.
    plan.torch_threads = n;
    at::set_num_threads(n);
    set_cpu_gemm_splits(false);
    return plan;
  }
  if (compute == DType::F32 && !splits) {
    // fp32 without splits: OpenBLAS's pool has the cores for the GEMMs, libtorch one thread.
    plan.torch_threads = 1;
    plan.openblas_threads = n;
    at::set_num_threads(1);
    openblas_set(n);
    set_cpu_gemm_splits(false);
    return plan;
  }
  // One pool: every GEMM split over libtorch's threads, each calling OpenBLAS single-threaded
  // (widening_linear_torch.hpp).
  plan.torch_threads = n;
  plan.openblas_threads = 1;
  at::set_num_threads(n);
  openblas_set(1);
  set_cpu_gemm_splits(splits);
  plan.gemm_splits = cpu_gemm_splits();
  return plan;
}

void tune_memory_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // 32 MiB is the largest mmap threshold glibc accepts on 64-bit; freed memory at the top of
    // the heap is only returned to the system beyond 1 GiB, and the heap grows 64 MiB at a time.
    // (Measured: with glibc's defaults, page faults took ~13% of a batch-64 decode step.)
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_TOP_PAD, 64 << 20);
  });
}

c10::ScalarType compute_scalar_type(DType compute) {
  switch (compute) {
    case DType::F32:
      return torch::kFloat;
    case DType::BF16:
      return torch::kBFloat16;
    default:
      break;
  }
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string("unsupported compute dtype ") +
                                                    dtype_name(compute) + " (supported: F32, BF16)");
}

// ---------------------------------------------------------------- loading

DecoderModel::DecoderModel(Private, ModelConfig config, DType compute, torch::Device device)
    : config_(std::move(config)),
      compute_(compute),
      scalar_type_(compute_scalar_type(compute)),
      device_(device) {}

std::shared_ptr<DecoderModel> DecoderModel::load(const std::filesystem::path& dir, DType compute,
                                                 torch::Device device) {
  ModelConfig config = ModelConfig::from_directory(dir);
  SafetensorsModel weights = SafetensorsModel::open(dir);
  weights.validate_against(config);
  return from_state_dict(config, load_state_dict(weights), compute, device);
}

std::shared_ptr<DecoderModel> DecoderModel::from_state_dict(const ModelConfig& config,
                                                            const std::map<std::string, torch::Tensor>& state,
                                                            DType compute, torch::Device device) {
  SWARM_REQUIRE(config.rope_scaling.type != RopeScalingType::DYNAMIC, ErrorKind::INVALID_ARGUMENT,
                "rope_scaling type 'dynamic' is not supported yet");
  SWARM_REQUIRE(config.head_dim % 2 == 0, ErrorKind::INVALID_ARGUMENT,
                "head_dim must be even for RoPE, got " + std::to_string(config.head_dim));
  SWARM_REQUIRE(
      config.num_key_value_heads > 0 && config.num_attention_heads % config.num_key_value_heads == 0,
      ErrorKind::INVALID_ARGUMENT, "num_attention_heads must be a multiple of num_key_value_heads");
  SWARM_REQUIRE(config.max_position_embeddings > 0, ErrorKind::INVALID_ARGUMENT,
                "max_position_embeddings must be positive");
  tune_memory_allocator();
  auto model = std::make_shared<DecoderModel>(Private{}, config, compute, device);
  const auto options = torch::TensorOptions().dtype(model->scalar_type_).device(device);

  std::unordered_map<std::string, int> index;
  for (const TensorSpec& spec : config.expected_tensors()) {
    auto it = state.find(spec.name);
    // Tied embeddings may be stored once, as lm_head.weight (TinyStories does).
    if (it == state.end() && spec.name == "model.embed_tokens.weight" && config.tie_word_embeddings) {
      it = state.find("lm_head.weight");
    }
    SWARM_REQUIRE(it != state.end(), ErrorKind::INVALID_ARGUMENT, "missing tensor '" + spec.name + "'");
    const torch::Tensor& t = it->second;
    SWARM_REQUIRE(t.sizes().vec() == spec.shape, ErrorKind::INVALID_ARGUMENT,
                  "tensor '" + spec.name + "' has shape " + shape_str(t.sizes()) + ", expected " +
                      shape_str(spec.shape));
    SWARM_REQUIRE(t.is_floating_point(), ErrorKind::INVALID_ARGUMENT,
                  "tensor '" + spec.name + "' is not floating-point");
    // An owned, contiguous copy: the state dict may alias a read-only file mapping.
    index[spec.name] = static_cast<int>(model->params_.size());
    model->params_.emplace_back(spec.name, t.to(options, /*non_blocking=*/false, /*copy=*/true).contiguous());
  }

  auto find = [&](const std::string& name) {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  };
  auto need = [&](const std::string& name) {
    const int i = find(name);
    SWARM_CHECK(i >= 0, "parameter '" + name + "' not loaded");
    return i;
  };
  model->embed_ = need("model.embed_tokens.weight");
  model->final_norm_ = need("model.norm.weight");
  model->head_ = config.tie_word_embeddings ? model->embed_ : need("lm_head.weight");
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    LayerParams lp;
    lp.q_w = need(pre + "self_attn.q_proj.weight");
    lp.q_b = find(pre + "self_attn.q_proj.bias");
    lp.k_w = need(pre + "self_attn.k_proj.weight");
    lp.k_b = find(pre + "self_attn.k_proj.bias");
    lp.v_w = need(pre + "self_attn.v_proj.weight");
    lp.v_b = find(pre + "self_attn.v_proj.bias");
    lp.o_w = need(pre + "self_attn.o_proj.weight");
    lp.o_b = find(pre + "self_attn.o_proj.bias");
    lp.q_norm = find(pre + "self_attn.q_norm.weight");
    lp.k_norm = find(pre + "self_attn.k_norm.weight");
    lp.gate_w = need(pre + "mlp.gate_proj.weight");
    lp.gate_b = find(pre + "mlp.gate_proj.bias");
    lp.up_w = need(pre + "mlp.up_proj.weight");
    lp.up_b = find(pre + "mlp.up_proj.bias");
    lp.down_w = need(pre + "mlp.down_proj.weight");
    lp.down_b = find(pre + "mlp.down_proj.bias");
    lp.in_norm = need(pre + "input_layernorm.weight");
    lp.post_norm = need(pre + "post_attention_layernorm.weight");
    model->layers_.push_back(lp);
  }
  model->build_rope_tables();
  model->merge_projections();
  return model;
}

namespace {

// Rows of `parts` (2-D, same columns, dtype, device) stacked into one contiguous tensor; each
// part is then replaced by the view of its rows, so writing through either updates both.
torch::Tensor stack_rows(const std::vector<torch::Tensor*>& parts) {
  std::vector<torch::Tensor> list;
  for (const torch::Tensor* t : parts) list.push_back(*t);
  torch::Tensor stacked = at::cat(list, 0).contiguous();
  int64_t row = 0;
  for (torch::Tensor* t : parts) {
    const int64_t n = t->size(0);
    *t = stacked.narrow(0, row, n);
    row += n;
  }
  return stacked;
}

// Whether `part` is the view of rows [row, row + part.size(0)) of `stacked`.
bool is_rows_of(const torch::Tensor& part, const torch::Tensor& stacked, int64_t row) {
  if (!part.defined() || !stacked.defined() || !part.is_contiguous() || part.dim() != stacked.dim())
    return false;
  const int64_t row_elems = stacked.dim() == 2 ? stacked.size(1) : 1;
  return part.data_ptr() ==
         static_cast<const char*>(stacked.data_ptr()) + row * row_elems * stacked.element_size();
}

// `parts` (contiguous, same dtype and columns) when they lie one after another in memory, as
// one tensor of their rows over that memory; undefined when they do not.
torch::Tensor rows_in_place(const std::vector<const torch::Tensor*>& parts) {
  const torch::Tensor& first = *parts.front();
  const int64_t row_elems = first.dim() == 2 ? first.size(1) : 1;
  int64_t rows = 0;
  for (const torch::Tensor* t : parts) {
    if (!t->defined() || !t->is_contiguous() || t->dim() != first.dim() ||
        t->scalar_type() != first.scalar_type() || (t->dim() == 2 && t->size(1) != first.size(1)) ||
        t->data_ptr() != static_cast<const char*>(first.data_ptr()) + rows * row_elems * first.element_size())
      return {};
    rows += t->size(0);
  }
  std::vector<int64_t> sizes = first.sizes().vec();
  sizes[0] = rows;
  return first.as_strided(sizes, first.strides(), first.storage_offset());
}

}  // namespace

std::vector<size_t> DecoderModel::merged_order() const {
  const size_t n = params_.size();
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of(n, -1);
  const auto add = [&](std::vector<int> g) {
    for (int i : g) group_of[static_cast<size_t>(i)] = static_cast<int>(groups.size());
    groups.push_back(std::move(g));
  };
  for (const LayerParams& lp : layers_) {  // the groups merge_projections stacks
    if ((lp.q_b >= 0) == (lp.k_b >= 0) && (lp.k_b >= 0) == (lp.v_b >= 0)) {
      add({lp.q_w, lp.k_w, lp.v_w});
      if (lp.q_b >= 0) add({lp.q_b, lp.k_b, lp.v_b});
    }
    if ((lp.gate_b >= 0) == (lp.up_b >= 0)) {
      add({lp.gate_w, lp.up_w});
      if (lp.gate_b >= 0) add({lp.gate_b, lp.up_b});
    }
  }
  std::vector<size_t> order;
  std::vector<char> done(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (done[i] != 0) continue;
    if (group_of[i] < 0) {
      order.push_back(i), done[i] = 1;
      continue;
    }
    for (int j : groups[static_cast<size_t>(group_of[i])])
      order.push_back(static_cast<size_t>(j)), done[static_cast<size_t>(j)] = 1;
  }
  return order;
}

std::shared_ptr<DecoderModel> DecoderModel::with_serving_parameters(
    std::vector<torch::Tensor> tensors) const {
  std::shared_ptr<DecoderModel> model = with_parameters(std::move(tensors));
  model->merged_.assign(layers_.size(), Merged{});
  const auto p = [&](int i) { return &model->params_[static_cast<size_t>(i)].second; };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerParams& lp = layers_[l];
    Merged& m = model->merged_[l];
    if ((lp.q_b >= 0) == (lp.k_b >= 0) && (lp.k_b >= 0) == (lp.v_b >= 0)) {
      m.qkv_w = rows_in_place({p(lp.q_w), p(lp.k_w), p(lp.v_w)});
      if (m.qkv_w.defined() && lp.q_b >= 0) {
        m.qkv_b = rows_in_place({p(lp.q_b), p(lp.k_b), p(lp.v_b)});
        if (!m.qkv_b.defined()) m.qkv_w = torch::Tensor();  // weights and biases merge together or not at all
      }
    }
    if ((lp.gate_b >= 0) == (lp.up_b >= 0)) {
      m.gate_up_w = rows_in_place({p(lp.gate_w), p(lp.up_w)});
      if (m.gate_up_w.defined() && lp.gate_b >= 0) {
        m.gate_up_b = rows_in_place({p(lp.gate_b), p(lp.up_b)});
        if (!m.gate_up_b.defined()) m.gate_up_w = torch::Tensor();
      }
    }
  }
  return model;
}

void DecoderModel::merge_projections() {
  torch::NoGradGuard no_grad;
  merged_.assign(layers_.size(), Merged{});
  auto param = [&](int i) { return &params_[static_cast<size_t>(i)].second; };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerParams& lp = layers_[l];
    Merged& m = merged_[l];
    // Biases are merged with their weights, so only when all of a group have one or none do.
    if ((lp.q_b >= 0) == (lp.k_b >= 0) && (lp.k_b >= 0) == (lp.v_b >= 0)) {
      m.qkv_w = stack_rows({param(lp.q_w), param(lp.k_w), param(lp.v_w)});
      if (lp.q_b >= 0) m.qkv_b = stack_rows({param(lp.q_b), param(lp.k_b), param(lp.v_b)});
    }
    if ((lp.gate_b >= 0) == (lp.up_b >= 0)) {
      m.gate_up_w = stack_rows({param(lp.gate_w), param(lp.up_w)});
      if (lp.gate_b >= 0) m.gate_up_b = stack_rows({param(lp.gate_b), param(lp.up_b)});
    }
  }
}

bool DecoderModel::qkv_merged(size_t l) const {
  if (l >= merged_.size() || !merged_[l].qkv_w.defined()) return false;
  const LayerParams& lp = layers_[l];
  const Merged& m = merged_[l];
  const int64_t q = p(lp.q_w).size(0), k = p(lp.k_w).size(0);
  if (!is_rows_of(p(lp.q_w), m.qkv_w, 0) || !is_rows_of(p(lp.k_w), m.qkv_w, q) ||
      !is_rows_of(p(lp.v_w), m.qkv_w, q + k))
    return false;
  return !m.qkv_b.defined() || (is_rows_of(p(lp.q_b), m.qkv_b, 0) && is_rows_of(p(lp.k_b), m.qkv_b, q) &&
                                is_rows_of(p(lp.v_b), m.qkv_b, q + k));
}

bool DecoderModel::gate_up_merged(size_t l) const {
  if (l >= merged_.size() || !merged_[l].gate_up_w.defined()) return false;
  const LayerParams& lp = layers_[l];
  const Merged& m = merged_[l];
  const int64_t g = p(lp.gate_w).size(0);
  if (!is_rows_of(p(lp.gate_w), m.gate_up_w, 0) || !is_rows_of(p(lp.up_w), m.gate_up_w, g)) return false;
  return !m.gate_up_b.defined() ||
         (is_rows_of(p(lp.gate_b), m.gate_up_b, 0) && is_rows_of(p(lp.up_b), m.gate_up_b, g));
}

const torch::Tensor& DecoderModel::parameter(const std::string& name) const {
  for (const auto& [n, t] : params_) {
    if (n == name) return t;
  }
  throw SwarmError(ErrorKind::NOT_FOUND, "model has no parameter '" + name + "'");
}

std::shared_ptr<DecoderModel> DecoderModel::with_parameters(std::vector<torch::Tensor> tensors,
                                                            std::optional<DType> compute) const {
  SWARM_REQUIRE(tensors.size() == params_.size(), ErrorKind::INVALID_ARGUMENT,
                "with_parameters: " + std::to_string(tensors.size()) + " tensors for " +
                    std::to_string(params_.size()) + " parameters");
  const DType dtype = compute.value_or(compute_);
  auto model = std::make_shared<DecoderModel>(Private{}, config_, dtype, device_);
  model->params_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, mine] = params_[i];
    const torch::Tensor& t = tensors[i];
    SWARM_REQUIRE(
        t.defined() && t.sizes() == mine.sizes() && t.scalar_type() == model->scalar_type_ &&
            t.device() == mine.device(),
        ErrorKind::INVALID_ARGUMENT,
        "with_parameters: tensor for '" + name + "' does not match the parameter's shape, dtype or device");
    model->params_.emplace_back(name, t);
  }
  model->layers_ = layers_;
  model->embed_ = embed_;
  model->final_norm_ = final_norm_;
  model->head_ = head_;
  model->cos_f32_ = cos_f32_;
  model->sin_f32_ = sin_f32_;
  model->cos_ = dtype == compute_ ? cos_ : cos_f32_.to(cos_.options().dtype(model->scalar_type_));
  model->sin_ = dtype == compute_ ? sin_ : sin_f32_.to(sin_.options().dtype(model->scalar_type_));
  return model;
}

void DecoderModel::build_rope_tables() {
  // In fp32, step for step as transformers' rotary embeddings compute inv_freq and the angles
  // (the tables then agree to the last bits at long positions, where a double computation would
  // differ by ~1e-3).
  const int64_t hd = config_.head_dim;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  // A Python `scalar / tensor` is reciprocal(tensor) * scalar, which rounds differently from a
  // division: written the same way here.
  torch::Tensor inv =
      at::pow(config_.rope_theta,
              torch::arange(0, hd, 2, torch::TensorOptions().dtype(torch::kLong)).to(torch::kFloat) /
                  static_cast<double>(hd))
          .reciprocal();
  const RopeScaling& rs = config_.rope_scaling;
  switch (rs.type) {
    case RopeScalingType::NONE:
      break;
    case RopeScalingType::LINEAR:
      inv = inv / rs.factor;
      break;
    case RopeScalingType::LLAMA3: {
      const double old = static_cast<double>(rs.original_max_position_embeddings);
      const double lo_wavelen = old / rs.low_freq_factor;
      const double hi_wavelen = old / rs.high_freq_factor;
      const torch::Tensor wavelen = inv.reciprocal() * (2 * std::numbers::pi);
      // Long wavelengths are slowed down by `factor`, short ones kept, the band between blended.
      const torch::Tensor scaled = at::where(wavelen > lo_wavelen, inv / rs.factor, inv);
      const torch::Tensor smooth =
          (wavelen.reciprocal() * old - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      const torch::Tensor mid = (1 - smooth) * scaled / rs.factor + smooth * scaled;
      const torch::Tensor is_mid = (wavelen >= hi_wavelen).logical_and(wavelen <= lo_wavelen);
      inv = at::where(is_mid, mid, scaled);
      break;
    }
    case RopeScalingType::DYNAMIC:
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, "rope_scaling type 'dynamic' is not supported yet");
  }
  const torch::Tensor angle =
      torch::arange(config_.max_position_embeddings, f32).unsqueeze(1) * inv.unsqueeze(0);  // [P, hd/2]
  const torch::Tensor full = at::cat({angle, angle}, -1);
  cos_f32_ = at::cos(full);
  sin_f32_ = at::sin(full);
  cos_ = cos_f32_.to(torch::TensorOptions().dtype(scalar_type_).device(device_));
  sin_ = sin_f32_.to(torch::TensorOptions().dtype(scalar_type_).device(device_));
}

// ---------------------------------------------------------------- building blocks

torch::Tensor DecoderModel::rms_norm(const torch::Tensor& x, const torch::Tensor& weight) const {
  // The statistics in fp32 whatever the compute dtype; the scale in the compute dtype.
  const torch::Tensor xf = x.to(torch::kFloat);
  const torch::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + config_.rms_norm_eps);
  return y.to(x.scalar_type()) * weight;
}

torch::Tensor DecoderModel::serving_rms_norm(const torch::Tensor& x, const torch::Tensor& weight,
                                             const torch::Tensor& out) const {
  if (device_.is_cpu() && x.dim() == 2 && x.is_contiguous())
    return rms_norm_rows(x, weight, config_.rms_norm_eps, out);
  return rms_norm(x, weight);
}

torch::Tensor DecoderModel::serving_add_rms_norm(torch::Tensor& x, const torch::Tensor& delta,
                                                 const torch::Tensor& weight,
                                                 const torch::Tensor& out) const {
  if (device_.is_cpu() && x.dim() == 2 && x.is_contiguous() && delta.is_contiguous()) {
    return add_rms_norm_rows(x, delta, weight, config_.rms_norm_eps, out);
  }
  x.add_(delta);
  return serving_rms_norm(x, weight, out);
}

torch::Tensor DecoderModel::apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                                       const torch::Tensor& sin) const {
  return x * cos + rotate_half(x) * sin;
}

// q [b, nq, heads, hd], k/v [b, L, kv_heads, hd], blocked [b, nq, L] -> [b, nq, heads * hd].
// GQA without copying K/V: query head h uses kv head h / rep, so the query heads of one kv head
// are folded into the query dimension and the matmul broadcasts over them.
torch::Tensor DecoderModel::attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const torch::Tensor& blocked) const {
  const int64_t b = q.size(0), nq = q.size(1), hd = config_.head_dim;
  const int64_t kvh = config_.num_key_value_heads, rep = config_.num_attention_heads / kvh, L = k.size(1);
  const torch::Tensor qg =
      q.reshape({b, nq, kvh, rep, hd}).permute({0, 2, 3, 1, 4}).reshape({b, kvh, rep * nq, hd});
  const torch::Tensor kt = k.permute({0, 2, 3, 1});  // [b, kv, hd, L]
  // Scores and softmax in fp32 (a no-op cast in fp32 mode). The 1/sqrt(head_dim) scale goes on
  // q, not on the scores: a pass over [.., nq, hd] instead of [.., nq, L] (forward and backward);
  // exactly the same numbers when head_dim is a power of 4 (64: the scale is 1/8).
  const torch::Tensor qs = qg.to(torch::kFloat) * (1.0 / std::sqrt(static_cast<double>(hd)));
  torch::Tensor scores = model_matmul(qs, kt.to(torch::kFloat));
  scores = scores.view({b, kvh, rep, nq, L}).masked_fill(blocked.reshape({b, 1, 1, nq, L}), kNegInf);
  const torch::Tensor probs = at::softmax(scores, -1).to(q.scalar_type()).view({b, kvh, rep * nq, L});
  const torch::Tensor out = model_matmul(probs, v.permute({0, 2, 1, 3}));  // [b, kv, rep*nq, hd]
  return out.view({b, kvh, rep, nq, hd}).permute({0, 3, 1, 2, 4}).reshape({b, nq, kvh * rep * hd});
}

torch::Tensor DecoderModel::serving_linear(const torch::Tensor& x, const torch::Tensor& w,
                                           const torch::Tensor& b, bool float_out,
                                           const torch::Tensor& out) const {
  // Decode steps have a handful of rows: stream the weights once instead of a GEMM (faster than
  // OpenBLAS up to 8 rows in fp32, 32 with AVX2 but not AVX-512; in bf16 up to 384 rows on CPUs
  // with AVX512_BF16, 64 with AVX2: small_linear_max_rows).
  const c10::optional<torch::Tensor> bias = b.defined() ? c10::optional<torch::Tensor>(b) : c10::nullopt;
  if (device_.is_cpu() && x.dim() == 2 && x.size(0) <= small_linear_max_rows(scalar_type_)) {
    return small_linear(x, w, bias, float_out, out);
  }
  if (widens(x)) return widening_linear(x, w, b, float_out);  // no bf16 dot products: fp32 GEMM
  if (splits(x)) return split_linear(x, w, b);                // fp32: float_out is the result itself
  const torch::Tensor y = at::linear(x, w, bias);
  return float_out ? y.to(torch::kFloat) : y;
}

torch::Tensor DecoderModel::proj(const torch::Tensor& x, int w, int b, bool serving,
                                 const torch::Tensor& out) const {
  if (serving) return serving_linear(x, p(w), b < 0 ? torch::Tensor() : p(b), false, out);
  return model_linear(x, p(w), bias(b));
}

torch::Tensor DecoderModel::mlp(const LayerParams& layer, const torch::Tensor& x, bool serving) const {
  const torch::Tensor gate = proj(x, layer.gate_w, layer.gate_b, serving);
  const torch::Tensor up = proj(x, layer.up_w, layer.up_b, serving);
  return proj(at::silu(gate) * up, layer.down_w, layer.down_b, serving);
}

torch::Tensor DecoderModel::serving_mlp(size_t l, const torch::Tensor& x, const torch::Tensor& act_out,
                                        const torch::Tensor& out) const {
  const LayerParams& layer = layers_[l];
  if (!gate_up_merged(l)) return mlp(layer, x, true);
  const Merged& m = merged_[l];
  const int64_t inter = p(layer.gate_w).size(0);
  if (device_.is_cpu() && x.dim() == 2 && x.size(0) <= small_linear_max_rows(scalar_type_)) {
    // The activation as the projection's results leave the kernel.
    const c10::optional<torch::Tensor> b =
        m.gate_up_b.defined() ? c10::optional<torch::Tensor>(m.gate_up_b) : c10::nullopt;
    const torch::Tensor act = small_linear_silu_mul(x, m.gate_up_w, b, act_out);
    return proj(act, layer.down_w, layer.down_b, true, out);
  }
  const torch::Tensor both = serving_linear(x, m.gate_up_w, m.gate_up_b);  // [N, 2 * inter]
  const torch::Tensor act = device_.is_cpu()
                                ? silu_mul(both)  // one fused pass
                                : at::silu(both.narrow(1, 0, inter)) * both.narrow(1, inter, inter);
  return proj(act, layer.down_w, layer.down_b, true);
}

torch::Tensor DecoderModel::logits(const torch::Tensor& x) const {
  return proj(rms_norm(x, p(final_norm_)), head_, -1, /*serving=*/false).to(torch::kFloat);
}

// ---------------------------------------------------------------- full forward (training)

torch::Tensor DecoderModel::forward_full(const torch::Tensor& input_ids, const torch::Tensor& lengths) const {
  return logits(final_hidden(input_ids, lengths));
}

torch::Tensor DecoderModel::head_logits(const torch::Tensor& hidden) const { return logits(hidden); }

torch::Tensor DecoderModel::final_norm(const torch::Tensor& hidden) const {
  return rms_norm(hidden, p(final_norm_));
}

torch::Tensor DecoderModel::final_hidden(const torch::Tensor& input_ids, const torch::Tensor& lengths) const {
  SWARM_REQUIRE(input_ids.dim() == 2, ErrorKind::INVALID_ARGUMENT,
                "forward_full: input_ids must be [B, T], got " + shape_str(input_ids.sizes()));
  SWARM_REQUIRE(lengths.dim() == 1 && lengths.size(0) == input_ids.size(0), ErrorKind::INVALID_ARGUMENT,
                "forward_full: lengths must be [B], got " + shape_str(lengths.sizes()));
  return final_hidden(padded_tokens(input_ids, lengths), TrainingForward{TrainingAttention::EAGER, false});
}

TrainingTokens padded_tokens(const torch::Tensor& ids, const torch::Tensor& lengths) {
  const torch::Tensor lens = lengths.to(torch::kCPU, torch::kLong).contiguous();
  return TrainingTokens{
      ids, std::vector<int64_t>(lens.data_ptr<int64_t>(), lens.data_ptr<int64_t>() + lens.numel()),
      /*packed=*/false};
}

// One decoder layer recomputed in the backward (activation checkpointing): the forward runs the
// layer without autograd and keeps only its input; the backward runs it again under autograd
// from that input and back-propagates through it, which accumulates the parameters' gradients
// into their leaves (as the unchecked graph's backward does) and returns the input's. The same
// ops on the same values: the same gradients, bit for bit. What the layer needs is kept in the
// node (the layout's tensors and integers) and the model by address: DecoderModel::final_hidden
// requires it to outlive the backward.
struct CheckpointedDecoderLayer : public torch::autograd::Function<CheckpointedDecoderLayer> {
  struct Call {
    const DecoderModel* model = nullptr;
    size_t layer = 0;
    const DecoderModel::TrainingLayout* layout = nullptr;
  };

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const Call& call) {
    const DecoderModel::TrainingLayout& lay = *call.layout;
    ctx->save_for_backward({x});
    ctx->saved_data["model"] = reinterpret_cast<int64_t>(call.model);
    ctx->saved_data["layer"] = static_cast<int64_t>(call.layer);
    ctx->saved_data["rows"] = lay.rows;
    ctx->saved_data["cols"] = lay.cols;
    ctx->saved_data["attention"] = static_cast<int64_t>(lay.attention);
    ctx->saved_data["block"] = lay.block;
    ctx->saved_data["cu_seqlens"] = lay.cu_seqlens;
    ctx->saved_data["cos"] = lay.cos;
    ctx->saved_data["sin"] = lay.sin;
    if (lay.blocked.defined()) ctx->saved_data["blocked"] = lay.blocked;
    if (lay.blocked_windowed.defined()) ctx->saved_data["blocked_windowed"] = lay.blocked_windowed;
    return {call.model->training_layer(call.layer, x, lay)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const auto* model = reinterpret_cast<const DecoderModel*>(ctx->saved_data["model"].toInt());
    DecoderModel::TrainingLayout lay;
    lay.rows = ctx->saved_data["rows"].toInt();
    lay.cols = ctx->saved_data["cols"].toInt();
    lay.attention = static_cast<DecoderModel::TrainingLayout::Kernel>(ctx->saved_data["attention"].toInt());
    lay.block = ctx->saved_data["block"].toInt();
    lay.cu_seqlens = ctx->saved_data["cu_seqlens"].toIntVector();
    lay.cos = ctx->saved_data["cos"].toTensor();
    lay.sin = ctx->saved_data["sin"].toTensor();
    if (ctx->saved_data.count("blocked")) lay.blocked = ctx->saved_data["blocked"].toTensor();
    if (ctx->saved_data.count("blocked_windowed"))
      lay.blocked_windowed = ctx->saved_data["blocked_windowed"].toTensor();
    torch::Tensor input = x.detach().requires_grad_(x.requires_grad());
    torch::Tensor out;
    {
      torch::AutoGradMode grad_on(true);
      out = model->training_layer(static_cast<size_t>(ctx->saved_data["layer"].toInt()), input, lay);
    }
    torch::Tensor g = grads[0];
    if (!g.defined()) g = torch::zeros_like(out);
    torch::autograd::backward({out}, {g});
    return {input.requires_grad() ? input.grad() : torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor DecoderModel::final_hidden(const TrainingTokens& tokens, const TrainingForward& how) const {
  const torch::Tensor& input_ids = tokens.ids;
  const int64_t hd = config_.head_dim;
  TrainingLayout lay;
  torch::Tensor ids;
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  std::vector<int64_t> positions;  // packed: each token's position within its sample
  if (tokens.packed) {
    SWARM_REQUIRE(input_ids.dim() == 1, ErrorKind::INVALID_ARGUMENT,
                  "final_hidden: packed ids must be [N], got " + shape_str(input_ids.sizes()));
    lay.rows = 1;
    lay.cols = input_ids.size(0);
    lay.cu_seqlens.push_back(0);
    for (int64_t n : tokens.lengths) {
      SWARM_REQUIRE(n >= 1 && n <= config_.max_position_embeddings, ErrorKind::INVALID_ARGUMENT,
                    "final_hidden: a packed sample has " + std::to_string(n) +
                        " tokens (1 to max_position_embeddings " +
                        std::to_string(config_.max_position_embeddings) + ")");
      for (int64_t t = 0; t < n; ++t) positions.push_back(t);
      lay.cu_seqlens.push_back(lay.cu_seqlens.back() + n);
    }
    SWARM_REQUIRE(lay.cu_seqlens.back() == lay.cols, ErrorKind::INVALID_ARGUMENT,
                  "final_hidden: the packed lengths sum to " + std::to_string(lay.cu_seqlens.back()) +
                      ", the ids hold " + std::to_string(lay.cols));
    ids = input_ids.to(device_, torch::kLong).view({1, lay.cols});
  } else {
    SWARM_REQUIRE(input_ids.dim() == 2, ErrorKind::INVALID_ARGUMENT,
                  "forward_full: input_ids must be [B, T], got " + shape_str(input_ids.sizes()));
    lay.rows = input_ids.size(0);
    lay.cols = input_ids.size(1);
    SWARM_REQUIRE(static_cast<int64_t>(tokens.lengths.size()) == lay.rows, ErrorKind::INVALID_ARGUMENT,
                  "forward_full: lengths must be [B]: " + std::to_string(tokens.lengths.size()) + " for " +
                      std::to_string(lay.rows) + " rows");
    SWARM_REQUIRE(lay.cols <= config_.max_position_embeddings, ErrorKind::INVALID_ARGUMENT,
                  "forward_full: " + std::to_string(lay.cols) + " positions exceed max_position_embeddings " +
                      std::to_string(config_.max_position_embeddings));
    // Rows attend within themselves; a padded query may attend to the padding before it (its
    // output is never read), a real query never does: padding only follows it.
    for (int64_t r = 0; r <= lay.rows; ++r) lay.cu_seqlens.push_back(r * lay.cols);
    ids = input_ids.to(device_, torch::kLong);
  }
  const int64_t B = lay.rows, T = lay.cols;

  // The attention: eager as asked; scaled_dot_product_attention on a GPU with libtorch 2.x
  // (auto); the blockwise kernel otherwise (its windowed layers, too).
  lay.attention = how.attention == TrainingAttention::EAGER ? TrainingLayout::Kernel::EAGER
                                                            : TrainingLayout::Kernel::BLOCKWISE;
  lay.block = how.attention_block > 0 ? how.attention_block : kAttentionBlock;
#if TORCH_VERSION_MAJOR >= 2
  if (how.attention == TrainingAttention::AUTO && device_.is_cuda())
    lay.attention = TrainingLayout::Kernel::SDPA;
#endif
  if (lay.attention == TrainingLayout::Kernel::EAGER) {
    // blocked[b, i, j]: key j is in the future, or padding, or another sample's. A padded query
    // may always see itself, so no softmax row is empty (finite logits, clean gradients).
    const torch::Tensor i = torch::arange(T, long_opts).view({1, T, 1});
    const torch::Tensor j = torch::arange(T, long_opts).view({1, 1, T});
    torch::Tensor allowed;
    torch::Tensor qpos = i, kpos = j;  // positions within the sample (windows)
    if (tokens.packed) {
      std::vector<int64_t> sample;
      for (size_t s = 0; s < tokens.lengths.size(); ++s)
        sample.insert(sample.end(), static_cast<size_t>(tokens.lengths[s]), static_cast<int64_t>(s));
      const torch::Tensor seg = torch::tensor(sample, torch::kLong).to(device_);
      allowed = (j <= i).logical_and(seg.view({1, 1, T}) == seg.view({1, T, 1}));
    } else {
      const torch::Tensor lens = torch::tensor(tokens.lengths, torch::kLong).to(device_);
      allowed = (j <= i).logical_and((j < lens.view({B, 1, 1})).logical_or(j == i));
    }
    lay.blocked = allowed.logical_not().expand({B, T, T});
    // Windowed layers also block keys `window` or more positions back (never the query itself).
    // Within one sample the distance of two packed tokens is their distance in the row.
    if (config_.any_layer_windowed()) {
      lay.blocked_windowed =
          allowed.logical_and((qpos - kpos) < *config_.sliding_window).logical_not().expand({B, T, T});
    }
  }

  if (tokens.packed) {
    const torch::Tensor pos = torch::tensor(positions, torch::kLong).to(device_);
    lay.cos = cos_.index_select(0, pos).view({1, T, 1, hd});
    lay.sin = sin_.index_select(0, pos).view({1, T, 1, hd});
  } else {
    lay.cos = cos_.narrow(0, 0, T).view({1, T, 1, hd});
    lay.sin = sin_.narrow(0, 0, T).view({1, T, 1, hd});
  }

  torch::Tensor x = at::embedding(p(embed_), ids);  // [B, T, H]
  const bool checkpoint = how.checkpoint_layers && torch::GradMode::is_enabled();
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (checkpoint && x.requires_grad()) {
      x = CheckpointedDecoderLayer::apply(x, CheckpointedDecoderLayer::Call{this, l, &lay})[0];
    } else {
      x = training_layer(l, x, lay);
    }
  }
  return tokens.packed ? x.view({T, x.size(-1)}) : x;
}

torch::Tensor DecoderModel::training_layer(size_t l, const torch::Tensor& x,
                                           const TrainingLayout& lay) const {
  const int64_t nh = config_.num_attention_heads, kvh = config_.num_key_value_heads, hd = config_.head_dim;
  const int64_t B = lay.rows, T = lay.cols;
  const LayerParams& layer = layers_[l];
  const torch::Tensor h = rms_norm(x, p(layer.in_norm));
  torch::Tensor q = model_linear(h, p(layer.q_w), bias(layer.q_b)).view({B, T, nh, hd});
  torch::Tensor k = model_linear(h, p(layer.k_w), bias(layer.k_b)).view({B, T, kvh, hd});
  const torch::Tensor v = model_linear(h, p(layer.v_w), bias(layer.v_b)).view({B, T, kvh, hd});
  if (layer.q_norm >= 0) {
    q = rms_norm(q, p(layer.q_norm));
    k = rms_norm(k, p(layer.k_norm));
  }
  q = apply_rope(q, lay.cos, lay.sin);
  k = apply_rope(k, lay.cos, lay.sin);
  const torch::Tensor o = training_attention(l, q, k, v, lay);
  torch::Tensor y = x + model_linear(o, p(layer.o_w), bias(layer.o_b));
  return y + mlp(layer, rms_norm(y, p(layer.post_norm)));
}

torch::Tensor DecoderModel::training_attention(size_t l, const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& v, const TrainingLayout& lay) const {
  const int64_t nh = config_.num_attention_heads, kvh = config_.num_key_value_heads, hd = config_.head_dim;
  const int64_t B = lay.rows, T = lay.cols;
  const bool windowed = config_.layer_window(static_cast<int64_t>(l)).has_value();
  if (lay.attention == TrainingLayout::Kernel::EAGER)
    return attend(q, k, v, windowed ? lay.blocked_windowed : lay.blocked);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
#if TORCH_VERSION_MAJOR >= 2
  if (lay.attention == TrainingLayout::Kernel::SDPA && !windowed) {
    // scaled_dot_product_attention per sample (its causal mask is the sample's own, so the
    // flash and memory-efficient backends apply), the kv heads repeated for GQA.
    const int64_t rep = nh / kvh;
    const torch::Tensor qf = q.reshape({B * T, nh, hd}), kf = k.reshape({B * T, kvh, hd}),
                        vf = v.reshape({B * T, kvh, hd});
    std::vector<torch::Tensor> parts;
    for (size_t s = 0; s + 1 < lay.cu_seqlens.size(); ++s) {
      const int64_t s0 = lay.cu_seqlens[s], n = lay.cu_seqlens[s + 1] - s0;
      const torch::Tensor qs = qf.narrow(0, s0, n).transpose(0, 1).unsqueeze(0);  // [1, nh, n, hd]
      torch::Tensor ks = kf.narrow(0, s0, n).transpose(0, 1), vs = vf.narrow(0, s0, n).transpose(0, 1);
      if (rep > 1) ks = ks.repeat_interleave(rep, 0), vs = vs.repeat_interleave(rep, 0);
      const torch::Tensor o = at::scaled_dot_product_attention(qs, ks.unsqueeze(0), vs.unsqueeze(0), {}, 0.0,
                                                               /*is_causal=*/true);
      parts.push_back(o.squeeze(0).transpose(0, 1));  // [n, nh, hd]
    }
    return torch::cat(parts, 0).reshape({B, T, nh * hd});
  }
#endif
  const int64_t window = windowed ? *config_.layer_window(static_cast<int64_t>(l)) : 0;
  return blockwise_attention(q.reshape({B * T, nh, hd}), k.reshape({B * T, kvh, hd}),
                             v.reshape({B * T, kvh, hd}), lay.cu_seqlens, window, scale, lay.block)
      .view({B, T, nh * hd});
}

// ---------------------------------------------------------------- packed step (serving)

torch::Tensor DecoderModel::forward_step(const std::vector<StepInput>& seqs, KvCache& cache,
                                         bool all_logits) const {
  c10::InferenceMode inference_mode;
  SWARM_REQUIRE(!seqs.empty(), ErrorKind::INVALID_ARGUMENT, "forward_step: no sequences");
  SWARM_CHECK(cache.num_layers() == config_.num_hidden_layers &&
                  cache.num_kv_heads() == config_.num_key_value_heads && cache.head_dim() == config_.head_dim,
              "forward_step: the KV cache is shaped for another model");
  SWARM_CHECK(cache.dtype() == scalar_type_ && cache.device() == device_,
              "forward_step: the KV cache's dtype/device differ from the model's");
  const int64_t nh = config_.num_attention_heads, kvh = config_.num_key_value_heads, hd = config_.head_dim;
  const bool windowed = config_.any_layer_windowed();
  const int64_t window = config_.sliding_window.value_or(std::numeric_limits<int64_t>::max());
  const BlockAllocator& blocks = cache.allocator();

  // Decode sequences first (one padded group), then each prefill sequence as its own group;
  // `order` maps packed position -> index in `seqs`.
  std::vector<size_t> order;
  order.reserve(seqs.size());
  std::unordered_set<int64_t> slots_seen;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const StepInput& in = seqs[s];
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    SWARM_REQUIRE(n > 0, ErrorKind::INVALID_ARGUMENT, "forward_step: sequence with no new tokens");
    SWARM_REQUIRE(in.start_pos >= 0, ErrorKind::INVALID_ARGUMENT, "forward_step: negative start_pos");
    SWARM_REQUIRE(in.start_pos + n <= config_.max_position_embeddings, ErrorKind::INVALID_ARGUMENT,
                  "forward_step: " + std::to_string(in.start_pos + n) +
                      " positions exceed max_position_embeddings " +
                      std::to_string(config_.max_position_embeddings));
    SWARM_CHECK(in.start_pos + n <= blocks.capacity(in.seq_slot),
                "forward_step: sequence " + std::to_string(in.seq_slot) + " needs " +
                    std::to_string(in.start_pos + n) + " cached tokens but holds " +
                    std::to_string(blocks.capacity(in.seq_slot)) + " (call ensure_capacity first)");
    SWARM_CHECK(slots_seen.insert(in.seq_slot).second,
                "forward_step: sequence slot " + std::to_string(in.seq_slot) + " appears twice");
    for (int32_t t : in.tokens) {
      SWARM_REQUIRE(t >= 0 && t < config_.vocab_size, ErrorKind::INVALID_ARGUMENT,
                    "forward_step: token id " + std::to_string(t) + " out of range [0, " +
                        std::to_string(config_.vocab_size) + ")");
    }
    if (n == 1) order.push_back(s);
  }
  const size_t num_decode = order.size();
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (seqs[s].tokens.size() > 1) order.push_back(s);
  }

  std::vector<int64_t> ids, positions, write_rows;
  std::vector<int64_t> row_of_seq(seqs.size());  // first packed row of each sequence
  for (size_t s : order) {
    const StepInput& in = seqs[s];
    row_of_seq[s] = static_cast<int64_t>(ids.size());
    for (size_t t = 0; t < in.tokens.size(); ++t) {
      const int64_t pos = in.start_pos + static_cast<int64_t>(t);
      ids.push_back(in.tokens[t]);
      positions.push_back(pos);
      write_rows.push_back(blocks.slot_of(in.seq_slot, pos));
    }
  }
  const int64_t N = static_cast<int64_t>(ids.size());

  // At decode sizes on the CPU the step's activations go into buffers kept with the cache from
  // one step to the next: there an allocation and a free per op cost as much as a small
  // model's arithmetic. (Larger steps go through libtorch GEMMs, which allocate their results.)
  StepBuffers& kept = cache.step_buffers();
  const bool reuse = device_.is_cpu() && N <= small_linear_max_rows(scalar_type_);
  enum : size_t {
    kIds,
    kPositions,
    kWriteRows,
    kResidual,
    kNormed,
    kQkv,
    kQuery,
    kAttention,
    kProjected,
    kActivation,
    kNoBuffer
  };
  auto buffer = [&](size_t slot, std::initializer_list<int64_t> sizes, c10::ScalarType dtype) {
    return reuse && slot != kNoBuffer ? kept.get(slot, sizes, dtype, device_) : torch::Tensor();
  };
  const c10::ScalarType st = scalar_type_;
  auto to_device = [&](std::vector<int64_t>& v, size_t slot = kNoBuffer) {
    const int64_t n = static_cast<int64_t>(v.size());
    if (device_.is_cpu()) {  // a memcpy into a buffer or one allocation, no dispatch of a copy op
      torch::Tensor t = buffer(slot, {n}, torch::kLong);
      if (!t.defined()) t = torch::empty({n}, torch::kLong);
      std::memcpy(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
      return t;
    }
    return torch::from_blob(v.data(), {n}, torch::kLong)
        .to(device_, torch::kLong, /*non_blocking=*/false, /*copy=*/true);
  };

  // Attention groups: which cache rows each attends over, and its mask.
  std::vector<AttentionGroup> groups;
  auto make_group = [&](size_t first, size_t last) {  // packed sequences [first, last)
    AttentionGroup g;
    g.row_begin = row_of_seq[order[first]];
    g.batch = static_cast<int64_t>(last - first);
    g.queries = static_cast<int64_t>(seqs[order[first]].tokens.size());
    for (size_t k = first; k < last; ++k) {
      const StepInput& in = seqs[order[k]];
      g.keys = std::max(g.keys, in.start_pos + static_cast<int64_t>(in.tokens.size()));
    }
    std::vector<int64_t> gather(static_cast<size_t>(g.batch * g.keys));
    std::vector<uint8_t> blocked(static_cast<size_t>(g.batch * g.queries * g.keys), 1);
    std::vector<uint8_t> blocked_windowed;
    if (windowed) blocked_windowed.assign(blocked.size(), 1);
    for (size_t k = first; k < last; ++k) {
      const StepInput& in = seqs[order[k]];
      const int64_t b = static_cast<int64_t>(k - first);
      const int64_t len = in.start_pos + static_cast<int64_t>(in.tokens.size());
      // Padding keys read the sequence's own first row (written, finite) and are masked.
      for (int64_t j = 0; j < g.keys; ++j) {
        gather[static_cast<size_t>(b * g.keys + j)] = blocks.slot_of(in.seq_slot, j < len ? j : 0);
      }
      for (int64_t qi = 0; qi < g.queries; ++qi) {
        const int64_t qpos = in.start_pos + qi;
        for (int64_t j = 0; j <= qpos; ++j) {
          const size_t at = static_cast<size_t>((b * g.queries + qi) * g.keys + j);
          blocked[at] = 0;
          if (windowed && qpos - j < window) blocked_windowed[at] = 0;
        }
      }
    }
    g.gather = to_device(gather);
    g.blocked = torch::from_blob(blocked.data(), {g.batch, g.queries, g.keys}, torch::kByte)
                    .to(device_, torch::kBool, /*non_blocking=*/false, /*copy=*/true);
    if (windowed) {
      g.blocked_windowed =
          torch::from_blob(blocked_windowed.data(), {g.batch, g.queries, g.keys}, torch::kByte)
              .to(device_, torch::kBool, /*non_blocking=*/false, /*copy=*/true);
    }
    groups.push_back(std::move(g));
  };
  if (device_.is_cpu()) {
    // On the CPU every new token is one query of the paged kernel, reading its sequence's keys
    // up to its own position straight out of the cache: decoding tokens and prompt chunks
    // alike, in one call, with no gathered context, no mask and no work above the diagonal.
    AttentionGroup g;
    g.batch = N;
    g.queries = 1;
    g.paged = true;
    g.context.table_offset.push_back(0);
    const bool shared_tables = N != static_cast<int64_t>(seqs.size());  // some sequence has several tokens
    for (size_t k = 0; k < order.size(); ++k) {
      const StepInput& in = seqs[order[k]];
      const std::vector<int64_t>& table = blocks.block_table(in.seq_slot);
      g.context.block_ids.insert(g.context.block_ids.end(), table.begin(), table.end());
      g.context.table_offset.push_back(static_cast<int64_t>(g.context.block_ids.size()));
      for (int64_t t = 0; t < static_cast<int64_t>(in.tokens.size()); ++t) {
        g.context.lengths.push_back(in.start_pos + t + 1);
        if (shared_tables) g.context.table_index.push_back(static_cast<int64_t>(k));
      }
    }
    groups.push_back(std::move(g));
  } else {
    if (num_decode > 0) make_group(0, num_decode);
    for (size_t k = num_decode; k < order.size(); ++k) make_group(k, k + 1);
  }

  const torch::Tensor ids_t = to_device(ids, kIds);
  const torch::Tensor pos_t = to_device(positions, kPositions);
  const torch::Tensor write_t = to_device(write_rows, kWriteRows);
  torch::Tensor cos, sin;  // the step's rows of the tables, for the unfused path
  auto rope_rows = [&] {
    if (!cos.defined()) {
      cos = cos_.index_select(0, pos_t).view({N, 1, hd});
      sin = sin_.index_select(0, pos_t).view({N, 1, hd});
    }
  };

  // The residual stream x, and h = the next norm of it: each residual add is fused with the
  // norm that follows it (the next layer's input norm, or the final norm).
  const torch::Tensor& embed = p(embed_);
  const int64_t H = embed.size(1);
  torch::Tensor x = buffer(kResidual, {N, H}, embed.scalar_type());  // [N, H], this step's own
  if (x.defined() && embed.is_contiguous()) {
    const size_t row_bytes = static_cast<size_t>(H) * embed.element_size();
    const auto* table = static_cast<const char*>(embed.data_ptr());
    auto* rows_out = static_cast<char*>(x.data_ptr());
    for (int64_t i = 0; i < N; ++i) {  // ids were checked against the vocabulary above
      std::memcpy(rows_out + static_cast<size_t>(i) * row_bytes,
                  table + static_cast<size_t>(ids[static_cast<size_t>(i)]) * row_bytes, row_bytes);
    }
  } else {
    x = at::embedding(embed, ids_t);
  }
  torch::Tensor h =
      serving_rms_norm(x, p(layers_.empty() ? final_norm_ : layers_[0].in_norm), buffer(kNormed, {N, H}, st));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerParams& layer = layers_[l];
    const int64_t l64 = static_cast<int64_t>(l);
    const bool layer_windowed = config_.layer_window(l64).has_value();
    const torch::Tensor k_rows = cache.keys(l64).view({-1, kvh, hd});
    const torch::Tensor v_rows = cache.values(l64).view({-1, kvh, hd});
    torch::Tensor q;
    if (qkv_merged(l) && layer.q_norm < 0 && device_.is_cpu()) {
      // One GEMM, then rotary embedding of q and k, and the new K/V into the cache, in one pass.
      const torch::Tensor qkv = serving_linear(h, merged_[l].qkv_w, merged_[l].qkv_b, false,
                                               buffer(kQkv, {N, merged_[l].qkv_w.size(0)}, st));
      q = rope_qkv_into_cache(qkv, nh, kvh, hd, cos_, sin_, pos_t, write_t, cache.keys(l64),
                              cache.values(l64), buffer(kQuery, {N, nh, hd}, st));
    } else {
      torch::Tensor k, v;
      if (qkv_merged(l)) {  // one GEMM, split into views: [N, (nh + 2 kvh) * hd]
        const torch::Tensor qkv = serving_linear(h, merged_[l].qkv_w, merged_[l].qkv_b);
        q = qkv.narrow(1, 0, nh * hd).view({N, nh, hd});
        k = qkv.narrow(1, nh * hd, kvh * hd).view({N, kvh, hd});
        v = qkv.narrow(1, (nh + kvh) * hd, kvh * hd).view({N, kvh, hd});
      } else {
        q = proj(h, layer.q_w, layer.q_b, true).view({N, nh, hd});
        k = proj(h, layer.k_w, layer.k_b, true).view({N, kvh, hd});
        v = proj(h, layer.v_w, layer.v_b, true).view({N, kvh, hd});
      }
      if (layer.q_norm >= 0) {
        q = rms_norm(q, p(layer.q_norm));
        k = rms_norm(k, p(layer.k_norm));
      }
      rope_rows();
      q = apply_rope(q, cos, sin);
      k = apply_rope(k, cos, sin);
      // New K/V into the cache first, so each group reads its whole context from one place.
      k_rows.index_copy_(0, write_t, k);
      v_rows.index_copy_(0, write_t, v);
    }

    std::vector<torch::Tensor> outs;
    outs.reserve(groups.size());
    for (const AttentionGroup& g : groups) {
      if (g.paged) {  // the CPU's one group: every row of the step
        outs.push_back(paged_decode_attention(q.contiguous(), cache.keys(l64), cache.values(l64), g.context,
                                              layer_windowed ? window : std::numeric_limits<int64_t>::max(),
                                              1.0 / std::sqrt(static_cast<double>(hd)),
                                              buffer(kAttention, {N, nh * hd}, st)));
        continue;
      }
      const torch::Tensor qg =
          q.narrow(0, g.row_begin, g.batch * g.queries).view({g.batch, g.queries, nh, hd});
      const torch::Tensor kg = k_rows.index_select(0, g.gather).view({g.batch, g.keys, kvh, hd});
      const torch::Tensor vg = v_rows.index_select(0, g.gather).view({g.batch, g.keys, kvh, hd});
      outs.push_back(attend(qg, kg, vg, layer_windowed ? g.blocked_windowed : g.blocked)
                         .view({g.batch * g.queries, nh * hd}));
    }
    const torch::Tensor o = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
    // h is spent (q, k, v are computed), so the norms take turns in its buffer; the o and down
    // projections share one (the first is added into x before the second is computed).
    const torch::Tensor attn_out = proj(o, layer.o_w, layer.o_b, true, buffer(kProjected, {N, H}, st));
    const torch::Tensor post =
        serving_add_rms_norm(x, attn_out, p(layer.post_norm), buffer(kNormed, {N, H}, st));
    const int64_t inter = p(layer.down_w).size(1);
    const torch::Tensor mlp_out =
        serving_mlp(l, post, buffer(kActivation, {N, inter}, st), buffer(kProjected, {N, H}, st));
    h = serving_add_rms_norm(x, mlp_out, p(l + 1 < layers_.size() ? layers_[l + 1].in_norm : final_norm_),
                             buffer(kNormed, {N, H}, st));
  }

  // Back to the caller's order: every new token, or the last one of each sequence.
  std::vector<int64_t> rows;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t n = static_cast<int64_t>(seqs[s].tokens.size());
    if (all_logits) {
      for (int64_t t = 0; t < n; ++t) rows.push_back(row_of_seq[s] + t);
    } else {
      rows.push_back(row_of_seq[s] + n - 1);
    }
  }
  bool identity = static_cast<int64_t>(rows.size()) == N;
  for (size_t r = 0; identity && r < rows.size(); ++r) identity = rows[r] == static_cast<int64_t>(r);
  // h is the final norm of every row: the LM head of the rows asked for.
  return serving_linear(identity ? h : h.index_select(0, to_device(rows)), p(head_), torch::Tensor(),
                        /*float_out=*/true);
}

}  // namespace swarm
