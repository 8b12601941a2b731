// Advantages, grouping, mini/micro-batch planning and the learning-rate schedule (no torch).
#include "trainer/grpo_batch.hpp"

#include <cmath>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "common/error.hpp"

namespace swarm {
namespace {

Sample make_sample(const std::string& task, double reward, int prompt, int response) {
  Sample s;
  s.task_id = task;
  s.reward = reward;
  for (int i = 0; i < prompt + response; ++i) {
    s.token_ids.push_back(i + 1);
    s.loss_mask.push_back(i >= prompt ? 1 : 0);
    s.rollout_logprobs.push_back(i >= prompt ? -0.5f : 0.f);
    s.policy_versions.push_back(i >= prompt ? 0 : -1);
  }
  return s;
}

FinishedEpisode episode(const std::string& task, double reward, int prompt = 3, int response = 2) {
  FinishedEpisode e;
  e.task_id = task;
  e.reward = reward;
  e.samples.push_back(make_sample(task, reward, prompt, response));
  return e;
}

TEST(GrpoBatch, GrpoAdvantageIsGroupZScoreWithUnbiasedStd) {
  TrainBatch b;
  for (double r : {1.0, 0.0, 0.0, 1.0}) b.episodes.push_back(episode("a", r));
  for (double r : {0.5, 0.25}) b.episodes.push_back(episode("b", r));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO, 0.0);
  ASSERT_EQ(p.sequences.size(), 6u);
  ASSERT_EQ(p.groups.size(), 2u);
  const double std_a = std::sqrt(1.0 / 3.0);  // values 1,0,0,1: mean .5, unbiased var 1/3
  EXPECT_NEAR(p.sequences[0].advantage, 0.5 / std_a, 1e-12);
  EXPECT_NEAR(p.sequences[1].advantage, -0.5 / std_a, 1e-12);
  const double std_b = std::sqrt(2 * 0.125 * 0.125);
  EXPECT_NEAR(p.sequences[4].advantage, 0.125 / std_b, 1e-12);
  EXPECT_NEAR(p.sequences[5].advantage, -0.125 / std_b, 1e-12);
  EXPECT_EQ(p.sequences[4].group, 1);
  EXPECT_EQ(p.stats.groups, 2);
  EXPECT_EQ(p.stats.zero_variance_groups, 0);
}

TEST(GrpoBatch, NoStdAndReinforceBaseline) {
  TrainBatch b;
  for (double r : {1.0, 0.0}) b.episodes.push_back(episode("a", r));
  for (double r : {0.5, 0.0}) b.episodes.push_back(episode("b", r));
  const PreparedBatch ns = prepare_batch(b, AdvantageEstimator::GRPO_NO_STD);
  EXPECT_DOUBLE_EQ(ns.sequences[0].advantage, 0.5);
  EXPECT_DOUBLE_EQ(ns.sequences[3].advantage, -0.25);
  const PreparedBatch rb = prepare_batch(b, AdvantageEstimator::REINFORCE_BASELINE);
  EXPECT_DOUBLE_EQ(rb.sequences[0].advantage, 1.0 - 0.375);  // batch mean 0.375
  EXPECT_DOUBLE_EQ(rb.sequences[3].advantage, -0.375);
}

TEST(GrpoBatch, ZeroVarianceGroupsAreCountedAndLeftOut) {
  TrainBatch b;
  for (double r : {1.0, 1.0, 1.0}) b.episodes.push_back(episode("same", r));
  b.episodes.push_back(episode("alone", 0.3));
  for (double r : {1.0, 0.0}) b.episodes.push_back(episode("mixed", r));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO);
  EXPECT_EQ(p.stats.groups, 3);
  EXPECT_EQ(p.stats.zero_variance_groups, 2);
  EXPECT_EQ(p.stats.skipped_samples, 4);
  ASSERT_EQ(p.sequences.size(), 2u);
  EXPECT_EQ(p.sequences[0].sample->task_id, "mixed");
  EXPECT_EQ(p.groups.size(), 1u);
}

// reinforce_baseline subtracts the batch's mean, so a group of one sample, or a group whose
// rewards are all equal, carries signal unless its rewards are that mean (num_repeat: 1 gives
// only groups of one: before, nothing ever trained).
TEST(GrpoBatch, ReinforceBaselineTrainsSingleSampleAndEqualRewardGroups) {
  TrainBatch b;
  b.episodes.push_back(episode("one", 1.0));
  b.episodes.push_back(episode("two", 0.0));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::REINFORCE_BASELINE);
  ASSERT_EQ(p.sequences.size(), 2u);
  EXPECT_DOUBLE_EQ(p.sequences[0].advantage, 0.5);
  EXPECT_DOUBLE_EQ(p.sequences[1].advantage, -0.5);
  EXPECT_EQ(p.stats.zero_variance_groups, 0);
  EXPECT_EQ(p.groups.size(), 2u);

  // Equal rewards within a group, different across: kept. A group at the batch mean: left out.
  TrainBatch c;
  for (double r : {1.0, 1.0}) c.episodes.push_back(episode("high", r));
  for (double r : {0.0, 0.0}) c.episodes.push_back(episode("low", r));
  for (double r : {0.5, 0.5}) c.episodes.push_back(episode("mean", r));
  const PreparedBatch q = prepare_batch(c, AdvantageEstimator::REINFORCE_BASELINE);
  ASSERT_EQ(q.sequences.size(), 4u);
  EXPECT_DOUBLE_EQ(q.sequences[0].advantage, 0.5);
  EXPECT_DOUBLE_EQ(q.sequences[3].advantage, -0.5);
  EXPECT_EQ(q.stats.zero_variance_groups, 1);
  EXPECT_EQ(q.stats.skipped_samples, 2);
  // grpo on the same batch: every group has equal rewards, nothing trains.
  EXPECT_TRUE(prepare_batch(c, AdvantageEstimator::GRPO).sequences.empty());
  EXPECT_TRUE(prepare_batch(c, AdvantageEstimator::GRPO_NO_STD).sequences.empty());

  // The baseline is the mean of the samples that train: a sample without trained tokens (its
  // completion is empty) is not in it.
  TrainBatch d = b;
  d.episodes.push_back(episode("empty", 1.0, 3, 0));
  const PreparedBatch r = prepare_batch(d, AdvantageEstimator::REINFORCE_BASELINE);
  ASSERT_EQ(r.sequences.size(), 2u);
  EXPECT_DOUBLE_EQ(r.sequences[0].advantage, 0.5);
  EXPECT_DOUBLE_EQ(r.sequences[1].advantage, -0.5);
}

// A group of equal rewards whose mean is not exactly representable (0.1 × 3 sums to
// 0.30000000000000004) still has no signal under grpo: no 1e-11 / eps advantages.
TEST(GrpoBatch, EqualRewardsWhoseMeanRoundsAreStillZeroVariance) {
  TrainBatch b;
  for (double r : {0.1, 0.1, 0.1}) b.episodes.push_back(episode("a", r));
  EXPECT_TRUE(prepare_batch(b, AdvantageEstimator::GRPO).sequences.empty());
  EXPECT_EQ(prepare_batch(b, AdvantageEstimator::GRPO).stats.zero_variance_groups, 1);
}

TEST(GrpoBatch, GroupIsTheTaskAcrossEpisodesAndSamples) {
  TrainBatch b;
  FinishedEpisode e = episode("t", 1.0);
  e.samples.push_back(make_sample("t", 1.0, 4, 1));  // a second timeline of the same episode
  b.episodes.push_back(e);
  b.episodes.push_back(episode("t", 0.0));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO_NO_STD);
  ASSERT_EQ(p.sequences.size(), 3u);
  EXPECT_NEAR(p.sequences[0].advantage, 1.0 - 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(p.sequences[2].advantage, -2.0 / 3.0, 1e-12);
}

TEST(GrpoBatch, TrainedTokensSkipPositionZeroAndPrompt) {
  TrainBatch b;
  b.episodes.push_back(episode("t", 1.0, 3, 4));
  b.episodes.push_back(episode("t", 0.0, 3, 2));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO);
  EXPECT_EQ(p.sequences[0].trained_tokens, 4);
  EXPECT_EQ(p.sequences[0].length, 7);
  EXPECT_EQ(p.trained_tokens(), 6);
  // A mask bit on position 0 cannot be trained (nothing predicts the first token).
  TrainBatch c;
  FinishedEpisode e = episode("u", 1.0, 0, 3);
  c.episodes.push_back(e);
  c.episodes.push_back(episode("u", 0.0, 1, 2));
  const PreparedBatch q = prepare_batch(c, AdvantageEstimator::GRPO);
  EXPECT_EQ(q.sequences[0].trained_tokens, 2);
}

TEST(GrpoBatch, MiniBatchesAreConsecutiveTaskGroups) {
  TrainBatch b;
  for (const char* t : {"a", "b", "c"})
    for (double r : {1.0, 0.0}) b.episodes.push_back(episode(t, r));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO);
  const auto all = split_mini_batches(p, 0);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].size(), 6u);
  const auto two = split_mini_batches(p, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(two[1], (std::vector<size_t>{4, 5}));
}

TEST(GrpoBatch, MicroBatchesRespectTheTokenBudget) {
  TrainBatch b;
  const int lens[] = {10, 3, 7, 7, 2, 30};
  for (int i = 0; i < 6; ++i) b.episodes.push_back(episode("t", i % 2, 1, lens[i] - 1));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO);
  std::vector<size_t> all(p.sequences.size());
  std::iota(all.begin(), all.end(), 0);
  const auto micro = plan_micro_batches(p, all, 20);
  std::multiset<size_t> seen;
  for (const auto& mb : micro) {
    int64_t longest = 0;
    for (size_t i : mb) longest = std::max(longest, p.sequences[i].length), seen.insert(i);
    // Over budget only for a sequence alone in its micro-batch.
    if (mb.size() > 1) {
      EXPECT_LE(static_cast<int64_t>(mb.size()) * longest, 20);
    }
  }
  EXPECT_EQ(seen, std::multiset<size_t>(all.begin(), all.end()));
  EXPECT_EQ(micro[0], std::vector<size_t>{5});  // 30 tokens: alone
  EXPECT_THROW(plan_micro_batches(p, all, 0), SwarmError);
}

// Packed micro-batches: every sequence once, each micro-batch's total tokens within the budget
// (a longer sequence alone), first-fit longest first: a later short sequence fills an earlier
// micro-batch's room.
TEST(GrpoBatch, PackedMicroBatchesStayWithinTheTokenBudget) {
  TrainBatch b;
  const std::vector<int> lengths = {12, 30, 7, 9, 3, 15, 4, 11};
  for (size_t i = 0; i < lengths.size(); ++i)
    b.episodes.push_back(episode("t" + std::to_string(i % 2), static_cast<int>(i % 3), 1, lengths[i] - 1));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO);
  std::vector<size_t> all(p.sequences.size());
  std::iota(all.begin(), all.end(), 0);
  const auto micro = plan_packed_micro_batches(p, all, 20);
  std::multiset<size_t> seen;
  for (const auto& mb : micro) {
    int64_t total = 0;
    for (size_t i : mb) total += p.sequences[i].length, seen.insert(i);
    if (mb.size() > 1) {
      EXPECT_LE(total, 20);
    }
  }
  EXPECT_EQ(seen, std::multiset<size_t>(all.begin(), all.end()));
  ASSERT_FALSE(micro.empty());
  EXPECT_EQ(micro[0].size(), 1u);  // the 30-token sequence, alone
  EXPECT_EQ(p.sequences[micro[0][0]].length, 30);
  // 91 tokens: the 30 alone, the other 61 in as few rows of 20 as first-fit finds (4).
  EXPECT_EQ(micro.size(), 5u);
  EXPECT_THROW(plan_packed_micro_batches(p, all, 0), SwarmError);
}

TEST(GrpoBatch, RankSharesCoverTheMiniBatchOnceAndBalanceTokens) {
  TrainBatch b;
  for (int i = 0; i < 9; ++i) b.episodes.push_back(episode("t", i % 2, 2, 1 + 3 * i));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO);
  std::vector<size_t> all(p.sequences.size());
  std::iota(all.begin(), all.end(), 0);
  std::multiset<size_t> seen;
  int64_t tokens[2] = {0, 0};
  for (int r = 0; r < 2; ++r)
    for (size_t i : shard_for_rank(p, all, r, 2)) seen.insert(i), tokens[r] += p.sequences[i].length;
  EXPECT_EQ(seen, std::multiset<size_t>(all.begin(), all.end()));
  EXPECT_LE(std::abs(tokens[0] - tokens[1]), 27);  // at most the longest sequence apart
  EXPECT_EQ(shard_for_rank(p, all, 0, 1), all);
  EXPECT_THROW(shard_for_rank(p, all, 2, 2), SwarmError);
}

TEST(GrpoBatch, LearningRateSchedules) {
  EXPECT_DOUBLE_EQ(learning_rate_at(1e-3, "constant", 0, 0, 0), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(1e-3, "constant", 4, 0, 0), 0.25e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(1e-3, "constant", 4, 0, 3), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(1e-3, "constant", 4, 0, 100), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate_at(1.0, "cosine", 2, 12, 1), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(1.0, "cosine", 2, 12, 2), 1.0);
  EXPECT_NEAR(learning_rate_at(1.0, "cosine", 2, 12, 7), 0.5, 1e-12);
  EXPECT_NEAR(learning_rate_at(1.0, "cosine", 2, 12, 12), 0.0, 1e-12);
  EXPECT_NEAR(learning_rate_at(1.0, "cosine", 2, 12, 50), 0.0, 1e-12);
  EXPECT_THROW(learning_rate_at(1.0, "cosine", 2, 2, 0), SwarmError);
  EXPECT_THROW(learning_rate_at(1.0, "linear", 0, 0, 0), SwarmError);
}

TEST(GrpoBatch, ParsesJobNames) {
  EXPECT_EQ(parse_advantage_estimator("grpo_no_std"), AdvantageEstimator::GRPO_NO_STD);
  EXPECT_EQ(parse_loss_aggregation("seq-mean-token-mean"), LossAggregation::SEQ_MEAN_TOKEN_MEAN);
  EXPECT_EQ(parse_kl_estimator("k1"), KlEstimator::K1);
  EXPECT_THROW(parse_advantage_estimator("ppo"), SwarmError);
  EXPECT_THROW(parse_loss_aggregation("sum"), SwarmError);
  EXPECT_THROW(parse_kl_estimator("k2"), SwarmError);
}

}  // namespace
}  // namespace swarm

namespace swarm {
namespace {

// A sample of two calls (as merge_calls_into_samples builds it): 2 prompt tokens, the
// planner's 2 generated tokens, 1 environment token, the checker's 2 generated tokens.
FinishedEpisode two_agent_episode(const std::string& task, std::vector<double> turn_rewards,
                                  double reward = 0.0) {
  FinishedEpisode e;
  e.task_id = task;
  e.reward = reward;
  e.turn_rewards = std::move(turn_rewards);
  Sample s;
  s.task_id = task;
  s.reward = reward;
  s.calls = {{0, "planner", 0}, {1, "checker", 0}};
  const int call_of[] = {-1, -1, 0, 0, -1, 1, 1};
  for (int t = 0; t < 7; ++t) {
    s.token_ids.push_back(t + 1);
    s.loss_mask.push_back(call_of[t] >= 0 ? 1 : 0);
    s.token_call.push_back(call_of[t]);
    s.rollout_logprobs.push_back(call_of[t] >= 0 ? -0.5f : 0.f);
    s.policy_versions.push_back(call_of[t] >= 0 ? 0 : -1);
  }
  s.num_calls = 2;
  e.samples.push_back(std::move(s));
  return e;
}

// AT-GRPO: the planner's calls are compared with the planner's, the checker's with the
// checker's, each on its own turn reward; the advantages land on each call's tokens.
TEST(GrpoBatch, TaskAgentTurnGroupsCallsOfOneAgentAndTurnOnTurnRewards) {
  TrainBatch b;
  b.episodes.push_back(two_agent_episode("t", {1, 0}));
  b.episodes.push_back(two_agent_episode("t", {0, 0}));
  b.episodes.push_back(two_agent_episode("t", {1, 1}));
  b.episodes.push_back(two_agent_episode("u", {1, 0}));  // u: both groups have zero variance
  b.episodes.push_back(two_agent_episode("u", {1, 0}));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO, 0.0, GroupBy::TASK_AGENT_TURN);
  EXPECT_EQ(p.stats.groups, 4);  // (t, planner, 0), (t, checker, 0), (u, planner, 0), (u, checker, 0)
  EXPECT_EQ(p.stats.zero_variance_groups, 2);
  EXPECT_EQ(p.stats.skipped_samples, 4);  // the calls of u's groups
  ASSERT_EQ(p.sequences.size(), 3u);
  ASSERT_EQ(p.groups.size(), 1u);
  const double s = std::sqrt(1.0 / 3.0);  // both t groups: one value apart from the other two
  const double planner[] = {(1 - 2.0 / 3) / s, (0 - 2.0 / 3) / s, (1 - 2.0 / 3) / s};
  const double checker[] = {(0 - 1.0 / 3) / s, (0 - 1.0 / 3) / s, (1 - 1.0 / 3) / s};
  for (size_t e = 0; e < 3; ++e) {
    const auto& adv = p.sequences[e].token_advantage;
    ASSERT_EQ(adv.size(), 7u);
    const double expected[] = {0, 0, planner[e], planner[e], 0, checker[e], checker[e]};
    for (size_t t = 0; t < 7; ++t)
      EXPECT_NEAR(adv[t], expected[t], 1e-6) << "episode " << e << " token " << t;
    EXPECT_NEAR(p.sequences[e].advantage, (planner[e] * 2 + checker[e] * 2) / 4, 1e-6);
  }
  // The broken-on-purpose check: grouping by task alone on the same batch (every episode's reward
  // 0) finds no signal at all, so these per-call advantages come from the turn grouping.
  EXPECT_TRUE(prepare_batch(b, AdvantageEstimator::GRPO, 0.0, GroupBy::TASK).sequences.empty());
}

TEST(GrpoBatch, TaskAgentTurnFallsBackToTheEpisodeRewardAndParsesItsName) {
  TrainBatch b;
  b.episodes.push_back(two_agent_episode("t", {}, 1.0));
  b.episodes.push_back(two_agent_episode("t", {}, 0.0));
  const PreparedBatch p = prepare_batch(b, AdvantageEstimator::GRPO_NO_STD, 0.0, GroupBy::TASK_AGENT_TURN);
  ASSERT_EQ(p.sequences.size(), 2u);
  EXPECT_FLOAT_EQ(p.sequences[0].token_advantage[2], 0.5f);
  EXPECT_FLOAT_EQ(p.sequences[1].token_advantage[6], -0.5f);
  EXPECT_EQ(parse_group_by("task_agent_turn"), GroupBy::TASK_AGENT_TURN);
  EXPECT_EQ(parse_group_by("task"), GroupBy::TASK);
  EXPECT_THROW(parse_group_by("agent"), SwarmError);
}

}  // namespace
}  // namespace swarm
