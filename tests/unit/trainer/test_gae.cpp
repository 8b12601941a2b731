// Reward placement and GAE, checked against tests/reference/gae_reference.py
// (numpy, verl's way of looping over observation tokens) on seeded random multi-turn samples.
#include "trainer/gae.hpp"

#include <gtest/gtest.h>

#include <random>

#include "common/error.hpp"
#include "support/scratch_dir.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// prompt (3), call 0 (3 generated), tool result (2), call 1 (2 generated)
Sample two_call_sample() {
  Sample s;
  s.reward = 0.75;
  s.calls = {{0, "", 0}, {1, "", 1}};
  const int call_of[] = {-1, -1, -1, 0, 0, 0, -1, -1, 1, 1};
  for (int t = 0; t < 10; ++t) {
    s.token_ids.push_back(t + 1);
    s.loss_mask.push_back(call_of[t] >= 0 ? 1 : 0);
    s.token_call.push_back(call_of[t]);
  }
  return s;
}

TEST(Gae, RewardsLandWhereTheyWereEarned) {
  Sample s = two_call_sample();
  FinishedEpisode outcome;
  std::vector<float> r = place_rewards(s, outcome);  // the episode's reward on the last generated token
  EXPECT_EQ(r, (std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0.75f}));
  FinishedEpisode turns;
  turns.turn_rewards = {0.5, 2.0};  // each call's on its own last token
  r = place_rewards(s, turns);
  EXPECT_EQ(r, (std::vector<float>{0, 0, 0, 0, 0, 0.5f, 0, 0, 0, 2.0f}));
  s.token_rewards = {9, 9, 9, 0.1f, 0.2f, 0.3f, 9, 9, 0.4f, 0.5f};  // environment tokens earn nothing
  r = place_rewards(s, outcome);
  EXPECT_EQ(r, (std::vector<float>{0, 0, 0, 0.1f, 0.2f, 0.3f, 0, 0, 0.4f, 0.5f}));
  r = place_rewards(s, turns);  // both: token rewards plus turn rewards at call ends
  EXPECT_FLOAT_EQ(r[5], 0.8f);
  EXPECT_FLOAT_EQ(r[9], 2.5f);
}

TEST(Gae, MatchesTheNumpyReferenceOnRandomMultiTurnSamples) {
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<double> u(-1, 1);
  json req = {{"gamma", 0.97}, {"lam", 0.9}, {"samples", json::array()}};
  std::vector<std::vector<float>> rewards, values;
  std::vector<std::vector<uint8_t>> masks;
  for (int k = 0; k < 12; ++k) {
    const int n = 5 + static_cast<int>(rng() % 40);
    std::vector<float> r(n), v(n);
    std::vector<uint8_t> m(n);
    for (int t = 0; t < n; ++t) {
      m[t] = t >= 2 && rng() % 3 != 0;  // prompt, then generated runs broken by environment tokens
      v[t] = static_cast<float>(u(rng));
      r[t] = m[t] && rng() % 4 == 0 ? static_cast<float>(u(rng)) : 0.0f;
    }
    req["samples"].push_back({{"rewards", r}, {"values", v}, {"mask", m}});
    rewards.push_back(r), values.push_back(v), masks.push_back(m);
  }
  testing::ScratchDir scratch("swarm-gae");
  const json ref = testing::run_python_reference(
      fs::path(SWARM_SOURCE_DIR) / "tests/reference/gae_reference.py", req, scratch.path());
  std::vector<GaeResult> got;
  for (size_t k = 0; k < masks.size(); ++k)
    got.push_back(compute_gae(rewards[k], values[k], masks[k], 0.97, 0.9));
  std::vector<std::vector<float>*> advs;
  std::vector<const std::vector<uint8_t>*> ms;
  for (size_t k = 0; k < masks.size(); ++k) {
    for (size_t t = 0; t < masks[k].size(); ++t) {
      EXPECT_NEAR(got[k].advantages[t], ref["advantages"][k][t].get<double>(), 1e-5) << k << "," << t;
      EXPECT_NEAR(got[k].returns[t], ref["returns"][k][t].get<double>(), 1e-5) << k << "," << t;
    }
    advs.push_back(&got[k].advantages);
    ms.push_back(&masks[k]);
  }
  whiten_advantages(advs, ms);
  for (size_t k = 0; k < masks.size(); ++k)
    for (size_t t = 0; t < masks[k].size(); ++t)
      EXPECT_NEAR(got[k].advantages[t], ref["whitened"][k][t].get<double>(), 1e-4) << k << "," << t;
}

// The broken-on-purpose checks: one hand-computed case, and the sign flip it would catch.
TEST(Gae, HandComputedCaseAndItsBrokenTwin) {
  // generated, environment, generated: V = 0.5, 9 (skipped), 0.25; reward 1 at the end.
  const GaeResult g = compute_gae({0, 7, 1}, {0.5f, 9, 0.25f}, {1, 0, 1}, 0.9, 0.8);
  const double a2 = 1 - 0.25;                                 // delta at the last token (no next value)
  const double a0 = (0 + 0.9 * 0.25 - 0.5) + 0.9 * 0.8 * a2;  // the environment token passes through
  EXPECT_NEAR(g.advantages[2], a2, 1e-6);
  EXPECT_NEAR(g.advantages[0], a0, 1e-6);
  EXPECT_EQ(g.advantages[1], 0.0f);
  EXPECT_NEAR(g.returns[0], a0 + 0.5, 1e-6);
  EXPECT_GT(g.advantages[0], 0.0) << "a flipped sign (delta = V - r - gamma V') would make this negative";
  EXPECT_THROW(compute_gae({0}, {0}, {1}, 1.5, 0.9), SwarmError);
}

}  // namespace
}  // namespace swarm
