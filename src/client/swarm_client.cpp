#include "swarm/client.hpp"
#include "common/env.hpp"

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "http/http_client.hpp"
#include "client/wire.hpp"
#include "common/json_nesting.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kOffline = "ENGINE.OFFLINE";
constexpr const char* kBooting = "ENGINE.BOOTING";
constexpr const char* kRolling = "ENGINE.ROLLING";
constexpr const char* kRollingPost = "ENGINE.ROLLING_POST";
constexpr const char* kWeightSyncing = "ENGINE.WEIGHT_SYNCING";

std::mt19937_64& thread_rng() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

std::string random_uuid_v4() {
  uint64_t a = thread_rng()();
  uint64_t b = thread_rng()();
  a = (a & ~0xF000ULL) | 0x4000ULL;                         // version 4
  b = (b & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;  // RFC 4122 variant
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(a >> 32), static_cast<unsigned long long>((a >> 16) & 0xFFFF),
                static_cast<unsigned long long>(a & 0xFFFF), static_cast<unsigned long long>(b >> 48),
                static_cast<unsigned long long>(b & 0xFFFFFFFFFFFFULL));
  return buf;
}

spdlog::level::level_enum to_spdlog(ClientLogLevel level) {
  switch (level) {
    case ClientLogLevel::OFF:
      return spdlog::level::off;
    case ClientLogLevel::ERROR:
      return spdlog::level::err;
    case ClientLogLevel::WARN:
      return spdlog::level::warn;
    case ClientLogLevel::INFO:
      return spdlog::level::info;
    case ClientLogLevel::DEBUG:
      return spdlog::level::debug;
  }
  return spdlog::level::warn;
}

// Non-throwing field access: the server's JSON is input, not trusted to be well-typed.
std::string str_field(const json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

std::optional<bool> bool_field(const json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

double num_field(const json& j, const char* key, double dflt = 0.0) {
  if (!j.is_object()) return dflt;
  auto it = j.find(key);
  return (it != j.end() && it->is_number()) ? it->get<double>() : dflt;
}

int64_t int_field(const json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  return it->is_number_integer() ? it->get<int64_t>() : static_cast<int64_t>(it->get<double>());
}

// Command routes may answer 2xx with {"success": false, ...}: treat that as an error too.
void require_success(const json& j, const std::string& what) {
  if (bool_field(j, "success").value_or(true)) return;
  std::string cause = str_field(j, "fail_cause");
  if (cause.empty() && j.contains("error") && j["error"].is_object())
    cause = str_field(j["error"], "message");
  if (cause.empty()) cause = "request failed";
  throw ServerError(200, "request_failed", what + ": " + cause);
}

json parse_json_text(const std::string& text, const std::string& field, bool want_object) {
  if (!json_nesting_within(text))
    throw ConfigError(field + " is nested deeper than " + std::to_string(kMaxJsonNesting) + " levels");
  json j;
  try {
    j = json::parse(text.empty() ? (want_object ? "{}" : "[]") : text);
  } catch (const std::exception& e) {
    throw ConfigError(field + " is not valid JSON: " + e.what());
  }
  if (want_object && !j.is_object()) throw ConfigError(field + " must be a JSON object");
  if (!want_object && !j.is_array()) throw ConfigError(field + " must be a JSON array");
  return j;
}

json task_to_json(const Task& task) {
  return json{{"task_id", task.task_id},
              {"main_query", task.main_query},
              {"init_messages", parse_json_text(task.init_messages_json, "task.init_messages_json", false)},
              {"env_type", task.env_type},
              {"metadata", parse_json_text(task.metadata_json, "task.metadata_json", true)}};
}

json output_to_json(const WorkflowOutput& out) {
  // JSON has no NaN or infinity (they would be sent as null: an episode without reward).
  if (out.reward && !std::isfinite(*out.reward))
    throw ConfigError("workflow_output.reward must be a finite number, got " + std::to_string(*out.reward));
  json metrics = json::object();
  for (const auto& [name, value] : out.log_metrics) metrics[name] = value;
  json j{{"reward", out.reward ? json(*out.reward) : json(nullptr)},
         {"is_success", out.is_success ? json(*out.is_success) : json(nullptr)},
         {"metadata", parse_json_text(out.metadata_json, "workflow_output.metadata_json", true)},
         {"log_metrics", std::move(metrics)}};
  const auto finite = [](const std::vector<double>& v, const char* what) {
    for (double x : v)
      if (!std::isfinite(x))
        throw ConfigError(std::string("workflow_output.") + what + " must hold finite numbers");
  };
  if (!out.turn_rewards.empty()) {
    finite(out.turn_rewards, "turn_rewards");
    j["turn_rewards"] = out.turn_rewards;
  }
  if (!out.token_rewards.empty()) {
    for (const auto& call : out.token_rewards) finite(call, "token_rewards");
    j["token_rewards"] = out.token_rewards;
  }
  return j;
}

/// Jittered exponential backoff: each wait is 50-100% of the current step.
class Backoff {
 public:
  explicit Backoff(const SwarmClientOptions& o)
      : initial_(std::max<int64_t>(1, o.backoff_initial.count())),
        max_(std::max<int64_t>(initial_, o.backoff_max.count())),
        mult_(std::max(1.0, o.backoff_multiplier)),
        step_(initial_) {}

  milliseconds next() {
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    const double wait = step_ * jitter(thread_rng());
    step_ = std::min(max_, step_ * mult_);
    return milliseconds(std::max<int64_t>(1, static_cast<int64_t>(wait)));
  }
  void reset() { step_ = initial_; }

 private:
  double initial_, max_, mult_, step_;
};

// now + d, saturating instead of overflowing for absurdly long durations.
Clock::time_point after(milliseconds d) {
  constexpr auto kFar = std::chrono::hours(24 * 365 * 10);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::min<milliseconds>(d, kFar));
}

bool is_running_state(const std::string& s) {
  return s == kRolling || s == kRollingPost || s == kWeightSyncing;
}

}  // namespace

struct SwarmClient::Impl {
  std::string url;
  SwarmClientOptions opts;
  std::shared_ptr<spdlog::logger> log;

  // Connection pool: a bounded free list of keep-alive connections.
  std::mutex pool_mu;
  std::condition_variable pool_cv;
  std::vector<std::unique_ptr<HttpClient>> free_conns;
  size_t open_conns = 0;

  // Episodes claimed by this client, for the client-side lifetime rule.
  struct EpisodeRecord {
    Clock::time_point claimed;
    double discard_timeout;
  };
  std::mutex episodes_mu;
  std::unordered_map<std::string, EpisodeRecord> episodes;

  Clock::time_point now() const { return opts.now ? opts.now() : Clock::now(); }

  // Borrows a connection for one request; returns it to the pool when done.
  class Lease {
   public:
    explicit Lease(Impl& impl) : impl_(impl), conn_(impl.acquire()) {}
    ~Lease() { impl_.release(std::move(conn_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    HttpClient& operator*() { return *conn_; }
    HttpClient* operator->() { return conn_.get(); }

   private:
    Impl& impl_;
    std::unique_ptr<HttpClient> conn_;
  };

  std::unique_ptr<HttpClient> acquire() {
    {
      std::unique_lock lock(pool_mu);
      pool_cv.wait(lock, [&] { return !free_conns.empty() || open_conns < opts.max_connections; });
      if (!free_conns.empty()) {
        auto conn = std::move(free_conns.back());
        free_conns.pop_back();
        return conn;
      }
      ++open_conns;
    }
    try {
      return std::make_unique<HttpClient>(wire::make_http_client(url, opts.request_timeout, opts.ca_file));
    } catch (...) {
      std::lock_guard lock(pool_mu);
      --open_conns;
      pool_cv.notify_one();
      throw;
    }
  }

  void release(std::unique_ptr<HttpClient> conn) {
    if (!conn) return;
    std::lock_guard lock(pool_mu);
    free_conns.push_back(std::move(conn));
    pool_cv.notify_one();
  }

  // The token a route needs (the server's Access table): control routes the admin token, the
  // episode routes the client token (or the admin token when there is no client token).
  wire::Headers auth_headers(const std::string& path) const {
    static const char* kAdmin[] = {"/sync_train_config", "/start_engine",       "/stop_engine",
                                   "/sync_train_code",   "/get_episode_buffer", "/replay_latest_llm_call",
                                   "/get_verbose_logs"};
    static const char* kClient[] = {"/claim_episode", "/end_episode", "/abort_episode",
                                    "/can_continue_episode", "/agree_sync_weight"};
    const auto in = [&](const auto& list) {
      return std::any_of(std::begin(list), std::end(list), [&](const char* p) { return path == p; });
    };
    const std::string& token = in(kAdmin) ? opts.admin_token
                               : in(kClient)
                                   ? (opts.client_token.empty() ? opts.admin_token : opts.client_token)
                                   : std::string();
    if (token.empty()) return {};
    return {{"Authorization", "Bearer " + token}};
  }

  // The routes the server answers the same when a request is repeated: a retried end gets the
  // recorded outcome (docs/reliability.md), an abort of an ended episode is "nothing to abort",
  // the others only read or set a flag. A POST whose answer was lost on the way (the connection
  // closed with no answer) is sent again for these, up to kRepeats times; for the others
  // (claim_episode, control routes) the error goes to the caller, who knows whether to retry.
  static constexpr int kRepeats = 3;
  static bool answered_idempotently(const std::string& path) {
    return path == "/end_episode" || path == "/abort_episode" || path == "/can_continue_episode" ||
           path == "/agree_sync_weight";
  }

  json call(const std::string& method, const std::string& path, const json* body,
            std::optional<milliseconds> timeout = std::nullopt) {
    const int attempts = method == "POST" && answered_idempotently(path) ? 1 + kRepeats : 1;
    for (int attempt = 1;; ++attempt) {
      Lease conn(*this);
      conn->set_timeout(timeout ? *timeout : opts.request_timeout);
      try {
        return wire::call_json(*conn, method, path, body, auth_headers(path));
      } catch (const TransportError& e) {
        conn->close();  // start the next request on a fresh connection
        if (attempt >= attempts) throw;
        log->warn("{}: {} (attempt {} of {}); sending it again", path, e.what(), attempt, attempts);
        std::this_thread::sleep_for(milliseconds(100 * attempt));
      }
    }
  }

  json post(const std::string& path, const json& body, std::optional<milliseconds> timeout = std::nullopt) {
    return call("POST", path, &body, timeout);
  }

  json get(const std::string& path) { return call("GET", path, nullptr); }

  void forget(const std::string& episode_uuid) {
    std::lock_guard lock(episodes_mu);
    episodes.erase(episode_uuid);
  }

  // True if the episode is known and older than its 2 × discard_timeout lifetime.
  bool expired(const std::string& episode_uuid, bool erase) {
    std::lock_guard lock(episodes_mu);
    auto it = episodes.find(episode_uuid);
    if (it == episodes.end()) return false;
    const double age = std::chrono::duration<double>(now() - it->second.claimed).count();
    const bool too_old = age > 2.0 * it->second.discard_timeout;
    if (erase) episodes.erase(it);
    return too_old;
  }

  void send_abort(const std::string& episode_uuid) {
    forget(episode_uuid);
    const json body{{"client_uuid", opts.client_uuid}, {"episode_uuid", episode_uuid}};
    require_success(post("/abort_episode", body), "abort_episode");
  }

  // Best effort: used on failure paths where the original error matters more.
  void abort_quietly(const std::string& episode_uuid) noexcept {
    try {
      send_abort(episode_uuid);
    } catch (const std::exception& e) {
      log->warn("abort_episode({}) failed: {}", episode_uuid, e.what());
    } catch (...) {
      log->warn("abort_episode({}) failed", episode_uuid);
    }
  }
};

SwarmClient::SwarmClient(std::string server_url, SwarmClientOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->url = wire::trim_url(std::move(server_url));
  if (opts.client_uuid.empty()) opts.client_uuid = random_uuid_v4();
  if (opts.max_connections == 0) opts.max_connections = 1;
  if (opts.admin_token.empty())
    if (auto v = env_value("SWARM_ADMIN_TOKEN")) opts.admin_token = *v;
  if (opts.client_token.empty())
    if (auto v = env_value("SWARM_CLIENT_TOKEN")) opts.client_token = *v;
  if (opts.request_timeout.count() <= 0) throw ConfigError("SwarmClientOptions.request_timeout must be > 0");
  impl_->opts = std::move(opts);
  static auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  impl_->log = std::make_shared<spdlog::logger>("swarm_client", sink);
  impl_->log->set_level(to_spdlog(impl_->opts.log_level));
  // Validate the URL now (no connection is made) and keep the connection for later.
  impl_->release(std::make_unique<HttpClient>(
      wire::make_http_client(impl_->url, impl_->opts.request_timeout, impl_->opts.ca_file)));
  impl_->open_conns = 1;
}

SwarmClient::~SwarmClient() = default;

const std::string& SwarmClient::client_uuid() const { return impl_->opts.client_uuid; }
const std::string& SwarmClient::server_url() const { return impl_->url; }

// ---------------------------------------------------------------------- episodes

OpenAIEndpoint SwarmClient::begin_episode(double discard_episode_timeout, const std::string& episode_type,
                                          std::optional<milliseconds> deadline) {
  if (!(discard_episode_timeout > 0)) throw ConfigError("begin_episode: discard_episode_timeout must be > 0");
  const json body{{"client_uuid", impl_->opts.client_uuid},
                  {"episode_type", episode_type},
                  {"discard_episode_timeout", discard_episode_timeout},
                  {"throttle_policy", nullptr}};
  const bool has_deadline = deadline.has_value();
  const auto until = has_deadline ? after(*deadline) : Clock::time_point::max();
  Backoff backoff(impl_->opts);
  std::string cause;
  for (int attempt = 1;; ++attempt) {
    std::optional<milliseconds> timeout;
    if (has_deadline) {
      auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
      timeout = std::clamp(left, milliseconds(50), impl_->opts.request_timeout);
    }
    try {
      const json r = impl_->post("/claim_episode", body, timeout);
      if (bool_field(r, "success").value_or(false)) {
        OpenAIEndpoint ep{str_field(r, "openai_base_url"), str_field(r, "openai_api_key"),
                          str_field(r, "episode_uuid"), impl_->opts.ca_file};
        if (ep.episode_uuid.empty() || ep.base_url.empty())
          throw ClientError("claim_episode: the server's answer lacks episode_uuid or openai_base_url");
        {
          std::lock_guard lock(impl_->episodes_mu);
          impl_->episodes[ep.episode_uuid] = {impl_->now(), discard_episode_timeout};
        }
        impl_->log->debug("claimed episode {} after {} attempt(s)", ep.episode_uuid, attempt);
        return ep;
      }
      cause = str_field(r, "fail_cause");
      if (cause.empty()) cause = "server declined the claim";
    } catch (const TransportError& e) {
      cause = e.what();
      // Visible by default (rate-limited): an unreachable server is worth knowing about.
      if (attempt == 1 || attempt % 10 == 0)
        impl_->log->warn("claim_episode: {} (attempt {}; still retrying)", cause, attempt);
    } catch (const ServerError& e) {
      if (!e.retryable()) throw;
      cause = e.what();
    }
    auto wait = backoff.next();
    if (has_deadline) {
      const auto now = Clock::now();
      if (now >= until)
        throw TimeoutError("begin_episode: no episode claimed within " + std::to_string(deadline->count()) +
                           " ms (" + std::to_string(attempt) + " attempts); last cause: " + cause);
      wait = std::min(wait, std::chrono::duration_cast<milliseconds>(until - now) + milliseconds(1));
    }
    impl_->log->debug("claim_episode attempt {} failed ({}); retrying in {} ms", attempt, cause,
                      wait.count());
    std::this_thread::sleep_for(wait);
  }
}

bool SwarmClient::end_episode(const Task& task, const std::string& episode_uuid,
                              const WorkflowOutput& output) {
  json body{{"client_uuid", impl_->opts.client_uuid},
            {"episode_uuid", episode_uuid},
            {"task_id", task.task_id},
            {"workflow_output", output_to_json(output)},
            {"task", task_to_json(task)}};
  if (impl_->expired(episode_uuid, /*erase=*/true)) {
    impl_->log->warn(
        "episode {} ended after its max lifetime (2 x discard_episode_timeout); sending abort instead so "
        "stale data never enters a batch",
        episode_uuid);
    impl_->abort_quietly(episode_uuid);
    return false;
  }
  require_success(impl_->post("/end_episode", body), "end_episode");
  return true;
}

void SwarmClient::abort_episode(const std::string& episode_uuid) { impl_->send_abort(episode_uuid); }

bool SwarmClient::can_continue_episode(const std::string& episode_uuid) {
  if (impl_->expired(episode_uuid, /*erase=*/false)) return false;
  const json body{{"client_uuid", impl_->opts.client_uuid}, {"episode_uuid", episode_uuid}};
  const json r = impl_->post("/can_continue_episode", body);
  auto v = bool_field(r, "can_continue");
  if (!v) throw ClientError("can_continue_episode: the server's answer lacks a boolean can_continue");
  return *v;
}

// ---------------------------------------------------------------------- engine control

void SwarmClient::sync_train_config(const Job& job) {
  job.validate();
  const json body{{"yaml_as_string", job.to_yaml()}};
  require_success(impl_->post("/sync_train_config", body), "sync_train_config");
}

void SwarmClient::start_engine(bool resume) {
  require_success(impl_->post("/start_engine", resume ? json{{"resume", true}} : json::object()),
                  "start_engine");
}

void SwarmClient::stop_engine() {
  require_success(impl_->post("/stop_engine", json::object()), "stop_engine");
}

void SwarmClient::auto_sync_train_config_and_start_engine(const Job& job, bool force_restart,
                                                          milliseconds timeout) {
  job.validate();
  const auto until = after(timeout);
  Backoff backoff(impl_->opts);
  bool restart_pending = force_restart;
  bool started = false;            // we sent start_engine ...
  Clock::time_point started_at{};  // ... at this time
  bool saw_foreign_boot = false;   // waited on a boot someone else started
  std::string last_state;
  for (;;) {
    EngineStatus st;
    try {
      st = get_engine_status();
    } catch (const Error& e) {
      // Unreachable at the first look: say so at once. Later, while waiting for a boot,
      // ride out transient failures until the deadline.
      const auto* se = dynamic_cast<const ServerError*>(&e);
      if (last_state.empty() || (se && !se->retryable()) || Clock::now() >= until) throw;
      impl_->log->warn("get_engine_status failed while waiting for the engine: {}", e.what());
      std::this_thread::sleep_for(backoff.next());
      continue;
    }
    if (st.engine_status != last_state) {
      impl_->log->info("engine is {}", st.engine_status);
      last_state = st.engine_status;
    }
    if (is_running_state(st.engine_status) || st.engine_status == kBooting) {
      if (restart_pending) {
        impl_->log->info("force_restart: stopping the engine (was {})", st.engine_status);
        stop_engine();
        restart_pending = false;
        saw_foreign_boot = false;
        backoff.reset();
        continue;
      }
      if (is_running_state(st.engine_status)) return;
      // BOOTING (ours or someone else's): wait below.
      if (!started) saw_foreign_boot = true;
    } else if (st.engine_status == kOffline) {
      restart_pending = false;
      if (saw_foreign_boot) {
        throw ClientError("engine failed to boot (started by another client): " +
                          (st.engine_status_detail.empty() ? std::string("(no detail from the server)")
                                                           : st.engine_status_detail));
      }
      if (!started) {
        try {
          sync_train_config(job);
          started_at = Clock::now();
          started = true;
          start_engine();
          backoff.reset();
          continue;
        } catch (const ServerError& e) {
          // 409: another client changed the state in between; look again after a pause.
          if (e.status() != 409) throw;
          impl_->log->info("engine state changed concurrently ({}); re-checking", e.what());
          started = false;
        }
      } else {
        // We asked for a start and it is OFFLINE again: the boot failed, unless this is
        // still the OFFLINE period from before our request (a server that switches state
        // asynchronously), which we tolerate for a few seconds.
        const auto now = Clock::now();
        const auto entered = now - std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(std::max(0.0, st.seconds_in_state)));
        if (entered >= started_at || now - started_at > std::chrono::seconds(5)) {
          throw ClientError("engine failed to boot: " + (st.engine_status_detail.empty()
                                                             ? std::string("(no detail from the server)")
                                                             : st.engine_status_detail));
        }
      }
    } else {
      throw ClientError("unknown engine status '" + st.engine_status + "'");
    }
    const auto now = Clock::now();
    if (now >= until)
      throw TimeoutError("engine did not reach ENGINE.ROLLING within " + std::to_string(timeout.count()) +
                         " ms (state " + st.engine_status +
                         (st.engine_status_detail.empty() ? "" : ": " + st.engine_status_detail) + ")");
    std::this_thread::sleep_for(
        std::min(backoff.next(), std::chrono::duration_cast<milliseconds>(until - now) + milliseconds(1)));
  }
}

// ---------------------------------------------------------------------- monitoring

EngineStatus SwarmClient::get_engine_status() {
  const json r = impl_->get("/get_engine_status");
  EngineStatus st;
  st.engine_status = str_field(r, "engine_status");
  if (st.engine_status.empty())
    throw ClientError("get_engine_status: the server's answer lacks engine_status");
  st.engine_status_detail = str_field(r, "engine_status_detail");
  st.global_step = int_field(r, "global_step");
  st.policy_version = int_field(r, "policy_version");
  st.seconds_in_state = num_field(r, "seconds_in_state");
  return st;
}

nlohmann::json SwarmClient::get_pool_information() {
  return impl_->get("/get_current_batch_rollout_pool_information");
}

bool SwarmClient::health() {
  try {
    return str_field(impl_->get("/health"), "status") == "ok";
  } catch (const std::exception& e) {
    impl_->log->debug("health check failed: {}", e.what());
    return false;
  }
}

// ---------------------------------------------------------------------- helpers

RunSummary SwarmClient::run_episodes_until_all_complete(const std::vector<Task>& tasks, const EpisodeFn& fn,
                                                        int max_parallel, int max_retries,
                                                        double discard_episode_timeout) {
  if (max_parallel < 1) throw ConfigError("run_episodes_until_all_complete: max_parallel must be >= 1");
  if (max_retries < 0) throw ConfigError("run_episodes_until_all_complete: max_retries must be >= 0");
  if (!fn) throw ConfigError("run_episodes_until_all_complete: no workflow function");

  RunSummary summary;
  summary.rewards.assign(tasks.size(), std::nullopt);
  std::atomic<size_t> next{0}, completed{0}, failed{0}, retries{0};

  auto worker = [&] {
    for (size_t i = next++; i < tasks.size(); i = next++) {
      const Task& task = tasks[i];
      bool done = false;
      for (int attempt = 0; attempt <= max_retries && !done; ++attempt) {
        if (attempt > 0) ++retries;
        std::optional<OpenAIEndpoint> ep;
        bool settled = false;  // ended or aborted: nothing left to clean up
        try {
          ep = begin_episode(discard_episode_timeout, "train", impl_->opts.run_claim_deadline);
          WorkflowOutput out = fn(task, *ep);
          const bool ok = end_episode(task, ep->episode_uuid, out);
          settled = true;
          if (ok) {
            summary.rewards[i] = out.reward;  // each index is written by one thread only
            done = true;
          } else {
            impl_->log->warn("task {}: episode {} outlived its lifetime and was aborted (attempt {})",
                             task.task_id, ep->episode_uuid, attempt + 1);
          }
        } catch (const std::exception& e) {
          impl_->log->warn("task {}: attempt {} failed: {}", task.task_id, attempt + 1, e.what());
        } catch (...) {
          impl_->log->warn("task {}: attempt {} failed with a non-standard exception", task.task_id,
                           attempt + 1);
        }
        if (ep && !settled) impl_->abort_quietly(ep->episode_uuid);
      }
      if (done)
        ++completed;
      else
        ++failed;
    }
  };

  const size_t n_threads = std::min<size_t>(static_cast<size_t>(max_parallel), tasks.size());
  std::vector<std::thread> threads;
  threads.reserve(n_threads);
  try {
    for (size_t t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  } catch (const std::exception& e) {
    next = tasks.size();  // let the started workers finish what they hold
    for (auto& th : threads) th.join();
    throw ClientError(std::string("run_episodes_until_all_complete: cannot start threads: ") + e.what());
  }
  for (auto& th : threads) th.join();

  summary.completed = completed;
  summary.failed = failed;
  summary.retries = retries;
  return summary;
}

}  // namespace swarm
