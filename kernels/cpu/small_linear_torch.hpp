// y = x · Wᵀ (+ b) for a handful of rows on the CPU: the decode-time shape of every projection.
// BLAS GEMM packs the whole weight matrix for each call, which at one to a few rows costs more
// than reading the weights; this kernel streams each weight row once and computes every input
// row's dot product with it while it is in L1, so it runs at memory bandwidth.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace swarm {

/// Largest number of rows the widening kernel (fp32, and bf16 on CPUs without AVX512_BF16)
/// takes. Measured with the AVX-512 copy (SmolLM2 decode, 2 cores): it beats at::linear up to 8
/// rows in fp32 (OpenBLAS); in bf16 the alternative there is the widened fp32 GEMM too.
constexpr int64_t kSmallLinearMaxRows = 8;

/// Largest number of rows of the bf16 dot-product kernel (CPUs with AVX512_BF16). Measured here
/// (2 threads) against oneDNN: SmolLM2 projections 2.4x faster at 1 row; the projections of all
/// 30 SmolLM2 layers, weights from memory: 1.57x at 64 rows, 1.36x at 128, 1.15x at 256, 1.06x
/// at 384, 0.98x at 512. Serving steps that mix prompt chunks with decoding land in between.
constexpr int64_t kSmallLinearBf16MaxRows = 384;

/// Largest number of rows small_linear takes for bf16 on CPUs with AVX2 but not AVX512_BF16
/// (decode steps: their results go into the step's kept buffers): from 9 rows the widening tiles
/// (3 input rows x 3 weight rows at a time, the bf16 weights widened in registers), from
/// kSmallLinearTileMaxRows + 1 the packed bf16 GEMM (packed_gemm.hpp), which widening_linear
/// runs above. Measured on an AVX512_BF16 host behaving as AVX2 (SWARM_CPU_LEVEL=avx2 with
/// oneDNN's and ATen's switches), 2 threads, SmolLM2's four projection shapes, time against
/// fp32's split GEMM (OpenBLAS) on the same shape: tiles 32 rows 0.89-0.94x, 64 rows
/// 1.05-1.09x; packed GEMM 32 rows 0.84-0.93x, 64 rows 0.88-0.91x, 512 rows 0.93-1.00x (the
/// widened fp32 GEMM it replaced: 1.14-1.21x, 1.10-1.17x, 1.08-1.16x).
constexpr int64_t kSmallLinearWideningMaxRows = 64;

/// Largest number of rows the widening tiles take; from one more to kSmallLinearWideningMaxRows
/// small_linear runs the packed bf16 GEMM (packed_gemm.hpp), as widening_linear does above.
/// Measured the same way, the projections of 30 SmolLM2 layers with their weights from memory,
/// packed GEMM against tiles: 16 rows 1.13-1.18x the time, 24 rows 1.08-1.11x, 32 rows
/// 0.95-1.09x, 40 rows 0.89-0.93x, 48-64 rows 0.85-0.89x.
constexpr int64_t kSmallLinearTileMaxRows = 32;

/// On CPUs with AVX2 but not AVX-512 the widening tiles take fp32 too, up to
/// kSmallLinearTileMaxRows rows, and take over from the row kernel below 9 rows: for bf16 from
/// kSmallLinearBf16TilesFromRows, for both dtypes from kSmallLinearWideTilesFromRows once the
/// fp32 input rows (widened, for bf16) reach kSmallLinearWideTilesBytes: the row kernel keeps
/// all M input rows in L1 beside the weight stream, the tiles three. Measured on the AVX512_BF16
/// host behaving as AVX2 (2 threads, SmolLM2's projection shapes [3072, 576], [576, 1536],
/// [960, 576] and the gate/up projection with SiLU, 24 sets of weights from memory, each case
/// in its own process, three alternating runs), time of the tiles against what ran before:
/// fp32 against the split OpenBLAS GEMM, 12 rows 0.66-0.79x, 16 rows 0.76-0.88x, 24 rows
/// 0.74-0.97x, 32 rows 0.80-0.97x (48 rows 0.92-1.03x, 64 rows 1.0-1.09x: not taken); fp32
/// against the row kernel at [576, 1536] 0.75x at 4 rows, 0.64-0.74x at 6, 0.80-0.90x at 8
/// (1.1-1.5x slower at 4-8 rows of the 576-wide shapes); bf16 against the row kernel at 6 and 8
/// rows 0.66-0.88x over all four (4 rows: 0.74-0.94x at [576, 1536], 0.96-1.25x elsewhere).
/// AVX-512 copies keep the row kernel to 8 rows and OpenBLAS above in fp32 (the row kernel's
/// 32 registers: 1.3-1.9x faster than these tiles at 4-8 rows there).
constexpr int64_t kSmallLinearBf16TilesFromRows = 6;
constexpr int64_t kSmallLinearWideTilesFromRows = 4;
constexpr int64_t kSmallLinearWideTilesBytes = 24 << 10;

/// How many rows small_linear takes, and beats at::linear at, for this dtype on this CPU:
/// kSmallLinearBf16MaxRows for bf16 with AVX512_BF16, kSmallLinearWideningMaxRows for bf16
/// with AVX2, kSmallLinearTileMaxRows for fp32 with AVX2 but not AVX-512, else
/// kSmallLinearMaxRows.
int64_t small_linear_max_rows(at::ScalarType dtype);

/// Threads small_linear splits its work over; 0 (the default) = libtorch's intra-op thread
/// count. Its own setting because it decides the split of the GEMMs too (widening_linear_torch.hpp)
/// and once had to differ from libtorch's count (when the fp32 plan gave libtorch one thread;
/// streaming the weights at a few rows needs every core: SmolLM2 fp32 decode at batch 1, 63.5 ->
/// 110 tokens/s). configure_compute_threads sets both to the same n.
void set_small_linear_threads(int n);
/// The threads small_linear uses now (set_small_linear_threads, else libtorch's count).
int small_linear_threads();

/// x [M, in] (fp32 or bf16), w [out, in] of x's dtype, bias [out] or undefined; contiguous
/// CPU tensors, 1 <= M <= max(kSmallLinearMaxRows, small_linear_max_rows(dtype)). Accumulates
/// in fp32; returns [M, out] in x's dtype. No autograd (serving only). Parallel over output
/// rows on libtorch's OpenMP pool (set_small_linear_threads threads). float_out: return fp32
/// holding exactly the x-dtype results (what .to(kFloat) of them gives), written directly by
/// the bf16 dot-product kernel where it runs.
/// out: see output_tensor (serving_ops_torch.hpp).
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                        bool float_out = false, const at::Tensor& out = {});

/// silu_mul(small_linear(x, w, bias)) for w = [gate; up] ([2 * inter, in]) and bias [2 * inter]
/// or undefined: [M, inter] = silu(x · gateᵀ) * (x · upᵀ), bit for bit that chain. With the bf16
/// dot-product kernel the activation is applied as the results leave the kernel, with no
/// [M, 2 * inter] intermediate and no second pass; elsewhere it is the chain itself.
at::Tensor small_linear_silu_mul(const at::Tensor& x, const at::Tensor& w,
                                 const c10::optional<at::Tensor>& bias, const at::Tensor& out = {});

}  // namespace swarm
