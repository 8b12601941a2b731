#include "common/latency_window.hpp"

#include <gtest/gtest.h>

namespace swarm {
namespace {

TEST(LatencyWindow, EmptyIsZero) {
  LatencyWindow w(4);
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(w.percentile(50), 0.0);
  EXPECT_EQ(w.percentile(99), 0.0);
}

TEST(LatencyWindow, NearestRankPercentiles) {
  LatencyWindow w(100);
  for (int i = 100; i >= 1; --i) w.add(i);  // 1..100, inserted out of order
  EXPECT_EQ(w.size(), 100u);
  EXPECT_EQ(w.percentile(0), 1.0);
  EXPECT_EQ(w.percentile(50), 50.0);
  EXPECT_EQ(w.percentile(99), 99.0);
  EXPECT_EQ(w.percentile(100), 100.0);
  EXPECT_EQ(w.percentile(250), 100.0);  // clamped
}

TEST(LatencyWindow, KeepsOnlyTheMostRecentSamples) {
  LatencyWindow w(3);
  for (double v : {100.0, 200.0, 300.0, 1.0, 2.0}) w.add(v);
  EXPECT_EQ(w.size(), 3u);
  // The window holds 300, 1, 2: the two oldest were overwritten.
  EXPECT_EQ(w.percentile(0), 1.0);
  EXPECT_EQ(w.percentile(50), 2.0);
  EXPECT_EQ(w.percentile(100), 300.0);
  w.add(3.0);  // now 1, 2, 3
  EXPECT_EQ(w.percentile(100), 3.0);
}

TEST(LatencyWindow, ZeroCapacityHoldsOne) {
  LatencyWindow w(0);
  w.add(5.0);
  w.add(7.0);
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.percentile(50), 7.0);
}

}  // namespace
}  // namespace swarm
