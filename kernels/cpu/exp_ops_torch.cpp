// The serving ops built on the exponential: SiLU(gate) * up, and the softmax statistics and
// rows of the sampler (serving_ops_torch.hpp declares them). Unlike serving_ops_torch.cpp this
// file is compiled with multiply-add contraction (CMakeLists.txt): their exponential
// (simd::exp_parts) is not a libtorch op chain to repeat, and its polynomial is six
// multiply-adds where separate multiplies and adds take twelve. small_linear_torch.cpp, which
// applies the same silu as its projection's results leave it, is compiled alike, so the two
// agree bit for bit.
#include "kernels/cpu/serving_ops_torch.hpp"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "common/error.hpp"
#include "kernels/cpu/cpu_dispatch.hpp"
#include "kernels/cpu/cpu_vec.hpp"
#include "kernels/cpu/serving_ops_internal.hpp"

namespace swarm {
namespace {

using serving_ops::check_cpu_dtype;
using serving_ops::grain_for;
using simd::exp_nonpositive;
using simd::hsum;
using simd::load_vec;
using simd::round_inner;
using simd::store_vec;
using simd::Vec;

// ---------------------------------------------------------------- SiLU(gate) * up

struct SiluArgs {
  const void* in;
  void* out;
  int64_t inter;
};

constexpr int64_t kAhead = 4;  // rows silu_mul prefetches ahead

// silu(g) = g / (1 + e^-g) (simd::silu). The product with up is rounded as the two ops it
// replaces round.
template <class T, int W>
SWARM_INLINE void silu_mul_rows(const SiluArgs& a, int64_t begin, int64_t end) {
  using V = typename Vec<W>::type;
  const int64_t n = a.inter, vec = n / W * W, pairs = n / (2 * W) * (2 * W), quads = n / (4 * W) * (4 * W);
  for (int64_t r = begin; r < end; ++r) {
    const T* g = static_cast<const T*>(a.in) + r * 2 * n;
    const T* u = g + n;
    T* o = static_cast<T*>(a.out) + r * n;
    int64_t j = 0;
    // 4W at a time, the four vectors' silu step by step side by side (simd::silu_n: the same
    // bits as one at a time). Measured on one core in L1, bf16, inter 1536: 0.59-0.63 ns an
    // element against 0.71-0.74 on AVX2, 0.31-0.35 against 0.39 on AVX-512.
    // The rows kAhead below, asked for as this row is read: gate and up lie side by side in a
    // row, so each is a stream of 6 KiB runs (fp32, SmolLM2) with gaps, which the hardware
    // prefetcher alone follows poorly (measured from memory, fp32, 4096 rows, two threads:
    // 2.0-2.6 ms, against 1.3-1.6 for the same work on gate and up as two separate arrays and
    // 1.4-1.5 with this prefetch).
    const T* ahead = r + kAhead < end ? g + kAhead * 2 * n : nullptr;
    for (; j < quads; j += 4 * W) {
      if (ahead != nullptr)
        for (int64_t b = 0; b < 4 * W * static_cast<int64_t>(sizeof(T)); b += 64) {
          __builtin_prefetch(reinterpret_cast<const char*>(ahead + j) + b);
          __builtin_prefetch(reinterpret_cast<const char*>(ahead + n + j) + b);
        }
      V x[4], up[4], act[4];
      simd::load_pair<W>(g + j, x[0], x[1]);
      simd::load_pair<W>(g + j + 2 * W, x[2], x[3]);
      simd::load_pair<W>(u + j, up[0], up[1]);
      simd::load_pair<W>(u + j + 2 * W, up[2], up[3]);
      simd::silu_n<W, 4>(x, act);
      simd::store_pair<W>(o + j, round_inner<T, W>(act[0]) * up[0], round_inner<T, W>(act[1]) * up[1]);
      simd::store_pair<W>(o + j + 2 * W, round_inner<T, W>(act[2]) * up[2],
                          round_inner<T, W>(act[3]) * up[3]);
    }
    for (; j < pairs; j += 2 * W) {  // 2W at a time: bf16 widened without shuffles (load_pair)
      V g0, g1, u0, u1;
      simd::load_pair<W>(g + j, g0, g1);
      simd::load_pair<W>(u + j, u0, u1);
      simd::store_pair<W>(o + j, round_inner<T, W>(simd::silu<W>(g0)) * u0,
                          round_inner<T, W>(simd::silu<W>(g1)) * u1);
    }
    for (; j < vec; j += W) {
      const V x = load_vec<W>(g + j);
      const V silu = simd::silu<W>(x);
      store_vec<W>(o + j, round_inner<T, W>(silu) * load_vec<W>(u + j));
    }
    if (j < n) {  // the tail through the same vector code (zero-padded), so every column is computed alike
      T gt[W] = {}, ut[W] = {}, ot[W];
      std::copy(g + j, g + n, gt);
      std::copy(u + j, u + n, ut);
      const V x = load_vec<W>(gt);
      const V silu = simd::silu<W>(x);
      store_vec<W>(ot, round_inner<T, W>(silu) * load_vec<W>(ut));
      std::copy(ot, ot + (n - j), o + j);
    }
  }
}
SWARM_KERNEL_COPIES(silu_mul_kernel, SiluArgs, silu_mul_rows)

// ---------------------------------------------------------------- softmax statistics

struct StatsArgs {
  const float* x;
  const float* temps;
  SoftmaxRowStats* out;
  int64_t v;
};

// Per row, two passes. The first reads the raw logits once from memory: x / t rounds
// monotonically (t > 0), so max_j x[j] / t is (max_j x[j]) / t and the scaled maximum needs no
// division per element; four independent chains of compare-and-select keep each lane's first
// maximum and its index (a strict >), then the lowest index among the lanes holding the row's
// maximum is the argmax. The second sums e^(x / t - max) from the cache while prefetching the
// next row, so the memory stream goes on under the exponentials.
// NaN: a comparison with NaN is false, so the maximum and the argmax pass over it, and a NaN
// makes the sum NaN; the row is searched for one only when the sum comes out NaN (or the maximum
// is -inf). Not in the first pass: GCC 12 at -O3 turns a loop-carried `nan |= v != v` over
// 16-lane vectors into a scalar compare per lane (measured on a Zen 5: the AVX-512 copy of this
// kernel ran 1.3-2x slower than the AVX2 one; without the test, 2x faster).
template <class T, int W>  // T unused: logits are fp32
SWARM_INLINE void stats_rows(const StatsArgs& a, int64_t begin, int64_t end) {
  using V = typename Vec<W>::type;
  using I = typename Vec<W>::ints;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr int kChains = 4, kLine = 64 / sizeof(float);  // floats per cache line
  static_assert(kLine % W == 0);
  const int64_t n = a.v, vec = n / W * W, chained = n / (kChains * W) * (kChains * W);
  for (int64_t r = begin; r < end; ++r) {
    const float* x = a.x + r * n;
    const float t = a.temps[r];
    SoftmaxRowStats& st = a.out[r];
    V mv[kChains];
    I at[kChains], iota;
    for (int k = 0; k < W; ++k) iota[k] = k;
    for (int c = 0; c < kChains; ++c) mv[c] = V{} - kInf, at[c] = I{};
    int64_t j = 0;
    for (; j < chained; j += kChains * W) {
      for (int c = 0; c < kChains; ++c) {
        const V v = load_vec<W>(x + j + c * W);
        const auto gt = v > mv[c];
        mv[c] = gt ? v : mv[c];
        at[c] = gt ? iota + static_cast<int32_t>(j + c * W) : at[c];
      }
    }
    for (; j < vec; j += W) {  // the last few vectors on chain 0
      const V v = load_vec<W>(x + j);
      const auto gt = v > mv[0];
      mv[0] = gt ? v : mv[0];
      at[0] = gt ? iota + static_cast<int32_t>(j) : at[0];
    }
    float raw = -kInf;
    for (int c = 0; c < kChains; ++c)
      for (int k = 0; k < W; ++k) raw = std::max(raw, mv[c][k]);
    int64_t argmax = 0;
    if (raw != -kInf) {
      argmax = n;
      for (int c = 0; c < kChains; ++c)
        for (int k = 0; k < W; ++k)
          if (mv[c][k] == raw) argmax = std::min<int64_t>(argmax, at[c][k]);
    }
    for (; j < n; ++j)
      if (x[j] > raw) raw = x[j], argmax = j;
    const float m = t == 1.f ? raw : raw / t;
    st.max = m;
    st.argmax = argmax;
    auto row_has_nan = [&] {
      for (int64_t k = 0; k < n; ++k)
        if (x[k] != x[k]) return true;
      return false;
    };
    if (m == -kInf) {
      st.has_nan = row_has_nan();
      st.log_sum = 0;
      continue;
    }
    const float* next = r + 1 < end ? x + n : nullptr;
    V acc[kChains] = {};  // four sums: the exponentials' long chains overlap, not their additions
    const int64_t lines = n / (kChains * kLine) * (kChains * kLine);
    auto sums = [&](auto scale) __attribute__((always_inline)) {
      auto term = [&](int64_t at_j) __attribute__((always_inline)) {
        V v = load_vec<W>(x + at_j);
        if constexpr (decltype(scale)::value) v = v / t;
        const V e = exp_nonpositive<W>(v - m);
        return v == -kInf ? V{} : e;
      };
      // Four vectors' exponentials step by step side by side (simd::exp_parts_n), added to
      // their chain's sum in the same order as one at a time.
      constexpr int kVectors = kChains * kLine / W, kSide = 4;
      static_assert(kVectors % kSide == 0);
      const V lo = V{} - 87.0f;
      for (j = 0; j < lines; j += kChains * kLine) {
        if (next != nullptr)
          for (int c = 0; c < kChains; ++c) __builtin_prefetch(next + j + c * kLine, 0, 3);
        for (int h = 0; h < kVectors; h += kSide) {
          V v[kSide], d[kSide], p[kSide], s[kSide];
          for (int k = 0; k < kSide; ++k) {
            v[k] = load_vec<W>(x + j + (h + k) * W);
            if constexpr (decltype(scale)::value) v[k] = v[k] / t;
            d[k] = v[k] - m;
            d[k] = d[k] < lo ? lo : d[k];  // as exp_nonpositive clamps
          }
          simd::exp_parts_n<W, kSide>(d, p, s);
          for (int k = 0; k < kSide; ++k) acc[(h + k) * W / kLine] += v[k] == -kInf ? V{} : p[k] * s[k];
        }
      }
      for (; j < vec; j += W) acc[0] += term(j);
    };
    if (t == 1.f) {
      sums(std::false_type{});
    } else {
      sums(std::true_type{});
    }
    float sum = hsum(V((acc[0] + acc[1]) + (acc[2] + acc[3])));
    for (; j < n; ++j) {
      const float v = t == 1.f ? x[j] : x[j] / t;
      if (v != -kInf) sum += std::exp(v - m);
    }
    st.has_nan = sum != sum && row_has_nan();  // also NaN without one: +inf - max (+inf)
    st.log_sum = st.has_nan ? 0.f : std::log(sum);
  }
}
SWARM_KERNEL_COPIES(stats_kernel, StatsArgs, stats_rows)

struct RowArgs {
  const float* x;
  float* logp;
  float* probs;
  int64_t v;
  float t, max, log_sum;  // logp = (x / t - max) - log_sum: max + log_sum first would round at max's scale
};

template <class T, int W>  // T unused; one row, [begin, end) = [0, 1)
SWARM_INLINE void logp_row(const RowArgs& a, int64_t, int64_t) {
  using V = typename Vec<W>::type;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t n = a.v, vec = n / W * W;
  const float t = a.t;
  int64_t j = 0;
  for (; j < vec; j += W) {
    V v = load_vec<W>(a.x + j);
    if (t != 1.f) v = v / t;
    const V lp = (v - a.max) - a.log_sum;
    store_vec<W>(a.logp + j, lp);
    if (a.probs != nullptr) store_vec<W>(a.probs + j, v == -kInf ? V{} : exp_nonpositive<W>(lp));
  }
  for (; j < n; ++j) {
    const float v = t == 1.f ? a.x[j] : a.x[j] / t;
    a.logp[j] = (v - a.max) - a.log_sum;
    if (a.probs != nullptr) a.probs[j] = v == -kInf ? 0.f : std::exp(a.logp[j]);
  }
}
SWARM_KERNEL_COPIES(logp_kernel, RowArgs, logp_row)

}  // namespace

std::vector<SoftmaxRowStats> softmax_row_stats(const at::Tensor& x, const std::vector<float>& temperature) {
  RECORD_FUNCTION("swarm::softmax_row_stats", c10::ArrayRef<const c10::IValue>{});
  SWARM_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "softmax_row_stats: x must be [B, V] fp32 contiguous on the CPU");
  SWARM_CHECK(static_cast<int64_t>(temperature.size()) == x.size(0),
              "softmax_row_stats: one temperature per row");
  for (float t : temperature)
    SWARM_CHECK(t > 0.f && std::isfinite(t), "softmax_row_stats: temperatures must be finite and > 0");
  std::vector<SoftmaxRowStats> out(static_cast<size_t>(x.size(0)));
  const StatsArgs a{x.data_ptr<float>(), temperature.data(), out.data(), x.size(1)};
  const auto run = stats_kernel(false);
  at::parallel_for(0, x.size(0), 1, [&](int64_t b, int64_t e) { run(a, b, e); });
  return out;
}

void log_softmax_row(const float* x, int64_t V, float t, const SoftmaxRowStats& stats, float* logp,
                     float* probs) {
  SWARM_CHECK(t > 0.f && V > 0, "log_softmax_row: temperature must be > 0 and the row non-empty");
  logp_kernel(false)(RowArgs{x, logp, probs, V, t, stats.max, stats.log_sum}, 0, 1);
}

at::Tensor silu_mul(const at::Tensor& gate_up, const at::Tensor& out_buffer) {
  RECORD_FUNCTION("swarm::silu_mul", c10::ArrayRef<const c10::IValue>{});
  check_cpu_dtype(gate_up, "silu_mul");
  SWARM_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "silu_mul: gate_up must be [N, 2 * inter] contiguous");
  const int64_t n = gate_up.size(0), inter = gate_up.size(1) / 2;
  at::Tensor out = output_tensor(out_buffer, {n, inter}, gate_up.scalar_type(), "silu_mul", {&gate_up});
  const SiluArgs a{gate_up.data_ptr(), out.data_ptr(), inter};
  const auto run = silu_mul_kernel(gate_up.scalar_type() == at::kBFloat16);
  at::parallel_for(0, n, grain_for(2 * inter), [&](int64_t b, int64_t e) { run(a, b, e); });
  return out;
}

}  // namespace swarm
