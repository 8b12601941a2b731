#include "trainer/gae.hpp"

#include <cmath>

#include "common/error.hpp"

namespace swarm {

std::vector<float> place_rewards(const Sample& sample, const FinishedEpisode& episode) {
  const size_t n = sample.token_ids.size();
  std::vector<float> out(n, 0.0f);
  if (!sample.token_rewards.empty()) {
    SWARM_CHECK(sample.token_rewards.size() == n, "token_rewards do not match the sample's tokens");
    for (size_t t = 0; t < n; ++t)
      if (sample.loss_mask[t]) out[t] = sample.token_rewards[t];
  }
  // The last generated token of each call of the sample.
  std::vector<int64_t> last(sample.calls.size(), -1);
  int64_t last_generated = -1;
  for (size_t t = 0; t < n; ++t) {
    if (!sample.loss_mask[t]) continue;
    last_generated = static_cast<int64_t>(t);
    const int32_t k = t < sample.token_call.size() ? sample.token_call[t] : -1;
    if (k >= 0 && static_cast<size_t>(k) < last.size())
      last[static_cast<size_t>(k)] = static_cast<int64_t>(t);
  }
  if (!episode.turn_rewards.empty()) {
    for (size_t k = 0; k < sample.calls.size(); ++k) {
      const auto index = static_cast<size_t>(sample.calls[k].index);
      SWARM_CHECK(index < episode.turn_rewards.size(), "a call of the sample has no turn reward");
      if (last[k] >= 0) out[static_cast<size_t>(last[k])] += static_cast<float>(episode.turn_rewards[index]);
    }
  } else if (sample.token_rewards.empty() && last_generated >= 0) {
    out[static_cast<size_t>(last_generated)] += static_cast<float>(sample.reward);
  }
  return out;
}

GaeResult compute_gae(const std::vector<float>& rewards, const std::vector<float>& values,
                      const std::vector<uint8_t>& loss_mask, double gamma, double lambda) {
  const size_t n = loss_mask.size();
  SWARM_REQUIRE(rewards.size() == n && values.size() == n, ErrorKind::INVALID_ARGUMENT,
                "compute_gae: rewards, values and loss_mask must have one entry per token");
  SWARM_REQUIRE(gamma >= 0 && gamma <= 1 && lambda >= 0 && lambda <= 1, ErrorKind::INVALID_ARGUMENT,
                "compute_gae: gamma and lambda must be in [0, 1]");
  GaeResult r;
  r.advantages.assign(n, 0.0f);
  r.returns.assign(n, 0.0f);
  double next_value = 0.0, next_advantage = 0.0;
  for (size_t i = n; i-- > 0;) {
    if (!loss_mask[i]) continue;
    const double delta = rewards[i] + gamma * next_value - values[i];
    const double a = delta + gamma * lambda * next_advantage;
    r.advantages[i] = static_cast<float>(a);
    r.returns[i] = static_cast<float>(a + values[i]);
    next_value = values[i];
    next_advantage = a;
  }
  return r;
}

MaskedSum masked_sum(const std::vector<const std::vector<float>*>& values,
                     const std::vector<const std::vector<uint8_t>*>& masks) {
  SWARM_REQUIRE(values.size() == masks.size(), ErrorKind::INVALID_ARGUMENT,
                "masked_sum: one mask per sample");
  MaskedSum out;
  for (size_t s = 0; s < values.size(); ++s)
    for (size_t t = 0; t < values[s]->size(); ++t)
      if ((*masks[s])[t]) out.sum += (*values[s])[t], ++out.count;
  return out;
}

double masked_squared_deviation(const std::vector<const std::vector<float>*>& values,
                                const std::vector<const std::vector<uint8_t>*>& masks, double mean) {
  SWARM_REQUIRE(values.size() == masks.size(), ErrorKind::INVALID_ARGUMENT,
                "masked_squared_deviation: one mask per sample");
  double sq = 0.0;
  for (size_t s = 0; s < values.size(); ++s)
    for (size_t t = 0; t < values[s]->size(); ++t)
      if ((*masks[s])[t]) sq += ((*values[s])[t] - mean) * ((*values[s])[t] - mean);
  return sq;
}

double whitening_scale(double squared_deviation, double count, double eps) {
  const double var = count > 1 ? squared_deviation / (count - 1.0) : 0.0;
  return 1.0 / std::sqrt(var + eps);
}

void whiten_advantages(std::vector<std::vector<float>*> advantages,
                       const std::vector<const std::vector<uint8_t>*>& masks, bool shift_mean, double eps) {
  const std::vector<const std::vector<float>*> values(advantages.begin(), advantages.end());
  const MaskedSum total = masked_sum(values, masks);
  if (total.count == 0) return;
  const double mean = total.sum / static_cast<double>(total.count);
  const double scale =
      whitening_scale(masked_squared_deviation(values, masks, mean), static_cast<double>(total.count), eps);
  for (size_t s = 0; s < advantages.size(); ++s)
    for (size_t t = 0; t < advantages[s]->size(); ++t) {
      if (!(*masks[s])[t]) continue;
      float& a = (*advantages[s])[t];
      a = static_cast<float>((a - mean) * scale + (shift_mean ? 0.0 : mean));
    }
}

}  // namespace swarm
