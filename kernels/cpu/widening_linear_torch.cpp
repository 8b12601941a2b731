#include "kernels/cpu/widening_linear_torch.hpp"
#include "common/env.hpp"

#include <ATen/Version.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "common/error.hpp"
#include "kernels/cpu/cpu_dispatch.hpp"
#include "kernels/cpu/cpu_vec.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/small_linear_torch.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace swarm {
namespace {

#define SWARM_WIDEN_INLINE inline __attribute__((always_inline))

// bf16 -> fp32 for n contiguous values: a shift of each 16-bit pattern into the high half.
template <int W>
SWARM_WIDEN_INLINE void widen_impl(const c10::BFloat16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    const auto a = simd::load_vec<W>(src + i), b = simd::load_vec<W>(src + i + W);
    const auto c = simd::load_vec<W>(src + i + 2 * W), d = simd::load_vec<W>(src + i + 3 * W);
    simd::store_vec<W>(dst + i, a);
    simd::store_vec<W>(dst + i + W, b);
    simd::store_vec<W>(dst + i + 2 * W, c);
    simd::store_vec<W>(dst + i + 3 * W, d);
  }
  for (; i + W <= n; i += W) simd::store_vec<W>(dst + i, simd::load_vec<W>(src + i));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
SWARM_TARGET_AVX512 void widen_avx512(const c10::BFloat16* s, float* d, int64_t n) {
  widen_impl<16>(s, d, n);
}
SWARM_TARGET_AVX2 void widen_avx2(const c10::BFloat16* s, float* d, int64_t n) { widen_impl<8>(s, d, n); }
void widen_base(const c10::BFloat16* s, float* d, int64_t n) { widen_impl<8>(s, d, n); }
using WidenFn = void (*)(const c10::BFloat16*, float*, int64_t);

WidenFn widen_fn() {
  static const WidenFn fn = cpu_pick<WidenFn>(widen_avx512, widen_avx2, widen_base);
  return fn;
}

void widen(const at::Tensor& src, at::Tensor& dst) {
  widen_fn()(src.data_ptr<c10::BFloat16>(), dst.data_ptr<float>(), src.numel());
}

// fp32 -> bf16 for n contiguous values, rounded to nearest even as .to(kBFloat16) rounds them;
// in place (bf16 null): each value rounded to bf16 precision and kept as fp32.
template <int W>
SWARM_WIDEN_INLINE void narrow_impl(float* src, c10::BFloat16* dst, int64_t n) {
  int64_t i = 0;
  if (dst == nullptr) {
    for (; i + W <= n; i += W) simd::store_vec<W>(src + i, simd::round_bf16<W>(simd::load_vec<W>(src + i)));
    for (; i < n; ++i) src[i] = static_cast<float>(static_cast<c10::BFloat16>(src[i]));
    return;
  }
  for (; i + W <= n; i += W) simd::store_vec<W>(dst + i, simd::load_vec<W>(src + i));
  for (; i < n; ++i) dst[i] = static_cast<c10::BFloat16>(src[i]);
}
SWARM_TARGET_AVX512 void narrow_avx512(float* s, c10::BFloat16* d, int64_t n) { narrow_impl<16>(s, d, n); }
SWARM_TARGET_AVX2 void narrow_avx2(float* s, c10::BFloat16* d, int64_t n) { narrow_impl<8>(s, d, n); }
void narrow_base(float* s, c10::BFloat16* d, int64_t n) { narrow_impl<8>(s, d, n); }
using NarrowFn = void (*)(float*, c10::BFloat16*, int64_t);

NarrowFn narrow_fn() {
  static const NarrowFn fn = cpu_pick<NarrowFn>(narrow_avx512, narrow_avx2, narrow_base);
  return fn;
}

// Runs f(begin, end) for [0, n) split into `threads` contiguous chunks (multiples of `align`), one
// per OpenMP thread of the pool libtorch and our kernels share. Each thread converts its own
// weights and calls the fp32 GEMM itself, with OpenBLAS's own pool at one thread (the bf16 thread
// plan, configure_compute_threads): two busy-waiting pools on the same cores (our conversion
// threads spinning while OpenBLAS's run) measured 3-4x slower at 32 rows.
template <class F>
void split_work(int64_t n, int64_t align, int64_t min_per_thread, const F& f) {
  const int threads = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(small_linear_threads(), n / std::max<int64_t>(1, min_per_thread))));
#ifdef _OPENMP
  if (threads > 1 && !omp_in_parallel()) {
    std::exception_ptr error;
    // The caller's thread-local modes go with the work (an inference tensor may only be written
    // in inference mode); no autograd inside.
    const bool inference = c10::InferenceMode::is_enabled();
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t chunk = ((n + nt - 1) / nt + align - 1) / align * align;
      const int64_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
      try {
        c10::InferenceMode mode(inference);
        at::NoGradGuard no_grad;
        if (b < e) f(b, e);
      } catch (...) {
#pragma omp critical
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
#endif
  f(0, n);
}

// How many units of `macs` multiply-adds each make a thread worth waking: 2^18 multiply-adds.
int64_t units_worth_a_thread(int64_t macs) {
  return std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, macs));
}

// Bytes of one thread's fp32 weight panel: in its core's L2 while the GEMM reads it.
// SWARM_WIDEN_PANEL_KB overrides (for measuring).
int64_t panel_bytes() {
  static const int64_t bytes = [] {
    const auto kb = env_value("SWARM_WIDEN_PANEL_KB");
    return kb && std::atoll(kb->c_str()) > 0 ? std::atoll(kb->c_str()) * 1024 : int64_t{384} << 10;
  }();
  return bytes;
}

// Weight rows per panel (see panel_bytes); each GEMM call packs all M input rows again, so with
// many rows the panel grows (at P rows the packing costs about 1/P of the arithmetic's time) and
// is read from the shared L3 instead.
int64_t panel_rows(int64_t m, int64_t in, int64_t out) {
  const int64_t fit = std::max<int64_t>(16, panel_bytes() / (4 * std::max<int64_t>(in, 1)));
  const int64_t rows = std::max(fit, std::min<int64_t>(m, 512));
  return std::min(out, (rows + 15) / 16 * 16);
}

// y [M, out] fp32 = x [M, in] fp32 · wᵀ (+ bias fp32 [out] or undefined), w bf16 contiguous:
// each thread takes a range of output features, panel by panel, and then rounds its results to
// bf16: into y_bf16 [M, out] where given, else in place in yf.
void panel_gemm_xwt(const at::Tensor& xf, const at::Tensor& w, const at::Tensor& biasf, at::Tensor& yf,
                    c10::BFloat16* y_bf16) {
  const int64_t m = xf.size(0), in = xf.size(1), out = w.size(0);
  split_work(out, 16, std::max<int64_t>(16, units_worth_a_thread(m * in)), [&](int64_t begin, int64_t end) {
    // The results leave in bf16 as the thread finishes them: no pass over all of y after.
    auto finish = [&] {
      float* yp = yf.data_ptr<float>();
      for (int64_t r = 0; r < m; ++r)
        narrow_fn()(yp + r * out + begin, y_bf16 == nullptr ? nullptr : y_bf16 + r * out + begin,
                    end - begin);
    };
    const int64_t p = panel_rows(m, in, end - begin);
    at::Tensor panel = at::empty({p, in}, xf.options());
    for (int64_t p0 = begin; p0 < end; p0 += p) {
      const int64_t rows = std::min(p, end - p0);
      at::Tensor wp = panel.narrow(0, 0, rows);
      widen(w.narrow(0, p0, rows), wp);  // bf16 -> fp32, in cache
      at::Tensor ys = yf.narrow(1, p0, rows);
      if (biasf.defined())
        at::addmm_out(ys, biasf.narrow(0, p0, rows), xf, wp.t());
      else
        at::mm_out(ys, xf, wp.t());
    }
    finish();
  });
}

// gx [M, in] fp32 = gy [M, out] fp32 · w [out, in] (bf16, or fp32): each thread takes a range of
// the M rows and converts bf16 weights panel by panel for itself (M is large where this runs:
// training).
at::Tensor panel_gemm_gw(const at::Tensor& gyf, const at::Tensor& w_any) {
  const at::Tensor w = w_any.contiguous();
  const int64_t m = gyf.size(0), out = w.size(0), in = w.size(1);
  const bool fp32 = w.scalar_type() == at::kFloat;
  at::Tensor gx = fp32 ? at::empty({m, in}, gyf.options()) : at::zeros({m, in}, gyf.options());
  split_work(m, 1, 64, [&](int64_t begin, int64_t end) {
    const at::Tensor g = gyf.narrow(0, begin, end - begin);
    at::Tensor gxs = gx.narrow(0, begin, end - begin);
    if (fp32) {
      at::mm_out(gxs, g, w);
      return;
    }
    const int64_t p = panel_rows(end - begin, in, out);
    at::Tensor panel = at::empty({p, in}, gyf.options());
    for (int64_t p0 = 0; p0 < out; p0 += p) {
      const int64_t rows = std::min(p, out - p0);
      at::Tensor wp = panel.narrow(0, 0, rows);
      widen(w.narrow(0, p0, rows), wp);
      gxs.addmm_(g.narrow(1, p0, rows), wp);
    }
  });
  return gx;
}

// gw [out, in] fp32 = gyᵀ · x, gy [M, out], x [M, in] fp32: each thread takes a range of `out`.
at::Tensor gemm_gyt_x(const at::Tensor& gyf, const at::Tensor& xf) {
  const int64_t out = gyf.size(1), in = xf.size(1);
  at::Tensor gw = at::empty({out, in}, gyf.options());
  split_work(out, 16, 16, [&](int64_t begin, int64_t end) {
    at::Tensor dst = gw.narrow(0, begin, end - begin);
    at::mm_out(dst, gyf.narrow(1, begin, end - begin).t(), xf);
  });
  return gw;
}

void check_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  SWARM_REQUIRE(x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == at::kBFloat16 &&
                    w.scalar_type() == at::kBFloat16 && w.dim() == 2 && x.dim() >= 1 &&
                    x.size(-1) == w.size(1),
                ErrorKind::INVALID_ARGUMENT, "widening_linear: expects bf16 CPU x [..., in] and w [out, in]");
  SWARM_REQUIRE(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(0)),
                ErrorKind::INVALID_ARGUMENT, "widening_linear: bias must be [out]");
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y [M, out] fp32 = x [M, in] fp32 · wᵀ (+ bias) with fp32 weights: each thread a range of
// output features, one GEMM each.
void split_gemm_xwt(const at::Tensor& xf, const at::Tensor& w, const at::Tensor& bias, at::Tensor& yf) {
  const int64_t m = xf.size(0), in = xf.size(1), out = w.size(0);
  split_work(out, 16, std::max<int64_t>(16, units_worth_a_thread(m * in)), [&](int64_t begin, int64_t end) {
    at::Tensor ys = yf.narrow(1, begin, end - begin);
    const at::Tensor wp = w.narrow(0, begin, end - begin);
    if (bias.defined())
      at::addmm_out(ys, bias.narrow(0, begin, end - begin), xf, wp.t());
    else
      at::mm_out(ys, xf, wp.t());
  });
}

// out [B, M, N] = a [B, M, K] · b [B, K, N], fp32: each thread a range of the batch items.
at::Tensor split_bmm(const at::Tensor& a, const at::Tensor& b) {
  const int64_t items = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  at::Tensor out = at::empty({items, m, n}, a.options());
  split_work(items, 1, units_worth_a_thread(m * k * n), [&](int64_t begin, int64_t end) {
    at::Tensor o = out.narrow(0, begin, end - begin);
    at::bmm_out(o, a.narrow(0, begin, end - begin), b.narrow(0, begin, end - begin));
  });
  return out;
}

std::atomic<bool> g_gemm_splits{false};

// Gradients of y = x · wᵀ + b, split (and widened) as the forward is.
variable_list linear_backward(AutogradContext* ctx, const at::Tensor& gy, bool has_bias) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& x = saved[0];
  const at::Tensor& w = saved[1];
  const int64_t in = w.size(1), out = w.size(0);
  const at::Tensor gyf = gy.reshape({-1, out}).to(at::kFloat);
  at::Tensor gx, gw, gb;
  const at::ScalarType type = x.scalar_type();
  if (ctx->needs_input_grad(0)) gx = panel_gemm_gw(gyf, w).to(type).view(x.sizes());
  if (ctx->needs_input_grad(1)) gw = gemm_gyt_x(gyf, x.reshape({-1, in}).to(at::kFloat)).to(type);
  if (has_bias && ctx->needs_input_grad(2)) gb = gyf.sum(0).to(type);
  if (has_bias) return {gx, gw, gb};
  return {gx, gw};
}

// The split (fp32) or widening (bf16) linear layer, differentiable.
at::Tensor split_or_widening_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  return x.scalar_type() == at::kFloat ? split_linear(x, w, bias) : widening_linear(x, w, bias);
}

struct SplitLinear : public torch::autograd::Function<SplitLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return split_or_widening_linear(x, w, at::Tensor());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return linear_backward(ctx, grads[0], false);
  }
};

struct SplitLinearBias : public torch::autograd::Function<SplitLinearBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b) {
    ctx->save_for_backward({x, w});
    return split_or_widening_linear(x, w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return linear_backward(ctx, grads[0], true);
  }
};

// a [B, M, K] · b [B, K, N], fp32, split over the batch items; the gradients split the same way.
struct SplitBmm : public torch::autograd::Function<SplitBmm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return split_bmm(a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& a = saved[0];
    const at::Tensor& b = saved[1];
    const at::Tensor& g = grads[0];
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = split_bmm(g, b.transpose(1, 2));
    if (ctx->needs_input_grad(1)) gb = split_bmm(a.transpose(1, 2), g);
    return {ga, gb};
  }
};

// a · b in fp32: split over the batch items when the GEMMs split and both have the same batch
// dimensions (what attention passes), else at::matmul.
at::Tensor fp32_matmul(const at::Tensor& a, const at::Tensor& b) {
  const bool same_batch = a.dim() >= 3 && a.dim() == b.dim() &&
                          a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2);
  if (!splits(a) || !b.device().is_cpu() || b.scalar_type() != at::kFloat || !same_batch)
    return at::matmul(a, b);
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  SWARM_REQUIRE(b.size(-2) == k, ErrorKind::INVALID_ARGUMENT, "model_matmul: inner dimensions differ");
  const at::Tensor a3 = a.reshape({-1, m, k}), b3 = b.reshape({-1, k, n});
  const bool grad = at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad());
  const at::Tensor out = grad ? SplitBmm::apply(a3, b3) : split_bmm(a3, b3);
  std::vector<int64_t> sizes(a.sizes().begin(), a.sizes().end());
  sizes.back() = n;
  return out.view(sizes);
}

}  // namespace

bool cpu_gemm_splits() { return g_gemm_splits.load(std::memory_order_relaxed); }

void set_cpu_gemm_splits(bool on) { g_gemm_splits.store(on, std::memory_order_relaxed); }

bool splits(const at::Tensor& x) {
  return x.defined() && x.scalar_type() == at::kFloat && x.device().is_cpu() && cpu_gemm_splits();
}

at::Tensor split_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  SWARM_REQUIRE(x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == at::kFloat &&
                    w.scalar_type() == at::kFloat && w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
                ErrorKind::INVALID_ARGUMENT, "split_linear: expects fp32 CPU x [..., in] and w [out, in]");
  SWARM_REQUIRE(
      !bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(0) && bias.scalar_type() == at::kFloat),
      ErrorKind::INVALID_ARGUMENT, "split_linear: bias must be fp32 [out]");
  const int64_t in = w.size(1), out = w.size(0);
  const at::Tensor xf = x.reshape({-1, in}).contiguous();
  at::Tensor yf = at::empty({xf.size(0), out}, xf.options());
  split_gemm_xwt(xf, w.contiguous(), bias, yf);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = out;
  return yf.view(sizes);
}

bool bf16_matmul_widens() {
  static const bool widens = !cpu_has_avx512_bf16();
  return widens;
}

std::string bf16_matmul_path() {
  if (!bf16_matmul_widens()) return "on AVX512_BF16 dot products";
  return packed_gemm_bf16_available() ? "on the packed bf16 GEMM (no AVX512_BF16; fp32 accumulation)"
                                      : "widened to fp32 GEMM (no AVX512_BF16, no AVX2)";
}

std::string aten_cpu_capability() {
  // at::show_config() has a line "  - CPU capability usage: AVX2" (NO AVX / AVX / AVX2 / AVX512).
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  const size_t at_key = config.find(key);
  if (at_key == std::string::npos) return "unknown";
  const size_t from = at_key + key.size();
  return config.substr(from, config.find('\n', from) - from);
}

std::string onednn_cpu_isa() {
  using GetIsa = int (*)();
  auto get = reinterpret_cast<GetIsa>(dlsym(RTLD_DEFAULT, "dnnl_get_effective_cpu_isa"));
  if (get == nullptr) return "not loaded";
  // oneDNN's dnnl_cpu_isa_t codes (dnnl_types.h).
  const int isa = get();
  switch (isa) {
    case 0x1:
      return "sse41";
    case 0x3:
      return "avx";
    case 0x7:
      return "avx2";
    case 0x407:
      return "avx2_vnni";
    case 0x27:
      return "avx512_core";
    case 0x67:
      return "avx512_core_vnni";
    case 0xe7:
      return "avx512_core_bf16";
    case 0x3e7:
      return "avx512_core_amx";
    default: {
      char code[32];
      std::snprintf(code, sizeof code, "isa 0x%x", isa);
      return code;
    }
  }
}

bool widens(const at::Tensor& t) {
  return t.defined() && t.scalar_type() == at::kBFloat16 && t.device().is_cpu() && bf16_matmul_widens();
}

at::Tensor widening_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool float_out) {
  check_args(x, w, bias);
  const int64_t in = w.size(1), out = w.size(0);
  const at::Tensor xb = x.reshape({-1, in}).contiguous();
  const int64_t m = xb.size(0);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = out;
  if (packed_gemm_bf16_available()) {
    // The packed bf16 GEMM (packed_gemm.hpp): widened as it packs, rounded as it stores.
    const at::Tensor wc = w.contiguous();
    const at::Tensor biasf = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor y = at::empty({m, out}, xb.options().dtype(float_out ? at::kFloat : at::kBFloat16));
    const PackedGemmArgs args{xb.data_ptr<c10::BFloat16>(),
                              wc.data_ptr<c10::BFloat16>(),
                              biasf.defined() ? biasf.data_ptr<float>() : nullptr,
                              y.data_ptr(),
                              float_out,
                              m,
                              out,
                              in};
    split_work(out, 16, std::max<int64_t>(16, units_worth_a_thread(m * in)),
               [&](int64_t begin, int64_t end) { packed_gemm_bf16(args, begin, end); });
    return y.view(sizes);
  }
  // Without AVX2: the input widened and the results rounded on every thread by our kernels, each
  // thread its own share, instead of two libtorch conversions over all of it (measured within
  // noise of them in a driver at 512 rows: the conversions are bound by memory either way).
  at::Tensor xf = at::empty({m, in}, xb.options().dtype(at::kFloat));
  const auto* xp = xb.data_ptr<c10::BFloat16>();
  float* xfp = xf.data_ptr<float>();
  split_work(
      m, 1, std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, in)),
      [&](int64_t begin, int64_t end) { widen_fn()(xp + begin * in, xfp + begin * in, (end - begin) * in); });
  const at::Tensor biasf = bias.defined() ? bias.to(at::kFloat) : at::Tensor();
  if (float_out) {
    at::Tensor yf = at::empty({m, out}, xf.options());  // the bf16 results, widened: rounded in place
    panel_gemm_xwt(xf, w.contiguous(), biasf, yf, nullptr);
    return yf.view(sizes);
  }
  at::Tensor yf = at::empty({m, out}, xf.options());
  at::Tensor y = at::empty({m, out}, xb.options());
  panel_gemm_xwt(xf, w.contiguous(), biasf, yf, y.data_ptr<c10::BFloat16>());
  return y.view(sizes);
}

at::Tensor model_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (widens(x)) {
    check_args(x, w, bias);
  } else if (!splits(x) || !splits(w) || (bias.defined() && !splits(bias))) {
    return at::linear(x, w, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt);
  }
  const bool grad = at::GradMode::is_enabled() &&
                    (x.requires_grad() || w.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (!grad) return split_or_widening_linear(x, w, bias);
  if (bias.defined()) return SplitLinearBias::apply(x, w, bias);
  return SplitLinear::apply(x, w);
}

at::Tensor model_matmul(const at::Tensor& a, const at::Tensor& b) {
  if (widens(a)) return fp32_matmul(a.to(at::kFloat), b.to(at::kFloat)).to(a.scalar_type());
  if (splits(a)) return fp32_matmul(a, b);
  return at::matmul(a, b);
}

at::Tensor linear_grad_input(const at::Tensor& grad_y, const at::Tensor& w) {
  if (widens(grad_y)) return panel_gemm_gw(grad_y.to(at::kFloat), w).to(grad_y.scalar_type());
  if (splits(grad_y) && splits(w) && grad_y.dim() == 2) return panel_gemm_gw(grad_y, w);
  return grad_y.mm(w);
}

at::Tensor linear_grad_weight(const at::Tensor& grad_y, const at::Tensor& x) {
  if (widens(grad_y)) return gemm_gyt_x(grad_y.to(at::kFloat), x.to(at::kFloat)).to(grad_y.scalar_type());
  if (splits(grad_y) && splits(x) && grad_y.dim() == 2) return gemm_gyt_x(grad_y, x);
  return grad_y.t().mm(x);
}

}  // namespace swarm
