#include "inference/paged_attention_torch.hpp"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.hpp"

namespace swarm {
namespace {

// Inlined into each per-ISA clone below, so every clone gets its own vectorised copy.
#define SWARM_INLINE inline __attribute__((always_inline))

struct Args {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  const PagedContext* ctx;
  int64_t heads, kv_heads, head_dim, block_size, window;
  float scale;
};

SWARM_INLINE float to_float(float x) { return x; }
SWARM_INLINE float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

// Converts one cache row to fp32 (a no-op copy for fp32 rows is avoided by the caller).
template <class T>
SWARM_INLINE void load_row(const T* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

// Attention of the `rep` query heads of kv head g of sequence b.
template <class T>
SWARM_INLINE void attend_one(const Args& a, int64_t b, int64_t g, std::vector<float>& scratch) {
  const int64_t hd = a.head_dim, rep = a.heads / a.kv_heads, kvh = a.kv_heads, bs = a.block_size;
  const PagedContext& ctx = *a.ctx;
  const int64_t len = ctx.lengths[static_cast<size_t>(b)];
  const int64_t first = std::max<int64_t>(0, len - a.window);
  const int64_t n = len - first;
  const int64_t* table = ctx.block_ids.data() + ctx.table_offset[static_cast<size_t>(b)];

  // scratch: q (rep*hd) | scores (rep*n) | acc (rep*hd) | row (hd)
  scratch.resize(static_cast<size_t>(rep * hd * 2 + rep * n + hd));
  float* qf = scratch.data();
  float* scores = qf + rep * hd;
  float* acc = scores + rep * n;
  float* row = acc + rep * hd;

  const T* q = static_cast<const T*>(a.q) + (b * a.heads + g * rep) * hd;
  for (int64_t i = 0; i < rep * hd; ++i) qf[i] = to_float(q[i]) * a.scale;

  const T* kbase = static_cast<const T*>(a.k);
  const T* vbase = static_cast<const T*>(a.v);
  auto cache_row = [&](const T* base, int64_t j) __attribute__((always_inline)) {
    const int64_t block = table[j / bs];
    return base + ((block * bs + j % bs) * kvh + g) * hd;
  };

  // Scores: every key row is read once for all the query heads that share it.
  for (int64_t j = 0; j < n; ++j) {
    const T* kr = cache_row(kbase, first + j);
    const float* kf;
    if constexpr (std::is_same_v<T, float>) {
      kf = kr;
    } else {
      load_row(kr, row, hd);
      kf = row;
    }
    for (int64_t r = 0; r < rep; ++r) {
      const float* qr = qf + r * hd;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < hd; ++i) s += qr[i] * kf[i];
      scores[r * n + j] = s;
    }
  }
  // Softmax per query head.
  for (int64_t r = 0; r < rep; ++r) {
    float* sr = scores + r * n;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) m = std::max(m, sr[j]);
    float sum = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      sr[j] = std::exp(sr[j] - m);
      sum += sr[j];
    }
    const float inv = 1.f / sum;
    for (int64_t j = 0; j < n; ++j) sr[j] *= inv;
  }
  // Weighted sum of the values.
  std::fill(acc, acc + rep * hd, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    const T* vr = cache_row(vbase, first + j);
    const float* vf;
    if constexpr (std::is_same_v<T, float>) {
      vf = vr;
    } else {
      load_row(vr, row, hd);
      vf = row;
    }
    for (int64_t r = 0; r < rep; ++r) {
      const float p = scores[r * n + j];
      float* ar = acc + r * hd;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) ar[i] += p * vf[i];
    }
  }
  T* out = static_cast<T*>(a.out) + (b * a.heads + g * rep) * hd;
  for (int64_t i = 0; i < rep * hd; ++i) out[i] = static_cast<T>(acc[i]);
}

template <class T>
SWARM_INLINE void run_range(const Args& a, int64_t begin, int64_t end) {
  std::vector<float> scratch;
  for (int64_t item = begin; item < end; ++item) attend_one<T>(a, item / a.kv_heads, item % a.kv_heads, scratch);
}

// Compiled for several instruction sets; the loader picks the best one for this CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SWARM_CPU_CLONES __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define SWARM_CPU_CLONES
#endif

SWARM_CPU_CLONES void run_range_f32(const Args& a, int64_t begin, int64_t end) { run_range<float>(a, begin, end); }
SWARM_CPU_CLONES void run_range_bf16(const Args& a, int64_t begin, int64_t end) {
  run_range<c10::BFloat16>(a, begin, end);
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const PagedContext& context, int64_t window, double scale) {
  SWARM_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode_attention: q must be [B, heads, hd] and the caches [blocks, block, kv_heads, hd]");
  SWARM_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "paged_decode_attention: CPU tensors only");
  SWARM_CHECK(q.scalar_type() == k_cache.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_decode_attention: q and the caches must share a dtype");
  SWARM_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode_attention: contiguous tensors only");
  const int64_t B = q.size(0), heads = q.size(1), hd = q.size(2);
  const int64_t kvh = k_cache.size(2);
  SWARM_CHECK(k_cache.size(3) == hd && kvh > 0 && heads % kvh == 0, "paged_decode_attention: head shapes differ");
  SWARM_CHECK(static_cast<int64_t>(context.lengths.size()) == B &&
                  static_cast<int64_t>(context.table_offset.size()) == B + 1,
              "paged_decode_attention: context does not describe every sequence");
  const int64_t bs = k_cache.size(1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = context.lengths[static_cast<size_t>(b)];
    const int64_t blocks = context.table_offset[static_cast<size_t>(b) + 1] - context.table_offset[static_cast<size_t>(b)];
    SWARM_CHECK(len >= 1 && len <= blocks * bs, "paged_decode_attention: a sequence's length exceeds its blocks");
  }

  at::Tensor out = at::empty({B, heads * hd}, q.options());
  Args a{q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), &context, heads, kvh, hd, bs,
         std::max<int64_t>(1, window), static_cast<float>(scale)};
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  SWARM_CHECK(bf16 || q.scalar_type() == at::kFloat, "paged_decode_attention: fp32 or bf16 only");
  at::parallel_for(0, B * kvh, 1, [&](int64_t begin, int64_t end) {
    if (bf16) {
      run_range_bf16(a, begin, end);
    } else {
      run_range_f32(a, begin, end);
    }
  });
  return out;
}

}  // namespace swarm
