#include "api/metrics.hpp"

#include <fmt/format.h>

namespace swarm {

void Metrics::observe_request(const std::string& route, int status, double seconds) {
  std::lock_guard lk(mu_);
  ++requests_[{route, status}];
  Histogram& h = latency_[route];
  ++h.count;
  h.sum += seconds;
  for (size_t i = 0; i < kBuckets.size(); ++i)
    if (seconds <= kBuckets[i]) ++h.buckets[i];
}

void Metrics::observe_tokens(int64_t prompt_tokens, int64_t completion_tokens) {
  prompt_tokens_ += prompt_tokens;
  completion_tokens_ += completion_tokens;
}

std::string Metrics::render(const EngineSnapshot& st, const PoolSnapshot& pool,
                            const std::vector<TrainStepReport>& steps,
                            const std::map<std::string, double>& inference) const {
  std::string out;
  auto header = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };

  header("swarm_engine_state", "gauge", "1 for the engine's current state.");
  for (auto s : {EngineState::OFFLINE, EngineState::BOOTING, EngineState::ROLLING, EngineState::ROLLING_POST,
                 EngineState::WEIGHT_SYNCING})
    out +=
        fmt::format("swarm_engine_state{{state=\"{}\"}} {}\n", engine_state_wire(s), st.state == s ? 1 : 0);
  header("swarm_engine_seconds_in_state", "gauge", "Seconds since the engine entered its current state.");
  out += fmt::format("swarm_engine_seconds_in_state {:.3f}\n", st.seconds_in_state);
  header("swarm_engine_transitions_total", "counter", "State transitions by from->to.");
  for (const auto& [k, v] : st.transitions) {
    auto arrow = k.find("->");
    out += fmt::format("swarm_engine_transitions_total{{from=\"{}\",to=\"{}\"}} {}\n", k.substr(0, arrow),
                       k.substr(arrow + 2), v);
  }
  header("swarm_global_step", "gauge", "Policy steps completed.");
  out += fmt::format("swarm_global_step {}\n", st.global_step);
  header("swarm_policy_version", "gauge", "Version of the weights serving generation.");
  out += fmt::format("swarm_policy_version {}\n", st.policy_version);
  header("swarm_max_staleness", "gauge", "The run's max_staleness (0 = synchronous training).");
  out += fmt::format("swarm_max_staleness {}\n", st.max_staleness);
  header("swarm_trainer_step", "gauge", "The policy step the trainer is computing; 0 when idle.");
  out += fmt::format("swarm_trainer_step {}\n", st.trainer_step);

  if (st.store) {
    const EpisodeStoreStats& d = *st.store;
    header("swarm_episode_store_total", "counter",
           "The episode store (durable_episodes): episodes recorded, commits, failed records, records "
           "forgotten/trained/pruned.");
    for (auto [event, v] :
         std::initializer_list<std::pair<const char*, int64_t>>{{"recorded", d.recorded},
                                                                {"commits", d.commits},
                                                                {"record_failures", d.record_failures},
                                                                {"forgotten", d.forgotten},
                                                                {"marked_trained", d.marked_trained},
                                                                {"pruned", d.pruned},
                                                                {"retried", d.retried},
                                                                {"given_up", d.given_up},
                                                                {"bytes", d.bytes}})
      out += fmt::format("swarm_episode_store_total{{event=\"{}\"}} {}\n", event, v);
    header("swarm_episode_store_pending", "gauge",
           "Stored episodes not yet trained (a restart reloads them).");
    out += fmt::format("swarm_episode_store_pending {}\n", d.pending);
    header("swarm_episode_store_last_commit_seconds", "gauge", "Duration of the store's last commit.");
    out += fmt::format("swarm_episode_store_last_commit_seconds {:.6f}\n", d.last_commit_ms / 1000.0);
  }
  if (st.exchange) {
    const ExchangeStatus& x = *st.exchange;
    header("swarm_exchange_connected", "gauge", "1 while the swarm's NATS broker is connected (SAPO).");
    out += fmt::format("swarm_exchange_connected {}\n", x.connected ? 1 : 0);
    header("swarm_exchange_groups_total", "counter", "Task groups shared through the swarm, by event.");
    for (auto [event, v] : std::initializer_list<std::pair<const char*, int64_t>>{
             {"published", x.published},
             {"received", x.received},
             {"accepted", x.accepted},
             {"used", x.used},
             {"outbox_dropped", x.outbox_dropped},
             {"publish_errors", x.publish_errors},
             {"publish_duplicates", x.publish_duplicates},
             {"publish_skipped_zero_advantage", x.publish_skipped_zero_advantage},
             {"publish_too_large", x.publish_too_large}})
      out += fmt::format("swarm_exchange_groups_total{{event=\"{}\"}} {}\n", event, v);
    header("swarm_exchange_reconnects_total", "counter", "Reconnections to the broker after a loss.");
    out += fmt::format("swarm_exchange_reconnects_total {}\n", x.reconnects);
    header("swarm_exchange_buffered_groups", "gauge", "External groups waiting in the local buffer.");
    out += fmt::format("swarm_exchange_buffered_groups {}\n", x.buffered);
    header("swarm_exchange_outbox_groups", "gauge", "Own groups waiting for the broker.");
    out += fmt::format("swarm_exchange_outbox_groups {}\n", x.outbox);
    header("swarm_exchange_dropped_total", "counter", "Received messages not kept, by reason.");
    for (const auto& [reason, n] : x.dropped)
      out += fmt::format("swarm_exchange_dropped_total{{reason=\"{}\"}} {}\n", reason, n);
    header("swarm_exchange_peer_groups_total", "counter", "Groups from each peer node, by event.");
    for (const auto& [node, p] : x.peers)
      for (auto [event, v] : std::initializer_list<std::pair<const char*, int64_t>>{
               {"received", p.received}, {"accepted", p.accepted}, {"used", p.used}, {"dropped", p.dropped}})
        out +=
            fmt::format("swarm_exchange_peer_groups_total{{peer=\"{}\",event=\"{}\"}} {}\n", node, event, v);
  }

  const auto& c = st.counters;
  header("swarm_episodes_total", "counter", "Episode events since the server started.");
  for (auto [event, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"claimed", c.claimed},
           {"ended", c.ended},
           {"ended_eval", c.ended_eval},
           {"ended_without_reward", c.ended_without_reward},
           {"ended_with_turn_rewards", c.ended_with_turn_rewards},
           {"split_by_drift", c.episodes_split_by_drift},
           {"aborted", c.aborted},
           {"timed_out", c.timed_out},
           {"cancelled", c.cancelled},
           {"stale_dropped", c.stale_dropped_episodes},
           {"restored", c.restored},
           {"store_failed", c.store_failures},
           {"end_replayed", c.end_replayed},
           {"end_failed", c.end_failed}})
    out += fmt::format("swarm_episodes_total{{event=\"{}\"}} {}\n", event, v);
  header("swarm_llm_calls_total", "counter", "LLM calls recorded into episodes.");
  out += fmt::format("swarm_llm_calls_total {}\n", c.llm_calls);
  header("swarm_late_llm_calls_total", "counter", "LLM calls that finished after their episode was gone.");
  out += fmt::format("swarm_late_llm_calls_total {}\n", c.late_calls_dropped);
  header("swarm_safety_valve_dropped_total", "counter",
         "Incomplete task groups dropped by the safety valve.");
  out += fmt::format("swarm_safety_valve_dropped_total{{unit=\"groups\"}} {}\n", c.valve_dropped_groups);
  out += fmt::format("swarm_safety_valve_dropped_total{{unit=\"episodes\"}} {}\n", c.valve_dropped_episodes);
  header("swarm_tokens_total", "counter", "Tokens processed by the OpenAI endpoint.");
  out += fmt::format("swarm_tokens_total{{kind=\"prompt\"}} {}\n", prompt_tokens_.load());
  out += fmt::format("swarm_tokens_total{{kind=\"completion\"}} {}\n", completion_tokens_.load());
  header("swarm_tool_call_parse_failures_total", "counter",
         "Generated tool-call blocks that did not parse (left in the message content).");
  out += fmt::format("swarm_tool_call_parse_failures_total {}\n", tool_call_parse_failures_.load());

  header("swarm_pool_episodes", "gauge", "Episodes in the rollout pool by status.");
  out += fmt::format("swarm_pool_episodes{{status=\"unclaimed\"}} {}\n", pool.unclaimed);
  out += fmt::format("swarm_pool_episodes{{status=\"running\"}} {}\n", pool.running);
  out += fmt::format("swarm_pool_episodes{{status=\"finished_cached\"}} {}\n", pool.finished_episodes);
  header("swarm_pool_complete_tasks", "gauge", "Task groups with a full set of episodes.");
  out += fmt::format("swarm_pool_complete_tasks{{kind=\"all\"}} {}\n", pool.complete_tasks);
  out += fmt::format("swarm_pool_complete_tasks{{kind=\"non_dummy\"}} {}\n", pool.complete_non_dummy_tasks);

  if (!steps.empty()) {
    const auto& last = steps.back();
    header("swarm_train_last_step", "gauge", "Figures of the last policy step.");
    for (auto [name, v] : std::initializer_list<std::pair<const char*, double>>{
             {"reward_mean", last.reward_mean},
             {"reward_std", last.reward_std},
             {"reward_min", last.reward_min},
             {"reward_max", last.reward_max},
             {"episodes", static_cast<double>(last.episodes)},
             {"samples", static_cast<double>(last.samples)},
             {"tokens", static_cast<double>(last.tokens)},
             {"seconds", last.seconds}})
      out += fmt::format("swarm_train_last_step{{field=\"{}\"}} {}\n", name, v);
    for (const auto& [k, v] : last.metrics)
      out += fmt::format("swarm_train_last_step{{field=\"{}\"}} {}\n", k, v);
  }

  if (!st.serving.empty()) {
    // Every rank serves; rank 0 routes each generation to one (engine/rank_router.hpp).
    header("swarm_rank_requests_total", "counter", "Generation requests routed to each rank.");
    for (const RankServing& r : st.serving)
      out += fmt::format("swarm_rank_requests_total{{rank=\"{}\"}} {}\n", r.rank, r.requests);
    header("swarm_rank_generated_tokens_total", "counter", "Tokens each rank generated (finished requests).");
    for (const RankServing& r : st.serving)
      out += fmt::format("swarm_rank_generated_tokens_total{{rank=\"{}\"}} {}\n", r.rank, r.generated_tokens);
    header("swarm_rank_in_flight", "gauge", "Generation requests each rank serves now.");
    for (const RankServing& r : st.serving)
      out += fmt::format("swarm_rank_in_flight{{rank=\"{}\"}} {}\n", r.rank, r.in_flight);
    header("swarm_rank_up", "gauge", "1 while the rank serves, 0 once its serving link broke.");
    for (const RankServing& r : st.serving)
      out += fmt::format("swarm_rank_up{{rank=\"{}\"}} {}\n", r.rank, r.up ? 1 : 0);
  }

  if (!inference.empty()) {
    header("swarm_inference", "gauge",
           "The inference engine: sequences running/waiting, KV blocks, steps and tokens (cumulative ones "
           "end in _total).");
    for (const auto& [k, v] : inference) out += fmt::format("swarm_inference{{field=\"{}\"}} {}\n", k, v);
    // The prefix cache and the KV pool also under names of their own (docs/concepts.md
    // "Prefix caching"), from the torch engine and the mock alike.
    const struct {
      const char* field;
      const char* name;
      const char* type;
      const char* help;
    } named[] = {
        {"prefix_cache_queries_tokens_total", "swarm_prefix_cache_queries_tokens_total", "counter",
         "Prompt tokens looked up in the prefix cache (each sequence once, at admission)."},
        {"prefix_cache_hit_tokens_total", "swarm_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens found in the prefix cache (their KV reused, not prefilled)."},
        {"kv_blocks_free", "swarm_kv_blocks_free", "gauge",
         "KV cache blocks a new sequence can take: free, or cached and held by no sequence."},
    };
    for (const auto& n : named) {
      auto it = inference.find(n.field);
      if (it == inference.end()) continue;
      header(n.name, n.type, n.help);
      out += fmt::format("{} {}\n", n.name, it->second);
    }
  }

  std::lock_guard lk(mu_);
  header("swarm_http_requests_total", "counter", "HTTP requests by route and status.");
  for (const auto& [key, v] : requests_)
    out +=
        fmt::format("swarm_http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, v);
  header("swarm_http_request_duration_seconds", "histogram",
         "Time from request parsed to response handed off.");
  for (const auto& [route, h] : latency_) {
    for (size_t i = 0; i < kBuckets.size(); ++i)
      out += fmt::format("swarm_http_request_duration_seconds_bucket{{route=\"{}\",le=\"{}\"}} {}\n", route,
                         kBuckets[i], h.buckets[i]);
    out += fmt::format("swarm_http_request_duration_seconds_bucket{{route=\"{}\",le=\"+Inf\"}} {}\n", route,
                       h.count);
    out += fmt::format("swarm_http_request_duration_seconds_sum{{route=\"{}\"}} {:.6f}\n", route, h.sum);
    out += fmt::format("swarm_http_request_duration_seconds_count{{route=\"{}\"}} {}\n", route, h.count);
  }
  return out;
}

}  // namespace swarm
