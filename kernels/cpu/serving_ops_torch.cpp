// RMSNorm (with the residual add) and rotary embedding into the KV cache: op chains repeated
// rounding for rounding, so this file is compiled without multiply-add contraction
// (CMakeLists.txt). SiLU * up and the softmax statistics are in exp_ops_torch.cpp.
#include "kernels/cpu/serving_ops_torch.hpp"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/error.hpp"
#include "kernels/cpu/cpu_dispatch.hpp"
#include "kernels/cpu/cpu_vec.hpp"
#include "kernels/cpu/serving_ops_internal.hpp"

namespace swarm {
namespace {

using serving_ops::check_cpu_dtype;
using serving_ops::grain_for;
using simd::hsum;
using simd::load_vec;
using simd::round_inner;
using simd::round_to;
using simd::store_vec;
using simd::to_float;
using simd::Vec;

// ---------------------------------------------------------------- RMSNorm

struct NormArgs {
  const void* x;
  const void* w;
  void* y;
  int64_t h;
  float eps;
  const void* add = nullptr;  // when set: x += add first (rounded to T, stored back into x)
};

// 2W values at a time through load_pair / store_pair (bf16 widened without shuffles; the sum of
// squares in two accumulators), the rest one by one.
template <class T, int W>
SWARM_INLINE void rms_rows(const NormArgs& a, int64_t begin, int64_t end) {
  using V = typename Vec<W>::type;
  const int64_t H = a.h, vec = H / (2 * W) * (2 * W);
  const T* w = static_cast<const T*>(a.w);
  for (int64_t r = begin; r < end; ++r) {
    const T* x = static_cast<const T*>(a.x) + r * H;
    T* y = static_cast<T*>(a.y) + r * H;
    V acc0{}, acc1{};
    int64_t j = 0;
    float ss = 0.f;
    if (a.add != nullptr) {  // the residual add, as x.add_(d) rounds it, then the statistics
      T* xs = const_cast<T*>(x);
      const T* d = static_cast<const T*>(a.add) + r * H;
      for (; j < vec; j += 2 * W) {
        V x0, x1, d0, d1;
        simd::load_pair<W>(xs + j, x0, x1);
        simd::load_pair<W>(d + j, d0, d1);
        const V v0 = round_inner<T, W>(x0 + d0), v1 = round_inner<T, W>(x1 + d1);
        simd::store_pair<W>(xs + j, v0, v1);
        acc0 += v0 * v0;
        acc1 += v1 * v1;
      }
      ss = hsum(V(acc0 + acc1));
      for (; j < H; ++j) {
        const float v = round_to<T>(to_float(xs[j]) + to_float(d[j]));
        xs[j] = static_cast<T>(v);
        ss += v * v;
      }
    } else {
      for (; j < vec; j += 2 * W) {
        V x0, x1;
        simd::load_pair<W>(x + j, x0, x1);
        acc0 += x0 * x0;
        acc1 += x1 * x1;
      }
      ss = hsum(V(acc0 + acc1));
      for (; j < H; ++j) ss += to_float(x[j]) * to_float(x[j]);
    }
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + a.eps);
    for (j = 0; j < vec; j += 2 * W) {
      V x0, x1, w0, w1;
      simd::load_pair<W>(x + j, x0, x1);
      simd::load_pair<W>(w + j, w0, w1);
      simd::store_pair<W>(y + j, round_inner<T, W>(x0 * inv) * w0, round_inner<T, W>(x1 * inv) * w1);
    }
    for (; j < H; ++j) y[j] = static_cast<T>(round_to<T>(to_float(x[j]) * inv) * to_float(w[j]));
  }
}
SWARM_KERNEL_COPIES(rms_kernel, NormArgs, rms_rows)

// ---------------------------------------------------------------- rotary embedding + cache

struct RopeArgs {
  const void* qkv;
  const void* cos;
  const void* sin;
  const int64_t* positions;
  const int64_t* rows;
  void* q;
  void* k_cache;
  void* v_cache;
  int64_t heads, kv_heads, hd;
};

// out = x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1], each product and the sum
// rounded as the op chain in T rounds them.
// W lanes of it from column j (j + W <= half).
template <class T, int W>
SWARM_INLINE void rope_lanes(const T* x, const T* c, const T* s, T* out, int64_t half, int64_t j) {
  using V = typename Vec<W>::type;
  const V x1 = load_vec<W>(x + j), x2 = load_vec<W>(x + half + j);
  store_vec<W>(out + j,
               round_inner<T, W>(x1 * load_vec<W>(c + j)) - round_inner<T, W>(x2 * load_vec<W>(s + j)));
  store_vec<W>(out + half + j, round_inner<T, W>(x2 * load_vec<W>(c + half + j)) +
                                   round_inner<T, W>(x1 * load_vec<W>(s + half + j)));
}

// 2W lanes of it from column j (j + 2W <= half) through load_pair / store_pair: the same
// operations on each element as rope_lanes (bf16 widened without shuffles). cos / sin come
// widened in load_pair's order (for fp32 that is the table row itself), once per row for all
// its heads.
template <class T, int W>
SWARM_INLINE void rope_pairs(const T* x, const float* c, const float* s, T* out, int64_t half, int64_t j) {
  using V = typename Vec<W>::type;
  V x1[2], x2[2];
  simd::load_pair<W>(x + j, x1[0], x1[1]);
  simd::load_pair<W>(x + half + j, x2[0], x2[1]);
  V lo[2], hi[2];
  for (int k = 0; k < 2; ++k) {
    const int64_t at = j + k * W;
    const V c1 = load_vec<W>(c + at), c2 = load_vec<W>(c + half + at);
    const V s1 = load_vec<W>(s + at), s2 = load_vec<W>(s + half + at);
    lo[k] = round_inner<T, W>(x1[k] * c1) - round_inner<T, W>(x2[k] * s1);
    hi[k] = round_inner<T, W>(x2[k] * c2) + round_inner<T, W>(x1[k] * s2);
  }
  simd::store_pair<W>(out + j, lo[0], lo[1]);
  simd::store_pair<W>(out + half + j, hi[0], hi[1]);
}

// cos / sin columns [0, pairs) of each half widened in load_pair's order (bf16; fp32 rows are
// read in place).
template <class T, int W>
SWARM_INLINE const float* widened_pairs(const T* row, float* buf, int64_t half, int64_t pairs) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    using V = typename Vec<W>::type;
    for (int64_t base : {int64_t{0}, half})
      for (int64_t j = 0; j < pairs; j += 2 * W) {
        V even, odd;
        simd::load_pair<W>(row + base + j, even, odd);
        store_vec<W>(buf + base + j, even);
        store_vec<W>(buf + base + j + W, odd);
      }
    return buf;
  }
}

template <class T, int W>
SWARM_INLINE void rope_head(const T* x, const T* c, const T* s, const float* cw, const float* sw, T* out,
                            int64_t half, int64_t pairs) {
  int64_t j = 0;
  for (; j < pairs; j += 2 * W) rope_pairs<T, W>(x, cw, sw, out, half, j);
  for (; j + W <= half; j += W) rope_lanes<T, W>(x, c, s, out, half, j);
  // Half-width vectors for what is left (head_dim 16, as TinyStories has, is all of it with
  // 16-float vectors: scalar, it took 9 % of a batch-32 step).
  if constexpr (W > 8) {
    for (; j + 8 <= half; j += 8) rope_lanes<T, 8>(x, c, s, out, half, j);
  }
  for (; j < half; ++j) {
    const float x1 = to_float(x[j]), x2 = to_float(x[half + j]);
    out[j] = static_cast<T>(round_to<T>(x1 * to_float(c[j])) - round_to<T>(x2 * to_float(s[j])));
    out[half + j] =
        static_cast<T>(round_to<T>(x2 * to_float(c[half + j])) + round_to<T>(x1 * to_float(s[half + j])));
  }
}

template <class T, int W>
SWARM_INLINE void rope_rows(const RopeArgs& a, int64_t begin, int64_t end) {
  const int64_t hd = a.hd, half = hd / 2, width = (a.heads + 2 * a.kv_heads) * hd, kv_width = a.kv_heads * hd;
  const int64_t pairs = half / (2 * W) * (2 * W);
  std::vector<float> widened(std::is_same_v<T, float> ? 0 : static_cast<size_t>(2 * hd));
  for (int64_t i = begin; i < end; ++i) {
    const T* src = static_cast<const T*>(a.qkv) + i * width;
    const T* c = static_cast<const T*>(a.cos) + a.positions[i] * hd;
    const T* s = static_cast<const T*>(a.sin) + a.positions[i] * hd;
    const float* cw = widened_pairs<T, W>(c, widened.data(), half, pairs);
    const float* sw = widened_pairs<T, W>(s, widened.data() + hd, half, pairs);
    T* q = static_cast<T*>(a.q) + i * a.heads * hd;
    for (int64_t h = 0; h < a.heads; ++h)
      rope_head<T, W>(src + h * hd, c, s, cw, sw, q + h * hd, half, pairs);
    T* k = static_cast<T*>(a.k_cache) + a.rows[i] * kv_width;
    for (int64_t h = 0; h < a.kv_heads; ++h)
      rope_head<T, W>(src + (a.heads + h) * hd, c, s, cw, sw, k + h * hd, half, pairs);
    std::memcpy(static_cast<T*>(a.v_cache) + a.rows[i] * kv_width, src + (a.heads + a.kv_heads) * hd,
                static_cast<size_t>(kv_width) * sizeof(T));
  }
}
SWARM_KERNEL_COPIES(rope_kernel, RopeArgs, rope_rows)

}  // namespace

at::Tensor output_tensor(const at::Tensor& out, at::IntArrayRef sizes, at::ScalarType dtype, const char* op,
                         std::initializer_list<const at::Tensor*> inputs) {
  if (!out.defined()) return at::empty(sizes, at::TensorOptions().dtype(dtype));
  SWARM_CHECK(
      out.device().is_cpu() && out.is_contiguous() && out.scalar_type() == dtype && out.sizes() == sizes,
      std::string(op) + ": out must be a contiguous CPU tensor of the result's shape and dtype");
  const auto* begin = static_cast<const char*>(out.data_ptr());
  const auto* end = begin + out.nbytes();
  for (const at::Tensor* in : inputs) {
    if (in == nullptr || !in->defined()) continue;
    const auto* b = static_cast<const char*>(in->data_ptr());
    SWARM_CHECK(b + in->nbytes() <= begin || end <= b, std::string(op) + ": out shares memory with an input");
  }
  return out;
}

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& out) {
  RECORD_FUNCTION("swarm::rms_norm_rows", c10::ArrayRef<const c10::IValue>{});
  check_cpu_dtype(x, "rms_norm_rows");
  SWARM_CHECK(x.dim() == 2 && x.is_contiguous() && weight.dim() == 1 && weight.is_contiguous() &&
                  weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "rms_norm_rows: x [N, H] contiguous, weight [H] of x's dtype");
  at::Tensor y = output_tensor(out, x.sizes(), x.scalar_type(), "rms_norm_rows", {&x, &weight});
  const NormArgs a{x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.size(1), static_cast<float>(eps)};
  const auto run = rms_kernel(x.scalar_type() == at::kBFloat16);
  at::parallel_for(0, x.size(0), grain_for(x.size(1)), [&](int64_t b, int64_t e) { run(a, b, e); });
  return y;
}

at::Tensor add_rms_norm_rows(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps,
                             const at::Tensor& out) {
  RECORD_FUNCTION("swarm::add_rms_norm_rows", c10::ArrayRef<const c10::IValue>{});
  check_cpu_dtype(x, "add_rms_norm_rows");
  SWARM_CHECK(x.dim() == 2 && x.is_contiguous() && weight.dim() == 1 && weight.is_contiguous() &&
                  weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "add_rms_norm_rows: x [N, H] contiguous, weight [H] of x's dtype");
  SWARM_CHECK(delta.sizes() == x.sizes() && delta.is_contiguous() && delta.scalar_type() == x.scalar_type() &&
                  delta.device().is_cpu(),
              "add_rms_norm_rows: delta must be contiguous, of x's shape and dtype");
  at::Tensor y = output_tensor(out, x.sizes(), x.scalar_type(), "add_rms_norm_rows", {&x, &delta, &weight});
  NormArgs a{x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.size(1), static_cast<float>(eps)};
  a.add = delta.data_ptr();
  const auto run = rms_kernel(x.scalar_type() == at::kBFloat16);
  at::parallel_for(0, x.size(0), grain_for(2 * x.size(1)), [&](int64_t b, int64_t e) { run(a, b, e); });
  return y;
}

at::Tensor rope_qkv_into_cache(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t head_dim,
                               const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                               const at::Tensor& cache_rows, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& out) {
  RECORD_FUNCTION("swarm::rope_qkv_into_cache", c10::ArrayRef<const c10::IValue>{});
  check_cpu_dtype(qkv, "rope_qkv_into_cache");
  const int64_t n = qkv.size(0), width = (heads + 2 * kv_heads) * head_dim;
  const auto dt = qkv.scalar_type();
  SWARM_CHECK(
      qkv.dim() == 2 && qkv.is_contiguous() && qkv.size(1) == width && head_dim % 2 == 0,
      "rope_qkv_into_cache: qkv must be [N, (heads + 2 kv_heads) * head_dim] contiguous, head_dim even");
  SWARM_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.dim() == 2 &&
                  cos.size(1) == head_dim && cos.scalar_type() == dt && sin.scalar_type() == dt,
              "rope_qkv_into_cache: cos / sin must be [positions, head_dim] of qkv's dtype");
  SWARM_CHECK(positions.scalar_type() == at::kLong && cache_rows.scalar_type() == at::kLong &&
                  positions.is_contiguous() && cache_rows.is_contiguous() && positions.numel() == n &&
                  cache_rows.numel() == n && positions.device().is_cpu() && cache_rows.device().is_cpu(),
              "rope_qkv_into_cache: positions / cache_rows must be [N] int64 on the CPU");
  SWARM_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.scalar_type() == dt &&
                  v_cache.scalar_type() == dt && k_cache.numel() == v_cache.numel() &&
                  k_cache.numel() % (kv_heads * head_dim) == 0,
              "rope_qkv_into_cache: the caches must be contiguous, of qkv's dtype, whole rows of kv_heads * "
              "head_dim");
  const int64_t cache_rows_total = k_cache.numel() / (kv_heads * head_dim);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* rows = cache_rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    SWARM_CHECK(pos[i] >= 0 && pos[i] < cos.size(0),
                "rope_qkv_into_cache: position out of the tables' range");
    SWARM_CHECK(rows[i] >= 0 && rows[i] < cache_rows_total, "rope_qkv_into_cache: cache row out of range");
  }
  at::Tensor q =
      output_tensor(out, {n, heads, head_dim}, dt, "rope_qkv_into_cache", {&qkv, &k_cache, &v_cache});
  const RopeArgs a{qkv.data_ptr(),     cos.data_ptr(),     sin.data_ptr(), pos,      rows,    q.data_ptr(),
                   k_cache.data_ptr(), v_cache.data_ptr(), heads,          kv_heads, head_dim};
  const auto run = rope_kernel(dt == at::kBFloat16);
  at::parallel_for(0, n, grain_for(width), [&](int64_t b, int64_t e) { run(a, b, e); });
  return q;
}

}  // namespace swarm
