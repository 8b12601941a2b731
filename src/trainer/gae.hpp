// Dense credit for PPO: where each reward lands in a sample, and generalised
// advantage estimation over its generated tokens. No torch (the value model that supplies the
// values is the trainer's part).
#pragma once

#include <cstdint>
#include <vector>

#include "rollout_pool/types.hpp"

namespace swarm {

/// Per token of `sample`, the reward earned there: its token rewards (workflow_output.
/// token_rewards) if any, plus each call's turn reward (`episode.turn_rewards[call.index]`)
/// on that call's last generated token; with neither, the sample's (episode's) reward on its
/// last generated token. 0 elsewhere (prompts, tool results: nothing is earned by the
/// environment's tokens).
std::vector<float> place_rewards(const Sample& sample, const FinishedEpisode& episode);

struct GaeResult {
  std::vector<float> advantages;  // per token; 0 where the loss mask is 0
  std::vector<float> returns;     // advantages + values on generated tokens; 0 elsewhere
};

/// GAE over the generated tokens (loss mask 1) of one sample, in order; the environment's
/// tokens between two calls are skipped (the value and the running advantage pass through
/// them unchanged), and the value after the last generated token is 0 (the episode ends):
///   delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma * lambda * A_next.
/// `rewards`, `values` and `loss_mask` have one entry per token; rewards on tokens with mask 0
/// are ignored (place_rewards never puts any there). gamma, lambda in [0, 1].
GaeResult compute_gae(const std::vector<float>& rewards, const std::vector<float>& values,
                      const std::vector<uint8_t>& loss_mask, double gamma, double lambda);

/// The two passes of whitening over the tokens with mask 1 of several samples, separable so that
/// ranks can add theirs up in between: the sum and count, then the squared deviations from a mean.
struct MaskedSum {
  double sum = 0.0;
  int64_t count = 0;
};
MaskedSum masked_sum(const std::vector<const std::vector<float>*>& values,
                     const std::vector<const std::vector<uint8_t>*>& masks);
double masked_squared_deviation(const std::vector<const std::vector<float>*>& values,
                                const std::vector<const std::vector<uint8_t>*>& masks, double mean);
/// 1 / sqrt(unbiased variance + eps) of `count` values whose squared deviations add up to
/// `squared_deviation` (variance 0 for a single value).
double whitening_scale(double squared_deviation, double count, double eps = 1e-8);

/// Whitens advantages over the tokens with mask 1 of several samples at once (mean 0, unit
/// variance; the mean is kept when `shift_mean` is false, as verl's masked_whiten does for
/// returns). Unbiased variance; a single token or zero variance leaves the values centred only.
void whiten_advantages(std::vector<std::vector<float>*> advantages,
                       const std::vector<const std::vector<uint8_t>*>& masks, bool shift_mean = true,
                       double eps = 1e-8);

}  // namespace swarm
