#include "kernels/cpu/packed_gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_dispatch.hpp"
#include "kernels/cpu/cpu_vec.hpp"

#if SWARM_HAVE_X86_KERNELS
#include <immintrin.h>
#endif

namespace swarm {
namespace {

// The register tile: 6 input rows x 16 output features = 12 AVX2 accumulators, plus the two
// weight vectors and one broadcast of 16 registers.
constexpr int64_t kRows = 6;
constexpr int64_t kFeatures = 16;
// Blocking, measured on the AVX2 setting of a Zen 5 (SmolLM2's projections, 65-512 rows):
// steps of the shared dimension per pass (a 16-feature weight panel of ~320 steps is 20 KiB,
// in L1 while 6-row input panels stream past it), features per packed weight block (with 320
// steps 640 KiB, in L2/L3; 512 and 1024 measured alike, 256 2-4 % slower), rows per packed
// input block, and rows per pass over the fp32 partial sums (the scratch of a multi-pass
// shared dimension: kChunkRows x kBlockFeatures floats, 1 MiB).
constexpr int64_t kStepsTarget = 320;
constexpr int64_t kBlockFeatures = 512;
constexpr int64_t kBlockRows = 144;
constexpr int64_t kChunkRows = 512;

float widen_one(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Steps per pass: the shared dimension cut into equal passes of at most ~kStepsTarget (a
// multiple of 8, for the packing's 8 x 8 transposes).
int64_t steps_per_pass(int64_t k) {
  const int64_t passes = std::max<int64_t>(1, (k + kStepsTarget - 1) / kStepsTarget);
  return ((k + passes - 1) / passes + 7) / 8 * 8;
}

// 64-byte aligned scratch kept by the calling thread, grown on demand.
float* scratch(std::vector<float>& buffer, int64_t floats) {
  if (static_cast<int64_t>(buffer.size()) < floats + 16) buffer.resize(static_cast<size_t>(floats + 16));
  const auto at = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<float*>((at + 63) & ~uintptr_t{63});
}

#if SWARM_HAVE_X86_KERNELS

SWARM_TARGET_AVX2 inline __m256 widen8(const c10::BFloat16* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

SWARM_TARGET_AVX2 inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// Weights of features [j0, j0 + count) (rows of w, `ld` apart), steps [k0, k0 + steps), widened
// into panels of 16 features: panel p holds step s of feature 16p + f at [p][s][f]. Features
// past `count` are zero.
SWARM_TARGET_AVX2 void pack_weights(const c10::BFloat16* w, int64_t ld, int64_t j0, int64_t count, int64_t k0,
                                    int64_t steps, float* dst) {
  for (int64_t p = 0; p < count; p += kFeatures) {
    float* panel = dst + p * steps;
    for (int64_t half = 0; half < kFeatures; half += 8) {
      const int64_t valid = std::clamp<int64_t>(count - p - half, 0, 8);
      const c10::BFloat16* src = w + (j0 + p + half) * ld + k0;
      int64_t s = 0;
      if (valid == 8) {
        for (; s + 8 <= steps; s += 8) {
          __m256 r[8];
          for (int i = 0; i < 8; ++i) r[i] = widen8(src + i * ld + s);
          transpose8(r);
          for (int i = 0; i < 8; ++i) _mm256_store_ps(panel + (s + i) * kFeatures + half, r[i]);
        }
      }
      for (; s < steps; ++s)
        for (int64_t f = 0; f < 8; ++f)
          panel[s * kFeatures + half + f] = f < valid ? widen_one(src[f * ld + s]) : 0.f;
    }
  }
}

// Input rows [i0, i0 + count) (`ld` apart), steps [k0, k0 + steps), widened into panels of 6
// rows: panel p holds step s of row 6p + r at [p][s][r]. Rows past `count` are zero.
SWARM_TARGET_AVX2 void pack_inputs(const c10::BFloat16* x, int64_t ld, int64_t i0, int64_t count, int64_t k0,
                                   int64_t steps, float* dst) {
  for (int64_t p = 0; p < count; p += kRows) {
    float* panel = dst + p * steps;
    for (int64_t r = 0; r < kRows; ++r) {
      if (p + r >= count) {
        for (int64_t s = 0; s < steps; ++s) panel[s * kRows + r] = 0.f;
        continue;
      }
      const c10::BFloat16* src = x + (i0 + p + r) * ld + k0;
      for (int64_t s = 0; s < steps; ++s) panel[s * kRows + r] = widen_one(src[s]);
    }
  }
}

// Where a tile's results go: the fp32 partial sums (`sums`, `ld_sums` apart) while passes of the
// shared dimension remain, else y with the bias.
struct TileOut {
  float* sums;
  int64_t ld_sums;
  void* y;  // row 0, feature 0 of the tile
  int64_t ld_y;
  bool y_float;
  const float* bias;   // feature 0 of the tile, or null
  int rows, features;  // the rows the tile computes; its features that exist (up to 16)
};

// One row of a tile, one step: the row's input value broadcast against the 16 weights.
SWARM_TARGET_AVX2 inline __attribute__((always_inline)) void fma_row(const float* a, __m256 b0, __m256 b1,
                                                                     __m256& c0, __m256& c1) {
  const __m256 v = _mm256_broadcast_ss(a);
  c0 = _mm256_fmadd_ps(v, b0, c0);
  c1 = _mm256_fmadd_ps(v, b1, c1);
}

// One tile of R rows (6, or the 1-5 rows a block's last panel has: computing all 6 there
// measured 13 % slower at 32 rows) x 16 features over `steps` steps: a (6-row panel) x b
// (16-feature panel), added to the partial sums unless First, stored as partial sums unless Last.
template <int R, bool First, bool Last>
SWARM_TARGET_AVX2 void tile(int64_t steps, const float* a, const float* b, const TileOut& o) {
  // Twelve named accumulators, the rows written out: written as an array indexed in loops (as
  // the stores below index it), GCC 12 -O3 kept them in memory and it ran at half the speed.
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
         c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t s = 0; s < steps; ++s) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    fma_row(a, b0, b1, c00, c01);
    if constexpr (R > 1) fma_row(a + 1, b0, b1, c10, c11);
    if constexpr (R > 2) fma_row(a + 2, b0, b1, c20, c21);
    if constexpr (R > 3) fma_row(a + 3, b0, b1, c30, c31);
    if constexpr (R > 4) fma_row(a + 4, b0, b1, c40, c41);
    if constexpr (R > 5) fma_row(a + 5, b0, b1, c50, c51);
    a += kRows;
    b += kFeatures;
  }
  __m256 acc[kRows][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  if constexpr (!First) {
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(o.sums + r * o.ld_sums));
      acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(o.sums + r * o.ld_sums + 8));
    }
  }
  if constexpr (!Last) {
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(o.sums + r * o.ld_sums, acc[r][0]);
      _mm256_storeu_ps(o.sums + r * o.ld_sums + 8, acc[r][1]);
    }
  } else {
    using V = simd::Vec<8>::type;
    alignas(32) float bias[kFeatures] = {};
    if (o.bias != nullptr) std::copy(o.bias, o.bias + o.features, bias);
    const V bias0 = simd::load_vec<8>(bias), bias1 = simd::load_vec<8>(bias + 8);
    for (int r = 0; r < R; ++r) {
      const V v0 = V(acc[r][0]) + bias0, v1 = V(acc[r][1]) + bias1;
      if (o.y_float) {
        float* dst = static_cast<float*>(o.y) + r * o.ld_y;
        const V r0 = simd::round_bf16<8>(v0), r1 = simd::round_bf16<8>(v1);
        if (o.features == kFeatures) {
          simd::store_vec<8>(dst, r0);
          simd::store_vec<8>(dst + 8, r1);
        } else {
          alignas(32) float row[kFeatures];
          simd::store_vec<8>(row, r0);
          simd::store_vec<8>(row + 8, r1);
          std::copy(row, row + o.features, dst);
        }
      } else {
        c10::BFloat16* dst = static_cast<c10::BFloat16*>(o.y) + r * o.ld_y;
        if (o.features == kFeatures) {
          simd::store_vec<8>(dst, v0);
          simd::store_vec<8>(dst + 8, v1);
        } else {
          c10::BFloat16 row[kFeatures];
          simd::store_vec<8>(row, v0);
          simd::store_vec<8>(row + 8, v1);
          std::copy(row, row + o.features, dst);
        }
      }
    }
  }
}

using TileFn = void (*)(int64_t, const float*, const float*, const TileOut&);

// The tile for `rows` rows (1-6) and this pass.
template <int R>
TileFn tile_for_pass(bool first, bool last) {
  return first && last ? tile<R, true, true>
         : first       ? tile<R, true, false>
         : last        ? tile<R, false, true>
                       : tile<R, false, false>;
}
TileFn tile_for(int rows, bool first, bool last) {
  switch (rows) {
    case 1:
      return tile_for_pass<1>(first, last);
    case 2:
      return tile_for_pass<2>(first, last);
    case 3:
      return tile_for_pass<3>(first, last);
    case 4:
      return tile_for_pass<4>(first, last);
    case 5:
      return tile_for_pass<5>(first, last);
    default:
      return tile_for_pass<6>(first, last);
  }
}

SWARM_TARGET_AVX2 void gemm_avx2(const PackedGemmArgs& a, int64_t begin, int64_t end) {
  thread_local std::vector<float> weight_buffer, input_buffer, sum_buffer;
  const int64_t steps = steps_per_pass(a.k);
  const bool one_pass = steps >= a.k;
  float* const packed_w = scratch(weight_buffer, kBlockFeatures * steps);
  float* const packed_x = scratch(input_buffer, kBlockRows * steps);
  float* const sums = one_pass ? nullptr : scratch(sum_buffer, kChunkRows * kBlockFeatures);
  const size_t elem = a.y_float ? sizeof(float) : sizeof(c10::BFloat16);
  for (int64_t m0 = 0; m0 < a.m; m0 += kChunkRows) {
    const int64_t chunk = std::min(kChunkRows, a.m - m0);
    for (int64_t j0 = begin; j0 < end; j0 += kBlockFeatures) {
      const int64_t features = std::min(kBlockFeatures, end - j0);
      for (int64_t k0 = 0; k0 < a.k; k0 += steps) {
        const int64_t pass = std::min(steps, a.k - k0);
        const bool first = k0 == 0, last = k0 + pass >= a.k;
        const TileFn whole = tile_for(kRows, first, last);
        pack_weights(a.w, a.k, j0, features, k0, pass, packed_w);
        for (int64_t i0 = m0; i0 < m0 + chunk; i0 += kBlockRows) {
          const int64_t rows = std::min(kBlockRows, m0 + chunk - i0);
          pack_inputs(a.x, a.k, i0, rows, k0, pass, packed_x);
          for (int64_t jp = 0; jp < features; jp += kFeatures) {
            TileOut o{};
            o.ld_sums = kBlockFeatures;
            o.ld_y = a.n;
            o.y_float = a.y_float;
            o.bias = a.bias != nullptr ? a.bias + j0 + jp : nullptr;
            o.features = static_cast<int>(std::min(kFeatures, features - jp));
            for (int64_t ip = 0; ip < rows; ip += kRows) {
              o.rows = static_cast<int>(std::min(kRows, rows - ip));
              const int64_t row = i0 + ip;
              o.sums = sums == nullptr ? nullptr : sums + (row - m0) * kBlockFeatures + jp;
              o.y = static_cast<char*>(a.y) + static_cast<size_t>(row * a.n + j0 + jp) * elem;
              (o.rows == kRows ? whole : tile_for(o.rows, first, last))(pass, packed_x + ip * pass,
                                                                        packed_w + jp * pass, o);
            }
          }
        }
      }
    }
  }
}

#endif  // SWARM_HAVE_X86_KERNELS

// Without AVX2 (and for an empty shared dimension): the same sums in the same order, one value
// at a time: each pass of `steps` a chain of fused multiply-adds from zero, then added to the
// partial sum. Only for completeness: the callers keep the widened fp32 GEMM where
// packed_gemm_bf16_available() is false.
void gemm_scalar(const PackedGemmArgs& a, int64_t begin, int64_t end) {
  const int64_t steps = steps_per_pass(a.k);
  for (int64_t i = 0; i < a.m; ++i)
    for (int64_t j = begin; j < end; ++j) {
      float total = 0.f;
      for (int64_t k0 = 0; k0 < a.k; k0 += steps) {
        float part = 0.f;
        for (int64_t s = k0; s < std::min(a.k, k0 + steps); ++s)
          part = std::fma(widen_one(a.x[i * a.k + s]), widen_one(a.w[j * a.k + s]), part);
        total = k0 == 0 ? part : total + part;
      }
      total += a.bias != nullptr ? a.bias[j] : 0.f;
      const c10::BFloat16 rounded(total);
      if (a.y_float)
        static_cast<float*>(a.y)[i * a.n + j] = static_cast<float>(rounded);
      else
        static_cast<c10::BFloat16*>(a.y)[i * a.n + j] = rounded;
    }
}

}  // namespace

bool packed_gemm_bf16_available() {
#if SWARM_HAVE_X86_KERNELS
  return static_cast<int>(cpu_level()) >= static_cast<int>(CpuLevel::AVX2);
#else
  return false;
#endif
}

void packed_gemm_bf16(const PackedGemmArgs& a, int64_t begin, int64_t end) {
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, a.n);
  if (begin >= end || a.m <= 0) return;
#if SWARM_HAVE_X86_KERNELS
  if (packed_gemm_bf16_available() && a.k > 0) return gemm_avx2(a, begin, end);
#endif
  gemm_scalar(a, begin, end);
}

}  // namespace swarm
