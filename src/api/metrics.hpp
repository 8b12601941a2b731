// Request metrics and the Prometheus text rendering of /metrics.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.hpp"

namespace swarm {

/// Counts requests by (route, status) and records latency histograms by route.
/// Thread-safe. Routes are the fixed set the router knows plus "other", so label
/// cardinality is bounded.
class Metrics {
 public:
  static constexpr std::array<double, 14> kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                      0.1,    0.25,  0.5,    1.0,   2.5,  5.0,   10.0};

  void observe_request(const std::string& route, int status, double seconds);
  /// Counts an OpenAI generation's tokens.
  void observe_tokens(int64_t prompt_tokens, int64_t completion_tokens);
  /// Generated text that looked like a tool call but did not parse (left in content).
  void observe_tool_call_parse_failures(int64_t n) { tool_call_parse_failures_ += n; }

  /// Renders every metric, including the engine's state and counters.
  std::string render(const EngineSnapshot& status, const PoolSnapshot& pool,
                     const std::vector<TrainStepReport>& steps,
                     const std::map<std::string, double>& inference = {}) const;

 private:
  struct Histogram {
    std::array<int64_t, kBuckets.size()> buckets{};
    int64_t count = 0;
    double sum = 0.0;
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, Histogram> latency_;
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> completion_tokens_{0};
  std::atomic<int64_t> tool_call_parse_failures_{0};
};

}  // namespace swarm
