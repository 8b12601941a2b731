#include "kernels/cpu/small_linear_torch.hpp"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "kernels/cpu/cpu_dispatch.hpp"
#include "kernels/cpu/cpu_vec.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/serving_ops_torch.hpp"

#if SWARM_HAVE_X86_KERNELS
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace swarm {
namespace {

#define SWARM_INLINE inline __attribute__((always_inline))

struct Args {
  // [M, in], fp32 copy of the input (the widening kernels). For bf16 weights each row's first
  // in / 2W * 2W values are in pair order (widened_input below), matching simd::load_pair.
  const float* x;
  const void* xb;    // [M, in], the bf16 input itself (the dot-product kernel)
  const void* w;     // [out, in]
  const void* bias;  // [out] or null
  void* y;           // [M, out]
  int64_t m, in, out;
  bool y_float = false;  // y is fp32, holding the results rounded to bf16 (bf16 weights)
  int64_t pair = 0;      // > 0: y[:, o] = silu(x . w[o]) * (x . w[o + pair]), out = pair
};

using simd::to_float;

// Output feature o for the M input rows. The weight row is streamed once, front to back (one
// sequential stream per thread is what the hardware prefetcher follows best: reading several
// weight rows side by side measured 10-20% slower once the weights come from memory), with
// U x M independent accumulators of W lanes, so every W weights are loaded (and widened from
// bf16) once for all M rows and U x M multiply-add chains run side by side instead of one
// long dependent chain.
constexpr int64_t kOutBlock = 32;  // output features per block of results

// Writes the M results of feature o to sums[0], sums[kOutBlock], ..., sums[(M - 1) * kOutBlock].
// bf16 weights are read 2W at a time with simd::load_pair (the even-indexed and the odd-indexed
// weights of the 2W, widened with one shift or mask each: GCC 12 turns the plain widening load
// into five instructions on AVX2, which made the bf16 stream compute-bound), against an input
// laid out to match (widened_input); fp32 weights W at a time.
template <class T, int W, int M, int U>
SWARM_INLINE void one_row(const Args& a, int64_t o, float* sums) {
  using V = typename simd::Vec<W>::type;
  constexpr bool kPairs = std::is_same_v<T, c10::BFloat16>;
  constexpr int64_t kStep = kPairs ? 2 * W : W;                            // values per load
  constexpr int64_t kLoads = kPairs && U == 1 ? 1 : (kPairs ? U / 2 : U);  // loads per step
  constexpr int64_t kSpan = kLoads * kStep;
  const int64_t in = a.in, full = in / kSpan * kSpan, vec = in / kStep * kStep;
  const T* w = static_cast<const T*>(a.w) + o * in;
  V acc[U][M];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < M; ++m) acc[u][m] = V{};
  // The kStep values at i into accumulators u and (pairs) u + 1, modulo U.
  auto step = [&](int64_t i, int u) __attribute__((always_inline)) {
    if constexpr (kPairs) {
      V even, odd;
      simd::load_pair<W>(w + i, even, odd);
      for (int m = 0; m < M; ++m) acc[u][m] += even * simd::load_vec<W>(a.x + m * in + i);
      for (int m = 0; m < M; ++m) acc[(u + 1) % U][m] += odd * simd::load_vec<W>(a.x + m * in + i + W);
    } else {
      const V wv = simd::load_vec<W>(w + i);
      for (int m = 0; m < M; ++m) acc[u][m] += wv * simd::load_vec<W>(a.x + m * in + i);
    }
  };
  int64_t i = 0;
  for (; i < full; i += kSpan)
    for (int k = 0; k < kLoads; ++k) step(i + k * kStep, static_cast<int>((kPairs ? 2 * k : k) % U));
  for (; i < vec; i += kStep) step(i, 0);
  const float b = a.bias ? to_float(static_cast<const T*>(a.bias)[o]) : 0.f;
  for (int m = 0; m < M; ++m) {
    V total = acc[0][m];
    for (int u = 1; u < U; ++u) total += acc[u][m];
    float s = simd::hsum(total);
    for (int64_t j = vec; j < in; ++j) s += to_float(w[j]) * a.x[m * in + j];
    sums[m * kOutBlock] = s + b;
  }
}

template <class T, int W, int M>
SWARM_INLINE void rows(const Args& a, int64_t begin, int64_t end) {
  constexpr int U = M <= 2 ? 4 : M <= 4 ? 2 : 1;  // U x M <= 8 accumulators
  // Results go to a small block first and out row by row: storing each feature's M results
  // straight into y touches M rows `out` apart, which for some widths (3072 fp32: 12 KiB, a
  // multiple of 4 KiB) all map to the same L1 set (measured: 8 rows, 3072 x 576, 1.7x slower).
  float block[M * kOutBlock];
  T* y = static_cast<T*>(a.y);
  if (a.pair > 0) {
    // silu(gate) * up, gate and up rounded to T as the projection rounds them and the rest as
    // silu_mul computes it, so the result is bit for bit small_linear followed by silu_mul.
    using V = typename simd::Vec<W>::type;
    float up_block[M * kOutBlock];
    for (int64_t o0 = begin; o0 < end; o0 += kOutBlock) {
      const int64_t count = std::min<int64_t>(kOutBlock, end - o0);
      for (int64_t k = 0; k < count; ++k) {
        one_row<T, W, M, U>(a, o0 + k, block + k);
        one_row<T, W, M, U>(a, a.pair + o0 + k, up_block + k);
      }
      for (int m = 0; m < M; ++m) {
        for (int64_t k = 0; k < count; k += W) {
          float gt[W] = {}, ut[W] = {};  // zero-padded past count, as silu_mul pads its tail
          T ot[W];
          const int64_t n = std::min<int64_t>(W, count - k);
          for (int64_t j = 0; j < n; ++j) {
            gt[j] = simd::round_to<T>(block[m * kOutBlock + k + j]);
            ut[j] = simd::round_to<T>(up_block[m * kOutBlock + k + j]);
          }
          const V g = simd::load_vec<W>(gt);
          simd::store_vec<W>(ot, simd::round_inner<T, W>(simd::silu<W>(g)) * simd::load_vec<W>(ut));
          std::copy(ot, ot + n, y + m * a.out + o0 + k);
        }
      }
    }
    return;
  }
  float* yf = static_cast<float*>(a.y);
  for (int64_t o0 = begin; o0 < end; o0 += kOutBlock) {
    const int64_t count = std::min<int64_t>(kOutBlock, end - o0);
    for (int64_t k = 0; k < count; ++k) one_row<T, W, M, U>(a, o0 + k, block + k);
    for (int m = 0; m < M; ++m) {
      if (a.y_float) {  // fp32 out, holding the results rounded to T (what T then widened gives)
        for (int64_t k = 0; k < count; ++k)
          yf[m * a.out + o0 + k] = simd::round_to<T>(block[m * kOutBlock + k]);
      } else {
        for (int64_t k = 0; k < count; ++k) y[m * a.out + o0 + k] = static_cast<T>(block[m * kOutBlock + k]);
      }
    }
  }
}

template <class T, int W>
SWARM_INLINE void rows_any(const Args& a, int64_t begin, int64_t end) {
  switch (a.m) {
    case 1:
      return rows<T, W, 1>(a, begin, end);
    case 2:
      return rows<T, W, 2>(a, begin, end);
    case 3:
      return rows<T, W, 3>(a, begin, end);
    case 4:
      return rows<T, W, 4>(a, begin, end);
    case 5:
      return rows<T, W, 5>(a, begin, end);
    case 6:
      return rows<T, W, 6>(a, begin, end);
    case 7:
      return rows<T, W, 7>(a, begin, end);
    default:
      return rows<T, W, 8>(a, begin, end);  // a.m <= kSmallLinearMaxRows == 8
  }
}

// One copy per instruction set (cpu_dispatch.hpp).
SWARM_KERNEL_COPIES(widening_rows, Args, rows_any)

// ---------------------------------------------------------------- many rows (widening tiles)
//
// From 9 rows on, streaming each weight row once (rows above) leaves the multiply-adds waiting
// on loads: each weight vector meets at most 8 input rows. Here MT input rows and U weight rows
// meet at once, so each weight vector (widened once) serves MT rows and each input vector U
// weight rows: per 2W values, U weight loads and 2 MT input loads for 2 MT U multiply-adds.
// The input rows of a tile stay in L1 while a block of weight rows (in L2) passes them. Without
// bf16 dot products this reads the bf16 weights as they are (no widened copy, no GEMM packing);
// see kSmallLinearWideningMaxRows for what it was measured against.
constexpr int kTileRows = 3;                       // MT: input rows per tile
constexpr int kTileFeatures = 3;                   // U: weight rows per tile
constexpr int64_t kTileBlockBytes = 96 << 10;      // weights a block of tiles shares (L2)
constexpr int64_t kTileRowBlockBytes = 128 << 10;  // fp32 input rows a block of tiles shares (L2)

// Widens the high halves of W 32-bit lanes at p: read at the values' start, the odd-indexed bf16
// values of a pair order; read one value earlier, the even-indexed ones. A mask each, where
// simd::load_pair shifts the even ones (shifts share the multiply-add ports on many CPUs; masks
// run on any vector port). Reads p[-1] for the even ones: not for the first values of a tensor.
template <int W>
SWARM_INLINE typename simd::Vec<W>::type load_half(const c10::BFloat16* p) {
  using I = typename simd::Vec<W>::ints;
  I lanes;
  __builtin_memcpy(&lanes, p, sizeof lanes);
  lanes &= static_cast<int32_t>(0xffff0000u);
  typename simd::Vec<W>::type v;
  __builtin_memcpy(&v, &lanes, sizeof v);
  return v;
}

// sums[m][u] = x_{m0 + m} . w_{o + u} over the whole of `in` (x in pair order for bf16 weights).
template <class T, int W, int MT, int U>
SWARM_INLINE void tile(const Args& a, int64_t m0, int64_t o, float (&sums)[MT][U]) {
  using V = typename simd::Vec<W>::type;
  constexpr int64_t kStep = 2 * W;
  const int64_t in = a.in, vec = in / kStep * kStep;
  const T* w = static_cast<const T*>(a.w) + o * in;
  const float* x = a.x + m0 * in;
  V acc[MT][U];
  for (int m = 0; m < MT; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = V{};
  // The 2W values at i: the first W of each pair (even-indexed for bf16) against x's first W, then
  // the second. bf16 steps after the first read their pairs with masks only (load_half).
  auto step = [&](int64_t i, auto masked) __attribute__((always_inline)) {
    V wv[U];
    if constexpr (decltype(masked)::value) {
      for (int u = 0; u < U; ++u) wv[u] = load_half<W>(w + u * in + i - 1);
    } else {
      for (int u = 0; u < U; ++u) {
        V ignored;
        simd::load_pair<W>(w + u * in + i, wv[u], ignored);
      }
    }
    for (int m = 0; m < MT; ++m) {
      const V x0 = simd::load_vec<W>(x + m * in + i);
      for (int u = 0; u < U; ++u) acc[m][u] += wv[u] * x0;
    }
    if constexpr (decltype(masked)::value) {
      for (int u = 0; u < U; ++u) wv[u] = load_half<W>(w + u * in + i);
    } else {
      for (int u = 0; u < U; ++u) {
        V ignored;
        simd::load_pair<W>(w + u * in + i, ignored, wv[u]);
      }
    }
    for (int m = 0; m < MT; ++m) {
      const V x1 = simd::load_vec<W>(x + m * in + i + W);
      for (int u = 0; u < U; ++u) acc[m][u] += wv[u] * x1;
    }
  };
  constexpr bool kMasked = std::is_same_v<T, c10::BFloat16>;
  int64_t i = 0;
  if (vec > 0) step(i, std::false_type{}), i += kStep;
  for (; i < vec; i += kStep) step(i, std::integral_constant<bool, kMasked>{});
  // The lanes summed: the first 8 accumulators at once with simd::sum8 on 8-lane vectors (21
  // shuffles and adds for 8 sums, where hsum takes ~6 instructions each).
  int first = 0;
  if constexpr (W == 8 && MT * U >= 8) {
    V eight[8];
    for (int k = 0; k < 8; ++k) eight[k] = acc[k / U][k % U];
    const V total = simd::sum8(eight);
    for (int k = 0; k < 8; ++k) sums[k / U][k % U] = total[k];
    first = 8;
  }
  for (int k = first; k < MT * U; ++k) sums[k / U][k % U] = simd::hsum(acc[k / U][k % U]);
  if (vec < in) {
    for (int m = 0; m < MT; ++m)
      for (int u = 0; u < U; ++u)
        for (int64_t j = vec; j < in; ++j) sums[m][u] += to_float(w[u * in + j]) * x[m * in + j];
  }
}

// One tile's results (plus bias) into y, rounded as rows() rounds them.
template <class T, int W, int MT, int U>
SWARM_INLINE void tile_out(const Args& a, int64_t m0, int64_t o) {
  float sums[MT][U];
  tile<T, W, MT, U>(a, m0, o, sums);
  for (int m = 0; m < MT; ++m)
    for (int u = 0; u < U; ++u) {
      const float v = sums[m][u] + (a.bias ? to_float(static_cast<const T*>(a.bias)[o + u]) : 0.f);
      const int64_t at = (m0 + m) * a.out + o + u;
      if (a.y_float) {
        static_cast<float*>(a.y)[at] = simd::round_to<T>(v);
      } else {
        static_cast<T*>(a.y)[at] = static_cast<T>(v);
      }
    }
}

// Input rows [m0, m0 + MT) against weight rows [begin, end), U at a time.
template <class T, int W, int MT>
SWARM_INLINE void tile_features(const Args& a, int64_t m0, int64_t begin, int64_t end) {
  constexpr int U = kTileFeatures;
  int64_t o = begin;
  for (; o + U <= end; o += U) tile_out<T, W, MT, U>(a, m0, o);
  if constexpr (U > 2) {
    if (end - o >= 2) tile_out<T, W, MT, 2>(a, m0, o), o += 2;
  }
  if (end > o) tile_out<T, W, MT, 1>(a, m0, o);
}

template <class T, int W>
SWARM_INLINE void tiles(const Args& a, int64_t begin, int64_t end) {
  constexpr int MT = kTileRows;
  const int64_t block =
      std::max<int64_t>(kTileFeatures, kTileBlockBytes / static_cast<int64_t>(sizeof(T)) /
                                           std::max<int64_t>(1, a.in) / kTileFeatures * kTileFeatures);
  const int64_t row_block =
      std::max<int64_t>(MT, kTileRowBlockBytes / 4 / std::max<int64_t>(1, a.in) / MT * MT);
  for (int64_t r0 = 0; r0 < a.m; r0 += row_block) {
    const int64_t r1 = std::min(a.m, r0 + row_block);
    for (int64_t o0 = begin; o0 < end; o0 += block) {
      const int64_t o1 = std::min(end, o0 + block);
      int64_t m = r0;
      for (; m + MT <= r1; m += MT) tile_features<T, W, MT>(a, m, o0, o1);
      if constexpr (MT > 2) {
        if (r1 - m >= 2) tile_features<T, W, 2>(a, m, o0, o1), m += 2;
      }
      if (r1 > m) tile_features<T, W, 1>(a, m, o0, o1);
    }
  }
}

SWARM_KERNEL_COPIES(widening_tiles, Args, tiles)

#if SWARM_HAVE_X86_KERNELS
// ---------------------------------------------------------------- bf16 dot products (AVX512_BF16)
//
// VDPBF16PS multiplies 32 bf16 pairs and adds them into 16 fp32 lanes: one instruction per 32
// weights, with no widening. y[m, o] is the dot product of input row m and weight row o, both
// contiguous in `in`, so it is accumulated in 16 lanes and summed at the end. Measured here
// (SmolLM2 projections, 2 threads): one input row streams the weights at ~60 GB/s against
// ~27 GB/s for the widening kernel, and 32 rows run at ~420 GFLOP/s against oneDNN's ~290.
#define SWARM_BF16_INLINE SWARM_TARGET_AVX512_BF16 inline __attribute__((always_inline))

// 32 columns from i of MT input rows x U weight rows into acc; masked-off lanes load zeros.
template <int MT, int U>
SWARM_BF16_INLINE void dot_step(__m512 (&acc)[MT][U], const uint16_t* x, const uint16_t* w, int64_t in,
                                int64_t i, __mmask32 k) {
  __m512bh wv[U];
  for (int u = 0; u < U; ++u) wv[u] = (__m512bh)_mm512_maskz_loadu_epi16(k, w + u * in + i);
  for (int m = 0; m < MT; ++m) {
    const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(k, x + m * in + i);
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_dpbf16_ps(acc[m][u], wv[u], xv);
  }
}

// MT input rows x U weight rows over the whole of `in`: out[m * ld + u] = x_m . w_u. Full
// 32-column steps with a constant mask (plain loads), then one masked step for the rest
// (computing the mask inside the loop measured 1.3-3x slower).
// pf (optional): U weight rows to ask for while these are computed, one cache line of each per
// 32-column step (the next group's rows, spread over this tile rather than all at once).
template <int MT, int U>
SWARM_BF16_INLINE void dot_tile(const uint16_t* x, const uint16_t* w, int64_t in, float* out, int64_t ld,
                                const uint16_t* pf = nullptr) {
  __m512 acc[MT][U];
  for (int m = 0; m < MT; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  int64_t i = 0;
  if (pf != nullptr) {
    for (; i + 32 <= in; i += 32) {
      for (int u = 0; u < U; ++u) _mm_prefetch(reinterpret_cast<const char*>(pf + u * in + i), _MM_HINT_T0);
      dot_step<MT, U>(acc, x, w, in, i, ~__mmask32{0});
    }
  }
  for (; i + 32 <= in; i += 32) dot_step<MT, U>(acc, x, w, in, i, ~__mmask32{0});
  if (i < in) dot_step<MT, U>(acc, x, w, in, i, static_cast<__mmask32>((uint64_t{1} << (in - i)) - 1));
  if constexpr (MT == 4 && U == 4) {
    // The 16 sums in one transposing reduction: lane 4m + u is x_m . w_u.
    simd::Vec<16>::type all[16];
    for (int m = 0; m < 4; ++m)
      for (int u = 0; u < 4; ++u) all[4 * m + u] = simd::Vec<16>::type(acc[m][u]);
    float sums[16];
    simd::store_vec<16>(sums, simd::sum16(all));
    for (int m = 0; m < 4; ++m) __builtin_memcpy(out + m * ld, sums + 4 * m, 4 * sizeof(float));
    return;
  }
  for (int m = 0; m < MT; ++m) {
    if constexpr (U == 4) {
      const simd::f32x4 s = simd::sum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
      for (int u = 0; u < 4; ++u) out[m * ld + u] = s[u];
    } else {
      for (int u = 0; u < U; ++u) out[m * ld + u] = simd::hsum(simd::Vec<16>::type(acc[m][u]));
    }
  }
}

// All M input rows against U weight rows, four input rows at a time.
template <int U>
SWARM_BF16_INLINE void dot_rows(const uint16_t* x, int64_t m, const uint16_t* w, int64_t in, float* out,
                                int64_t ld, const uint16_t* pf = nullptr) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) dot_tile<4, U>(x + r * in, w, in, out + r * ld, ld, r == 0 ? pf : nullptr);
  switch (m - r) {
    case 3:
      return dot_tile<3, U>(x + r * in, w, in, out + r * ld, ld);
    case 2:
      return dot_tile<2, U>(x + r * in, w, in, out + r * ld, ld);
    case 1:
      return dot_tile<1, U>(x + r * in, w, in, out + r * ld, ld);
    default:
      return;
  }
}

// MT input rows (1, 2 or 4) x F = 16 / MT consecutive weight rows, the weight rows one after the
// other (one sequential stream, as dot_rows<1>), their accumulators kept until all F are done
// and then reduced in one sum16 instead of one horizontal sum per weight row: at one to eight
// rows the reductions cost more than the dot products (TinyStories: 4 VDPBF16PS per row).
template <int MT>
SWARM_BF16_INLINE void dot_seq(const uint16_t* x, const uint16_t* w, int64_t in, float* out, int64_t ld) {
  constexpr int F = 16 / MT;
  simd::Vec<16>::type all[16];
  for (int f = 0; f < F; ++f) {
    __m512 acc[MT][1];
    for (int m = 0; m < MT; ++m) acc[m][0] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= in; i += 32) dot_step<MT, 1>(acc, x, w + f * in, in, i, ~__mmask32{0});
    if (i < in)
      dot_step<MT, 1>(acc, x, w + f * in, in, i, static_cast<__mmask32>((uint64_t{1} << (in - i)) - 1));
    for (int m = 0; m < MT; ++m) all[m * F + f] = simd::Vec<16>::type(acc[m][0]);
  }
  float sums[16];
  simd::store_vec<16>(sums, simd::sum16(all));
  for (int m = 0; m < MT; ++m) __builtin_memcpy(out + m * ld, sums + m * F, F * sizeof(float));
}

// Features [k, count) of the block at o0, in whole groups of 16 / MT, for MT input rows.
template <int MT>
SWARM_BF16_INLINE void dot_seq_rows(const Args& a, const uint16_t* x, const uint16_t* w, int64_t o0,
                                    int64_t k, int64_t count, float* block) {
  for (; k + 16 / MT <= count; k += 16 / MT) dot_seq<MT>(x, w + (o0 + k) * a.in, a.in, block + k, kOutBlock);
}

// Weight rows [o0, o0 + count) of w (which has rows up to `end`) against every input row, into
// block (kOutBlock floats per input row).
SWARM_BF16_INLINE void dot_block(const Args& a, const uint16_t* x, const uint16_t* w, int64_t o0,
                                 int64_t count, int64_t end, float* block) {
  int64_t k = 0;
  if (a.m > kSmallLinearMaxRows) {
    for (; k + 4 <= count; k += 4) {
      // Four weight rows read side by side are not a stream the hardware prefetcher follows:
      // ask for the next four while these meet every input row. From 16 rows on, one line of
      // each per step of the first four input rows (the projections of a SmolLM2 batch-32
      // step, weights from memory: 20.1 -> 18.5 ms); fewer rows leave too little time after
      // the first tile, so all of them up front (SmolLM2 bf16 batch-32 decode step 31.6 ->
      // 30.2 ms against no prefetch).
      const int64_t next_row = o0 + k + 4;
      const bool has_next = o0 + k + 8 <= end;
      if (a.m >= 16) {
        dot_rows<4>(x, a.m, w + (o0 + k) * a.in, a.in, block + k, kOutBlock,
                    has_next ? w + next_row * a.in : nullptr);
      } else {
        const char* next = reinterpret_cast<const char*>(w + next_row * a.in);
        const int64_t next_bytes = (has_next ? 4 : 0) * a.in * 2;
        for (int64_t off = 0; off < next_bytes; off += 64) __builtin_prefetch(next + off);
        dot_rows<4>(x, a.m, w + (o0 + k) * a.in, a.in, block + k, kOutBlock);
      }
    }
  }
  // Up to 8 rows (or what is left of the block's features after the 4-row groups): one
  // weight row at a time. In groups of 16 / MT rows while the block has them.
  if (a.m <= kSmallLinearMaxRows) {
    int64_t r = 0;
    for (; a.m - r >= 4; r += 4) dot_seq_rows<4>(a, x + r * a.in, w, o0, k, count, block + r * kOutBlock);
    if (a.m - r >= 2) dot_seq_rows<2>(a, x + r * a.in, w, o0, k, count, block + r * kOutBlock), r += 2;
    if (a.m - r >= 1) dot_seq_rows<1>(a, x + r * a.in, w, o0, k, count, block + r * kOutBlock);
    // Features beyond the last whole group of 16 (at most 15): whichever groups left them.
    const int64_t whole = k + (count - k) / 16 * 16;  // covered by every MT (16, 8 and 4 divide 16)
    k = whole;
  }
  for (; k < count; ++k) dot_rows<1>(x, a.m, w + (o0 + k) * a.in, a.in, block + k, kOutBlock);
}

// Output features [begin, end). Up to 8 input rows, one weight row at a time: one sequential
// stream per thread, which the prefetcher follows best (bandwidth-bound). More rows: four weight
// rows at a time, each weight vector used for four input rows (compute-bound; measured 1.5x
// fewer cycles than one weight row at 16-64 rows, 1.3-1.5x slower at 8).
SWARM_TARGET_AVX512_BF16 void rows_bf16_dot(const Args& a, int64_t begin, int64_t end) {
  using V = simd::Vec<16>::type;
  const auto* x = static_cast<const uint16_t*>(a.xb);
  const auto* w = static_cast<const uint16_t*>(a.w);
  float block[kSmallLinearBf16MaxRows * kOutBlock];
  auto* y = static_cast<c10::BFloat16*>(a.y);
  auto* yf = static_cast<float*>(a.y);
  const auto* bias = static_cast<const c10::BFloat16*>(a.bias);
  if (a.pair > 0) {
    // silu(gate) * up, each rounded to bf16 as the projection, silu_mul and its product round
    // them, so the result is bit for bit small_linear followed by silu_mul.
    float up_block[kSmallLinearBf16MaxRows * kOutBlock];
    for (int64_t o0 = begin; o0 < end; o0 += kOutBlock) {
      const int64_t count = std::min<int64_t>(kOutBlock, end - o0);
      dot_block(a, x, w, o0, count, end, block);
      dot_block(a, x, w + a.pair * a.in, o0, count, end, up_block);
      float bg[kOutBlock] = {}, bu[kOutBlock] = {};
      for (int64_t k = 0; bias != nullptr && k < count; ++k) {
        bg[k] = static_cast<float>(bias[o0 + k]);
        bu[k] = static_cast<float>(bias[a.pair + o0 + k]);
      }
      for (int64_t m = 0; m < a.m; ++m) {
        for (int64_t k = 0; k < count; k += 16) {
          const float* gs = block + m * kOutBlock + k;
          const float* us = up_block + m * kOutBlock + k;
          float gt[16] = {}, ut[16] = {};
          if (k + 16 > count) {  // the block's last features: only count - k lanes were computed
            std::copy(gs, gs + (count - k), gt);
            std::copy(us, us + (count - k), ut);
            gs = gt;
            us = ut;
          }
          const V g = simd::round_bf16<16>(simd::load_vec<16>(gs) + simd::load_vec<16>(bg + k));
          const V u = simd::round_bf16<16>(simd::load_vec<16>(us) + simd::load_vec<16>(bu + k));
          const V act = simd::round_inner<c10::BFloat16, 16>(simd::silu<16>(g)) * u;
          c10::BFloat16* dst = y + m * a.out + o0 + k;
          if (k + 16 <= count) {
            simd::store_vec<16>(dst, act);
          } else {
            c10::BFloat16 tail[16];
            simd::store_vec<16>(tail, act);
            std::copy(tail, tail + (count - k), dst);
          }
        }
      }
    }
    return;
  }
  for (int64_t o0 = begin; o0 < end; o0 += kOutBlock) {
    const int64_t count = std::min<int64_t>(kOutBlock, end - o0);
    dot_block(a, x, w, o0, count, end, block);
    // Out with the bias, rounded to bf16 16 at a time (one by one, the rounding cost ~13 ms
    // per step at batch 32: 6.5 M outputs).
    const int64_t vec = count / 16 * 16;
    V bv[kOutBlock / 16];
    int64_t k = 0;
    for (; k < vec; k += 16) bv[k / 16] = bias ? simd::load_vec<16>(bias + o0 + k) : V{};
    for (int64_t m = 0; m < a.m; ++m) {
      const float* row = block + m * kOutBlock;
      const int64_t at = m * a.out + o0;
      if (a.y_float) {  // the same bf16 values, kept in fp32 (the logits: no conversion pass after)
        for (k = 0; k < vec; k += 16)
          simd::store_vec<16>(yf + at + k, simd::round_bf16<16>(simd::load_vec<16>(row + k) + bv[k / 16]));
      } else {
        for (k = 0; k < vec; k += 16)
          simd::store_vec<16>(y + at + k, simd::load_vec<16>(row + k) + bv[k / 16]);
      }
      for (; k < count; ++k) {
        const c10::BFloat16 v(row[k] + (bias ? static_cast<float>(bias[o0 + k]) : 0.f));
        if (a.y_float) {
          yf[at + k] = static_cast<float>(v);
        } else {
          y[at + k] = v;
        }
      }
    }
  }
}
#endif

std::atomic<int> g_threads{0};  // 0: libtorch's intra-op thread count

// Multiply-adds (counting at most 8 rows) a thread should get before a parallel region is
// worth starting: waking the pool costs several microseconds here.
constexpr int64_t kMinWorkPerThread = 1 << 18;

// [begin, end) split evenly over `threads` OpenMP threads (the pool libtorch also uses), in
// chunks of at least `grain`; serial inside another parallel region or without OpenMP.
template <class F>
void split_over_threads(int64_t begin, int64_t end, int64_t grain, int threads, const F& f) {
  const int64_t n = end - begin;
  const int64_t tasks = std::min<int64_t>(threads, (n + grain - 1) / std::max<int64_t>(1, grain));
#ifdef _OPENMP
  if (tasks > 1 && !omp_in_parallel()) {
#pragma omp parallel num_threads(static_cast <int>(tasks))
    {
      const int64_t chunk = (n + omp_get_num_threads() - 1) / omp_get_num_threads();
      const int64_t b = begin + omp_get_thread_num() * chunk;
      if (b < end) f(b, std::min(end, b + chunk));
    }
    return;
  }
#endif
  if (n > 0) f(begin, end);
}

}  // namespace

void set_small_linear_threads(int n) { g_threads.store(std::max(0, n)); }

int small_linear_threads() { return g_threads.load() > 0 ? g_threads.load() : at::get_num_threads(); }

int64_t small_linear_max_rows(at::ScalarType dtype) {
#if SWARM_HAVE_X86_KERNELS
  if (dtype == at::kBFloat16 && cpu_has_avx512_bf16()) return kSmallLinearBf16MaxRows;
  // Without bf16 dot products, from AVX2 on: the widening tiles, then the packed GEMM.
  if (dtype == at::kBFloat16 && cpu_level() >= CpuLevel::AVX2) return kSmallLinearWideningMaxRows;
  // fp32 with AVX2 but not AVX-512: the tiles up to 32 rows (small_linear_torch.hpp).
  if (dtype == at::kFloat && cpu_level() == CpuLevel::AVX2) return kSmallLinearTileMaxRows;
#endif
  return kSmallLinearMaxRows;
}

namespace {

void check_small_linear_args(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                             const char* name) {
  const std::string op(name);
  SWARM_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), op + ": shapes [M, in] x [out, in]");
  SWARM_CHECK(
      x.size(0) >= 1 && x.size(0) <= std::max(kSmallLinearMaxRows, small_linear_max_rows(x.scalar_type())),
      op + ": too many rows (" + std::to_string(x.size(0)) + ")");
  SWARM_CHECK(x.device().is_cpu() && w.device().is_cpu(), op + ": CPU tensors only");
  SWARM_CHECK(x.scalar_type() == w.scalar_type() && (!bias || bias->scalar_type() == w.scalar_type()),
              op + ": x, w and bias must share a dtype");
  SWARM_CHECK(w.is_contiguous() && (!bias || bias->is_contiguous()), op + ": contiguous weights only");
  SWARM_CHECK(w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kFloat, op + ": fp32 or bf16 only");
}

// Runs `run` over output features [0, out) in units of 4 (the dot-product kernel's tile), in
// chunks big enough that scheduling does not show; `rows_per_feature` weight rows each.
template <class F>
void run_features(const Args& a, int64_t out, int64_t rows_per_feature, const F& run) {
  const int64_t work = 4 * rows_per_feature * a.in * std::min<int64_t>(a.m, 8);
  const int64_t units = (out + 3) / 4;
  const int64_t grain = std::max<int64_t>(4, kMinWorkPerThread / std::max<int64_t>(1, work));
  const int threads = g_threads.load() > 0 ? g_threads.load() : at::get_num_threads();
  split_over_threads(0, units, grain, threads,
                     [&](int64_t begin, int64_t end) { run(a, begin * 4, std::min(end * 4, out)); });
}

// The fp32 input the widening kernels read: x itself, or bf16 x widened into a buffer kept by
// the calling thread (at most small_linear_max_rows rows; no allocation or op dispatch per call),
// in pair order: in each whole group of 2W values of a row (W = the kernel copy's vector width),
// the W even-indexed values first, then the W odd-indexed ones, as simd::load_pair splits the
// bf16 weights; the rest of the row in order.
const float* widened_input(const at::Tensor& x) {
  if (x.scalar_type() == at::kFloat) return x.data_ptr<float>();
  thread_local std::vector<float> buffer;
  const int64_t rows = x.size(0), in = x.size(1), two_w = 2 * cpu_vector_floats();
  const size_t n = static_cast<size_t>(x.numel());
  if (buffer.size() < n) buffer.resize(n);
  const auto* src = static_cast<const uint16_t*>(x.data_ptr());
  auto widen = [](uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * in;
    float* d = buffer.data() + r * in;
    const int64_t grouped = in / two_w * two_w;
    for (int64_t g = 0; g < grouped; g += two_w)
      for (int64_t k = 0; k < two_w / 2; ++k) {
        d[g + k] = widen(s[g + 2 * k]);
        d[g + two_w / 2 + k] = widen(s[g + 2 * k + 1]);
      }
    for (int64_t j = grouped; j < in; ++j) d[j] = widen(s[j]);
  }
  return buffer.data();
}

// Whether the widening tiles take m rows of `in` values (small_linear_torch.hpp): above 8 rows
// whenever small_linear takes them without bf16 dot products; at fewer rows on CPUs with AVX2
// but not AVX-512, where they beat the row kernel.
bool takes_tiles(int64_t m, int64_t in, bool bf16) {
#if SWARM_HAVE_X86_KERNELS
  if (bf16 && cpu_has_avx512_bf16()) return false;
  if (m > kSmallLinearMaxRows) return true;
  if (cpu_level() != CpuLevel::AVX2) return false;
  return (bf16 && m >= kSmallLinearBf16TilesFromRows) ||
         (m >= kSmallLinearWideTilesFromRows &&
          m * in * static_cast<int64_t>(sizeof(float)) >= kSmallLinearWideTilesBytes);
#else
  (void)in, (void)bf16;
  return m > kSmallLinearMaxRows;
#endif
}

// The kernel for these weights on this CPU and the fp32 input it reads: the bf16 dot-product
// kernel (AVX512_BF16) reads the bf16 input itself (null), the widening kernels an fp32 one.
std::pair<widening_rows_fn, const float*> pick_kernel(const at::Tensor& xin, bool bf16) {
#if SWARM_HAVE_X86_KERNELS
  if (bf16 && cpu_has_avx512_bf16()) return {rows_bf16_dot, nullptr};  // (the same signature)
#endif
  if (takes_tiles(xin.size(0), xin.size(1), bf16)) return {widening_tiles(bf16), widened_input(xin)};
  return {widening_rows(bf16), widened_input(xin)};
}

}  // namespace

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                        bool float_out, const at::Tensor& out_buffer) {
  RECORD_FUNCTION("swarm::small_linear", c10::ArrayRef<const c10::IValue>{});  // named in profiles
  check_small_linear_args(x, w, bias, "small_linear");
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
  const at::Tensor xin = x.contiguous();
  const at::ScalarType want = float_out ? at::kFloat : x.scalar_type();
  if (bf16 && m > kSmallLinearTileMaxRows && !cpu_has_avx512_bf16() && packed_gemm_bf16_available()) {
    // The packed GEMM from kSmallLinearTileMaxRows + 1 rows on (small_linear_torch.hpp).
    at::Tensor y = output_tensor(out_buffer, {m, out}, want, "small_linear", {&x, &w});
    const at::Tensor biasf = bias ? bias->to(at::kFloat) : at::Tensor();
    const PackedGemmArgs g{xin.data_ptr<c10::BFloat16>(),
                           w.data_ptr<c10::BFloat16>(),
                           biasf.defined() ? biasf.data_ptr<float>() : nullptr,
                           y.data_ptr(),
                           float_out,
                           m,
                           out,
                           in};
    const int64_t panels = (out + 15) / 16;
    const int64_t grain = std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, 16 * in * m));
    split_over_threads(0, panels, grain, small_linear_threads(), [&](int64_t begin, int64_t end) {
      packed_gemm_bf16(g, begin * 16, std::min(end * 16, out));
    });
    return y;
  }
  const auto [run, xf] = pick_kernel(xin, bf16);
  at::Tensor y = output_tensor(out_buffer, {m, out}, want, "small_linear", {&x, &w});
  const Args a{xf,  xin.data_ptr(),   w.data_ptr(), bias ? bias->data_ptr() : nullptr, y.data_ptr(), m, in,
               out, float_out && bf16};
  run_features(a, out, 1, run);
  return y;
}

at::Tensor small_linear_silu_mul(const at::Tensor& x, const at::Tensor& w,
                                 const c10::optional<at::Tensor>& bias, const at::Tensor& out) {
  RECORD_FUNCTION("swarm::small_linear_silu_mul", c10::ArrayRef<const c10::IValue>{});
  check_small_linear_args(x, w, bias, "small_linear_silu_mul");
  SWARM_CHECK(w.size(0) % 2 == 0, "small_linear_silu_mul: w must stack gate and up rows ([2 * inter, in])");
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  // fp32: the two ops. The fused kernel gives the same bits in fp32 too (silu_mul's file is
  // compiled with contraction as this one is), but it streams the gate and up rows side by side,
  // which for fp32 weights at 8 rows measured slower (2 threads, 3072 x 576: 352-488 us against
  // 283-339 us for the two ops; 1 row within noise).
  // The widening tiles have no fused form: the two ops.
  if (!bf16 || takes_tiles(x.size(0), x.size(1), bf16)) return silu_mul(small_linear(x, w, bias), out);
  const at::Tensor xin = x.contiguous();
  const auto [run, xf] = pick_kernel(xin, bf16);
  const int64_t m = x.size(0), inter = w.size(0) / 2;
  at::Tensor y = output_tensor(out, {m, inter}, x.scalar_type(), "small_linear_silu_mul", {&x, &w});
  Args a{xf, xin.data_ptr(), w.data_ptr(), bias ? bias->data_ptr() : nullptr, y.data_ptr(),
         m,  x.size(1),      inter};
  a.pair = inter;
  run_features(a, inter, 2, run);
  return y;
}

}  // namespace swarm
