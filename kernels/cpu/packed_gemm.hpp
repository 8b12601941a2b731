// The packed bf16 GEMM for CPUs without bf16 dot products (AVX2, or AVX-512 without
// AVX512_BF16): y = x · wᵀ (+ bias) from bf16 x and w, accumulated in fp32 and rounded once,
// as the widened fp32 GEMM computes it, without a widened copy of either operand.
//
// The classic blocked GEMM: the weights of a block of output features are widened into
// 16-feature panels as they are packed (which an fp32 GEMM does anyway: OpenBLAS copies its
// operands into panels too), the input rows likewise into 6-row panels, and a 6 x 16
// register tile of fp32 accumulators runs down the shared dimension with one broadcast and two
// multiply-adds per row per step. Results leave the tile with the bias, rounded to bf16 (or to
// bf16 precision kept in fp32): no pass over y after.
#pragma once

#include <cstdint>

#include <c10/util/BFloat16.h>

namespace swarm {

/// Whether packed_gemm_bf16 runs its vectorised copy here (x86-64 from AVX2 on, by cpu_level()).
/// Without it the callers keep the widened fp32 GEMM.
bool packed_gemm_bf16_available();

struct PackedGemmArgs {
  const c10::BFloat16* x = nullptr;  // [m, k], rows contiguous
  const c10::BFloat16* w = nullptr;  // [n, k], rows contiguous
  const float* bias = nullptr;       // [n] or null
  void* y = nullptr;                 // [m, n]: bf16, or fp32 holding bf16 values (y_float)
  bool y_float = false;
  int64_t m = 0, n = 0, k = 0;
};

/// Output features [begin, end) of y for all m rows: one thread's share (callers split the
/// features over threads, in multiples of 16 for speed). Each result is the fp32 sum over k in
/// a fixed order (independent of m, of the split and of the other rows), plus the bias, rounded
/// to bf16 as c10::BFloat16 rounds. Scratch buffers are kept per thread (bounded: under 2 MiB).
void packed_gemm_bf16(const PackedGemmArgs& a, int64_t begin, int64_t end);

}  // namespace swarm
