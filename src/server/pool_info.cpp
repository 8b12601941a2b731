#include "server/pool_info.hpp"

#include <chrono>

#include <fmt/format.h>

namespace swarm {
namespace {

using json = nlohmann::json;

// AgentJet's seconds as its overwatch parses them: "12.3s".
std::string seconds_text(double s) { return fmt::format("{:.1f}s", s); }

// The fields AgentJet's client and overwatch read (its CurrentBatchRolloutPoolInformation).
void add_agentjet_fields(json& out, const EngineSnapshot& st, const PoolSnapshot& pool,
                         const std::optional<Job>& config, const ClientIdView& show) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  out["completed_episodes"] = pool.finished_episodes;
  out["completed_episode_target"] = pool.target_episodes;
  out["completed_tasks"] = pool.complete_tasks;
  out["completed_task_target"] = pool.target_tasks;
  out["completed_non_dummy_tasks"] = pool.complete_non_dummy_tasks;
  out["completed_non_dummy_task_target"] = pool.target_tasks;
  out["task_expected_num_repeat"] = pool.config.num_repeat;
  json details = json::object(), rewards = json::object(), throttled = json::object();
  for (const auto& t : pool.tasks) {
    details[t.task_id] = t.episode_uuids;
    rewards[t.task_id] = t.rewards;
    if (!t.throttled_client_uuids.empty()) {
      json shown = json::array();
      for (const auto& c : t.throttled_client_uuids) shown.push_back(show(c));
      throttled[t.task_id] = std::move(shown);
    }
  }
  out["completed_tasks_details"] = std::move(details);
  out["completed_tasks_rewards"] = std::move(rewards);
  out["completed_tasks_client_uuids"] = std::move(throttled);
  // Every value a string, and null (not {}) when nothing runs: its client's throttle branches on it.
  json running = nullptr;
  for (const auto& e : pool.running_episodes) {
    if (running.is_null()) running = json::object();
    running[e.episode_uuid] = {{"episode_status", "claimed"},
                               {"time_since_last_activity", seconds_text(e.seconds_idle)},
                               {"discard_episode_timeout", seconds_text(e.discard_episode_timeout)},
                               {"llm_call_count", std::to_string(e.llm_calls)},
                               {"client_uuid", show(e.client_uuid)},
                               {"optional_task_id", e.optional_task_id}};
  }
  out["running_episode_details"] = std::move(running);
  out["booting_start_time"] = st.booting_since_unix ? json(*st.booting_since_unix) : json(nullptr);
  out["training_model_path"] = config ? json(config->model) : json(nullptr);
  json active = json::array();
  for (const auto& c : pool.active_clients)
    active.push_back({{"client_uuid", show(c.client_uuid)},
                      {"last_activity_at", now - c.seconds_idle},
                      {"allowed_sync_weight", c.allowed_sync_weight}});
  out["swarm_client_instruction"] = {{"active_clients", active}};
  json turns = json::array();
  for (const auto& e : pool.turn_reward_episodes)
    turns.push_back({{"episode_uuid", e.episode_uuid},
                     {"client_uuid", show(e.client_uuid)},
                     {"task_id", e.task_id},
                     {"turn_rewards", e.turn_rewards}});
  out["turn_reward_episodes"] = std::move(turns);
}

// Swarm experience sharing (SAPO): the connection, the counters and what each peer sent.
json exchange_json(const ExchangeStatus& x) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  json dropped = json::object();
  for (const auto& [reason, n] : x.dropped) dropped[reason] = n;
  json peers = json::array();
  for (const auto& [node, p] : x.peers)
    peers.push_back(
        {{"node_id", node},
         {"model", p.model},
         {"received", p.received},
         {"accepted", p.accepted},
         {"used", p.used},
         {"dropped", p.dropped},
         {"last_policy_step", p.last_policy_step},
         {"seconds_since_seen", p.last_seen > 0 ? json(std::max(0.0, now - p.last_seen)) : json(nullptr)}});
  return {{"url", x.url},
          {"swarm_name", x.swarm_name},
          {"node_id", x.node_id},
          {"stream", x.stream},
          {"connected", x.connected},
          {"ready", x.ready},
          {"last_error", x.last_error},
          {"published", x.published},
          {"publish_errors", x.publish_errors},
          {"publish_too_large", x.publish_too_large},
          {"publish_duplicates", x.publish_duplicates},
          {"publish_skipped_zero_advantage", x.publish_skipped_zero_advantage},
          {"outbox", x.outbox},
          {"outbox_dropped", x.outbox_dropped},
          {"received", x.received},
          {"accepted", x.accepted},
          {"buffered", x.buffered},
          {"used", x.used},
          {"reconnects", x.reconnects},
          {"dropped", dropped},
          {"peers", peers}};
}

}  // namespace

nlohmann::json pool_information_json(const EngineSnapshot& st, const PoolSnapshot& pool,
                                     const std::vector<TrainStepReport>& steps,
                                     const std::optional<Job>& config, const ClientIdView& show_client) {
  const ClientIdView show = show_client ? show_client : [](const std::string& c) { return c; };
  json running = json::array();
  for (const auto& e : pool.running_episodes)
    running.push_back({{"episode_uuid", e.episode_uuid},
                       {"client_uuid", show(e.client_uuid)},
                       {"episode_type", e.episode_type == EpisodeType::EVAL ? "eval" : "train"},
                       {"llm_calls", e.llm_calls},
                       {"in_flight_calls", e.in_flight_calls},
                       {"seconds_idle", e.seconds_idle},
                       {"discard_episode_timeout", e.discard_episode_timeout},
                       {"seconds_since_claim", e.seconds_since_claim},
                       {"optional_task_id", e.optional_task_id}});
  json tasks = json::array();
  for (const auto& t : pool.tasks)
    tasks.push_back({{"task_id", t.task_id},
                     {"episodes", t.episodes},
                     {"reward_mean", t.reward_mean},
                     {"reward_std", t.reward_std},
                     {"complete", t.complete},
                     {"dummy", t.dummy}});
  json history = json::array();
  const size_t first = steps.size() > 128 ? steps.size() - 128 : 0;
  for (size_t i = first; i < steps.size(); ++i) {
    const auto& s = steps[i];
    json m = json::object();
    for (const auto& [k, v] : s.metrics) m[k] = v;
    history.push_back({{"global_step", s.global_step},
                       {"run_id", st.run.run_id},
                       {"reward_mean", s.reward_mean},
                       {"reward_std", s.reward_std},
                       {"reward_min", s.reward_min},
                       {"reward_max", s.reward_max},
                       {"episodes", s.episodes},
                       {"tasks", s.tasks},
                       {"samples", s.samples},
                       {"tokens", s.tokens},
                       {"seconds", s.seconds},
                       {"metrics", m}});
    if (!s.log_metrics.empty()) history.back()["log_metrics"] = log_metrics_json(s.log_metrics);
  }
  const auto& c = st.counters;
  json eval = json::object();
  for (const auto& [k, v] : pool.eval_metrics) eval[k] = v;
  json out = {
      {"engine_status", engine_state_wire(st.state)},
      {"engine_status_detail", st.detail},
      {"seconds_in_state", st.seconds_in_state},
      {"global_step", st.global_step},
      {"policy_version", st.policy_version},
      // Synchronous or asynchronous training (max_staleness) and what the trainer is doing.
      {"training",
       {{"mode", st.max_staleness > 0 ? "asynchronous" : "synchronous"},
        {"max_staleness", st.max_staleness},
        {"trainer_step", st.trainer_step}}},
      {"sample_collection_method", collection_method_name(pool.config.method)},
      {"accepting_claims", pool.accepting_claims},
      {"batch_size", pool.config.batch_size},
      {"num_repeat", pool.config.num_repeat},
      {"targets",
       {{"episodes", pool.target_episodes},
        {"tasks", pool.target_tasks},
        {"non_dummy_tasks", pool.target_tasks}}},
      {"progress",
       {{"finished_episodes", pool.finished_episodes},
        {"complete_tasks", pool.complete_tasks},
        {"complete_non_dummy_tasks", pool.complete_non_dummy_tasks}}},
      {"slots",
       {{"max_parallel_episodes", pool.config.max_parallel_episodes},
        {"unclaimed", pool.unclaimed},
        {"running", pool.running}}},
      {"running_episodes", running},
      {"tasks", tasks},
      {"recent_rewards", pool.recent_rewards},
      {"step_history", history},
      {"eval_metrics", eval},
      {"counters", c.to_json()},
  };
  out["memory"] = rank_memory_json(st.memory);     // what each rank holds ([] without a loaded model)
  out["serving"] = rank_serving_json(st.serving);  // what each rank served ([] without a loaded model)
  // The run the step history and the counters belong to (they restart with a fresh run).
  out["counters"]["run_id"] = st.run.run_id;
  if (!st.run.run_id.empty()) {
    out["run"] = {{"run_id", st.run.run_id},
                  {"started", st.run.started_unix},
                  {"resumed_from", st.run.resumed_from.empty() ? json(nullptr) : json(st.run.resumed_from)}};
  }
  if (st.exchange) out["exchange"] = exchange_json(*st.exchange);
  if (st.store) {
    const EpisodeStoreStats& d = *st.store;
    out["episode_store"] = {{"file", st.store_file},
                            {"pending", d.pending},
                            {"recorded", d.recorded},
                            {"record_failures", d.record_failures},
                            {"commits", d.commits},
                            {"bytes", d.bytes},
                            {"marked_trained", d.marked_trained},
                            {"forgotten", d.forgotten},
                            {"pruned", d.pruned},
                            {"retried", d.retried},
                            {"given_up", d.given_up},
                            {"last_commit_ms", d.last_commit_ms}};
  }
  add_agentjet_fields(out, st, pool, config, show);
  return out;
}

}  // namespace swarm
