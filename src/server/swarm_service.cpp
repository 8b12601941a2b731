#include "server/swarm_service.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/error.hpp"
#include "http/http_error.hpp"
#include "http/json_body.hpp"
#include "api/openai_routes.hpp"
#include "server/pool_info.hpp"
#include "server/verbose_log.hpp"
#include "server/zip_listing.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;

// Who may call a route when tokens are configured (AccessTokens).
enum class Access {
  OPEN,    // status and metrics: always
  CLIENT,  // the episode routes: the client token (or the admin token) when one is set
  ADMIN,   // the run's control and other clients' data: the admin token when one is set
  EPISODE  // the model endpoints: the episode's own API key (openai_routes.cpp)
};

struct Route {
  const char* path;
  const char* method;
  bool openai;
  Access access;
};

constexpr Route kRoutes[] = {
    {"/health", "GET", false, Access::OPEN},
    {"/get_engine_status", "GET", false, Access::OPEN},
    {"/sync_train_config", "POST", false, Access::ADMIN},
    {"/start_engine", "POST", false, Access::ADMIN},
    {"/stop_engine", "POST", false, Access::ADMIN},
    {"/claim_episode", "POST", false, Access::CLIENT},
    {"/end_episode", "POST", false, Access::CLIENT},
    {"/abort_episode", "POST", false, Access::CLIENT},
    {"/can_continue_episode", "POST", false, Access::CLIENT},
    {"/get_current_batch_rollout_pool_information", "GET", false, Access::OPEN},
    // AgentJet's client and overwatch (docs/agentjet.md)
    {"/agree_sync_weight", "POST", false, Access::CLIENT},
    {"/sync_train_code", "POST", false, Access::ADMIN},
    {"/get_server_experiment_dir", "GET", false, Access::OPEN},
    {"/get_episode_buffer", "POST", false, Access::ADMIN},
    {"/replay_latest_llm_call", "POST", false, Access::ADMIN},
    {"/get_verbose_logs", "GET", false, Access::ADMIN},
    {"/metrics", "GET", false, Access::OPEN},
    {"/v1/chat/completions", "POST", true, Access::EPISODE},
    {"/v1/completions", "POST", true, Access::EPISODE},
    {"/v1/models", "GET", true, Access::EPISODE},
    // agent harnesses (docs/harnesses.md): Anthropic Messages, OpenAI Responses
    {"/v1/messages", "POST", true, Access::EPISODE},
    {"/v1/messages/count_tokens", "POST", true, Access::EPISODE},
    {"/v1/responses", "POST", true, Access::EPISODE},
};

// Compares in time independent of where the strings differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    diff |= static_cast<unsigned char>((i < a.size() ? a[i] : 0) ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// The token after "Authorization: Bearer ", or "".
std::string bearer_token(const HttpRequest& request) {
  const std::string& auth = request.header("authorization");
  return auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : std::string();
}

// Throws UNAUTHORIZED (401) when the route needs a token this request does not carry.
void check_access(Access access, const AccessTokens& tokens, const HttpRequest& request,
                  const std::string& route) {
  if (access == Access::OPEN || access == Access::EPISODE) return;
  const bool admin_only = access == Access::ADMIN;
  if (admin_only ? tokens.admin.empty() : tokens.client.empty()) return;
  const std::string presented = bearer_token(request);
  if (!presented.empty() && ((!tokens.admin.empty() && same_secret(presented, tokens.admin)) ||
                             (!admin_only && same_secret(presented, tokens.client))))
    return;
  throw SwarmError(
      ErrorKind::UNAUTHORIZED,
      route + " needs " + (admin_only ? "the admin token" : "the client token") +
          (presented.empty() ? ": send 'Authorization: Bearer <token>'" : ": the token sent is not it") +
          " (swarm-server --" + (admin_only ? "admin" : "client") + "-token-file; docs/reliability.md)");
}

// Whether the request carries the admin token (when one is configured).
bool presents_admin(const AccessTokens& tokens, const HttpRequest& request) {
  const std::string presented = bearer_token(request);
  return !tokens.admin.empty() && !presented.empty() && same_secret(presented, tokens.admin);
}

// A client id as open routes show it when a client token is set: HMAC-SHA256 under the
// server's key, 16 hex digits. The same client keeps its id (overwatch can follow it), and
// nobody without the admin token learns the uuid that ends or aborts its episodes.
std::string keyed_client_id(const std::string& key, const std::string& client_uuid) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(client_uuid.data()), client_uuid.size(), mac, &len);
  static const char* kHex = "0123456789abcdef";
  std::string out = "client-";
  for (unsigned int i = 0; i < 8 && i < len; ++i) {
    out += kHex[mac[i] >> 4];
    out += kHex[mac[i] & 15];
  }
  return out;
}

// Records status and latency when the answer is handed to the transport.
class MeteredSink final : public ResponseSink {
 public:
  MeteredSink(std::shared_ptr<ResponseSink> inner, std::shared_ptr<Metrics> metrics, std::string route)
      : inner_(std::move(inner)),
        metrics_(std::move(metrics)),
        route_(std::move(route)),
        start_(std::chrono::steady_clock::now()) {}

  void respond(HttpResponse response) override {
    observe(response.status);
    inner_->respond(std::move(response));
  }
  void start_stream(int status, const std::string& content_type) override {
    status_ = status;
    inner_->start_stream(status, content_type);
  }
  bool write(std::string chunk) override { return inner_->write(std::move(chunk)); }
  void end_stream() override {
    observe(status_);
    inner_->end_stream();
  }
  bool client_connected() const override { return inner_->client_connected(); }

 private:
  void observe(int status) {
    metrics_->observe_request(
        route_, status, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  std::shared_ptr<ResponseSink> inner_;
  std::shared_ptr<Metrics> metrics_;  // shared: the answer may end after the service is gone
  std::string route_;
  std::chrono::steady_clock::time_point start_;
  int status_ = 200;
};

HttpResponse json_response(const json& body, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  return r;
}

EpisodeType parse_episode_type(const json& body) {
  auto t = optional_string(body, "episode_type").value_or("train");
  if (t == "train") return EpisodeType::TRAIN;
  if (t == "eval") return EpisodeType::EVAL;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                   "field 'episode_type' must be \"train\" or \"eval\", got \"" + t + "\"");
}

// log_metrics values: a number; a list of numbers (AgentJet's client sends per-turn values),
// recorded as its mean; an object (AgentJet's `reward_stats`, `tool_stats`), flattened into
// "name/key" metrics, where what is not a number or a list of numbers is skipped. Names are at
// most kMaxLogMetricNameBytes, an episode at most kMaxLogMetrics metrics (docs/reliability.md).
constexpr size_t kMaxLogMetricNameBytes = 256;
constexpr size_t kMaxLogMetrics = 1024;

void add_log_metric(const std::string& name, const json& value, bool nested, WorkflowOutput& out) {
  if (name.size() > kMaxLogMetricNameBytes) {  // checked before it grows: no quadratic work
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "field 'workflow_output.log_metrics': the metric name '" +
                                                      name.substr(0, 64) + "...' is longer than " +
                                                      std::to_string(kMaxLogMetricNameBytes) + " bytes");
  }
  if ((value.is_number() || value.is_array()) && out.log_metrics.size() >= kMaxLogMetrics &&
      !out.log_metrics.contains(name)) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "field 'workflow_output.log_metrics' has more than " +
                                                      std::to_string(kMaxLogMetrics) +
                                                      " metrics (flattened)");
  }
  if (value.is_number()) {
    out.log_metrics[name] = value.get<double>();
    return;
  }
  if (value.is_array()) {
    double sum = 0;
    for (const json& x : value) {
      if (!x.is_number()) {
        if (nested) return;
        throw SwarmError(ErrorKind::INVALID_ARGUMENT, "field 'workflow_output.log_metrics." + name +
                                                          "' must be a number or a list of numbers");
      }
      sum += x.get<double>();
    }
    if (!value.empty()) out.log_metrics[name] = sum / static_cast<double>(value.size());
    return;
  }
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it)
      add_log_metric(name + "/" + it.key(), it.value(), true, out);
    return;
  }
  if (nested) return;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "field 'workflow_output.log_metrics." + name +
                                                    "' must be a number, a list of numbers or an object");
}

struct ParsedOutput {
  WorkflowOutput output;
};

// A list of finite numbers (`what` names the field in errors; `expected` says what it may be).
std::vector<double> finite_numbers(const json& list, const std::string& what,
                                   const std::string& expected = "a list of finite numbers") {
  if (!list.is_array())
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "field '" + what + "' must be " + expected);
  std::vector<double> out;
  out.reserve(list.size());
  for (const json& x : list) {
    if (!x.is_number() || !std::isfinite(x.get<double>()))
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, "field '" + what + "' must be " + expected);
    out.push_back(x.get<double>());
  }
  return out;
}

ParsedOutput parse_workflow_output(const json& body) {
  const json* wo = optional_object(body, "workflow_output");
  if (!wo) throw SwarmError(ErrorKind::INVALID_ARGUMENT, "missing required field 'workflow_output'");
  ParsedOutput parsed;
  WorkflowOutput& out = parsed.output;
  const auto reward = wo->find("reward");
  if (reward != wo->end() && reward->is_array()) {
    // AgentJet's client may send one reward per turn: read as turn_rewards, the episode's
    // reward being their sum (its return).
    out.turn_rewards =
        finite_numbers(*reward, "workflow_output.reward", "a number, a list of finite numbers or null");
    out.turn_rewards_from_list = true;
    double sum = 0;
    for (double r : out.turn_rewards) sum += r;
    out.reward = sum;
  } else {
    out.reward = optional_number(*wo, "reward");
  }
  if (auto it = wo->find("turn_rewards"); it != wo->end() && !it->is_null()) {
    if (reward != wo->end() && reward->is_array())
      throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                       "send either a list 'workflow_output.reward' or 'turn_rewards', not both");
    out.turn_rewards = finite_numbers(*it, "workflow_output.turn_rewards");
  }
  if (auto it = wo->find("token_rewards"); it != wo->end() && !it->is_null()) {
    if (!it->is_array())
      throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                       "field 'workflow_output.token_rewards' must be a list (one list per LLM call)");
    for (size_t c = 0; c < it->size(); ++c)
      out.token_rewards.push_back(
          finite_numbers((*it)[c], "workflow_output.token_rewards[" + std::to_string(c) + "]"));
  }
  out.is_success = optional_bool(*wo, "is_success");
  if (const json* md = optional_object(*wo, "metadata")) out.metadata_json = dump_json(*md);
  if (const json* lm = optional_object(*wo, "log_metrics")) {
    for (auto it = lm->begin(); it != lm->end(); ++it) add_log_metric(it.key(), it.value(), false, out);
  }
  return parsed;
}

// task_id comes from the top level (wire protocol) or from the task object.
std::string parse_task_id(const json& body) {
  if (auto id = optional_string(body, "task_id"); id && !id->empty()) return *id;
  if (const json* task = optional_object(body, "task"))
    if (auto id = optional_string(*task, "task_id"); id && !id->empty()) return *id;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "missing required field 'task_id'");
}

}  // namespace

SwarmService::SwarmService(Engine& engine, std::shared_ptr<Metrics> metrics,
                           std::function<std::string()> fallback_authority,
                           std::chrono::milliseconds keep_alive, AccessTokens tokens)
    : engine_(engine),
      metrics_(std::move(metrics)),
      fallback_authority_(std::move(fallback_authority)),
      tokens_(std::move(tokens)),
      client_id_key_(random_hex(32)),
      heartbeat_(keep_alive) {
  install_verbose_log_sink();
}

void SwarmService::handle(HttpRequest&& request, std::shared_ptr<ResponseSink> raw_sink) {
  const Route* route = nullptr;
  bool path_known = false;
  for (const auto& r : kRoutes) {
    if (request.path != r.path) continue;
    path_known = true;
    if (request.method == r.method) route = &r;
  }
  const std::string route_name = route ? route->path : (path_known ? request.path : "other");
  auto sink = std::make_shared<MeteredSink>(std::move(raw_sink), metrics_, route_name);
  const ErrorStyle style = error_style_for_path(request.path);
  if (!route) {
    if (path_known)
      sink->respond(error_response(style, 405, "invalid_request_error",
                                   "method " + request.method + " is not allowed on " + request.path,
                                   "method_not_allowed"));
    else
      sink->respond(error_response(style, 404, "not_found_error",
                                   "no route " + request.method + " " + request.path, "not_found"));
    return;
  }
  if (route->openai) {
    try {
      handle_openai(route_name, std::move(request), sink);
    } catch (...) {
      sink->respond(error_response_from_current_exception(style, route_name));
    }
    return;
  }
  auto run = [this, route, route_name](const HttpRequest& req, const std::shared_ptr<MeteredSink>& out) {
    HttpResponse response;
    try {
      check_access(route->access, tokens_, req, route_name);
      response = handle_command(route_name, req);
    } catch (...) {
      response = error_response_from_current_exception(ErrorStyle::COMMAND, route_name);
    }
    out->respond(std::move(response));
  };
  if (route_name == "/end_episode") {
    // Answered once the episode is durable (the episode store's commit), from the store's
    // thread: the I/O thread goes on serving meanwhile, and concurrent ends share one commit.
    try {
      check_access(route->access, tokens_, request, route_name);
      const json body = parse_json_object(request.body, false);
      const std::string client = require_string(body, "client_uuid");
      const std::string episode = require_string(body, "episode_uuid");
      const std::string task_id = parse_task_id(body);
      ParsedOutput parsed = parse_workflow_output(body);
      if (const json* task = optional_object(body, "task"))
        if (const json* md = optional_object(*task, "metadata"))
          parsed.output.task_metadata_json = dump_json(*md);
      engine_.end_episode_async(
          client, episode, task_id, parsed.output,
          optional_bool(body, "declare_client_active").value_or(true),
          [sink, route_name](EndOutcome outcome, std::exception_ptr error) {
            if (error) {
              try {
                std::rethrow_exception(error);
              } catch (...) {
                sink->respond(error_response_from_current_exception(ErrorStyle::COMMAND, route_name));
              }
              return;
            }
            json out = {{"success", true}, {"accepted", outcome.accepted}};
            if (!outcome.note.empty()) out["note"] = outcome.note;
            sink->respond(json_response(out));
          });
    } catch (...) {
      sink->respond(error_response_from_current_exception(ErrorStyle::COMMAND, route_name));
    }
    return;
  }
  run(request, sink);
}

HttpResponse SwarmService::handle_command(const std::string& route, const HttpRequest& request) {
  if (route == "/health") {
    return json_response({{"status", "ok"}, {"engine_status", engine_state_wire(engine_.status().state)}});
  }
  if (route == "/get_engine_status") {
    const EngineSnapshot st = engine_.status();
    return json_response({{"engine_status", engine_state_wire(st.state)},
                          {"engine_status_detail", st.detail},
                          {"global_step", st.global_step},
                          {"policy_version", st.policy_version},
                          {"max_staleness", st.max_staleness},
                          {"trainer_step", st.trainer_step},
                          {"seconds_in_state", st.seconds_in_state},
                          {"config_synced", st.config_synced},
                          {"engine", st.backend},
                          {"model", st.model},
                          {"memory", rank_memory_json(st.memory)},
                          {"serving", rank_serving_json(st.serving)}});
  }
  if (route == "/metrics") {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    const auto backend = engine_.backend();
    r.body = metrics_->render(engine_.status(), engine_.pool_snapshot(), engine_.step_history(),
                              backend ? backend->inference_metrics() : std::map<std::string, double>{});
    return r;
  }
  if (route == "/get_current_batch_rollout_pool_information") {
    // Open to all; with a client token set, client ids are shown raw to the admin only.
    ClientIdView show;
    if (!tokens_.client.empty() && !presents_admin(tokens_, request))
      show = [this](const std::string& c) { return keyed_client_id(client_id_key_, c); };
    return json_response(pool_information_json(engine_.status(), engine_.pool_snapshot(),
                                               engine_.step_history(), engine_.config(), show));
  }
  if (route == "/get_server_experiment_dir") {
    const std::string dir = engine_.status().experiment_dir;
    return json_response({{"server_experiment_dir", dir.empty() ? json(nullptr) : json(dir)}});
  }
  if (route == "/get_verbose_logs") {
    json entries = json::array();
    for (const auto& e : recent_log_entries())
      entries.push_back({{"timestamp", e.timestamp}, {"tag", e.tag}, {"message", e.message}});
    return json_response({{"entries", entries}});
  }
  if (route == "/replay_latest_llm_call") {  // a POST without a body (AgentJet's overwatch)
    const auto call = last_chat_->get();
    if (!call) throw SwarmError(ErrorKind::NOT_FOUND, "No LLM call has been made yet");
    json input = json::parse(call->request_body, nullptr, /*allow_exceptions=*/false);
    if (input.is_discarded()) input = call->request_body;
    return json_response({{"input", input}, {"output", json::parse(call->response)}, {"api", call->api}});
  }
  if (route == "/sync_train_code") {  // the body is the zip itself (Content-Type: application/zip)
    const EngineState state = engine_.status().state;  // the state first, as AgentJet answers
    if (state != EngineState::OFFLINE)
      throw SwarmError(ErrorKind::CONFLICT,
                       std::string("sync_train_code is only allowed in ENGINE.OFFLINE (engine is ") +
                           engine_state_wire(state) + "); call stop_engine first");
    check_agentjet_code_zip(request.body);
    const std::string path = engine_.store_train_code(request.body);
    return json_response({{"success", true},
                          {"message", "Training code synced successfully."},
                          {"temp_ajet_code_path", path},
                          {"note",
                           "swarm-server runs no Python: the archive is stored in the experiment "
                           "directory for the record and is not executed; training uses swarm's own "
                           "trainer with the synced config"}});
  }

  const json body =
      parse_json_object(request.body, /*allow_empty=*/route == "/start_engine" || route == "/stop_engine" ||
                                          route == "/get_episode_buffer");
  if (route == "/sync_train_config") {
    const JobConfigReport report = engine_.sync_train_config(require_string(body, "yaml_as_string"));
    json mapped = json::array();
    for (const auto& m : report.mapped) {
      json value = m.value;  // typed as our key is
      if (m.type == "bool")
        value = m.value == "true";
      else if (m.type == "int")
        value = std::stoll(m.value);
      else if (m.type == "float")
        value = std::stod(m.value);
      mapped.push_back({{"from", m.from}, {"to", m.to}, {"value", value}});
    }
    return json_response({{"success", true},
                          {"config_format", report.format},
                          {"mapped", mapped},
                          {"ignored", report.ignored},
                          {"warnings", report.warnings}});
  }
  if (route == "/start_engine") {
    const bool resume = optional_bool(body, "resume").value_or(false);
    engine_.start_engine(resume);
    // The boot decides what resume finds (the previous run's checkpoint-on-stop may still be
    // writing); the pool information's "run" says what it did.
    return json_response({{"success", true}, {"resume", resume}});
  }
  if (route == "/stop_engine") {
    engine_.stop_engine();
    return json_response({{"success", true}});
  }
  if (route == "/claim_episode") {
    ClaimRequest req;
    req.client_uuid = require_string(body, "client_uuid");
    req.episode_type = parse_episode_type(body);
    req.discard_episode_timeout = optional_number(body, "discard_episode_timeout").value_or(600.0);
    // AgentJet's client says which task the episode is for; its other throttle fields
    // (ratio, expected_batch_size, expected_num_repeat) steer the client alone.
    if (const json* throttle = optional_object(body, "throttle_policy"))
      req.optional_task_id = optional_string(*throttle, "current_task_id").value_or("");
    ClaimResult result = engine_.claim_episode(req);
    json out = {{"success", result.episode.has_value()},
                {"client_uuid", req.client_uuid},
                {"episode_uuid", result.episode ? result.episode->episode_uuid : ""},
                {"openai_base_url", ""},
                {"openai_api_key", result.episode ? result.episode->api_key : ""},
                {"fail_cause", result.fail_cause}};
    if (result.episode) {
      std::string authority = request.header("host");
      if (authority.empty()) authority = fallback_authority_();
      const char* scheme = request.secure ? "https://" : "http://";
      out["openai_base_url"] = scheme + authority + "/v1";
      out["anthropic_base_url"] = scheme + authority;  // what ANTHROPIC_BASE_URL takes (no /v1)
    }
    return json_response(out);
  }
  if (route == "/abort_episode") {
    const std::string episode = require_string(body, "episode_uuid");
    // Idempotent (AgentJet's client turns late ends into aborts): nothing running by that id
    // is a success with a note, in every state.
    if (!engine_.abort_episode(require_string(body, "client_uuid"), episode,
                               optional_bool(body, "declare_client_active").value_or(true)))
      return json_response(
          {{"success", true},
           {"note", "episode " + episode +
                        " is not running (unknown, already ended, aborted or timed out); nothing "
                        "to abort"}});
    return json_response({{"success", true}});
  }
  if (route == "/agree_sync_weight") {
    const AgreeResult r = engine_.agree_sync_weight(require_string(body, "client_uuid"));
    return json_response({{"success", r.success}, {"failure_reason", r.failure_reason}});
  }
  if (route == "/get_episode_buffer") {
    // AgentJet's EpisodeStatus for every running episode (API keys are not handed out again).
    const auto now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    json buffer = json::array();
    for (const auto& e : engine_.pool_snapshot().running_episodes)
      buffer.push_back({{"episode_uuid", e.episode_uuid},
                        {"episode_status", "claimed"},
                        {"episode_type", e.episode_type == EpisodeType::EVAL ? "eval" : "train"},
                        {"openai_base_url", ""},
                        {"openai_api_key", ""},
                        {"client_uuid", e.client_uuid},
                        {"zmq_listen_result_addr", ""},
                        {"latest_activity_timestamp", now - e.seconds_idle},
                        {"discard_episode_timeout", e.discard_episode_timeout},
                        {"llm_call_count", e.llm_calls},
                        {"debug_log", json::array()},
                        {"optional_task_id", e.optional_task_id}});
    return json_response({{"buffer", buffer}});
  }
  if (route == "/can_continue_episode") {
    bool ok = engine_.can_continue_episode(require_string(body, "client_uuid"),
                                           require_string(body, "episode_uuid"));
    return json_response({{"can_continue", ok}});
  }
  throw SwarmError(ErrorKind::INTERNAL, "route " + route + " has no handler");
}

void SwarmService::handle_openai(const std::string& route, HttpRequest&& request,
                                 std::shared_ptr<ResponseSink> sink) {
  if (route == "/v1/models") {
    sink->respond(openai_models(engine_));
    return;
  }
  if (route == "/v1/messages/count_tokens") {
    sink->respond(anthropic_count_tokens(engine_, request));
    return;
  }
  const ApiKind kind = route == "/v1/chat/completions" ? ApiKind::CHAT_COMPLETIONS
                       : route == "/v1/messages"       ? ApiKind::ANTHROPIC_MESSAGES
                       : route == "/v1/responses"      ? ApiKind::RESPONSES
                                                       : ApiKind::COMPLETIONS;
  serve_generation(engine_, metrics_, kind, request, std::move(sink), OpenAIContext{last_chat_, &heartbeat_});
}

}  // namespace swarm
