#include "anchor/ggml_kernels.hpp"

#include <ATen/ATen.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "common/torch_bench.hpp"
#include "kernels/cpu/paged_attention_torch.hpp"
#include "kernels/cpu/serving_ops_torch.hpp"
#include "kernels/cpu/small_linear_torch.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"

namespace swarm::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Every ggml function used here: member, symbol (types from the headers, as in llama_runner.cpp).
#define SWARM_GGML_FUNCTIONS(X)                              \
  X(init, ggml_init)                                         \
  X(free, ggml_free)                                         \
  X(tensor_overhead, ggml_tensor_overhead)                   \
  X(graph_overhead, ggml_graph_overhead)                     \
  X(new_tensor_1d, ggml_new_tensor_1d)                       \
  X(new_tensor_2d, ggml_new_tensor_2d)                       \
  X(new_tensor_3d, ggml_new_tensor_3d)                       \
  X(new_tensor_4d, ggml_new_tensor_4d)                       \
  X(rms_norm, ggml_rms_norm)                                 \
  X(mul, ggml_mul)                                           \
  X(mul_mat, ggml_mul_mat)                                   \
  X(swiglu_split, ggml_swiglu_split)                         \
  X(rope_ext, ggml_rope_ext)                                 \
  X(flash_attn_ext, ggml_flash_attn_ext)                     \
  X(new_graph, ggml_new_graph)                               \
  X(build_forward_expand, ggml_build_forward_expand)         \
  X(alloc_ctx_tensors, ggml_backend_alloc_ctx_tensors)       \
  X(buffer_free, ggml_backend_buffer_free)                   \
  X(tensor_set, ggml_backend_tensor_set)                     \
  X(graph_compute, ggml_backend_graph_compute)               \
  X(dev_by_type, ggml_backend_dev_by_type)                   \
  X(dev_init, ggml_backend_dev_init)                         \
  X(dev_backend_reg, ggml_backend_dev_backend_reg)           \
  X(reg_get_proc_address, ggml_backend_reg_get_proc_address) \
  X(backend_free, ggml_backend_free)

struct GgmlApi {
#define SWARM_GGML_MEMBER(member, symbol) decltype(&::symbol) member = nullptr;
  SWARM_GGML_FUNCTIONS(SWARM_GGML_MEMBER)
#undef SWARM_GGML_MEMBER
};

/// An input of a graph: its tensor and the host bytes copied into it.
struct Input {
  ggml_tensor* tensor;
  at::Tensor data;  // contiguous, the tensor's type
};

/// ggml's CPU backend (the variant bench_anchor loaded) with `threads` threads.
class Ggml {
 public:
  Ggml(const LlamaLibrary& lib, int threads) {
    // libllama is open already (RTLD_NOLOAD: the same handle); dlsym on it searches libggml too.
    handle_ = dlopen(lib.path().c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle_ == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    auto bind = [&](auto& fn, const char* symbol) {
      void* p = dlsym(handle_, symbol);
      if (!p) throw std::runtime_error(lib.path().string() + " and its libggml: no symbol " + symbol);
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
#define SWARM_GGML_BIND(member, symbol) bind(api_.member, #symbol);
    SWARM_GGML_FUNCTIONS(SWARM_GGML_BIND)
#undef SWARM_GGML_BIND
    ggml_backend_dev_t dev = api_.dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (dev == nullptr) throw std::runtime_error("ggml has no CPU backend loaded");
    backend_ = api_.dev_init(dev, nullptr);
    if (backend_ == nullptr) throw std::runtime_error("ggml could not start its CPU backend");
    auto set_threads = reinterpret_cast<ggml_backend_set_n_threads_t>(
        api_.reg_get_proc_address(api_.dev_backend_reg(dev), "ggml_backend_set_n_threads"));
    if (set_threads == nullptr)
      throw std::runtime_error("ggml's CPU backend has no ggml_backend_set_n_threads");
    set_threads(backend_, threads);
  }
  ~Ggml() {
    if (backend_ != nullptr) api_.backend_free(backend_);
    if (handle_ != nullptr) dlclose(handle_);
  }
  Ggml(const Ggml&) = delete;
  Ggml& operator=(const Ggml&) = delete;

  const GgmlApi& api() const { return api_; }

  /// Best microseconds of `reps` computations (after one untimed) of the graph `build` makes
  /// in a fresh context: it creates the input tensors (listing them with their data in
  /// `inputs`) and returns the result.
  double best_us(const std::function<ggml_tensor*(ggml_context*, std::vector<Input>&)>& build, int reps) {
    ggml_init_params params{64 * api_.tensor_overhead() + api_.graph_overhead(), nullptr, /*no_alloc=*/true};
    ggml_context* ctx = api_.init(params);
    if (ctx == nullptr) throw std::runtime_error("ggml_init failed");
    std::vector<Input> inputs;
    ggml_tensor* out = build(ctx, inputs);
    ggml_cgraph* graph = api_.new_graph(ctx);
    api_.build_forward_expand(graph, out);
    ggml_backend_buffer_t buffer = api_.alloc_ctx_tensors(ctx, backend_);
    if (buffer == nullptr) {
      api_.free(ctx);
      throw std::runtime_error("ggml could not allocate the graph's tensors");
    }
    for (const Input& in : inputs) api_.tensor_set(in.tensor, in.data.data_ptr(), 0, in.data.nbytes());
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i <= reps; ++i) {
      const auto t0 = Clock::now();
      const ggml_status status = api_.graph_compute(backend_, graph);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (status != GGML_STATUS_SUCCESS) {
        api_.buffer_free(buffer);
        api_.free(ctx);
        throw std::runtime_error("ggml_backend_graph_compute failed");
      }
      if (i > 0) best = std::min(best, us);
    }
    api_.buffer_free(buffer);
    api_.free(ctx);
    return best;
  }

 private:
  void* handle_ = nullptr;
  GgmlApi api_;
  ggml_backend_t backend_ = nullptr;
};

/// Best microseconds of `reps` calls (after one untimed).
double best_us(const std::function<void()>& call, int reps) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= reps; ++i) {
    const auto t0 = Clock::now();
    call();
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (i > 0) best = std::min(best, us);
  }
  return best;
}

ggml_type ggml_type_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return GGML_TYPE_F32;
    case at::kHalf:
      return GGML_TYPE_F16;
    case at::kBFloat16:
      return GGML_TYPE_BF16;
    default:
      throw std::runtime_error("no ggml type for this dtype");
  }
}

KernelComparison comparison(std::string kernel, std::string shape, std::string ggml_ops) {
  KernelComparison r;
  r.kernel = std::move(kernel);
  r.shape = std::move(shape);
  r.ggml_ops = std::move(ggml_ops);
  return r;
}

// Where a row keeps our time for dtype dt (fp32 or bf16), and ggml's (F32, F16 or BF16).
double& swarm_us(KernelComparison& r, at::ScalarType dt) {
  return dt == at::kFloat ? r.swarm_fp32_us : r.swarm_bf16_us;
}
double& ggml_us(KernelComparison& r, at::ScalarType dt) {
  return dt == at::kFloat ? r.ggml_f32_us : dt == at::kHalf ? r.ggml_f16_us : r.ggml_bf16_us;
}

// SmolLM2-135M's shapes, as bench_kernels has them.
constexpr int64_t kHidden = 576, kInter = 1536, kHeads = 9, kKvHeads = 3, kHeadDim = 64;
constexpr double kEps = 1e-5;

}  // namespace

std::vector<KernelComparison> compare_kernels(const LlamaLibrary& lib, int threads, bool quick,
                                              int64_t rows_per_op) {
  Ggml g(lib, threads);
  const GgmlApi& api = g.api();
  const int reps = quick ? 3 : 7;
  const int64_t n = rows_per_op > 0 ? rows_per_op
                    : quick         ? 4096
                                    : 16384;  // rows of the elementwise kernels (a prefill's worth)
  std::vector<KernelComparison> rows;
  at::manual_seed(29);

  // The gate/up projection at decode and prefill row counts: what serving runs for that many
  // rows (small_linear up to small_linear_max_rows, else model_linear) against ggml_mul_mat
  // with the weights in F32, F16 and BF16 (llama.cpp's matmul for those weight types).
  for (int64_t m : quick ? std::vector<int64_t>{1, 8, 128} : std::vector<int64_t>{1, 8, 32, 128, 512}) {
    KernelComparison r =
        comparison("projection (serving's)",
                   std::to_string(m) + (m == 1 ? " row" : " rows") + " x [3072, 576]", "mul_mat");
    const at::Tensor x = at::randn({m, kHidden}), w = at::randn({2 * kInter, kHidden}) * 0.05;
    auto takes_small = [&](at::ScalarType dt) { return m <= swarm::small_linear_max_rows(dt); };
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const at::Tensor xd = x.to(dt), wd = w.to(dt);
      const bool small = takes_small(dt);
      swarm_us(r, dt) = best_us(
          [&] {
            if (small) {
              swarm::small_linear(xd, wd, c10::nullopt);
            } else {
              swarm::model_linear(xd, wd);
            }
          },
          reps);
    }
    for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const at::Tensor wd = w.to(dt);
      ggml_us(r, dt) = g.best_us(
          [&](ggml_context* ctx, std::vector<Input>& in) {
            ggml_tensor* wt = api.new_tensor_2d(ctx, ggml_type_of(dt), kHidden, 2 * kInter);
            ggml_tensor* xt = api.new_tensor_2d(ctx, GGML_TYPE_F32, kHidden, m);
            in.push_back({wt, wd});
            in.push_back({xt, x});
            return api.mul_mat(ctx, wt, xt);
          },
          reps);
    }
    auto path = [&](at::ScalarType dt) {
      return std::string(takes_small(dt) ? "small_linear" : "model_linear");
    };
    r.note = "ours: fp32 " + path(at::kFloat) + ", bf16 " + path(at::kBFloat16) +
             "; ggml's input fp32, converted to the weights' type for its dot products";
    rows.push_back(r);
  }
  {  // RMSNorm times the weight
    KernelComparison r = comparison("rms_norm_rows", std::to_string(n) + " x 576", "rms_norm, mul");
    const at::Tensor x = at::randn({n, kHidden}), w = at::randn({kHidden});
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const at::Tensor xd = x.to(dt), wd = w.to(dt), out = at::empty_like(xd);
      swarm_us(r, dt) = best_us([&] { swarm::rms_norm_rows(xd, wd, kEps, out); }, reps);
    }
    r.ggml_f32_us = g.best_us(
        [&](ggml_context* ctx, std::vector<Input>& in) {
          ggml_tensor* xt = api.new_tensor_2d(ctx, GGML_TYPE_F32, kHidden, n);
          ggml_tensor* wt = api.new_tensor_1d(ctx, GGML_TYPE_F32, kHidden);
          in.push_back({xt, x});
          in.push_back({wt, w});
          return api.mul(ctx, api.rms_norm(ctx, xt, static_cast<float>(kEps)), wt);
        },
        reps);
    r.note = "ggml: activations fp32 only";
    rows.push_back(r);
  }
  {  // SiLU(gate) * up
    KernelComparison r = comparison("silu_mul", std::to_string(n) + " x 2 x 1536", "swiglu_split");
    const at::Tensor gate_up = at::randn({n, 2 * kInter}) * 2;
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const at::Tensor gu = gate_up.to(dt), out = at::empty({n, kInter}, gu.options());
      swarm_us(r, dt) = best_us([&] { swarm::silu_mul(gu, out); }, reps);
    }
    const at::Tensor gate = gate_up.narrow(1, 0, kInter).contiguous(),
                     up = gate_up.narrow(1, kInter, kInter).contiguous();
    r.ggml_f32_us = g.best_us(
        [&](ggml_context* ctx, std::vector<Input>& in) {
          ggml_tensor* gt = api.new_tensor_2d(ctx, GGML_TYPE_F32, kInter, n);
          ggml_tensor* ut = api.new_tensor_2d(ctx, GGML_TYPE_F32, kInter, n);
          in.push_back({gt, gate});
          in.push_back({ut, up});
          return api.swiglu_split(ctx, gt, ut);
        },
        reps);
    r.note = "gate and up in two tensors on ggml's side";
    rows.push_back(r);
  }
  {  // rotary embedding of q and k (NeoX halves, as HF's llama)
    KernelComparison r = comparison("rope_qkv_into_cache", std::to_string(n) + " x (9 + 2 x 3) x 64",
                                    "rope_ext (NeoX), q and k");
    const int64_t width = (kHeads + 2 * kKvHeads) * kHeadDim;
    const at::Tensor qkv = at::randn({n, width});
    const at::Tensor angles =
        at::arange(n, at::kFloat).unsqueeze(1) * at::linspace(0.001, 1.0, kHeadDim).unsqueeze(0);
    const at::Tensor pos = at::arange(n, at::kLong), cache_rows = at::randperm(n, at::kLong);
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const at::Tensor x = qkv.to(dt), cos = angles.cos().to(dt), sin = angles.sin().to(dt);
      const at::Tensor kc = at::zeros({n, kKvHeads * kHeadDim}, x.options()), vc = at::zeros_like(kc);
      const at::Tensor qout = at::empty({n, kHeads, kHeadDim}, x.options());
      swarm_us(r, dt) = best_us(
          [&] {
            swarm::rope_qkv_into_cache(x, kHeads, kKvHeads, kHeadDim, cos, sin, pos, cache_rows, kc, vc,
                                       qout);
          },
          reps);
    }
    const at::Tensor qk = qkv.narrow(1, 0, (kHeads + kKvHeads) * kHeadDim).contiguous();
    const at::Tensor positions = at::arange(n, at::kInt);
    r.ggml_f32_us = g.best_us(
        [&](ggml_context* ctx, std::vector<Input>& in) {
          ggml_tensor* a = api.new_tensor_3d(ctx, GGML_TYPE_F32, kHeadDim, kHeads + kKvHeads, n);
          ggml_tensor* p = api.new_tensor_1d(ctx, GGML_TYPE_I32, n);
          in.push_back({a, qk});
          in.push_back({p, positions});
          return api.rope_ext(ctx, a, p, nullptr, kHeadDim, GGML_ROPE_TYPE_NEOX, 0, 10000.f, 1.f, 0.f, 1.f,
                              32.f, 1.f);
        },
        reps);
    r.note = "ours also copies v and scatters k, v into cache rows; ggml computes its cos/sin";
    rows.push_back(r);
  }
  // Decode attention: one query token per sequence over its cached keys.
  for (int64_t batch : {int64_t{1}, int64_t{32}}) {
    const int64_t ctx_len = batch == 1 ? 4096 : 1024, block = 16, blocks = ctx_len / block;
    KernelComparison r = comparison(
        "paged_decode_attention", "batch " + std::to_string(batch) + ", " + std::to_string(ctx_len) + " keys",
        "flash_attn_ext");
    const at::Tensor q = at::randn({batch, kHeads, kHeadDim});
    // The same keys and values on both sides: ours in blocks of 16 rows, ggml's contiguous per
    // sequence and kv head ([64, keys, kv heads, batch] from the outside in).
    const at::Tensor k = at::randn({batch, ctx_len, kKvHeads, kHeadDim}), v = at::randn_like(k);
    const swarm::PagedContext context = consecutive_blocks_context(batch, blocks, ctx_len);
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const at::Tensor qd = q.to(dt);
      const at::Tensor kc = k.to(dt).reshape({batch * blocks, block, kKvHeads, kHeadDim});
      const at::Tensor vc = v.to(dt).reshape({batch * blocks, block, kKvHeads, kHeadDim});
      const at::Tensor out = at::empty({batch, kHeads * kHeadDim}, qd.options());
      swarm_us(r, dt) = best_us(
          [&] {
            swarm::paged_decode_attention(qd, kc, vc, context, std::numeric_limits<int64_t>::max(), 0.125,
                                          out);
          },
          reps);
    }
    const at::Tensor kg = k.permute({0, 2, 1, 3}).contiguous(), vg = v.permute({0, 2, 1, 3}).contiguous();
    for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const at::Tensor kd = kg.to(dt), vd = vg.to(dt);
      ggml_us(r, dt) = g.best_us(
          [&](ggml_context* ctx, std::vector<Input>& in) {
            ggml_tensor* qt = api.new_tensor_4d(ctx, GGML_TYPE_F32, kHeadDim, 1, kHeads, batch);
            ggml_tensor* kt = api.new_tensor_4d(ctx, ggml_type_of(dt), kHeadDim, ctx_len, kKvHeads, batch);
            ggml_tensor* vt = api.new_tensor_4d(ctx, ggml_type_of(dt), kHeadDim, ctx_len, kKvHeads, batch);
            in.push_back({qt, q});
            in.push_back({kt, kd});
            in.push_back({vt, vd});
            return api.flash_attn_ext(ctx, qt, kt, vt, nullptr, 0.125f, 0.f, 0.f);
          },
          reps);
    }
    r.note = "ours walks block tables; ggml's keys contiguous, no mask";
    rows.push_back(r);
  }
  return rows;
}

}  // namespace swarm::bench
