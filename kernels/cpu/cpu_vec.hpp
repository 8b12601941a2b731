// W-float vectors for the hand-written CPU kernels (GCC/Clang vector extensions): W = 16 on
// AVX-512, 8 on AVX2 and baseline x86-64, where the compiler splits them into what the target
// has. Loads and stores are unaligned; bf16 is widened on load and rounded on store exactly as
// c10::BFloat16 converts. Every helper is always inlined, so each per-ISA copy of a kernel
// (cpu_dispatch.hpp) gets code for its own instruction set.
#pragma once

#include <cstdint>
#include <type_traits>

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
// v rounded to bf16 precision exactly as c10::BFloat16 rounds (to nearest even; NaN ->
// 0x7fc0), kept as fp32: the value a bf16 op would produce, for fused kernels that repeat a
// chain of bf16 ops in registers.
template <int W>
SWARM_VEC_INLINE typename Vec<W>::type round_bf16(typename Vec<W>::type v) {
  using I = typename Vec<W>::ints;
  I bits;
  __builtin_memcpy(&bits, &v, sizeof bits);
  const I rounded = (bits + (((bits >> 16) & 1) + 0x7fff)) & static_cast<int32_t>(0xffff0000u);
  const I nan = v != v;
  const I out = (rounded & ~nan) | (static_cast<int32_t>(0x7fc00000) & nan);
  typename Vec<W>::type r;
  __builtin_memcpy(&r, &out, sizeof r);
  return r;
}
// 2W consecutive values as two W-float vectors, for elementwise kernels that store their result
// back with store_pair (where the lane order does not matter). fp32: p[0, W) and p[W, 2W). bf16:
// the even-indexed values and the odd-indexed ones, widened with one shift or mask each (a 32-bit
// lane holds two bf16, the even one in its low half): no widening shuffles, which GCC 12 splits
// into five instructions per load on AVX2.
template <int W>
SWARM_VEC_INLINE void load_pair(const float* p, typename Vec<W>::type& first, typename Vec<W>::type& second) {
  first = load_vec<W>(p);
  second = load_vec<W>(p + W);
}
template <int W>
SWARM_VEC_INLINE void load_pair(const c10::BFloat16* p, typename Vec<W>::type& even,
                                typename Vec<W>::type& odd) {
  using I = typename Vec<W>::ints;
  I pairs;
  __builtin_memcpy(&pairs, p, sizeof pairs);
  const I e = pairs << 16, o = pairs & static_cast<int32_t>(0xffff0000u);
  __builtin_memcpy(&even, &e, sizeof even);
  __builtin_memcpy(&odd, &o, sizeof odd);
}
/// The inverse of load_pair: bf16 values rounded exactly as store_vec rounds them.
template <int W>
SWARM_VEC_INLINE void store_pair(float* p, typename Vec<W>::type first, typename Vec<W>::type second) {
  store_vec<W>(p, first);
  store_vec<W>(p + W, second);
}
template <int W>
SWARM_VEC_INLINE void store_pair(c10::BFloat16* p, typename Vec<W>::type even, typename Vec<W>::type odd) {
  using I = typename Vec<W>::ints;
  const typename Vec<W>::type re = round_bf16<W>(even), ro = round_bf16<W>(odd);
  I e, o;
  __builtin_memcpy(&e, &re, sizeof e);
  __builtin_memcpy(&o, &ro, sizeof o);
  typedef uint32_t U __attribute__((vector_size(4 * W)));
  const I pairs = o | reinterpret_cast<I>(reinterpret_cast<U>(e) >> 16);  // a logical shift: no mask
  __builtin_memcpy(p, &pairs, sizeof pairs);
}
/// v as an op in T would leave it: unchanged for fp32, rounded to bf16 precision for bf16.
template <class T, int W>
SWARM_VEC_INLINE typename Vec<W>::type round_to(typename Vec<W>::type v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return round_bf16<W>(v);
  } else {
    return v;
  }
}
/// round_to for a value inside a chain whose result store_vec / store_pair rounds again: the same
/// rounding without round_bf16's NaN case (two instructions fewer). A NaN stays a NaN as long
/// as the low 16 bits of its fp32 pattern are zero, which holds for every NaN computed from bf16
/// operands (their own payloads, or the default NaN); the final store then makes it 0x7fc0 as
/// round_to would have. Every other value rounds exactly as round_to rounds it.
template <class T, int W>
SWARM_VEC_INLINE typename Vec<W>::type round_inner(typename Vec<W>::type v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    using I = typename Vec<W>::ints;
    I bits;
    __builtin_memcpy(&bits, &v, sizeof bits);
    const I rounded = (bits + (((bits >> 16) & 1) + 0x7fff)) & static_cast<int32_t>(0xffff0000u);
    typename Vec<W>::type r;
    __builtin_memcpy(&r, &rounded, sizeof r);
    return r;
  } else {
    return v;
  }
}
SWARM_VEC_INLINE float to_float(float x) { return x; }
SWARM_VEC_INLINE float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
/// x as an op in T would leave it (scalar round_to).
template <class T>
SWARM_VEC_INLINE float round_to(float x) {
  return static_cast<float>(static_cast<T>(x));
}

// min(v, bound) for a bound > 0 with one integer min on the bits: as int32, a float's bits order
// like the float wherever one side is positive (a negative float is a negative int). A positive
// NaN gives the bound, a negative NaN stays NaN (callers whose result carries the input itself,
// like silu's numerator, stay NaN either way).
template <int W>
SWARM_VEC_INLINE typename Vec<W>::type min_positive_bound(typename Vec<W>::type v, float bound) {
  using I = typename Vec<W>::ints;
  I bits, b;
  __builtin_memcpy(&bits, &v, sizeof bits);
  const typename Vec<W>::type bv = typename Vec<W>::type{} + bound;
  __builtin_memcpy(&b, &bv, sizeof b);
  const I m = bits < b ? bits : b;
  typename Vec<W>::type r;
  __builtin_memcpy(&r, &m, sizeof r);
  return r;
}

// e^x for x in [-87, 88], W lanes at once, as p * scale: x = n ln2 + r with |r| <= ln2 / 2,
// p = e^r from the degree-6 polynomial closest to it in relative error on that interval (a
// Remez fit: 4.3e-9 before rounding, a few ulp in all), in Horner's order (6 multiply-adds:
// these loops are bound by instruction count, the iterations are independent); scale = 2^n
// built in the exponent bits. The rounding constant carries the exponent bias: x log2(e) +
// (1.5 * 2^23 + 127) rounds to an integer whose low bits are n + 127, so one shift makes 2^n.
// K vectors at once, step by step across them: every lane gets the same operations (the same
// bits as K calls with one vector), but K independent chains of ~12 dependent operations sit
// side by side in the instruction stream, so the out-of-order core overlaps them where one
// chain after another filled its scheduler with operations waiting on their predecessors.
template <int W, int K>
SWARM_VEC_INLINE void exp_parts_n(const typename Vec<W>::type (&x)[K], typename Vec<W>::type (&p)[K],
                                  typename Vec<W>::type (&scale)[K]) {
  using V = typename Vec<W>::type;
  using I = typename Vec<W>::ints;
  const V magic = V{} + 12583039.0f;  // 1.5 * 2^23 + 127
  V t[K], r[K];
  for (int k = 0; k < K; ++k) t[k] = x[k] * 1.44269504088896341f + magic;
  for (int k = 0; k < K; ++k) {
    const V n = t[k] - magic;
    r[k] = (x[k] - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;  // ln2 in two parts
  }
  for (int k = 0; k < K; ++k) p[k] = r[k] * 1.3893402850791998e-3f + 8.37026267340343e-3f;
  for (int k = 0; k < K; ++k) p[k] = p[k] * r[k] + 4.166709015850953e-2f;
  for (int k = 0; k < K; ++k) p[k] = p[k] * r[k] + 0.1666650606733187f;
  for (int k = 0; k < K; ++k) p[k] = p[k] * r[k] + 0.4999999813118623f;
  for (int k = 0; k < K; ++k) p[k] = p[k] * r[k] + 1.0f;
  for (int k = 0; k < K; ++k) p[k] = p[k] * r[k] + 1.0f;
  for (int k = 0; k < K; ++k) {
    I bits;
    __builtin_memcpy(&bits, &t[k], sizeof bits);
    bits = bits << 23;
    __builtin_memcpy(&scale[k], &bits, sizeof bits);
  }
}
template <int W>
SWARM_VEC_INLINE typename Vec<W>::type exp_parts(typename Vec<W>::type x, typename Vec<W>::type& scale) {
  using V = typename Vec<W>::type;
  const V xs[1] = {x};
  V p[1], s[1];
  exp_parts_n<W, 1>(xs, p, s);
  scale = s[0];
  return p[0];
}
template <int W>
SWARM_VEC_INLINE typename Vec<W>::type exp_in_range(typename Vec<W>::type x) {
  typename Vec<W>::type scale;
  const typename Vec<W>::type p = exp_parts<W>(x, scale);
  return p * scale;
}
// e^x for x <= 0 (softmax after subtracting the maximum). Inputs below -87 give about 1e-38
// rather than 0 (callers zero the entries they mask).
template <int W>
SWARM_VEC_INLINE typename Vec<W>::type exp_nonpositive(typename Vec<W>::type x) {
  using V = typename Vec<W>::type;
  const V lo = V{} - 87.0f;
  return exp_in_range<W>(x < lo ? lo : x);
}
// silu(x) = x / (1 + e^-x), e^-x with its argument clamped to [-87, 88] (so 1 + e^-x stays
// finite: x below -88 gives about x * 1e-38 rather than x e^x, x = +-inf gives +-inf). Both
// clamps are integer mins (min_positive_bound: on x, then on -x); 1 + p * scale is one
// multiply-add. K vectors at once as exp_parts_n takes them (silu: one).
template <int W, int K>
SWARM_VEC_INLINE void silu_n(const typename Vec<W>::type (&x)[K], typename Vec<W>::type (&out)[K]) {
  using V = typename Vec<W>::type;
  V m[K], p[K], scale[K];
  for (int k = 0; k < K; ++k) m[k] = min_positive_bound<W>(-min_positive_bound<W>(x[k], 87.0f), 88.0f);
  exp_parts_n<W, K>(m, p, scale);
  for (int k = 0; k < K; ++k) out[k] = x[k] / (p[k] * scale[k] + 1.0f);
}
template <int W>
SWARM_VEC_INLINE typename Vec<W>::type silu(typename Vec<W>::type x) {
  using V = typename Vec<W>::type;
  const V xs[1] = {x};
  V out[1];
  silu_n<W, 1>(xs, out);
  return out[0];
}

// The sums of four 16-lane vectors, in order: one transposing reduction instead of four
// (GCC 12's reduce intrinsics also warn about their own undefined lanes).
SWARM_VEC_INLINE f32x4 sum4(Vec<16>::type a, Vec<16>::type b, Vec<16>::type c, Vec<16>::type d) {
  using V8 = Vec<8>::type;
  auto half = [](Vec<16>::type v) __attribute__((always_inline))->V8 {
    return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  };
  const V8 a8 = half(a), b8 = half(b), c8 = half(c), d8 = half(d);
  // [a 4 partials, b 4 partials], [c, d]; then pairs; then the four totals.
  const V8 ab = __builtin_shufflevector(a8, b8, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(a8, b8, 4, 5, 6, 7, 12, 13, 14, 15);
  const V8 cd = __builtin_shufflevector(c8, d8, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(c8, d8, 4, 5, 6, 7, 12, 13, 14, 15);
  const V8 pairs = __builtin_shufflevector(ab, cd, 0, 2, 4, 6, 8, 10, 12, 14) +
                   __builtin_shufflevector(ab, cd, 1, 3, 5, 7, 9, 11, 13, 15);
  return __builtin_shufflevector(pairs, pairs, 0, 2, 4, 6) +
         __builtin_shufflevector(pairs, pairs, 1, 3, 5, 7);
}
// The sums of sixteen 16-lane vectors, in order (lane k = the sum of s[k]): four levels that
// each add pairs of vectors after a two-source permute (one VPERMT2PS each), 30 permutes and
// 15 adds for 16 sums where four sum4 calls take ~80 instructions and scalar stores.
SWARM_VEC_INLINE Vec<16>::type sum16(const Vec<16>::type (&s)[16]) {
  using V = Vec<16>::type;
  V l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; ++i)  // lanes 0-7: 8 partials of s[2i]; 8-15: of s[2i+1]
    l1[i] = __builtin_shufflevector(s[2 * i], s[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                    22, 23) +
            __builtin_shufflevector(s[2 * i], s[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                    29, 30, 31);
  for (int i = 0; i < 4; ++i)  // four lanes per key, keys 4i .. 4i+3
    l2[i] = __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24,
                                    25, 26, 27) +
            __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                                    29, 30, 31);
  for (int i = 0; i < 2; ++i)  // two lanes per key, keys 8i .. 8i+7
    l3[i] = __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24,
                                    25, 28, 29) +
            __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26,
                                    27, 30, 31);
  return __builtin_shufflevector(l3[0], l3[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(l3[0], l3[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
// The sums of eight 8-lane vectors, in order (lane k = the sum of s[k]): three levels of
// two-source shuffles and adds (on AVX2: 14 shuffles and 7 adds where eight hsum calls take ~40
// instructions and scalar stores).
SWARM_VEC_INLINE Vec<8>::type sum8(const Vec<8>::type (&s)[8]) {
  using V = Vec<8>::type;
  V l1[4], l2[2];
  for (int i = 0; i < 4; ++i)  // lanes 0-3: 4 partials of s[2i]; 4-7: of s[2i+1]
    l1[i] = __builtin_shufflevector(s[2 * i], s[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
            __builtin_shufflevector(s[2 * i], s[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; ++i)  // two lanes per key, keys 4i .. 4i+3
    l2[i] = __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
            __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(l2[0], l2[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(l2[0], l2[1], 1, 3, 5, 7, 9, 11, 13, 15);
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
