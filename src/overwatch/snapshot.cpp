#include "overwatch/snapshot.hpp"

#include <charconv>
#include <cmath>
#include <limits>

#include "common/json_nesting.hpp"

namespace swarm::overwatch {
namespace {

using json = nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const json* member(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

std::string get_string(const json& j, const char* key) {
  const json* v = member(j, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

int64_t get_int(const json& j, const char* key) {
  const json* v = member(j, key);
  if (!v || !v->is_number()) return 0;
  if (v->is_number_float()) return static_cast<int64_t>(v->get<double>());
  return v->get<int64_t>();
}

// null (how nlohmann writes NaN) and absent fields read as `missing`.
double get_double(const json& j, const char* key, double missing = 0.0) {
  const json* v = member(j, key);
  return v && v->is_number() ? v->get<double>() : missing;
}

bool get_bool(const json& j, const char* key) {
  const json* v = member(j, key);
  return v && v->is_boolean() && v->get<bool>();
}

const json& get_array(const json& j, const char* key) {
  static const json kEmpty = json::array();
  const json* v = member(j, key);
  return v && v->is_array() ? *v : kEmpty;
}

const json& get_object(const json& j, const char* key) {
  static const json kEmpty = json::object();
  const json* v = member(j, key);
  return v && v->is_object() ? *v : kEmpty;
}

json parse_object(std::string_view body, const char* what) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ParseError(std::string(what) + ": the response is not JSON");
  if (!j.is_object()) throw ParseError(std::string(what) + ": the response is not a JSON object");
  return j;
}

}  // namespace

int64_t PoolInfo::counter(std::string_view name) const {
  for (const auto& [k, v] : counters)
    if (k == name) return v;
  return 0;
}

PoolInfo pool_information_from_json(const json& j) {
  if (!j.is_object()) throw ParseError("pool information: the response is not a JSON object");
  PoolInfo p;
  p.engine_status = get_string(j, "engine_status");
  p.engine_status_detail = get_string(j, "engine_status_detail");
  if (j.contains("run") && j["run"].is_object()) p.run_id = get_string(j["run"], "run_id");
  p.seconds_in_state = get_double(j, "seconds_in_state");
  p.global_step = get_int(j, "global_step");
  p.policy_version = get_int(j, "policy_version");
  if (j.contains("training")) {
    const json& training = get_object(j, "training");
    p.has_training = true;
    p.max_staleness = get_int(training, "max_staleness");
    p.trainer_step = get_int(training, "trainer_step");
  }
  if (j.contains("exchange") && j["exchange"].is_object()) {
    const json& x = j["exchange"];
    ExchangeInfo& e = p.exchange;
    e.present = true;
    e.url = get_string(x, "url");
    e.swarm_name = get_string(x, "swarm_name");
    e.node_id = get_string(x, "node_id");
    e.last_error = get_string(x, "last_error");
    e.connected = get_bool(x, "connected");
    e.ready = get_bool(x, "ready");
    e.published = get_int(x, "published");
    e.received = get_int(x, "received");
    e.accepted = get_int(x, "accepted");
    e.buffered = get_int(x, "buffered");
    e.used = get_int(x, "used");
    e.outbox = get_int(x, "outbox");
    for (const auto& [reason, n] : get_object(x, "dropped").items())
      if (reason != "own" && n.is_number_integer()) e.dropped += n.get<int64_t>();
    for (const json& peer : get_array(x, "peers")) {
      ExchangePeerInfo q;
      q.node_id = get_string(peer, "node_id");
      q.model = get_string(peer, "model");
      q.received = get_int(peer, "received");
      q.accepted = get_int(peer, "accepted");
      q.used = get_int(peer, "used");
      q.dropped = get_int(peer, "dropped");
      q.last_policy_step = get_int(peer, "last_policy_step");
      q.seconds_since_seen = peer.contains("seconds_since_seen") && peer["seconds_since_seen"].is_number()
                                 ? peer["seconds_since_seen"].get<double>()
                                 : -1.0;
      e.peers.push_back(std::move(q));
    }
  }
  for (const json& r : get_array(j, "serving")) {
    RankServingInfo q;
    q.rank = get_int(r, "rank");
    q.up = !r.contains("up") || get_bool(r, "up");
    q.requests = get_int(r, "requests");
    q.generated_tokens = get_int(r, "generated_tokens");
    q.in_flight = get_int(r, "in_flight");
    p.serving.push_back(q);
  }
  p.sample_collection_method = get_string(j, "sample_collection_method");
  p.accepting_claims = get_bool(j, "accepting_claims");
  p.batch_size = get_int(j, "batch_size");
  p.num_repeat = get_int(j, "num_repeat");
  const json& targets = get_object(j, "targets");
  p.target_episodes = get_int(targets, "episodes");
  p.target_tasks = get_int(targets, "tasks");
  p.target_non_dummy_tasks = get_int(targets, "non_dummy_tasks");
  const json& progress = get_object(j, "progress");
  p.finished_episodes = get_int(progress, "finished_episodes");
  p.complete_tasks = get_int(progress, "complete_tasks");
  p.complete_non_dummy_tasks = get_int(progress, "complete_non_dummy_tasks");
  const json& slots = get_object(j, "slots");
  p.max_parallel_episodes = get_int(slots, "max_parallel_episodes");
  p.unclaimed = get_int(slots, "unclaimed");
  p.running = get_int(slots, "running");

  for (const json& e : get_array(j, "running_episodes")) {
    RunningEpisode r;
    r.episode_uuid = get_string(e, "episode_uuid");
    r.client_uuid = get_string(e, "client_uuid");
    const std::string type = get_string(e, "episode_type");
    if (!type.empty()) r.episode_type = type;
    r.llm_calls = get_int(e, "llm_calls");
    r.in_flight_calls = get_int(e, "in_flight_calls");
    r.seconds_idle = get_double(e, "seconds_idle");
    r.discard_episode_timeout = get_double(e, "discard_episode_timeout");
    r.seconds_since_claim = get_double(e, "seconds_since_claim");
    p.running_episodes.push_back(std::move(r));
  }
  for (const json& t : get_array(j, "tasks")) {
    TaskStat s;
    s.task_id = get_string(t, "task_id");
    s.episodes = get_int(t, "episodes");
    s.reward_mean = get_double(t, "reward_mean", kNaN);
    s.reward_std = get_double(t, "reward_std", kNaN);
    s.complete = get_bool(t, "complete");
    s.dummy = get_bool(t, "dummy");
    p.tasks.push_back(std::move(s));
  }
  for (const json& r : get_array(j, "recent_rewards"))
    p.recent_rewards.push_back(r.is_number() ? r.get<double>() : kNaN);
  for (const json& s : get_array(j, "step_history")) {
    StepPoint pt;
    pt.global_step = get_int(s, "global_step");
    pt.reward_mean = get_double(s, "reward_mean", kNaN);
    pt.reward_std = get_double(s, "reward_std", kNaN);
    pt.episodes = get_int(s, "episodes");
    pt.tasks = get_int(s, "tasks");
    pt.seconds = get_double(s, "seconds");
    if (s.contains("metrics") && s["metrics"].is_object()) {
      const json& m = s["metrics"];
      pt.staleness_mean = get_double(m, "staleness_mean");
      pt.staleness_max = get_double(m, "staleness_max");
      pt.stale_dropped = static_cast<int64_t>(get_double(m, "stale_dropped_episodes"));
      pt.local_reward_mean = get_double(m, "local_reward_mean", kNaN);
      pt.trained_nothing = get_double(m, "trained_nothing") > 0;
    }
    p.step_history.push_back(pt);
  }
  for (const auto& [k, v] : get_object(j, "eval_metrics").items())
    if (v.is_number()) p.eval_metrics.emplace_back(k, v.get<double>());
  // nlohmann's default json keeps object keys sorted, which is also a stable display order.
  for (const auto& [k, v] : get_object(j, "counters").items())
    if (v.is_number())
      p.counters.emplace_back(k,
                              v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>());
  return p;
}

PoolInfo parse_pool_information(std::string_view body) {
  return pool_information_from_json(parse_object(body, "pool information"));
}

EngineInfo parse_engine_status(std::string_view body) {
  const json j = parse_object(body, "engine status");
  EngineInfo e;
  e.engine = get_string(j, "engine");
  e.model = get_string(j, "model");
  e.config_synced = get_bool(j, "config_synced");
  return e;
}

std::vector<PromSample> parse_prometheus(std::string_view text) {
  std::vector<PromSample> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;

    PromSample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = std::string(line.substr(0, i));
    if (s.name.empty()) continue;
    bool ok = true;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (ok && i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
          ok = false;
          break;
        }
        std::string key(line.substr(i, eq - i));
        std::string value;
        size_t k = eq + 2;
        for (; k < line.size() && line[k] != '"'; ++k) {
          if (line[k] == '\\' && k + 1 < line.size()) {
            ++k;
            value += line[k] == 'n' ? '\n' : line[k];
          } else {
            value += line[k];
          }
        }
        if (k >= line.size()) {
          ok = false;
          break;
        }
        s.labels.emplace(std::move(key), std::move(value));
        i = k + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (!ok || i >= line.size()) continue;
      ++i;  // '}'
    }
    while (i < line.size() && line[i] == ' ') ++i;
    std::string_view num = line.substr(i);
    const size_t sp = num.find(' ');  // an optional timestamp follows
    if (sp != std::string_view::npos) num = num.substr(0, sp);
    if (num.empty()) continue;
    if (num == "+Inf") {
      s.value = std::numeric_limits<double>::infinity();
    } else if (num == "-Inf") {
      s.value = -std::numeric_limits<double>::infinity();
    } else if (num == "NaN") {
      s.value = kNaN;
    } else {
      auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), s.value);
      if (ec != std::errc() || end != num.data() + num.size()) continue;
    }
    out.push_back(std::move(s));
  }
  return out;
}

RequestStats request_stats_from_metrics(std::string_view text) {
  RequestStats r;
  for (const auto& s : parse_prometheus(text)) {
    if (!std::isfinite(s.value)) continue;
    const auto n = static_cast<int64_t>(std::llround(s.value));
    if (s.name == "swarm_http_requests_total") {
      r.total += n;
      auto st = s.labels.find("status");
      const int status = st == s.labels.end() ? 0 : std::atoi(st->second.c_str());
      if (status >= 500) {
        r.server_errors += n;
      } else if (status >= 400) {
        r.client_errors += n;
      }
      auto route = s.labels.find("route");
      if (route != s.labels.end() && route->second.rfind("/v1/", 0) == 0) r.openai += n;
    } else if (s.name == "swarm_tokens_total") {
      auto kind = s.labels.find("kind");
      if (kind == s.labels.end()) continue;
      if (kind->second == "prompt") r.prompt_tokens += n;
      if (kind->second == "completion") r.completion_tokens += n;
    } else if (s.name == "swarm_prefix_cache_queries_tokens_total") {
      r.prefix_queries_tokens = n;
    } else if (s.name == "swarm_prefix_cache_hit_tokens_total") {
      r.prefix_hit_tokens = n;
    } else if (s.name == "swarm_kv_blocks_free") {
      r.kv_blocks_free = n;
    }
  }
  return r;
}

}  // namespace swarm::overwatch
