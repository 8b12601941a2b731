// Fused CPU kernels for the serving step's small element-wise work. At decode sizes a step is
// ~1,500 libtorch ops of a few microseconds each (dispatch, allocation, a pass over a few KiB),
// which cost as much as streaming the weights: RMSNorm as 8 ops, rotary embedding as 14, the
// K/V cache writes, SiLU-and-multiply as 4. Each kernel here does one of those chains in one
// pass and repeats the roundings of the op chain it replaces (bf16 after every op in bf16),
// so the serving path computes what forward_full computes. CPU tensors, fp32 or bf16.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include <ATen/ATen.h>

namespace swarm {

/// Every kernel here, small_linear and paged_decode_attention take an optional `out`: when it
/// is defined, the result is written into it (it must be contiguous, on the CPU, of the
/// result's shape and dtype, and share no memory with the inputs) and it is returned; else a
/// new tensor is. The serving step passes the buffers it keeps from one step to the next.
/// This is that check-or-allocate, for the kernels' wrappers.
at::Tensor output_tensor(const at::Tensor& out, at::IntArrayRef sizes, at::ScalarType dtype, const char* op,
                         std::initializer_list<const at::Tensor*> inputs);

/// RMSNorm of each row: y = round(x * rsqrt(mean(x^2) + eps)) * weight, the statistics in
/// fp32. x [N, H] contiguous, weight [H] of x's dtype. Returns [N, H] in x's dtype.
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps,
                         const at::Tensor& out = {});

/// The residual add and the next RMSNorm in one pass: x += delta in place (rounded to x's
/// dtype, as x.add_(delta)), then returns rms_norm_rows(x, weight, eps). delta [N, H]
/// contiguous, of x's dtype.
at::Tensor add_rms_norm_rows(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps,
                             const at::Tensor& out = {});

/// Rotary embedding of a packed q/k/v projection, straight into the KV cache. qkv [N, (heads +
/// 2 kv_heads) * head_dim] contiguous (q heads, then k heads, then v heads); cos / sin
/// [positions, head_dim] tables (Hugging Face rotate-half layout) of qkv's dtype; positions
/// [N] and cache_rows [N] int64. Row i's rotated k and its v go to row cache_rows[i] of
/// k_cache / v_cache (viewed as [rows, kv_heads * head_dim], contiguous). Returns the rotated
/// q as [N, heads, head_dim].
at::Tensor rope_qkv_into_cache(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t head_dim,
                               const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                               const at::Tensor& cache_rows, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& out = {});

/// SwiGLU's gate: gate_up [N, 2 * inter] contiguous (gate columns, then up) -> silu(gate) * up,
/// [N, inter] in gate_up's dtype.
at::Tensor silu_mul(const at::Tensor& gate_up, const at::Tensor& out = {});

/// One row of logits at a temperature, reduced: what sampling needs of a row that is not drawn
/// from (greedy, no top_logprobs), and what it takes to fill in the row for one that is.
struct SoftmaxRowStats {
  float max = 0;         // max_j x[j] / t over the row (-inf: every logit masked)
  int64_t argmax = 0;    // the first index of the largest logit x[j] (the greedy token)
  float log_sum = 0;     // log sum_j exp(x[j] / t - max)
  bool has_nan = false;  // a NaN logit (the row is unusable)
};

/// Per row b of x [B, V] (fp32, contiguous, CPU) at a finite temperature[b] > 0 (x / t exactly
/// as at::div rounds it); parallel over rows. Masked (-inf) logits count for nothing.
std::vector<SoftmaxRowStats> softmax_row_stats(const at::Tensor& x, const std::vector<float>& temperature);

/// One row's log-probabilities at temperature t from its stats: logp[j] = (x[j] / t - max) -
/// log_sum, and probs[j] = exp(logp[j]) (exactly 0 for masked logits) when probs is not null.
void log_softmax_row(const float* x, int64_t V, float t, const SoftmaxRowStats& stats, float* logp,
                     float* probs);

}  // namespace swarm
