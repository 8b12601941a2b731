#include "inference/small_linear_torch.hpp"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include <algorithm>

#include "common/error.hpp"
#include "inference/cpu_dispatch.hpp"
#include "inference/cpu_vec.hpp"

namespace swarm {
namespace {

#define SWARM_INLINE inline __attribute__((always_inline))

struct Args {
  const float* x;      // [M, in], fp32 copy of the input
  const void* w;       // [out, in]
  const void* bias;    // [out] or null
  void* y;             // [M, out]
  int64_t m, in, out;
};

SWARM_INLINE float to_float(float v) { return v; }
SWARM_INLINE float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

// Output feature o for the M input rows. The weight row is streamed once, front to back (one
// sequential stream per thread is what the hardware prefetcher follows best: reading several
// weight rows side by side measured 10-20% slower once the weights come from memory), with
// U x M independent accumulators of W lanes, so every W weights are loaded (and widened from
// bf16) once for all M rows and U x M multiply-add chains run side by side instead of one
// long dependent chain.
constexpr int64_t kOutBlock = 32;  // output features per block of results

// Writes the M results of feature o to sums[0], sums[kOutBlock], ..., sums[(M - 1) * kOutBlock].
template <class T, int W, int M, int U>
SWARM_INLINE void one_row(const Args& a, int64_t o, float* sums) {
  using V = typename simd::Vec<W>::type;
  const int64_t in = a.in, full = in / (U * W) * (U * W), vec = in / W * W;
  const T* w = static_cast<const T*>(a.w) + o * in;
  V acc[U][M];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < M; ++m) acc[u][m] = V{};
  int64_t i = 0;
  for (; i < full; i += U * W) {
    for (int u = 0; u < U; ++u) {
      const V wv = simd::load_vec<W>(w + i + u * W);
      for (int m = 0; m < M; ++m) acc[u][m] += wv * simd::load_vec<W>(a.x + m * in + i + u * W);
    }
  }
  for (; i < vec; i += W) {
    const V wv = simd::load_vec<W>(w + i);
    for (int m = 0; m < M; ++m) acc[0][m] += wv * simd::load_vec<W>(a.x + m * in + i);
  }
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
  for (int64_t o0 = begin; o0 < end; o0 += kOutBlock) {
    const int64_t count = std::min<int64_t>(kOutBlock, end - o0);
    for (int64_t k = 0; k < count; ++k) one_row<T, W, M, U>(a, o0 + k, block + k);
    for (int m = 0; m < M; ++m)
      for (int64_t k = 0; k < count; ++k) y[m * a.out + o0 + k] = static_cast<T>(block[m * kOutBlock + k]);
  }
}

template <class T, int W>
SWARM_INLINE void rows_any(const Args& a, int64_t begin, int64_t end) {
  switch (a.m) {
    case 1: return rows<T, W, 1>(a, begin, end);
    case 2: return rows<T, W, 2>(a, begin, end);
    case 3: return rows<T, W, 3>(a, begin, end);
    case 4: return rows<T, W, 4>(a, begin, end);
    case 5: return rows<T, W, 5>(a, begin, end);
    case 6: return rows<T, W, 6>(a, begin, end);
    case 7: return rows<T, W, 7>(a, begin, end);
    default: return rows<T, W, 8>(a, begin, end);  // a.m <= kSmallLinearMaxRows == 8
  }
}

// One copy per instruction set (cpu_dispatch.hpp).
SWARM_TARGET_AVX512 void rows_f32_avx512(const Args& a, int64_t begin, int64_t end) {
  rows_any<float, 16>(a, begin, end);
}
SWARM_TARGET_AVX2 void rows_f32_avx2(const Args& a, int64_t begin, int64_t end) { rows_any<float, 8>(a, begin, end); }
void rows_f32_base(const Args& a, int64_t begin, int64_t end) { rows_any<float, 8>(a, begin, end); }
SWARM_TARGET_AVX512 void rows_bf16_avx512(const Args& a, int64_t begin, int64_t end) {
  rows_any<c10::BFloat16, 16>(a, begin, end);
}
SWARM_TARGET_AVX2 void rows_bf16_avx2(const Args& a, int64_t begin, int64_t end) {
  rows_any<c10::BFloat16, 8>(a, begin, end);
}
void rows_bf16_base(const Args& a, int64_t begin, int64_t end) { rows_any<c10::BFloat16, 8>(a, begin, end); }

}  // namespace

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  RECORD_FUNCTION("swarm::small_linear", c10::ArrayRef<const c10::IValue>{});  // named in profiles
  SWARM_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "small_linear: shapes [M, in] x [out, in]");
  SWARM_CHECK(x.size(0) >= 1 && x.size(0) <= kSmallLinearMaxRows, "small_linear: 1..kSmallLinearMaxRows rows");
  SWARM_CHECK(x.device().is_cpu() && w.device().is_cpu(), "small_linear: CPU tensors only");
  SWARM_CHECK(x.scalar_type() == w.scalar_type() && (!bias || bias->scalar_type() == w.scalar_type()),
              "small_linear: x, w and bias must share a dtype");
  SWARM_CHECK(w.is_contiguous() && (!bias || bias->is_contiguous()), "small_linear: contiguous weights only");
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  SWARM_CHECK(bf16 || w.scalar_type() == at::kFloat, "small_linear: fp32 or bf16 only");
  const int64_t m = x.size(0), in = x.size(1), out = w.size(0);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({m, out}, x.options());
  Args a{xf.data_ptr<float>(), w.data_ptr(), bias ? bias->data_ptr() : nullptr, y.data_ptr(), m, in, out};
  // Chunks of output rows big enough that scheduling does not show.
  const int64_t grain = std::max<int64_t>(16, 32768 / std::max<int64_t>(1, in));
  using Rows = void (*)(const Args&, int64_t, int64_t);
  const Rows run = bf16 ? cpu_pick<Rows>(rows_bf16_avx512, rows_bf16_avx2, rows_bf16_base)
                        : cpu_pick<Rows>(rows_f32_avx512, rows_f32_avx2, rows_f32_base);
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) { run(a, begin, end); });
  return y;
}

}  // namespace swarm
