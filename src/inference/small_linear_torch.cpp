#include "inference/small_linear_torch.hpp"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include <vector>

#include "common/error.hpp"
#include "inference/cpu_dispatch.hpp"

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

// M input rows against one weight row. One row: a single vectorised reduction (measured
// fastest). Several rows: M accumulators of 16 lanes, so each 16 weights are loaded once for
// all rows and the M FMA chains run side by side.
template <int M>
SWARM_INLINE void dot_rows(const float* w, const float* x, int64_t in, float* out) {
  if constexpr (M == 1) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < in; ++i) s += w[i] * x[i];
    out[0] = s;
  } else {
    float acc[M][16] = {};
    int64_t i = 0;
    for (; i + 16 <= in; i += 16) {
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * in + i;
#pragma omp simd
        for (int l = 0; l < 16; ++l) acc[m][l] += w[i + l] * xm[l];
      }
    }
    for (int m = 0; m < M; ++m) {
      float s = 0.f;
      for (int l = 0; l < 16; ++l) s += acc[m][l];
      for (int64_t j = i; j < in; ++j) s += w[j] * x[m * in + j];
      out[m] = s;
    }
  }
}

template <class T, int M>
SWARM_INLINE void rows(const Args& a, int64_t begin, int64_t end) {
  std::vector<float> row_buf(static_cast<size_t>(a.in));
  float* row = row_buf.data();
  const T* w = static_cast<const T*>(a.w);
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
  float dots[M];
  for (int64_t o = begin; o < end; ++o) {
    const T* wr = w + o * a.in;
    const float* wf;
    if constexpr (std::is_same_v<T, float>) {
      wf = wr;
    } else {
#pragma omp simd
      for (int64_t i = 0; i < a.in; ++i) row[i] = to_float(wr[i]);
      wf = row;
    }
    dot_rows<M>(wf, a.x, a.in, dots);
    const float b = bias ? to_float(bias[o]) : 0.f;
    for (int m = 0; m < M; ++m) y[m * a.out + o] = static_cast<T>(dots[m] + b);
  }
}

template <class T>
SWARM_INLINE void rows_any(const Args& a, int64_t begin, int64_t end) {
  switch (a.m) {
    case 1: return rows<T, 1>(a, begin, end);
    case 2: return rows<T, 2>(a, begin, end);
    case 3: return rows<T, 3>(a, begin, end);
    case 4: return rows<T, 4>(a, begin, end);
    default: return rows<T, 4>(a, begin, end);  // a.m <= kSmallLinearMaxRows == 4
  }
}

// One copy per instruction set (cpu_dispatch.hpp).
SWARM_TARGET_AVX512 void rows_f32_avx512(const Args& a, int64_t begin, int64_t end) { rows_any<float>(a, begin, end); }
SWARM_TARGET_AVX2 void rows_f32_avx2(const Args& a, int64_t begin, int64_t end) { rows_any<float>(a, begin, end); }
void rows_f32_base(const Args& a, int64_t begin, int64_t end) { rows_any<float>(a, begin, end); }
SWARM_TARGET_AVX512 void rows_bf16_avx512(const Args& a, int64_t begin, int64_t end) {
  rows_any<c10::BFloat16>(a, begin, end);
}
SWARM_TARGET_AVX2 void rows_bf16_avx2(const Args& a, int64_t begin, int64_t end) { rows_any<c10::BFloat16>(a, begin, end); }
void rows_bf16_base(const Args& a, int64_t begin, int64_t end) { rows_any<c10::BFloat16>(a, begin, end); }

}  // namespace

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  RECORD_FUNCTION("swarm::small_linear", c10::ArrayRef<const c10::IValue>{});  // named in profiles
  SWARM_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "small_linear: shapes [M, in] x [out, in]");
  SWARM_CHECK(x.size(0) >= 1 && x.size(0) <= kSmallLinearMaxRows, "small_linear: 1..4 rows");
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
