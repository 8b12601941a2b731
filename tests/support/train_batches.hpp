// Synthetic training batches for trainer tests: random token sequences with a prompt (mask 0)
// and a response (mask 1), grouped by task, rewards that vary within each group.
#pragma once

#include <random>
#include <string>

#include "rollout_pool/types.hpp"

namespace swarm::testing {

/// `tasks` task groups × `per_task` episodes of one sample each; deterministic in `seed`.
inline TrainBatch random_batch(int tasks, int per_task, uint32_t seed, int vocab = 2048) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(3, vocab - 1), plen(3, 12), rlen(2, 10);
  std::uniform_real_distribution<float> lp(-6.f, -1.f);
  TrainBatch b;
  for (int t = 0; t < tasks; ++t) {
    for (int e = 0; e < per_task; ++e) {
      FinishedEpisode ep;
      ep.task_id = "task-" + std::to_string(t);
      ep.episode_uuid = ep.task_id + "-" + std::to_string(e);
      ep.reward = (e * 7 + t) % 3 * 0.5;
      Sample s;
      s.task_id = ep.task_id;
      s.episode_uuid = ep.episode_uuid;
      s.reward = ep.reward;
      const int p = plen(rng), r = rlen(rng);
      for (int i = 0; i < p + r; ++i) {
        s.token_ids.push_back(tok(rng));
        const bool gen = i >= p;
        s.loss_mask.push_back(gen ? 1 : 0);
        s.rollout_logprobs.push_back(gen ? lp(rng) : 0.f);
        s.policy_versions.push_back(gen ? 0 : -1);
      }
      s.num_calls = 1;
      ep.samples.push_back(std::move(s));
      b.episodes.push_back(std::move(ep));
    }
  }
  b.num_tasks = tasks;
  return b;
}

/// Per generated token, +1 for an even token id and -1 for an odd one (workflow_output.token_rewards):
/// dense credit a policy can follow token by token (PPO's GAE; GRPO ignores it).
inline TrainBatch with_token_rewards(TrainBatch b) {
  for (auto& ep : b.episodes)
    for (auto& s : ep.samples) {
      s.token_rewards.assign(s.token_ids.size(), 0.0f);
      for (size_t t = 0; t < s.token_ids.size(); ++t)
        if (s.loss_mask[t]) s.token_rewards[t] = s.token_ids[t] % 2 == 0 ? 1.0f : -1.0f;
    }
  return b;
}

}  // namespace swarm::testing
