// W-float vectors for the hand-written CPU kernels (GCC/Clang vector extensions): W = 16 on
// AVX-512, 8 on AVX2 and baseline x86-64, where the compiler splits them into what the target
// has. Loads and stores are unaligned; bf16 is widened on load and rounded on store exactly as
// c10::BFloat16 converts. Every helper is always inlined, so each per-ISA copy of a kernel
// (cpu_dispatch.hpp) gets code for its own instruction set.
#pragma once

#include <cstdint>

#include <c10/util/BFloat16.h>

namespace swarm::simd {

#define SWARM_VEC_INLINE inline __attribute__((always_inline))

template <int W>
struct Vec;
template <>
struct Vec<16> {
  typedef float type __attribute__((vector_size(64)));
  typedef float unaligned __attribute__((vector_size(64), aligned(4)));
  typedef int32_t ints __attribute__((vector_size(64)));
  typedef uint16_t halves __attribute__((vector_size(32), aligned(2)));
};
template <>
struct Vec<8> {
  typedef float type __attribute__((vector_size(32)));
  typedef float unaligned __attribute__((vector_size(32), aligned(4)));
  typedef int32_t ints __attribute__((vector_size(32)));
  typedef uint16_t halves __attribute__((vector_size(16), aligned(2)));
};
typedef float f32x4 __attribute__((vector_size(16)));

template <int W>
SWARM_VEC_INLINE typename Vec<W>::type load_vec(const float* p) {
  return *reinterpret_cast<const typename Vec<W>::unaligned*>(p);
}
// W elements of a cache row as fp32 (bf16 widened: its bits are the high half of an fp32).
template <int W>
SWARM_VEC_INLINE typename Vec<W>::type load_vec(const c10::BFloat16* p) {
  using I = typename Vec<W>::ints;
  const I bits = __builtin_convertvector(*reinterpret_cast<const typename Vec<W>::halves*>(p), I) << 16;
  typename Vec<W>::type v;
  __builtin_memcpy(&v, &bits, sizeof v);
  return v;
}
template <int W>
SWARM_VEC_INLINE void store_vec(float* p, typename Vec<W>::type v) {
  *reinterpret_cast<typename Vec<W>::unaligned*>(p) = v;
}
// W floats rounded to bf16 as c10::BFloat16 rounds them (to nearest even; NaN -> 0x7fc0).
template <int W>
SWARM_VEC_INLINE void store_vec(c10::BFloat16* p, typename Vec<W>::type v) {
  using I = typename Vec<W>::ints;
  I bits;
  __builtin_memcpy(&bits, &v, sizeof bits);
  const I rounded = (bits + (((bits >> 16) & 1) + 0x7fff)) >> 16;  // arithmetic shift: low 16 bits kept
  const I nan = v != v;                                            // -1 where NaN
  const I out = (rounded & ~nan) | (0x7fc0 & nan);
  *reinterpret_cast<typename Vec<W>::halves*>(p) = __builtin_convertvector(out, typename Vec<W>::halves);
}
SWARM_VEC_INLINE float hsum(Vec<8>::type v) {
  const f32x4 b = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
SWARM_VEC_INLINE float hsum(Vec<16>::type v) {
  return hsum(Vec<8>::type(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                           __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)));
}

}  // namespace swarm::simd
