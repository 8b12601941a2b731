// Token sampling for the serving engine: turns one row of
// next-token logits per sequence into a token, its log-probability and the top alternatives,
// honouring each request's temperature / top-k / top-p and its own random stream.
//
// Semantics, per row b with config c = configs[b]:
//  * Greedy (c.temperature == 0, or below kGreedyTemperatureBelow = 1e-5, generation.hpp): the token is argmax(logits[b]) (lowest id on ties), and
//    every reported log-probability is taken from log_softmax(logits[b]) (temperature 1).
//    The row's rng is not consumed.
//  * Otherwise: the scaled distribution is P = softmax(logits[b] / T). Truncation is applied
//    to P in this order:
//      1. top-k (when 0 < top_k < number of tokens with finite logits): keep the k most
//         probable tokens (ties broken by lower id) and renormalise;
//      2. top-p (when top_p < 1): on that (renormalised) distribution, keep the smallest
//         prefix of the tokens sorted by descending probability whose cumulative probability
//         is >= top_p; at least one token is always kept.
//    Exactly one rng.uniform() u in [0, 1) is drawn, and the token is chosen by inverse CDF
//    over the kept tokens in descending-probability order (ties: lower id first), i.e. the
//    first kept token whose cumulative (renormalised) probability exceeds u — except when
//    neither rule truncates anything (top-k off, top_p == 1): then the inverse CDF runs over
//    the tokens in id order, which draws from the same distribution without sorting the
//    vocabulary. Given the logits
//    and the rng state, the result is deterministic, and it does not depend on the other
//    rows of the batch.
//  * Reported `logprob` is the log-probability of the chosen token under the temperature-scaled
//    distribution BEFORE top-k/top-p truncation (log_softmax(logits[b] / T)), which is what the
//    trainer recomputes. `top` holds the min(top_logprobs, #tokens with finite logits) most
//    probable tokens of that same distribution as (id, logprob), descending (ties: lower id).
//  * Tokens whose logit is -inf (masked) are never sampled nor reported in `top`.
//
// Requirements: logits is a 2-D [B, V] floating tensor on any device (it is read, never
// modified; it may be an inference tensor); each row must contain at least one finite logit and
// no NaN / +inf. configs and rngs have B entries; the same SamplerRng* may appear in several
// rows (draws then happen in row order). Configs are assumed validated upstream.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "common/random.hpp"

namespace swarm {

/// One request's sampling settings (validated upstream).
struct SamplingConfig {
  double temperature = 1.0;  // 0 (or below 1e-5) = greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = -1;        // -1 (or 0) = off
  int64_t top_logprobs = 0;  // alternatives to report per position (0..20)
};

/// Per-sequence random state (xoshiro256**, seeded through splitmix64): the same seed gives the
/// same sequence of draws, whatever else shares the batch. Copyable; not thread-safe (one owner).
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed);
  /// Seeded from std::random_device, for requests that give no seed.
  static SamplerRng from_random_seed();

  /// Next 64 random bits.
  uint64_t next_u64();
  /// Uniform double in [0, 1) with 53 random bits.
  double uniform();

 private:
  Xoshiro256 gen_;
};

/// One sampled position.
struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;                        // under the scaled, untruncated distribution
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), descending
};

/// Samples one token per row of `logits` ([B, V]); see the file comment for the exact rules.
/// Throws SwarmError(INVALID_ARGUMENT) on shape / size mismatches or a row with no finite logit.
std::vector<SampledToken> sample_tokens(const at::Tensor& logits, const std::vector<SamplingConfig>& configs,
                                        std::vector<SamplerRng*>& rngs);

}  // namespace swarm
