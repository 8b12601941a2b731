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

TEST(Metrics, ThePrefixCacheHasSeriesOfItsOwn) {
  Metrics metrics;
  const std::string out = metrics.render(EngineSnapshot{}, PoolSnapshot{}, {},
                                         {{"prefix_cache_queries_tokens_total", 3200},
                                          {"prefix_cache_hit_tokens_total", 2880},
                                          {"kv_blocks_free", 250},
                                          {"kv_blocks_total", 256}});
  for (const char* line :
       {"# TYPE swarm_prefix_cache_queries_tokens_total counter\n",
        "swarm_prefix_cache_queries_tokens_total 3200\n",
        "# TYPE swarm_prefix_cache_hit_tokens_total counter\n", "swarm_prefix_cache_hit_tokens_total 2880\n",
        "# TYPE swarm_kv_blocks_free gauge\n", "swarm_kv_blocks_free 250\n",
        "swarm_inference{field=\"kv_blocks_total\"} 256\n"})
    EXPECT_NE(out.find(line), std::string::npos) << line << " missing from\n" << out;
  EXPECT_EQ(metrics.render(EngineSnapshot{}, PoolSnapshot{}, {}).find("swarm_prefix_cache"),
            std::string::npos);
}

TEST(Metrics, NoRanksNoRankSeries) {
  Metrics metrics;
  const std::string out = metrics.render(EngineSnapshot{}, PoolSnapshot{}, {});
  EXPECT_EQ(out.find("swarm_rank_"), std::string::npos);
  EXPECT_NE(out.find("swarm_engine_state"), std::string::npos);
}

}  // namespace
}  // namespace swarm
