#include "rollout_pool/context_tracker.hpp"

#include <gtest/gtest.h>

#include "common/error.hpp"

namespace swarm {
namespace {

using Ids = std::vector<TokenId>;
using Mask = std::vector<uint8_t>;

// A call whose completion log-probs are -0.1, -0.2, ... so alignment is checkable.
LlmCall make_call(Ids prompt, Ids completion, int64_t version = 0) {
  LlmCall c;
  c.prompt_ids = std::move(prompt);
  c.completion_ids = std::move(completion);
  for (size_t i = 0; i < c.completion_ids.size(); ++i) {
    c.completion_logprobs.push_back(-0.1f * static_cast<float>(i + 1));
  }
  c.policy_version = version;
  c.finish_reason = "stop";
  return c;
}

Ids concat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

void expect_consistent(const Sample& s) {
  ASSERT_EQ(s.loss_mask.size(), s.token_ids.size());
  ASSERT_EQ(s.rollout_logprobs.size(), s.token_ids.size());
  ASSERT_EQ(s.policy_versions.size(), s.token_ids.size());
  for (size_t i = 0; i < s.token_ids.size(); ++i) {
    if (s.loss_mask[i] == 0) {
      EXPECT_EQ(s.rollout_logprobs[i], 0.0f) << "token " << i;
      EXPECT_EQ(s.policy_versions[i], -1) << "token " << i;
    } else {
      EXPECT_GE(s.policy_versions[i], 0) << "token " << i;
    }
  }
}

TEST(ContextTracker, EmptyCallsGiveNoSamples) { EXPECT_TRUE(merge_calls_into_samples({}).empty()); }

TEST(ContextTracker, SingleCall) {
  auto samples = merge_calls_into_samples({make_call({1, 2, 3}, {10, 11}, 7)});
  ASSERT_EQ(samples.size(), 1u);
  const Sample& s = samples[0];
  EXPECT_EQ(s.token_ids, (Ids{1, 2, 3, 10, 11}));
  EXPECT_EQ(s.loss_mask, (Mask{0, 0, 0, 1, 1}));
  EXPECT_EQ(s.rollout_logprobs, (std::vector<float>{0, 0, 0, -0.1f, -0.2f}));
  EXPECT_EQ(s.policy_versions, (std::vector<int64_t>{-1, -1, -1, 7, 7}));
  EXPECT_EQ(s.num_calls, 1);
  // Left for the pool to stamp.
  EXPECT_TRUE(s.task_id.empty());
  EXPECT_TRUE(s.episode_uuid.empty());
  expect_consistent(s);
}

TEST(ContextTracker, ThreeTurnConversationIsOneTimeline) {
  const Ids sys = {1, 2, 3};
  const Ids a1 = {10, 11};
  const Ids env1 = {4, 5};  // tool result + template tokens
  const Ids a2 = {12, 13, 14};
  const Ids env2 = {6};
  const Ids a3 = {15};
  std::vector<LlmCall> calls = {
      make_call(sys, a1, 1),
      make_call(concat({sys, a1, env1}), a2, 1),
      make_call(concat({sys, a1, env1, a2, env2}), a3, 2),
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 1u);
  const Sample& s = samples[0];
  EXPECT_EQ(s.token_ids, concat({sys, a1, env1, a2, env2, a3}));
  //                          sys      a1    env1  a2       env2 a3
  EXPECT_EQ(s.loss_mask, (Mask{0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1}));
  EXPECT_EQ(s.num_calls, 3);
  EXPECT_EQ(s.policy_versions, (std::vector<int64_t>{-1, -1, -1, 1, 1, -1, -1, 1, 1, 1, -1, 2}));
  expect_consistent(s);
}

TEST(ContextTracker, NonPrefixCallStartsSecondSample) {
  std::vector<LlmCall> calls = {
      make_call({1, 2}, {10}), make_call({1, 2, 10, 3}, {11}),
      make_call({9, 9}, {12, 13}),  // e.g. a summarizer sub-agent
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].token_ids, (Ids{1, 2, 10, 3, 11}));
  EXPECT_EQ(samples[0].loss_mask, (Mask{0, 0, 1, 0, 1}));
  EXPECT_EQ(samples[0].num_calls, 2);
  EXPECT_EQ(samples[1].token_ids, (Ids{9, 9, 12, 13}));
  EXPECT_EQ(samples[1].loss_mask, (Mask{0, 0, 1, 1}));
  EXPECT_EQ(samples[1].num_calls, 1);
}

TEST(ContextTracker, RewrittenHistoryIsNotAPrefix) {
  // The agent truncated/edited earlier context: the completion is not reproduced as-is.
  std::vector<LlmCall> calls = {
      make_call({1, 2}, {10, 11}),
      make_call({1, 2, 10, 99, 3}, {12}),
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[1].token_ids, (Ids{1, 2, 10, 99, 3, 12}));
  EXPECT_EQ(samples[1].loss_mask, (Mask{0, 0, 0, 0, 0, 1}));
}

TEST(ContextTracker, BranchFromSameCallGivesTwoSamples) {
  // Two continuations of the same first call: the first extends its timeline; the second
  // no longer matches it (the timeline has grown) and becomes its own sample, where the
  // shared completion is context (it is trained once, in the first sample).
  std::vector<LlmCall> calls = {
      make_call({1, 2}, {10}),
      make_call({1, 2, 10, 3}, {11}),
      make_call({1, 2, 10, 4}, {12}),
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].token_ids, (Ids{1, 2, 10, 3, 11}));
  EXPECT_EQ(samples[0].loss_mask, (Mask{0, 0, 1, 0, 1}));
  EXPECT_EQ(samples[0].num_calls, 2);
  EXPECT_EQ(samples[1].token_ids, (Ids{1, 2, 10, 4, 12}));
  EXPECT_EQ(samples[1].loss_mask, (Mask{0, 0, 0, 0, 1}));
  EXPECT_EQ(samples[1].num_calls, 1);
}

TEST(ContextTracker, InterleavedTimelinesEachKeepTheirCalls) {
  std::vector<LlmCall> calls = {
      make_call({1}, {10}),            // timeline A: 1 10
      make_call({1, 10, 2, 3}, {11}),  // extends A: 1 10 2 3 11
      make_call({5}, {12}),            // timeline B: 5 12
      make_call({1, 10, 7}, {13}),     // not a prefix of A any more -> C: 1 10 7 13
      // Continues A although B and C were created after it.
      make_call({1, 10, 2, 3, 11, 4}, {14}),
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].token_ids, (Ids{1, 10, 2, 3, 11, 4, 14}));
  EXPECT_EQ(samples[0].num_calls, 3);
  EXPECT_EQ(samples[1].token_ids, (Ids{5, 12}));
  EXPECT_EQ(samples[2].token_ids, (Ids{1, 10, 7, 13}));
}

TEST(ContextTracker, LongestPrefixWins) {
  // Timelines [1 10] and [1 10 2 11] both prefix the last prompt; the longer one wins even
  // though the shorter one was extended more recently.
  std::vector<LlmCall> calls = {
      make_call({1}, {10}),         // A: 1 10
      make_call({1, 10, 2}, {11}),  // extends A: 1 10 2 11
      make_call({1}, {10}),         // B: 1 10 (A is longer than this prompt)
      make_call({1, 10, 2, 11, 3}, {12}),
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].token_ids, (Ids{1, 10, 2, 11, 3, 12}));
  EXPECT_EQ(samples[0].num_calls, 3);
  EXPECT_EQ(samples[1].token_ids, (Ids{1, 10}));
  EXPECT_EQ(samples[1].num_calls, 1);
}

TEST(ContextTracker, TieGoesToMostRecentlyExtended) {
  std::vector<LlmCall> calls = {
      make_call({1}, {10}),  // A
      make_call({1}, {10}),  // B, identical to A
      make_call({1, 10, 2}, {11}),
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].token_ids, (Ids{1, 10}));
  EXPECT_EQ(samples[1].token_ids, (Ids{1, 10, 2, 11}));
  EXPECT_EQ(samples[1].num_calls, 2);
}

TEST(ContextTracker, LogprobsAndVersionsStayAligned) {
  LlmCall c1 = make_call({1, 2}, {10, 11, 12}, 3);
  c1.completion_logprobs = {-1.0f, -2.0f, -3.0f};
  LlmCall c2 = make_call({1, 2, 10, 11, 12, 5, 6}, {13, 14}, 4);
  c2.completion_logprobs = {-4.0f, -5.0f};
  auto samples = merge_calls_into_samples({c1, c2});
  ASSERT_EQ(samples.size(), 1u);
  const Sample& s = samples[0];
  EXPECT_EQ(s.token_ids, (Ids{1, 2, 10, 11, 12, 5, 6, 13, 14}));
  EXPECT_EQ(s.rollout_logprobs, (std::vector<float>{0, 0, -1.0f, -2.0f, -3.0f, 0, 0, -4.0f, -5.0f}));
  EXPECT_EQ(s.policy_versions, (std::vector<int64_t>{-1, -1, 3, 3, 3, -1, -1, 4, 4}));
  expect_consistent(s);
}

TEST(ContextTracker, EmptyCompletionIsStillRecorded) {
  std::vector<LlmCall> calls = {
      make_call({1, 2}, {}),  // e.g. hit max_tokens = 0 or an immediate stop
      make_call({1, 2, 3}, {10}),
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].token_ids, (Ids{1, 2, 3, 10}));
  EXPECT_EQ(samples[0].loss_mask, (Mask{0, 0, 0, 1}));
  EXPECT_EQ(samples[0].num_calls, 2);
}

TEST(ContextTracker, IdenticalPromptReusesTimelineWithoutDuplicatingContext) {
  // A retry with exactly the timeline as prompt appends only the new completion.
  std::vector<LlmCall> calls = {
      make_call({1, 2}, {10}),
      make_call({1, 2, 10}, {11}),
  };
  auto samples = merge_calls_into_samples(calls);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].token_ids, (Ids{1, 2, 10, 11}));
  EXPECT_EQ(samples[0].loss_mask, (Mask{0, 0, 1, 1}));
}

TEST(ContextTracker, MismatchedLogprobsAreABug) {
  LlmCall c = make_call({1}, {10, 11});
  c.completion_logprobs.pop_back();
  try {
    merge_calls_into_samples({c});
    FAIL() << "expected SwarmError";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INTERNAL);
  }
}

}  // namespace
}  // namespace swarm
