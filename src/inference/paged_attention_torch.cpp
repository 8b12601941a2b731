#include "inference/paged_attention_torch.hpp"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/error.hpp"
#include "inference/cpu_dispatch.hpp"
#include "inference/cpu_vec.hpp"

namespace swarm {
namespace {

using simd::exp_nonpositive;
using simd::hsum;
using simd::load_vec;
using simd::store_vec;
using simd::to_float;
using simd::Vec;

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

// ---------------------------------------------------------------- vectorised path
// head_dim W, 2W, 4W, 6W, 8W or 16W for the vector width W (16 floats on AVX-512, 8
// otherwise): scores and the weighted sum run on W-float vectors (bf16 rows widened as they
// are loaded) with several independent accumulators, so neither waits on the latency of one
// long chain of multiply-adds as the plain loop above does, and the softmax's exponentials are
// computed W at a time.
// Attention of the `rep` query heads of kv head g of sequence b; head_dim = W * C.
template <class T, int W, int C>
SWARM_INLINE void attend_one_vec(const Args& a, int64_t b, int64_t g, std::vector<float>& scratch,
                                 std::vector<const T*>& krows, std::vector<const T*>& vrows) {
  using V = typename Vec<W>::type;
  constexpr int64_t hd = int64_t{W} * C;
  const int64_t rep = a.heads / a.kv_heads, kvh = a.kv_heads, bs = a.block_size;
  const PagedContext& ctx = *a.ctx;
  const int64_t len = ctx.lengths[static_cast<size_t>(b)];
  const int64_t first = std::max<int64_t>(0, len - a.window);
  const int64_t n = len - first;
  const int64_t n4 = (n + W - 1) / W * W;  // keys padded to a multiple of W (and so of 4)
  const int64_t* table = ctx.block_ids.data() + ctx.table_offset[static_cast<size_t>(b)];

  // scratch: q (rep*hd) | scores (rep*n4)
  scratch.resize(static_cast<size_t>(rep * hd + rep * n4));
  float* qf = scratch.data();
  float* scores = qf + rep * hd;
  const T* q = static_cast<const T*>(a.q) + (b * a.heads + g * rep) * hd;
  for (int64_t i = 0; i < rep * hd; ++i) qf[i] = to_float(q[i]) * a.scale;

  // Where each key's K and V rows are in the cache.
  krows.resize(static_cast<size_t>(n4));
  vrows.resize(static_cast<size_t>(n4));
  const T* kbase = static_cast<const T*>(a.k);
  const T* vbase = static_cast<const T*>(a.v);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t pos = first + j;
    const int64_t row = (table[pos / bs] * bs + pos % bs) * kvh + g;
    krows[static_cast<size_t>(j)] = kbase + row * hd;
    vrows[static_cast<size_t>(j)] = vbase + row * hd;
  }
  for (int64_t j = n; j < n4; ++j) {  // padding keys read a real row; their weight is 0
    krows[static_cast<size_t>(j)] = krows[0];
    vrows[static_cast<size_t>(j)] = vrows[0];
  }

  // The cache rows are scattered over blocks and each is only a few cache lines, too little for
  // the hardware prefetcher to follow: the first pass over the keys asks for the K rows
  // kPrefetchKeys ahead and for the V rows it will need after the softmax.
  constexpr int64_t kPrefetchKeys = 16;
  constexpr int64_t row_bytes = hd * static_cast<int64_t>(sizeof(T));
  const auto prefetch_row = [](const T* row) __attribute__((always_inline)) {
    const char* p = reinterpret_cast<const char*>(row);
    for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off);
    __builtin_prefetch(p + row_bytes - 1);
  };
  for (int64_t j = 0; j < std::min(n, kPrefetchKeys); ++j) prefetch_row(krows[static_cast<size_t>(j)]);

  for (int64_t r = 0; r < rep; ++r) {
    // Scores, four keys at a time (four independent accumulators).
    const float* qr = qf + r * hd;
    float* sr = scores + r * n4;
    for (int64_t j = 0; j < n4; j += 4) {
      if (r == 0) {
        for (int64_t k = j; k < std::min(j + 4, n); ++k) prefetch_row(vrows[static_cast<size_t>(k)]);
        for (int64_t k = j + kPrefetchKeys; k < std::min(j + kPrefetchKeys + 4, n); ++k)
          prefetch_row(krows[static_cast<size_t>(k)]);
      }
      const T* k0 = krows[static_cast<size_t>(j)];
      const T* k1 = krows[static_cast<size_t>(j + 1)];
      const T* k2 = krows[static_cast<size_t>(j + 2)];
      const T* k3 = krows[static_cast<size_t>(j + 3)];
      V s0{}, s1{}, s2{}, s3{};
      for (int c = 0; c < C; ++c) {
        const V qc = load_vec<W>(qr + W * c);
        s0 += qc * load_vec<W>(k0 + W * c);
        s1 += qc * load_vec<W>(k1 + W * c);
        s2 += qc * load_vec<W>(k2 + W * c);
        s3 += qc * load_vec<W>(k3 + W * c);
      }
      sr[j] = hsum(s0);
      sr[j + 1] = hsum(s1);
      sr[j + 2] = hsum(s2);
      sr[j + 3] = hsum(s3);
    }
    // Softmax over the n real keys; the padding keys get weight 0.
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) m = std::max(m, sr[j]);
    for (int64_t j = 0; j < n4; j += W) store_vec<W>(sr + j, exp_nonpositive<W>(load_vec<W>(sr + j) - m));
    for (int64_t j = n; j < n4; ++j) sr[j] = 0.f;
    V total{};
    for (int64_t j = 0; j < n4; j += W) total += load_vec<W>(sr + j);
    const V inv = V{} + 1.f / hsum(total);
    for (int64_t j = 0; j < n4; j += W) store_vec<W>(sr + j, load_vec<W>(sr + j) * inv);
  }

  // Weighted sum of the values: C accumulators per set, two sets (even and odd keys) while
  // that still fits the register file.
  constexpr int S = C >= 8 ? 1 : 2;
  T* out = static_cast<T*>(a.out) + (b * a.heads + g * rep) * hd;
  for (int64_t r = 0; r < rep; ++r) {
    const float* pr = scores + r * n4;
    V acc[S][C];
    for (int k = 0; k < S; ++k)
      for (int c = 0; c < C; ++c) acc[k][c] = V{};
    for (int64_t j = 0; j < n4; j += S) {
      for (int k = 0; k < S; ++k) {
        const T* vr = vrows[static_cast<size_t>(j + k)];
        const float p = pr[j + k];
        for (int c = 0; c < C; ++c) acc[k][c] += p * load_vec<W>(vr + W * c);
      }
    }
    for (int c = 0; c < C; ++c) {
      V total = acc[0][c];
      for (int k = 1; k < S; ++k) total += acc[k][c];
      store_vec<W>(out + r * hd + W * c, total);
    }
  }
}

template <class T, int W>
SWARM_INLINE void run_range(const Args& a, int64_t begin, int64_t end) {
  std::vector<float> scratch;
  std::vector<const T*> krows, vrows;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / a.kv_heads, g = item % a.kv_heads;
    switch (a.head_dim) {
      case W: attend_one_vec<T, W, 1>(a, b, g, scratch, krows, vrows); break;
      case 2 * W: attend_one_vec<T, W, 2>(a, b, g, scratch, krows, vrows); break;
      case 4 * W: attend_one_vec<T, W, 4>(a, b, g, scratch, krows, vrows); break;
      case 6 * W: attend_one_vec<T, W, 6>(a, b, g, scratch, krows, vrows); break;
      case 8 * W: attend_one_vec<T, W, 8>(a, b, g, scratch, krows, vrows); break;
      case 16 * W: attend_one_vec<T, W, 16>(a, b, g, scratch, krows, vrows); break;
      default: attend_one<T>(a, b, g, scratch); break;  // any other head_dim: the plain loop
    }
  }
}

// One copy per instruction set (cpu_dispatch.hpp).
SWARM_TARGET_AVX512 void run_range_f32_avx512(const Args& a, int64_t begin, int64_t end) { run_range<float, 16>(a, begin, end); }
SWARM_TARGET_AVX2 void run_range_f32_avx2(const Args& a, int64_t begin, int64_t end) { run_range<float, 8>(a, begin, end); }
void run_range_f32_base(const Args& a, int64_t begin, int64_t end) { run_range<float, 8>(a, begin, end); }
SWARM_TARGET_AVX512 void run_range_bf16_avx512(const Args& a, int64_t begin, int64_t end) {
  run_range<c10::BFloat16, 16>(a, begin, end);
}
SWARM_TARGET_AVX2 void run_range_bf16_avx2(const Args& a, int64_t begin, int64_t end) {
  run_range<c10::BFloat16, 8>(a, begin, end);
}
void run_range_bf16_base(const Args& a, int64_t begin, int64_t end) { run_range<c10::BFloat16, 8>(a, begin, end); }

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const PagedContext& context, int64_t window, double scale) {
  // Named in profiles (bench_inference --profile-ops), where it is not an aten op.
  RECORD_FUNCTION("swarm::paged_decode_attention", c10::ArrayRef<const c10::IValue>{});
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
  using Range = void (*)(const Args&, int64_t, int64_t);
  const Range run = bf16 ? cpu_pick<Range>(run_range_bf16_avx512, run_range_bf16_avx2, run_range_bf16_base)
                         : cpu_pick<Range>(run_range_f32_avx512, run_range_f32_avx2, run_range_f32_base);
  at::parallel_for(0, B * kvh, 1, [&](int64_t begin, int64_t end) { run(a, begin, end); });
  return out;
}

}  // namespace swarm
