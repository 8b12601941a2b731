// What swarm-overwatch knows about a server after one poll: the pool information, the
// engine status and the request counters of /metrics, parsed into plain structs.
//
// Parsing is tolerant: a missing or mistyped field takes its default, so the monitor
// keeps working against an older server or another implementation of the protocol.
// Only a body that is not a JSON object is an error.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace swarm::overwatch {

/// A response the monitor cannot use (not JSON, not an object).
class ParseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RunningEpisode {
  std::string episode_uuid;
  std::string client_uuid;
  std::string episode_type = "train";
  int64_t llm_calls = 0;
  int64_t in_flight_calls = 0;
  double seconds_idle = 0.0;
  double discard_episode_timeout = 0.0;
  double seconds_since_claim = 0.0;
};

struct TaskStat {
  std::string task_id;
  int64_t episodes = 0;
  double reward_mean = 0.0;  // NaN when the server sent null
  double reward_std = 0.0;
  bool complete = false;
  bool dummy = false;
};

/// One finished policy step (an entry of the pool's step_history).
struct StepPoint {
  int64_t global_step = 0;
  double reward_mean = 0.0;  // NaN when unknown
  double reward_std = 0.0;
  int64_t episodes = 0;
  int64_t tasks = 0;
  double seconds = 0.0;
  double staleness_mean = 0.0;  // lag of the trained tokens (0 when the server does not say)
  double staleness_max = 0.0;
  int64_t stale_dropped = 0;       // episodes dropped as too stale for this step
  double local_reward_mean = NAN;  // a swarm node's own episodes (reward_mean includes external groups)
  bool trained_nothing = false;    // the update trained no sequence (every group's rewards equal)
};

/// GET /get_current_batch_rollout_pool_information.
/// One peer of the swarm as this server sees it (SAPO).
struct ExchangePeerInfo {
  std::string node_id;
  std::string model;
  int64_t received = 0;
  int64_t accepted = 0;
  int64_t used = 0;
  int64_t dropped = 0;
  int64_t last_policy_step = -1;
  double seconds_since_seen = -1.0;  // -1: never
};

/// Swarm experience sharing (the pool information's "exchange", when the server has one).
struct ExchangeInfo {
  bool present = false;
  std::string url, swarm_name, node_id, last_error;
  bool connected = false;
  bool ready = false;
  int64_t published = 0;
  int64_t received = 0;
  int64_t accepted = 0;
  int64_t buffered = 0;
  int64_t used = 0;
  int64_t outbox = 0;
  int64_t dropped = 0;  // every reason but "own"
  std::vector<ExchangePeerInfo> peers;
};

/// What one rank of a multi-rank job served (the pool information's "serving").
struct RankServingInfo {
  int64_t rank = 0;
  bool up = true;
  int64_t requests = 0;
  int64_t generated_tokens = 0;
  int64_t in_flight = 0;
};

struct PoolInfo {
  std::string engine_status;
  std::string engine_status_detail;
  std::string run_id;  // the run the step history and counters belong to ("" from older servers)
  double seconds_in_state = 0.0;
  int64_t global_step = 0;
  int64_t policy_version = 0;
  bool has_training = false;  // the server reports its training mode (newer servers)
  int64_t max_staleness = 0;  // 0 = synchronous
  int64_t trainer_step = 0;   // the step the trainer computes; 0 = idle
  std::string sample_collection_method;
  bool accepting_claims = false;
  int64_t batch_size = 0;
  int64_t num_repeat = 0;
  int64_t target_episodes = 0;
  int64_t target_tasks = 0;
  int64_t target_non_dummy_tasks = 0;
  int64_t finished_episodes = 0;
  int64_t complete_tasks = 0;
  int64_t complete_non_dummy_tasks = 0;
  int64_t max_parallel_episodes = 0;
  int64_t unclaimed = 0;
  int64_t running = 0;
  std::vector<RunningEpisode> running_episodes;
  std::vector<TaskStat> tasks;
  std::vector<double> recent_rewards;   // episode rewards, oldest first
  std::vector<StepPoint> step_history;  // oldest first
  std::vector<std::pair<std::string, double>> eval_metrics;
  std::vector<std::pair<std::string, int64_t>> counters;  // in the server's order
  ExchangeInfo exchange;
  std::vector<RankServingInfo> serving;  // one per rank (empty from older servers and the mock)

  /// A counter by name, 0 when absent.
  int64_t counter(std::string_view name) const;
};

/// GET /get_engine_status (the fields the pool information does not carry).
struct EngineInfo {
  std::string engine;  // "mock" / "torch"
  std::string model;
  bool config_synced = false;
};

/// Totals from /metrics (swarm_http_requests_total, swarm_tokens_total, the prefix cache's
/// swarm_prefix_cache_*_tokens_total and swarm_kv_blocks_free).
struct RequestStats {
  int64_t total = 0;
  int64_t client_errors = 0;  // 4xx
  int64_t server_errors = 0;  // 5xx
  int64_t openai = 0;         // requests to /v1/* routes
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // The inference engine's prefix cache; -1 when /metrics has no such series (an engine that
  // serves nothing yet, prefix_caching false).
  int64_t prefix_queries_tokens = -1;
  int64_t prefix_hit_tokens = -1;
  int64_t kv_blocks_free = -1;
};

/// Everything one poll produced. Only the pool information is required; the other two
/// are absent when their route failed.
struct Snapshot {
  PoolInfo pool;
  std::optional<EngineInfo> engine;
  std::optional<RequestStats> requests;
};

/// One sample of the Prometheus text format: `name{label="v",...} value`.
struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

/// Parses the pool information. Throws ParseError unless `body` is a JSON object.
PoolInfo parse_pool_information(std::string_view body);
PoolInfo pool_information_from_json(const nlohmann::json& j);

/// Parses GET /get_engine_status. Throws ParseError unless `body` is a JSON object.
EngineInfo parse_engine_status(std::string_view body);

/// Parses Prometheus text exposition; comment lines and malformed lines are skipped.
std::vector<PromSample> parse_prometheus(std::string_view text);

/// Sums the request and token counters of /metrics.
RequestStats request_stats_from_metrics(std::string_view text);

}  // namespace swarm::overwatch
