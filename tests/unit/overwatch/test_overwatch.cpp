// swarm-overwatch's parser, monitor and renderer on fixed snapshots (no server, no terminal).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "overwatch/monitor.hpp"
#include "overwatch/render.hpp"
#include "overwatch/snapshot.hpp"
#include "overwatch/terminal.hpp"

namespace swarm::overwatch {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// What the mock server answers mid-batch (the shape of docs/protocol.md).
json pool_json() {
  return json::parse(R"({
    "engine_status": "ENGINE.ROLLING", "engine_status_detail": "", "seconds_in_state": 3.25,
    "global_step": 3, "policy_version": 3,
    "sample_collection_method": "rollout_until_finish_enough_tasks", "accepting_claims": true,
    "batch_size": 4, "num_repeat": 4,
    "targets": {"episodes": 16, "tasks": 4, "non_dummy_tasks": 4},
    "progress": {"finished_episodes": 9, "complete_tasks": 2, "complete_non_dummy_tasks": 1},
    "slots": {"max_parallel_episodes": 32, "unclaimed": 29, "running": 3},
    "running_episodes": [
      {"episode_uuid": "aaaaaaaa-1111", "client_uuid": "cccccccc-1111", "episode_type": "train",
       "llm_calls": 2, "in_flight_calls": 0, "seconds_idle": 1.5, "discard_episode_timeout": 600,
       "seconds_since_claim": 12.0},
      {"episode_uuid": "bbbbbbbb-2222", "client_uuid": "dddddddd-2222", "episode_type": "eval",
       "llm_calls": 5, "in_flight_calls": 1, "seconds_idle": 540, "discard_episode_timeout": 600,
       "seconds_since_claim": 700.0},
      {"episode_uuid": "eeeeeeee-3333", "client_uuid": "cccccccc-1111", "episode_type": "train",
       "llm_calls": 0, "in_flight_calls": 0, "seconds_idle": 0.2, "discard_episode_timeout": 600,
       "seconds_since_claim": 0.2}
    ],
    "tasks": [
      {"task_id": "task-3-0", "episodes": 4, "reward_mean": 0.875, "reward_std": 0.1, "complete": true, "dummy": false},
      {"task_id": "task-3-1", "episodes": 4, "reward_mean": 1.0, "reward_std": 0.0, "complete": true, "dummy": true},
      {"task_id": "task-3-2", "episodes": 1, "reward_mean": 0.5, "reward_std": 0.0, "complete": false, "dummy": false}
    ],
    "recent_rewards": [0.0, 0.5, 1.0, 1.0],
    "step_history": [
      {"global_step": 1, "reward_mean": 0.25, "reward_std": 0.1, "reward_min": 0, "reward_max": 1,
       "episodes": 16, "tasks": 4, "samples": 16, "tokens": 100, "seconds": 1.5, "metrics": {}},
      {"global_step": 2, "reward_mean": 0.5, "reward_std": 0.2, "episodes": 16, "tasks": 4, "seconds": 1.0},
      {"global_step": 3, "reward_mean": 0.75, "reward_std": 0.125, "episodes": 16, "tasks": 4, "seconds": 1.2}
    ],
    "eval_metrics": {"eval/reward_mean": 0.7, "eval/episodes": 12},
    "counters": {"claimed": 40, "ended": 36, "ended_eval": 2, "ended_without_reward": 0, "aborted": 1,
                 "timed_out": 0, "cancelled": 0, "llm_calls": 120, "late_calls_dropped": 0,
                 "valve_dropped_groups": 0, "valve_dropped_episodes": 0, "batches_taken": 3}
  })");
}

constexpr const char* kMetrics = R"(# HELP swarm_http_requests_total HTTP requests by route and status.
# TYPE swarm_http_requests_total counter
swarm_http_requests_total{route="/claim_episode",status="200"} 40
swarm_http_requests_total{route="/v1/chat/completions",status="200"} 118
swarm_http_requests_total{route="/v1/chat/completions",status="400"} 2
swarm_http_requests_total{route="/end_episode",status="500"} 1
swarm_http_request_duration_seconds_bucket{route="/claim_episode",le="+Inf"} 40
swarm_tokens_total{kind="prompt"} 12345
swarm_tokens_total{kind="completion"} 678
# TYPE swarm_prefix_cache_queries_tokens_total counter
swarm_prefix_cache_queries_tokens_total 12000
swarm_prefix_cache_hit_tokens_total 8640
swarm_kv_blocks_free 250
)";

Snapshot sample_snapshot() {
  Snapshot s;
  s.pool = pool_information_from_json(pool_json());
  s.engine = EngineInfo{"mock", "mock-echo", true};
  s.requests = request_stats_from_metrics(kMetrics);
  return s;
}

FrameInput sample_frame() {
  Monitor m("http://127.0.0.1:10086", 1.0);
  const auto t0 = Monitor::Clock::time_point{} + 1000s;
  m.on_poll_ok(sample_snapshot(), t0);
  FrameInput f = m.frame(t0);
  f.clock = "12:00:00";
  return f;
}

RenderOptions plain(int width, int height = 0) {
  RenderOptions o;
  o.width = width;
  o.height = height;
  o.color = false;
  o.interactive = false;
  return o;
}

bool has_line(const std::vector<std::string>& lines, const std::string& expected) {
  for (const auto& l : lines)
    if (l == expected) return true;
  return false;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// ---------------------------------------------------------------- building blocks

TEST(OverwatchFormat, Durations) {
  EXPECT_EQ(format_duration(0.0), "0.0s");
  EXPECT_EQ(format_duration(0.44), "0.4s");
  EXPECT_EQ(format_duration(12.7), "12s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(600), "10m00s");
  EXPECT_EQ(format_duration(7620), "2h07m");
  EXPECT_EQ(format_duration(100000), "1d03h");
  EXPECT_EQ(format_duration(-1), "-");
  EXPECT_EQ(format_duration(NAN), "-");
}

TEST(OverwatchFormat, Counts) {
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(9999), "9999");
  EXPECT_EQ(format_count(12345), "12.3k");
  EXPECT_EQ(format_count(1234567), "1.23M");
}

TEST(OverwatchSparkline, ScalesBetweenMinAndMax) {
  EXPECT_EQ(sparkline({1, 2, 3, 4, 5, 6, 7, 8}, 8), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(sparkline({0.0, 1.0}, 10), "▁█");  // fewer values than columns: shorter
  EXPECT_EQ(sparkline({0.5, 0.5, 0.5}, 10), "▄▄▄");
  EXPECT_EQ(sparkline({0.0, NAN, 1.0}, 10), "▁ █");
  EXPECT_EQ(sparkline({}, 10), "");
  EXPECT_EQ(sparkline({1, 2}, 0), "");
}

TEST(OverwatchSparkline, ShowsTheLastValuesWhenNarrow) {
  // The first (large) value scrolled out, so the scale is that of the last three.
  EXPECT_EQ(sparkline({100, 0, 10, 0}, 3), "▁█▁");
}

TEST(OverwatchProgressBar, Eighths) {
  EXPECT_EQ(progress_bar(0, 4, 8), "░░░░░░░░");
  EXPECT_EQ(progress_bar(2, 4, 8), "████░░░░");
  EXPECT_EQ(progress_bar(4, 4, 4), "████");
  EXPECT_EQ(progress_bar(9, 4, 4), "████");              // beyond the target: full
  EXPECT_EQ(progress_bar(1, 3, 4), "█▍░░");              // 1/3 of 32 eighths = 11
  EXPECT_EQ(progress_bar(0.01, 100, 10), "▏░░░░░░░░░");  // any progress shows
  EXPECT_EQ(progress_bar(99.9, 100, 4), "███▉");         // not done never looks done
  EXPECT_EQ(progress_bar(3, 0, 4), "░░░░");              // no target
  EXPECT_EQ(progress_bar(1, 2, 0), "");
  for (size_t w : {1u, 7u, 33u}) EXPECT_EQ(display_width(progress_bar(5, 17, w)), w);
}

TEST(OverwatchText, DisplayWidth) {
  EXPECT_EQ(display_width("abc"), 3u);
  EXPECT_EQ(display_width("\x1b[1;31mabc\x1b[0m"), 3u);
  EXPECT_EQ(display_width("█▌─…"), 4u);
  EXPECT_EQ(display_width("日本"), 4u);
  EXPECT_EQ(display_width(""), 0u);
}

TEST(OverwatchText, FitLine) {
  EXPECT_EQ(fit_line("abcdef", 10), "abcdef");
  EXPECT_EQ(fit_line("abcdef", 6), "abcdef");
  EXPECT_EQ(fit_line("abcdef", 4), "abc…");
  EXPECT_EQ(fit_line("abcdef", 1), "…");
  EXPECT_EQ(fit_line("abcdef", 0), "");
  EXPECT_EQ(fit_line("██████", 3), "██…");
  EXPECT_EQ(fit_line("日本語", 4), "日…");  // a wide character never straddles the edge
  // Colours survive the cut and are reset after it.
  EXPECT_EQ(fit_line("\x1b[31mabcdef\x1b[0m", 4), "\x1b[31mabc…\x1b[0m");
}

TEST(OverwatchText, SanitizeAndWrap) {
  EXPECT_EQ(sanitize("a\x1b[2Jb\nc"), "a?[2Jb?c");
  EXPECT_EQ(sanitize("ok \xff end"), "ok ? end");
  EXPECT_EQ(sanitize("héllo ✓"), "héllo ✓");
  EXPECT_EQ(wrap_text("connection refused by the host", 12),
            (std::vector<std::string>{"connection", "refused by", "the host"}));
  EXPECT_EQ(wrap_text("abcdefghij", 4), (std::vector<std::string>{"abcd", "efgh", "ij"}));
  EXPECT_EQ(wrap_text("", 4), (std::vector<std::string>{""}));
}

// ---------------------------------------------------------------- parsing

TEST(OverwatchParse, PoolInformation) {
  const PoolInfo p = pool_information_from_json(pool_json());
  EXPECT_EQ(p.engine_status, "ENGINE.ROLLING");
  EXPECT_DOUBLE_EQ(p.seconds_in_state, 3.25);
  EXPECT_EQ(p.global_step, 3);
  EXPECT_EQ(p.sample_collection_method, "rollout_until_finish_enough_tasks");
  EXPECT_EQ(p.target_episodes, 16);
  EXPECT_EQ(p.target_tasks, 4);
  EXPECT_EQ(p.finished_episodes, 9);
  EXPECT_EQ(p.complete_tasks, 2);
  EXPECT_EQ(p.complete_non_dummy_tasks, 1);
  EXPECT_EQ(p.max_parallel_episodes, 32);
  ASSERT_EQ(p.running_episodes.size(), 3u);
  EXPECT_EQ(p.running_episodes[1].episode_type, "eval");
  EXPECT_EQ(p.running_episodes[1].in_flight_calls, 1);
  EXPECT_DOUBLE_EQ(p.running_episodes[1].seconds_idle, 540);
  ASSERT_EQ(p.tasks.size(), 3u);
  EXPECT_TRUE(p.tasks[1].dummy);
  EXPECT_EQ(p.recent_rewards.size(), 4u);
  ASSERT_EQ(p.step_history.size(), 3u);
  EXPECT_DOUBLE_EQ(p.step_history[2].reward_mean, 0.75);
  EXPECT_EQ(p.counter("claimed"), 40);
  EXPECT_EQ(p.counter("no_such_counter"), 0);
  EXPECT_EQ(p.eval_metrics.size(), 2u);
}

TEST(OverwatchParse, TheRunIdAndTheStepFlags) {
  json j = pool_json();
  j["run"] = {{"run_id", "20261207-050241"}, {"started", 1.8e9}, {"resumed_from", nullptr}};
  j["step_history"][0]["metrics"] = {{"trained_nothing", 1}, {"local_reward_mean", 0.125}};
  const PoolInfo p = pool_information_from_json(j);
  EXPECT_EQ(p.run_id, "20261207-050241");
  EXPECT_TRUE(p.step_history[0].trained_nothing);
  EXPECT_DOUBLE_EQ(p.step_history[0].local_reward_mean, 0.125);
  EXPECT_FALSE(p.step_history[1].trained_nothing);
  EXPECT_TRUE(std::isnan(p.step_history[1].local_reward_mean));
  EXPECT_EQ(pool_information_from_json(pool_json()).run_id, "");
}

TEST(OverwatchParse, MissingAndNullFieldsTakeDefaults) {
  const PoolInfo p = parse_pool_information(std::string_view(
      R"({"engine_status": "ENGINE.OFFLINE", "tasks": [{"task_id": "t", "reward_mean": null}],
          "targets": "not an object", "global_step": "3"})"));
  EXPECT_EQ(p.engine_status, "ENGINE.OFFLINE");
  EXPECT_EQ(p.global_step, 0);
  EXPECT_EQ(p.target_tasks, 0);
  ASSERT_EQ(p.tasks.size(), 1u);
  EXPECT_TRUE(std::isnan(p.tasks[0].reward_mean));
  EXPECT_TRUE(p.running_episodes.empty());
}

TEST(OverwatchParse, RejectsNonObjects) {
  EXPECT_THROW(parse_pool_information(std::string_view("<html>")), ParseError);
  EXPECT_THROW(parse_pool_information(std::string_view("[1, 2]")), ParseError);
  EXPECT_THROW(parse_engine_status("42"), ParseError);
  const EngineInfo e = parse_engine_status(R"({"engine": "mock", "model": "m", "config_synced": true})");
  EXPECT_EQ(e.engine, "mock");
  EXPECT_TRUE(e.config_synced);
}

TEST(OverwatchParse, Prometheus) {
  const auto samples = parse_prometheus(
      "# HELP x y\nm_total{a=\"1\",b=\"q\\\"uo\\\\te\"} 3\nplain 2.5 1700000000\nbroken{a=\"1\" 4\n"
      "inf_bucket{le=\"+Inf\"} +Inf\n\nbad value\n");
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].name, "m_total");
  EXPECT_EQ(samples[0].labels.at("b"), "q\"uo\\te");
  EXPECT_DOUBLE_EQ(samples[0].value, 3);
  EXPECT_EQ(samples[1].name, "plain");
  EXPECT_DOUBLE_EQ(samples[1].value, 2.5);
  EXPECT_TRUE(std::isinf(samples[2].value));

  const RequestStats r = request_stats_from_metrics(kMetrics);
  EXPECT_EQ(r.total, 161);
  EXPECT_EQ(r.client_errors, 2);
  EXPECT_EQ(r.server_errors, 1);
  EXPECT_EQ(r.openai, 120);
  EXPECT_EQ(r.prompt_tokens, 12345);
  EXPECT_EQ(r.completion_tokens, 678);
  EXPECT_EQ(r.prefix_queries_tokens, 12000);
  EXPECT_EQ(r.prefix_hit_tokens, 8640);
  EXPECT_EQ(r.kv_blocks_free, 250);
  const RequestStats none = request_stats_from_metrics("swarm_tokens_total{kind=\"prompt\"} 5\n");
  EXPECT_EQ(none.prefix_queries_tokens, -1);  // an engine without the series: not shown
  EXPECT_EQ(none.kv_blocks_free, -1);
}

// ---------------------------------------------------------------- monitor

TEST(OverwatchMonitor, KeepsABoundedStepHistoryAcrossPolls) {
  Monitor m("u", 1.0, /*max_steps=*/4);
  auto t = Monitor::Clock::time_point{};
  Snapshot s;
  for (int step = 1; step <= 6; ++step) {
    s.pool.global_step = step;
    // The server only keeps its last two steps; the monitor keeps up to four.
    s.pool.step_history = {StepPoint{step - 1, 0.1 * (step - 1)}, StepPoint{step, 0.1 * step}};
    if (step == 1) s.pool.step_history.erase(s.pool.step_history.begin());
    m.on_poll_ok(s, t += 1s);
  }
  ASSERT_EQ(m.step_history().size(), 4u);
  EXPECT_EQ(m.step_history().front().global_step, 3);
  EXPECT_EQ(m.step_history().back().global_step, 6);

  // A restarted server (step back at 0) starts a new history.
  s.pool.global_step = 0;
  s.pool.step_history.clear();
  m.on_poll_ok(s, t += 1s);
  EXPECT_TRUE(m.step_history().empty());

  // So does a new run id, even when its steps have passed the old run's.
  s.pool.run_id = "20261207-050000";
  s.pool.global_step = 7;
  s.pool.step_history = {StepPoint{7, 0.7}};
  m.on_poll_ok(s, t += 1s);
  s.pool.run_id = "20261207-060000";
  s.pool.global_step = 8;
  s.pool.step_history = {StepPoint{8, 0.8}};
  m.on_poll_ok(s, t += 1s);
  ASSERT_EQ(m.step_history().size(), 1u);
  EXPECT_EQ(m.step_history().front().global_step, 8);
}

TEST(OverwatchMonitor, RatesAndOutages) {
  Monitor m("u", 1.0);
  auto t = Monitor::Clock::time_point{} + 100s;
  Snapshot s;
  s.requests = RequestStats{};
  s.requests->total = 100;
  m.on_poll_ok(s, t);
  EXPECT_FALSE(m.frame(t).requests_per_second.has_value());  // one reading is no rate
  s.requests->total = 120;
  s.requests->client_errors = 2;
  m.on_poll_ok(s, t += 2s);
  FrameInput f = m.frame(t);
  ASSERT_TRUE(f.requests_per_second.has_value());
  EXPECT_DOUBLE_EQ(*f.requests_per_second, 10.0);
  EXPECT_DOUBLE_EQ(*f.errors_per_second, 1.0);
  EXPECT_TRUE(f.connection.reachable);

  m.on_poll_failed("connection refused", t += 1s);
  m.on_poll_failed("connection refused again", t += 1s);
  f = m.frame(t += 500ms);
  EXPECT_FALSE(f.connection.reachable);
  EXPECT_TRUE(f.connection.ever_reached);
  EXPECT_EQ(f.connection.failed_polls, 2);
  EXPECT_DOUBLE_EQ(f.connection.down_seconds, 1.5);  // since the first failure
  EXPECT_DOUBLE_EQ(f.connection.seconds_since_last_ok, 2.5);
  EXPECT_EQ(f.connection.last_error, "connection refused again");
  EXPECT_TRUE(f.snapshot.has_value());  // the last good one is kept

  m.on_poll_ok(s, t += 1s);
  f = m.frame(t);
  EXPECT_TRUE(f.connection.reachable);
  EXPECT_EQ(f.connection.failed_polls, 0);
  EXPECT_FALSE(f.requests_per_second.has_value());  // no rate across an outage
}

TEST(OverwatchMonitor, ExtrapolatesTimeInState) {
  Monitor m("u", 1.0);
  const auto t0 = Monitor::Clock::time_point{} + 5s;
  m.on_poll_ok(sample_snapshot(), t0);
  EXPECT_DOUBLE_EQ(m.frame(t0 + 750ms).snapshot->pool.seconds_in_state, 4.0);
}

// ---------------------------------------------------------------- frames

TEST(OverwatchRender, DashboardLines) {
  const auto lines = render_frame(sample_frame(), plain(100));
  const std::string all = joined(lines);
  SCOPED_TRACE(all);
  // Header: URL left, engine · model · clock right-aligned to the width.
  EXPECT_EQ(lines[0],
            "swarm-overwatch  http://127.0.0.1:10086" + std::string(34, ' ') + "mock · mock-echo · 12:00:00");
  EXPECT_EQ(lines[1], "  ● ENGINE.ROLLING  for 3.2s   step 3 · policy v3 · claims open");
  EXPECT_TRUE(has_line(
      lines, "── Batch " + [] {
        std::string s;
        for (int i = 0; i < 91; ++i) s += "─";
        return s;
      }()));
  EXPECT_TRUE(has_line(lines, "  method     rollout_until_finish_enough_tasks · batch 4 tasks × 4 repeats"));
  // The active method's target comes first and is marked; bars are 50 cells at width 100.
  const std::string half = std::string() + [] {
    std::string s;
    for (int i = 0; i < 25; ++i) s += "█";
    for (int i = 0; i < 25; ++i) s += "░";
    return s;
  }();
  EXPECT_TRUE(has_line(lines, "▶ tasks      [" + half + "]  2/4   50%  ← target"));
  EXPECT_TRUE(has_line(lines, "  slots      running 3 · unclaimed 29 · max 32"));
  // Running episodes: closest to their timeout first; calls in flight after a '+'.
  EXPECT_TRUE(has_line(
      lines, "── Running episodes (3) " + [] {
        std::string s;
        for (int i = 0; i < 76; ++i) s += "─";
        return s;
      }()));
  size_t eval_row = 0, train_row = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("  bbbbbbbb  dddddddd  eval   5 +1    11m40s  9m00s / 10m00s   [", 0) == 0)
      eval_row = i;
    if (lines[i].rfind("  aaaaaaaa  cccccccc  train  2       12s     1.5s / 10m00s    [", 0) == 0)
      train_row = i;
  }
  EXPECT_GT(eval_row, 0u);
  EXPECT_GT(train_row, eval_row);
  // Tasks: episodes of the group, ✓ when complete, reward mean ± std.
  EXPECT_TRUE(has_line(lines, "  task-3-0  4/4 ✓         0.875 ± 0.100"));
  EXPECT_TRUE(has_line(lines, "  task-3-1  4/4 ✓ dummy   1.000 ± 0.000"));
  EXPECT_TRUE(has_line(lines, "  task-3-2  1/4           0.500 ± 0.000"));
  // Rewards: the per-step sparkline from the monitor's history, the episode one from the pool.
  EXPECT_TRUE(has_line(lines, "  per step   ▁▅█  step 3: 0.750 ± 0.125 · range 0.250..0.750 · 3 steps"));
  EXPECT_TRUE(has_line(lines, "  episodes   ▁▅██  mean 0.625 · last 4"));
  EXPECT_TRUE(has_line(lines, "  eval       eval/episodes 12 · eval/reward_mean 0.7"));
  EXPECT_TRUE(
      has_line(lines, "  requests 161 · openai 120 · errors 3 (4xx 2, 5xx 1) · tokens 12.3k in / 678 out"));
  EXPECT_NE(all.find("prefix cache 72.0% of 12.0k prompt tokens"), std::string::npos);
  EXPECT_NE(all.find("kv blocks free 250"), std::string::npos);
  EXPECT_NE(all.find("claimed 40 · ended 36"), std::string::npos);
  EXPECT_NE(all.find("aborted 1"), std::string::npos);
  EXPECT_EQ(all.find("q quit"), std::string::npos);  // --once has no key help
  EXPECT_EQ(all.find('\x1b'), std::string::npos);    // --no-color means none
}

// Asynchronous training: the mode, the trainer beside the collection, and how stale
// the last step's tokens were; an older server without "training" shows no such line.
TEST(OverwatchRender, TrainingModeTrainerAndStaleness) {
  json j = pool_json();
  j["training"] = {{"mode", "asynchronous"}, {"max_staleness", 2}, {"trainer_step", 4}};
  j["step_history"][2]["metrics"] = {
      {"staleness_mean", 1.25}, {"staleness_max", 2}, {"stale_dropped_episodes", 3}};
  j["counters"]["stale_dropped_episodes"] = 5;
  j["counters"]["claims_held_by_staleness"] = 7;
  Monitor m("http://127.0.0.1:10086", 1.0);
  Snapshot snap = sample_snapshot();
  snap.pool = pool_information_from_json(j);
  const auto t0 = Monitor::Clock::time_point{} + 1000s;
  m.on_poll_ok(snap, t0);
  auto lines = render_frame(m.frame(t0), plain(100));
  const std::string all = joined(lines);
  SCOPED_TRACE(all);
  EXPECT_EQ(lines[2],
            "  training async (max_staleness 2) · trainer on step 4 · staleness mean 1.25 max 2 · 3 stale "
            "dropped");
  EXPECT_NE(all.find("stale drops 5"), std::string::npos);
  EXPECT_NE(all.find("claims held 7"), std::string::npos);

  j["training"] = {{"mode", "synchronous"}, {"max_staleness", 0}, {"trainer_step", 0}};
  j["step_history"][2]["metrics"] = {{"staleness_mean", 0.0}, {"staleness_max", 0}};
  snap.pool = pool_information_from_json(j);
  m.on_poll_ok(snap, t0 + 1s);
  lines = render_frame(m.frame(t0 + 1s), plain(100));
  EXPECT_EQ(lines[2], "  training synchronous · trainer idle · staleness mean 0.00 max 0");
  EXPECT_EQ(joined(lines).find("stale drops"), std::string::npos);

  EXPECT_EQ(joined(render_frame(sample_frame(), plain(100))).find("  training "), std::string::npos);
}

// Swarm experience sharing: the broker, the group counters, and each peer; a server
// without an exchange shows no swarm line.
TEST(OverwatchRender, SwarmExchangeAndPeers) {
  json j = pool_json();
  j["exchange"] = {{"url", "nats://127.0.0.1:4222"},
                   {"swarm_name", "lab"},
                   {"node_id", "node-a"},
                   {"connected", true},
                   {"ready", true},
                   {"last_error", ""},
                   {"published", 12},
                   {"received", 30},
                   {"accepted", 9},
                   {"buffered", 3},
                   {"used", 6},
                   {"outbox", 0},
                   {"dropped", {{"own", 12}, {"zero_advantage", 7}, {"malformed", 2}}},
                   {"peers", json::array({{{"node_id", "node-b"},
                                           {"model", "tiny-char"},
                                           {"received", 18},
                                           {"accepted", 9},
                                           {"used", 6},
                                           {"dropped", 9},
                                           {"last_policy_step", 7},
                                           {"seconds_since_seen", 3.0}}})}};
  Monitor m("http://127.0.0.1:10086", 1.0);
  Snapshot snap = sample_snapshot();
  snap.pool = pool_information_from_json(j);
  const auto t0 = Monitor::Clock::time_point{} + 1000s;
  m.on_poll_ok(snap, t0);
  auto lines = render_frame(m.frame(t0), plain(120));
  const std::string all = joined(lines);
  SCOPED_TRACE(all);
  EXPECT_TRUE(
      has_line(lines,
               "  swarm lab as node-a ● connected · published 12 · accepted 9/30 · buffered 3 · used 6 · "
               "9 dropped"));
  EXPECT_TRUE(has_line(
      lines, "    peer node-b (tiny-char) · accepted 9 · used 6 · 9 dropped · step 7 · seen 3.0s ago"));

  j["exchange"]["connected"] = false;
  j["exchange"]["ready"] = false;
  j["exchange"]["outbox"] = 2;
  snap.pool = pool_information_from_json(j);
  m.on_poll_ok(snap, t0 + 1s);
  lines = render_frame(m.frame(t0 + 1s), plain(120));
  EXPECT_NE(joined(lines).find("● broker unreachable · published 12 (2 waiting)"), std::string::npos)
      << joined(lines);

  EXPECT_EQ(joined(render_frame(sample_frame(), plain(100))).find("  swarm "), std::string::npos);

  // A node's step reward includes the external groups: the line says so and shows its own.
  j["global_step"] = 4;
  j["step_history"].push_back({{"global_step", 4},
                               {"reward_mean", 0.75},
                               {"reward_std", 0.125},
                               {"episodes", 16},
                               {"tasks", 4},
                               {"seconds", 1.0},
                               {"metrics", {{"local_reward_mean", 0.41}}}});
  snap.pool = pool_information_from_json(j);
  m.on_poll_ok(snap, t0 + 2s);
  const std::string with_local = joined(render_frame(m.frame(t0 + 2s), plain(160)));
  EXPECT_NE(with_local.find("step 4: 0.750 ± 0.125 with external groups · local 0.410"), std::string::npos)
      << with_local;
  EXPECT_EQ(joined(render_frame(sample_frame(), plain(160))).find("external"), std::string::npos);
}

TEST(OverwatchRender, AStepThatTrainedNothingIsMarked) {
  json j = pool_json();
  j["step_history"][1]["metrics"] = {{"trained_nothing", 1}};
  Monitor m("http://127.0.0.1:10086", 1.0);
  Snapshot snap = sample_snapshot();
  snap.pool = pool_information_from_json(j);
  const auto t0 = Monitor::Clock::time_point{} + 1000s;
  m.on_poll_ok(snap, t0);
  std::string all = joined(render_frame(m.frame(t0), plain(160)));
  EXPECT_NE(all.find("· 1 trained nothing"), std::string::npos) << all;
  j["step_history"][2]["metrics"] = {{"trained_nothing", 1}};
  j["global_step"] = 3;
  snap.pool = pool_information_from_json(j);
  Monitor fresh("http://127.0.0.1:10086", 1.0);
  fresh.on_poll_ok(snap, t0);
  all = joined(render_frame(fresh.frame(t0), plain(160)));
  EXPECT_NE(all.find("this step trained nothing"), std::string::npos) << all;
  EXPECT_EQ(joined(render_frame(sample_frame(), plain(160))).find("trained nothing"), std::string::npos);
}

TEST(OverwatchRender, EveryServingRankHasALine) {
  json j = pool_json();
  j["serving"] = json::array(
      {{{"rank", 0}, {"up", true}, {"requests", 12}, {"generated_tokens", 480}, {"in_flight", 2}},
       {{"rank", 1}, {"up", false}, {"requests", 7}, {"generated_tokens", 300}, {"in_flight", 0}}});
  const PoolInfo p = pool_information_from_json(j);
  ASSERT_EQ(p.serving.size(), 2u);
  EXPECT_EQ(p.serving[1].rank, 1);
  EXPECT_FALSE(p.serving[1].up);
  EXPECT_EQ(p.serving[0].generated_tokens, 480);
  Monitor m("http://127.0.0.1:10086", 1.0);
  Snapshot snap = sample_snapshot();
  snap.pool = p;
  const auto t0 = Monitor::Clock::time_point{} + 1000s;
  m.on_poll_ok(snap, t0);
  const std::string all = joined(render_frame(m.frame(t0), plain(160)));
  EXPECT_NE(all.find("rank 0   requests      12  tokens     480  in flight 2"), std::string::npos) << all;
  EXPECT_NE(all.find("rank 1   requests       7  tokens     300  in flight 0  down"), std::string::npos)
      << all;
  // One rank: nothing to split, no per-rank lines.
  EXPECT_EQ(joined(render_frame(sample_frame(), plain(160))).find("rank 0"), std::string::npos);
}

TEST(OverwatchRender, ActiveTargetFollowsTheMethod) {
  FrameInput f = sample_frame();
  f.snapshot->pool.sample_collection_method = "rollout_until_finish_enough_episodes";
  auto lines = render_frame(f, plain(60));
  std::vector<std::string> targets;
  for (const auto& l : lines)
    if (l.rfind("▶ ", 0) == 0) targets.push_back(l);
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[0].rfind("▶ episodes   [", 0), 0u) << targets[0];
  EXPECT_NE(targets[0].find(" 9/16  56%"), std::string::npos) << targets[0];

  f.snapshot->pool.sample_collection_method = "rollout_until_finish_enough_non_dummy_tasks";
  lines = render_frame(f, plain(60));
  for (const auto& l : lines) {
    if (l.rfind("▶ ", 0) == 0) {
      EXPECT_EQ(l.rfind("▶ non-dummy  [", 0), 0u) << l;
    }
  }
}

TEST(OverwatchRender, OfflineWithoutAJob) {
  FrameInput f = sample_frame();
  PoolInfo& p = f.snapshot->pool;
  p = PoolInfo{};
  p.engine_status = "ENGINE.OFFLINE";
  p.engine_status_detail = "boot failed: no such model";
  f.step_history.clear();
  const auto lines = render_frame(f, plain(80));
  const std::string all = joined(lines);
  EXPECT_TRUE(has_line(lines, "  ● ENGINE.OFFLINE  for 0.0s   step 0 · policy v0 · claims closed")) << all;
  EXPECT_TRUE(has_line(lines, "  detail: boot failed: no such model")) << all;
  EXPECT_TRUE(has_line(lines, "  no batch: the engine is offline (sync_train_config, then start_engine)"))
      << all;
  EXPECT_TRUE(has_line(lines, "  none")) << all;
  EXPECT_TRUE(has_line(lines, "  per step   no finished step yet")) << all;
}

TEST(OverwatchRender, UnreachableScreen) {
  Monitor m("http://127.0.0.1:9", 1.0);
  auto t = Monitor::Clock::time_point{} + 10s;
  m.on_poll_ok(sample_snapshot(), t);
  m.on_poll_failed("HTTP connect to 127.0.0.1:9 failed: Connection refused", t += 1s);
  for (int i = 0; i < 4; ++i)
    m.on_poll_failed("HTTP connect to 127.0.0.1:9 failed: Connection refused", t += 15s);
  FrameInput f = m.frame(t);
  f.clock = "12:00:00";
  RenderOptions o = plain(80);
  o.interactive = true;
  const auto lines = render_frame(f, o);
  const std::vector<std::string> expected = {
      "swarm-overwatch  http://127.0.0.1:9" + std::string(37, ' ') + "12:00:00",
      "",
      "  ✖ SERVER UNREACHABLE",
      "",
      "  down for 1m00s · 5 failed polls · retrying every 1.0s",
      "  last error: HTTP connect to 127.0.0.1:9 failed: Connection refused",
      "  last seen 1m01s ago: ENGINE.ROLLING · step 3 · policy v3",
      "",
      "  q quit · the monitor keeps retrying",
  };
  EXPECT_EQ(lines, expected);

  // Never reached, and a long error wraps under its label instead of running off the screen.
  Monitor never("http://10.0.0.1:1", 2.0);
  never.on_poll_failed(std::string(50, 'x') + " timed out", Monitor::Clock::time_point{});
  const auto narrow = render_frame(never.frame(Monitor::Clock::time_point{} + 3s), plain(40));
  const std::string all = joined(narrow);
  EXPECT_NE(all.find("  never reached since swarm-overwatch\n  started"), std::string::npos) << all;
  EXPECT_NE(all.find("  down for 3.0s · 1 failed poll\n  retrying every 2.0s"), std::string::npos) << all;
  EXPECT_NE(all.find("              timed out"), std::string::npos) << all;
  for (const auto& l : narrow) EXPECT_LE(display_width(l), 40u) << l;
}

TEST(OverwatchRender, EveryLineFitsTheWidth) {
  FrameInput f = sample_frame();
  f.snapshot->pool.tasks[0].task_id =
      "a-very-long-task-identifier-that-goes-on-and-on-" + std::string(80, 'z');
  for (bool color : {false, true}) {
    for (int width : {10, 20, 40, 60, 80, 100, 160, 240}) {
      RenderOptions o = plain(width);
      o.color = color;
      o.interactive = true;
      const auto lines = render_frame(f, o);
      for (const auto& l : lines)
        EXPECT_LE(display_width(l), static_cast<size_t>(width)) << width << ": " << l;
      if (!color) {
        for (const auto& l : lines) EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
      }
    }
  }
}

TEST(OverwatchRender, BarsAndSparklinesUseTheWidth) {
  auto bar_cells = [](const std::vector<std::string>& lines) {
    for (const auto& l : lines)
      if (l.rfind("▶ tasks", 0) == 0) {
        const size_t open = l.find('['), close = l.find(']');
        return display_width(l.substr(open + 1, close - open - 1));
      }
    return size_t{0};
  };
  FrameInput f = sample_frame();
  EXPECT_EQ(bar_cells(render_frame(f, plain(60))), 23u);
  EXPECT_EQ(bar_cells(render_frame(f, plain(100))), 50u);  // capped
  EXPECT_EQ(bar_cells(render_frame(f, plain(30))), 5u);    // never below 5 (the line is cut instead)

  // A long history shows only what fits.
  for (int s = 4; s <= 300; ++s) f.step_history.push_back(StepPoint{s, std::sin(s * 0.1)});
  for (int width : {60, 100, 200}) {
    for (const auto& l : render_frame(f, plain(width))) {
      if (l.rfind("  per step", 0) == 0) {
        EXPECT_LE(display_width(l), static_cast<size_t>(width)) << l;
      }
    }
  }
}

TEST(OverwatchRender, HeightLimitsTheLists) {
  FrameInput f = sample_frame();
  auto& eps = f.snapshot->pool.running_episodes;
  for (int i = 0; i < 60; ++i) eps.push_back(eps[0]);
  RenderOptions o = plain(100, 40);
  o.interactive = true;
  const auto lines = render_frame(f, o);
  const std::string all = joined(lines);
  EXPECT_LE(lines.size(), 40u);
  EXPECT_NE(all.find("… "), std::string::npos) << all;
  EXPECT_NE(all.find(" more"), std::string::npos) << all;
  EXPECT_NE(all.find("task-3-2"), std::string::npos) << all;  // the short list still shows whole
  EXPECT_NE(all.find("q quit"), std::string::npos) << all;    // the footer is never cut

  // Without a height (--once) a list stops at max_list_rows.
  RenderOptions once = plain(100);
  once.max_list_rows = 10;
  const std::string unlimited = joined(render_frame(f, once));
  EXPECT_NE(unlimited.find("… 54 more"), std::string::npos) << unlimited;
}

TEST(OverwatchRender, ShortScreensDropSecondaryLinesFirst) {
  FrameInput f = sample_frame();
  RenderOptions o = plain(80, 24);
  o.interactive = true;
  const auto lines = render_frame(f, o);
  const std::string all = joined(lines);
  EXPECT_LE(lines.size(), 24u);
  // The lists keep their rows; the targets the method does not stop at and the episode
  // counters make room for them.
  EXPECT_NE(all.find("▶ tasks"), std::string::npos) << all;
  EXPECT_EQ(all.find("  episodes   ["), std::string::npos) << all;
  EXPECT_EQ(all.find("claimed 40"), std::string::npos) << all;
  EXPECT_NE(all.find("bbbbbbbb"), std::string::npos) << all;
  EXPECT_NE(all.find("eeeeeeee"), std::string::npos) << all;
  EXPECT_NE(all.find("task-3-2"), std::string::npos) << all;
  EXPECT_EQ(lines.back(), "  q quit · refresh every 1.0s");

  // Tall enough: everything.
  o.height = 60;
  const std::string tall = joined(render_frame(f, o));
  EXPECT_NE(tall.find("  episodes   ["), std::string::npos) << tall;
  EXPECT_NE(tall.find("claimed 40"), std::string::npos) << tall;

  // Absurdly short: still at most `height` lines, and the last one says how to quit.
  for (int h : {1, 3, 8}) {
    o.height = h;
    const auto tiny = render_frame(f, o);
    ASSERT_EQ(tiny.size(), static_cast<size_t>(h));
    EXPECT_EQ(tiny.back(), "  q quit · refresh every 1.0s");
  }
}

TEST(OverwatchRender, ServerTextCannotControlTheTerminal) {
  FrameInput f = sample_frame();
  f.snapshot->pool.tasks[0].task_id = "evil\x1b]0;pwned\x07\x1b[2J";
  f.snapshot->pool.engine_status_detail = "line1\nline2";
  for (const auto& l : render_frame(f, plain(120))) EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
}

TEST(OverwatchRender, ColoursWhenAsked) {
  RenderOptions o = plain(100);
  o.color = true;
  const std::string all = joined(render_frame(sample_frame(), o));
  EXPECT_NE(all.find("\x1b[1;32m● ENGINE.ROLLING\x1b[0m"), std::string::npos) << all;
}

TEST(OverwatchTerminal, ScreenBytesNeverScroll) {
  // Fewer lines than rows: the rest of the screen is cleared.
  EXPECT_EQ(screen_bytes({"a", "b"}, 5), "\x1b[H\x1b[2Ka\r\n\x1b[2Kb\r\n\x1b[J");
  // As many lines as rows, or more: no newline after the last row.
  EXPECT_EQ(screen_bytes({"a", "b", "c"}, 2), "\x1b[H\x1b[2Ka\r\n\x1b[2Kb");
  EXPECT_EQ(terminal_columns(-1, 77), 77);
}

}  // namespace
}  // namespace swarm::overwatch
