// /metrics' per-rank series (api/metrics.hpp): present for each rank the engine reports, absent
// where nothing is routed (the mock engine).
#include <gtest/gtest.h>

#include "api/metrics.hpp"

namespace swarm {
namespace {

TEST(Metrics, EachRankHasItsSeries) {
  Metrics metrics;
  EngineSnapshot st;
  st.serving = {RankServing{0, true, 12, 480, 2, 300}, RankServing{1, false, 7, 250, 0, 0}};
  const std::string out = metrics.render(st, PoolSnapshot{}, {});
  for (const char* line :
       {"# TYPE swarm_rank_requests_total counter\n", "swarm_rank_requests_total{rank=\"0\"} 12\n",
        "swarm_rank_requests_total{rank=\"1\"} 7\n", "# TYPE swarm_rank_generated_tokens_total counter\n",
        "swarm_rank_generated_tokens_total{rank=\"0\"} 480\n",
        "swarm_rank_generated_tokens_total{rank=\"1\"} 250\n", "swarm_rank_in_flight{rank=\"0\"} 2\n",
        "swarm_rank_up{rank=\"0\"} 1\n", "swarm_rank_up{rank=\"1\"} 0\n"})
    EXPECT_NE(out.find(line), std::string::npos) << line << " missing from\n" << out;
}

TEST(Metrics, NoRanksNoRankSeries) {
  Metrics metrics;
  const std::string out = metrics.render(EngineSnapshot{}, PoolSnapshot{}, {});
  EXPECT_EQ(out.find("swarm_rank_"), std::string::npos);
  EXPECT_NE(out.find("swarm_engine_state"), std::string::npos);
}

}  // namespace
}  // namespace swarm
