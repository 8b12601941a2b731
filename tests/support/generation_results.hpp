// Comparing two generation results bit for bit: the serving link's tests and the check that
// every rank answers as rank 0 does.
#pragma once

#include <cstring>

#include <gtest/gtest.h>

#include "inference/generation.hpp"

namespace swarm::testing {

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

/// Every field of every choice equal, log-probs to the bit.
inline void expect_same_generation(const GenerationResult& a, const GenerationResult& b) {
  EXPECT_EQ(a.policy_version, b.policy_version);
  ASSERT_EQ(a.choices.size(), b.choices.size());
  for (size_t c = 0; c < a.choices.size(); ++c) {
    SCOPED_TRACE("choice " + std::to_string(c));
    const GenerationChoice &x = a.choices[c], &y = b.choices[c];
    EXPECT_EQ(x.ids, y.ids);
    ASSERT_EQ(x.logprobs.size(), y.logprobs.size());
    for (size_t i = 0; i < x.logprobs.size(); ++i)
      EXPECT_TRUE(same_bits(x.logprobs[i], y.logprobs[i])) << "log-prob " << i << " differs in its bits";
    EXPECT_EQ(x.versions, y.versions);
    ASSERT_EQ(x.top.size(), y.top.size());
    for (size_t i = 0; i < x.top.size(); ++i) {
      ASSERT_EQ(x.top[i].size(), y.top[i].size());
      for (size_t k = 0; k < x.top[i].size(); ++k) {
        EXPECT_EQ(x.top[i][k].id, y.top[i][k].id);
        EXPECT_TRUE(same_bits(x.top[i][k].logprob, y.top[i][k].logprob));
      }
    }
    EXPECT_EQ(x.text, y.text);
    EXPECT_EQ(x.finish_reason, y.finish_reason);
  }
}

}  // namespace swarm::testing
