// Which rank serves a generation (engine/rank_router.hpp): sticky per episode, else the least
// outstanding tokens, turns when idle, never a rank that is down, and bounded memory.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/rank_router.hpp"

namespace swarm {
namespace {

TEST(RankRouter, AnIdleJobTakesTurns) {
  RankRouter router(3);
  std::vector<int> picked;
  for (int i = 0; i < 6; ++i) {
    const int r = router.route("", 100);
    picked.push_back(r);
    router.finish(r, 100, 10);
  }
  EXPECT_EQ(picked, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  for (const RankServing& c : router.counters()) {
    EXPECT_EQ(c.requests, 2);
    EXPECT_EQ(c.generated_tokens, 20);
    EXPECT_EQ(c.in_flight, 0);
    EXPECT_EQ(c.outstanding_tokens, 0);
  }
}

TEST(RankRouter, TheLeastOutstandingTokensWin) {
  RankRouter router(3);
  EXPECT_EQ(router.route("", 1000), 0);
  EXPECT_EQ(router.route("", 10), 1);
  EXPECT_EQ(router.route("", 10), 2);
  EXPECT_EQ(router.route("", 10), 1);   // 1 and 2 tie (10 tokens, 1 request each): the lower rank
  EXPECT_EQ(router.route("", 10), 2);   // 10 < 20
  EXPECT_EQ(router.route("", 500), 1);  // a tie again (20 tokens, 2 requests each)
  const auto c = router.counters();
  EXPECT_EQ(c[0].outstanding_tokens, 1000);
  EXPECT_EQ(c[1].outstanding_tokens, 520);
  EXPECT_EQ(c[2].outstanding_tokens, 20);
  EXPECT_EQ(c[1].in_flight, 3);
}

TEST(RankRouter, AnEpisodeStaysOnItsRank) {
  RankRouter router(2);
  EXPECT_EQ(router.route("episode-a", 10), 0);
  EXPECT_EQ(router.route("episode-b", 10), 1);
  EXPECT_EQ(router.route("", 10000), 0);        // rank 0 is now far busier than rank 1,
  EXPECT_EQ(router.route("episode-a", 10), 0);  // yet episode-a's next turns go where its cache is
  EXPECT_EQ(router.route("episode-a", 10), 0);
  EXPECT_EQ(router.route("episode-c", 10), 1);  // a new episode goes by load
  EXPECT_EQ(router.remembered_episodes(), 3u);
}

TEST(RankRouter, ARankThatIsDownGetsNothingAndItsEpisodesMove) {
  RankRouter router(2);
  EXPECT_EQ(router.route("episode-a", 1), 0);
  EXPECT_EQ(router.route("episode-b", 1), 1);
  router.set_down(1);
  EXPECT_EQ(router.route("episode-b", 1), 0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(router.route("", 1), 0);
  EXPECT_EQ(router.route("episode-b", 1), 0);  // it stays where it moved
  EXPECT_FALSE(router.counters()[1].up);
  router.set_down(0);
  EXPECT_EQ(router.route("episode-a", 1), -1);
  EXPECT_EQ(router.route("", 1), -1);
}

TEST(RankRouter, ItRemembersABoundedNumberOfEpisodes) {
  RankRouter router(2, 4);
  for (int i = 0; i < 100; ++i) router.finish(router.route("episode-" + std::to_string(i), 1), 1, 1);
  EXPECT_EQ(router.remembered_episodes(), 4u);
  // The most recent ones are the ones kept: episode-99 is still sticky.
  const int r99 = router.route("episode-99", 1);
  router.route("", 1000000);  // load the other rank... or this one; either way:
  EXPECT_EQ(router.route("episode-99", 1), r99);
}

TEST(RankRouter, ConcurrentUseKeepsTheCountsExact) {
  RankRouter router(4, 64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const int r = router.route("e" + std::to_string((t * 7 + i) % 100), 3);
        router.finish(r, 3, 2);
      }
    });
  for (auto& th : threads) th.join();
  int64_t requests = 0, generated = 0;
  for (const RankServing& c : router.counters()) {
    requests += c.requests;
    generated += c.generated_tokens;
    EXPECT_EQ(c.in_flight, 0);
    EXPECT_EQ(c.outstanding_tokens, 0);
  }
  EXPECT_EQ(requests, 8000);
  EXPECT_EQ(generated, 16000);
  EXPECT_LE(router.remembered_episodes(), 64u);
}

}  // namespace
}  // namespace swarm
