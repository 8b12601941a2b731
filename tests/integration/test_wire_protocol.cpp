// Wire compatibility (docs/design.md): every route spoken with raw HTTP + JSON, exactly as a
// client written for the peer system (AgentJet's Python swarm client) would speak it.
// Deliberately does not use the SDK: exact paths, field names and shapes are the contract.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "http/http_client.hpp"
#include "support/http_helpers.hpp"
#include "support/test_server.hpp"

using json = nlohmann::json;
using namespace std::chrono_literals;
using swarm::HttpClient;
using swarm::HttpClientResponse;
using swarm::testing::get_json;
using swarm::testing::header_of;
using swarm::testing::Headers;
using swarm::testing::parse_body;
using swarm::testing::post_json;
using swarm::testing::TestServer;

namespace {

const char* kConfig =
    "model: mock-model\n"
    "batch_size: 1\n"
    "num_repeat: 2\n"
    "max_parallel_episodes: 4\n";

// Polls GET /get_engine_status (as a Python client would) until `state` or a deadline.
bool poll_engine_status(HttpClient& c, const std::string& state, std::chrono::seconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (get_json(c, "/get_engine_status")["engine_status"] == state) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

// sync_train_config + start_engine, then polls until ROLLING (as a Python client would).
void start_rolling(HttpClient& c, const std::string& config) {
  EXPECT_EQ(post_json(c, "/sync_train_config", {{"yaml_as_string", config}})["success"], true);
  EXPECT_EQ(post_json(c, "/start_engine", json::object())["success"], true);
  ASSERT_TRUE(poll_engine_status(c, "ENGINE.ROLLING"));
}

// The `data:` payloads of an SSE body, in order.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    size_t line_start = 0;
    while (line_start < event.size()) {
      size_t nl = event.find('\n', line_start);
      if (nl == std::string::npos) nl = event.size();
      std::string line = event.substr(line_start, nl - line_start);
      if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
      line_start = nl + 1;
    }
  }
  return out;
}

struct Claimed {
  std::string episode_uuid;
  std::string base_url;
  std::string api_key;
};

// `host` is the authority the client reached the server by (the Host header).
Claimed claim(HttpClient& c, const std::string& client_uuid, uint16_t port,
              const std::string& host = "127.0.0.1") {
  json req = {{"client_uuid", client_uuid},
              {"episode_type", "train"},
              {"discard_episode_timeout", 120},
              {"throttle_policy", nullptr}};
  const std::string authority = host + ":" + std::to_string(port);
  json r = post_json(c, "/claim_episode", req, 200, {{"Host", authority}});
  EXPECT_EQ(r["success"], true) << r.dump();
  EXPECT_EQ(r["client_uuid"], client_uuid);
  EXPECT_TRUE(r["episode_uuid"].is_string());
  EXPECT_FALSE(r["episode_uuid"].get<std::string>().empty());
  EXPECT_EQ(r["openai_base_url"], "http://" + authority + "/v1");
  EXPECT_TRUE(r["openai_api_key"].is_string());
  EXPECT_GE(r["openai_api_key"].get<std::string>().size(), 16u);
  EXPECT_EQ(r["fail_cause"], "");
  return {r.value("episode_uuid", ""), r.value("openai_base_url", ""), r.value("openai_api_key", "")};
}

Headers bearer(const Claimed& e) { return swarm::testing::bearer(e.api_key); }

void expect_usage(const json& usage) {
  ASSERT_TRUE(usage.is_object()) << usage.dump();
  EXPECT_GT(usage["prompt_tokens"].get<int64_t>(), 0);
  EXPECT_GT(usage["completion_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(usage["total_tokens"].get<int64_t>(),
            usage["prompt_tokens"].get<int64_t>() + usage["completion_tokens"].get<int64_t>());
}

TEST(WireProtocol, ClaimWhileOfflineIsHttp200WithSuccessFalseAndACause) {
  TestServer server;
  HttpClient c(server.url());
  json r =
      post_json(c, "/claim_episode",
                {{"client_uuid", "c-offline"}, {"episode_type", "train"}, {"discard_episode_timeout", 60}});
  EXPECT_EQ(r["success"], false);
  EXPECT_EQ(r["client_uuid"], "c-offline");
  ASSERT_TRUE(r["fail_cause"].is_string());
  const std::string cause = r["fail_cause"];
  EXPECT_FALSE(cause.empty());
  EXPECT_NE(cause.find("ENGINE.OFFLINE"), std::string::npos) << cause;
  EXPECT_EQ(r["openai_api_key"], "");
}

TEST(WireProtocol, WholeLifecycleWithRawJson) {
  TestServer server;
  HttpClient c(server.url());
  const uint16_t port = server.port();

  // ---- health and status while OFFLINE
  json health = get_json(c, "/health");
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["engine_status"], "ENGINE.OFFLINE");
  json st = get_json(c, "/get_engine_status");
  EXPECT_EQ(st["engine_status"], "ENGINE.OFFLINE");
  EXPECT_TRUE(st["engine_status_detail"].is_string());
  EXPECT_EQ(st["global_step"], 0);
  EXPECT_EQ(st["policy_version"], 0);

  // ---- config, boot
  EXPECT_EQ(post_json(c, "/sync_train_config", {{"yaml_as_string", kConfig}}),
            json({{"success", true},
                  {"config_format", "swarm"},
                  {"mapped", json::array()},
                  {"ignored", json::array()},
                  {"warnings", json::array()}}));
  EXPECT_EQ(post_json(c, "/start_engine", json::object())["success"], true);
  ASSERT_TRUE(poll_engine_status(c, "ENGINE.ROLLING"));
  EXPECT_EQ(get_json(c, "/health")["engine_status"], "ENGINE.ROLLING");

  // ---- claim: two episodes of one task, plus one to abort
  Claimed a = claim(c, "client-a", port);
  Claimed b = claim(c, "client-b", port);
  // A client that reached the server by another name gets a base URL with that name.
  Claimed doomed = claim(c, "client-a", port, "localhost");
  ASSERT_FALSE(a.api_key.empty());
  EXPECT_NE(a.episode_uuid, b.episode_uuid);
  EXPECT_NE(a.api_key, b.api_key);
  ASSERT_EQ(a.base_url.substr(a.base_url.size() - 3), "/v1");

  // The OpenAI SDK joins base_url + "/chat/completions": use the URL exactly as returned.
  HttpClient llm_a(a.base_url);
  HttpClient llm_b(b.base_url);

  // ---- chat completion, plain
  {
    json req = {{"model", "mock-model"},
                {"messages",
                 {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hello"}}}},
                {"max_tokens", 32}};
    json r = post_json(llm_a, "/chat/completions", req, 200, bearer(a));
    EXPECT_TRUE(r["id"].is_string());
    EXPECT_FALSE(r["id"].get<std::string>().empty());
    EXPECT_EQ(r["object"], "chat.completion");
    EXPECT_TRUE(r["created"].is_number_integer());
    EXPECT_EQ(r["model"], "mock-model");
    ASSERT_TRUE(r["choices"].is_array());
    ASSERT_EQ(r["choices"].size(), 1u);
    const json& ch = r["choices"][0];
    EXPECT_EQ(ch["index"], 0);
    EXPECT_EQ(ch["message"]["role"], "assistant");
    EXPECT_TRUE(ch["message"]["content"].is_string());
    EXPECT_FALSE(ch["message"]["content"].get<std::string>().empty());
    EXPECT_TRUE(ch["finish_reason"] == "stop" || ch["finish_reason"] == "length") << ch.dump();
    EXPECT_TRUE(ch.contains("logprobs"));
    expect_usage(r["usage"]);
  }

  // ---- chat completion with logprobs
  {
    json req = {{"model", "mock-model"},
                {"messages", {{{"role", "user"}, {"content", "abc"}}}},
                {"logprobs", true},
                {"top_logprobs", 2}};
    json r = post_json(llm_a, "/chat/completions", req, 200, bearer(a));
    const json& content = r["choices"][0]["logprobs"]["content"];
    ASSERT_TRUE(content.is_array()) << r.dump();
    ASSERT_FALSE(content.empty());
    for (const json& t : content) {
      EXPECT_TRUE(t["token"].is_string());
      EXPECT_TRUE(t["logprob"].is_number());
      EXPECT_LE(t["logprob"].get<double>(), 0.0);
      ASSERT_TRUE(t["bytes"].is_array());
      std::string from_bytes;
      for (const json& b : t["bytes"]) from_bytes += static_cast<char>(b.get<int>());
      EXPECT_EQ(from_bytes, t["token"].get<std::string>());
      ASSERT_TRUE(t["top_logprobs"].is_array());
      EXPECT_EQ(t["top_logprobs"].size(), 2u);
      for (const json& alt : t["top_logprobs"]) {
        EXPECT_TRUE(alt["token"].is_string());
        EXPECT_TRUE(alt["logprob"].is_number());
        EXPECT_TRUE(alt["bytes"].is_array());
      }
    }
  }

  // ---- chat completion with token ids
  {
    json req = {{"model", "mock-model"},
                {"messages", {{{"role", "user"}, {"content", "ids"}}}},
                {"return_token_ids", true}};
    json r = post_json(llm_a, "/chat/completions", req, 200, bearer(a));
    ASSERT_TRUE(r["prompt_token_ids"].is_array()) << r.dump();
    EXPECT_EQ(static_cast<int64_t>(r["prompt_token_ids"].size()), r["usage"]["prompt_tokens"].get<int64_t>());
    ASSERT_TRUE(r["choices"][0]["token_ids"].is_array());
    EXPECT_EQ(static_cast<int64_t>(r["choices"][0]["token_ids"].size()),
              r["usage"]["completion_tokens"].get<int64_t>());
    for (const json& id : r["prompt_token_ids"]) EXPECT_TRUE(id.is_number_integer());
  }

  // ---- streaming chat completion
  {
    json req = {{"model", "mock-model"},
                {"messages", {{{"role", "user"}, {"content", "stream me"}}}},
                {"stream", true},
                {"stream_options", {{"include_usage", true}}}};
    auto r = llm_b.request("POST", "/chat/completions", req.dump(), bearer(b));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(header_of(r, "content-type").find("text/event-stream"), std::string::npos);
    auto events = sse_events(r.body);
    ASSERT_GE(events.size(), 4u) << r.body;
    EXPECT_EQ(events.back(), "[DONE]");
    std::string text;
    bool saw_finish = false, saw_usage = false;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      json ev = json::parse(events[i], nullptr, false);
      ASSERT_FALSE(ev.is_discarded()) << events[i];
      EXPECT_EQ(ev["object"], "chat.completion.chunk");
      EXPECT_TRUE(ev["id"].is_string());
      EXPECT_EQ(ev["model"], "mock-model");
      if (i == 0) {
        EXPECT_EQ(ev["choices"][0]["delta"]["role"], "assistant") << events[i];
      }
      if (ev.contains("usage") && ev["usage"].is_object()) {
        saw_usage = true;
        EXPECT_TRUE(ev["choices"].empty());
        expect_usage(ev["usage"]);
        EXPECT_EQ(i + 2, events.size()) << "the usage chunk comes last, before [DONE]";
        continue;
      }
      ASSERT_EQ(ev["choices"].size(), 1u);
      const json& ch = ev["choices"][0];
      if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) {
        saw_finish = true;
        EXPECT_EQ(ch["finish_reason"], "stop");
      }
    }
    EXPECT_TRUE(saw_finish);
    EXPECT_TRUE(saw_usage);
    EXPECT_FALSE(text.empty());
  }

  // ---- legacy completions with a string prompt
  {
    json req = {{"model", "mock-model"}, {"prompt", "Once upon a time"}, {"max_tokens", 16}};
    json r = post_json(llm_b, "/completions", req, 200, bearer(b));
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_TRUE(r["id"].is_string());
    EXPECT_EQ(r["model"], "mock-model");
    ASSERT_EQ(r["choices"].size(), 1u);
    EXPECT_TRUE(r["choices"][0]["text"].is_string());
    EXPECT_FALSE(r["choices"][0]["text"].get<std::string>().empty());
    EXPECT_TRUE(r["choices"][0].contains("finish_reason"));
    expect_usage(r["usage"]);
  }

  // ---- models
  {
    auto r = llm_a.request("GET", "/models", "", bearer(a));
    ASSERT_EQ(r.status, 200) << r.body;
    json m = parse_body(r);
    EXPECT_EQ(m["object"], "list");
    ASSERT_EQ(m["data"].size(), 1u);
    EXPECT_EQ(m["data"][0]["id"], "mock-model");
    EXPECT_EQ(m["data"][0]["object"], "model");
  }

  // ---- can_continue
  EXPECT_EQ(
      post_json(c, "/can_continue_episode", {{"client_uuid", "client-a"}, {"episode_uuid", a.episode_uuid}}),
      json({{"can_continue", true}}));

  // ---- pool information while episodes run
  {
    json p = get_json(c, "/get_current_batch_rollout_pool_information");
    EXPECT_EQ(p["engine_status"], "ENGINE.ROLLING");
    EXPECT_EQ(p["global_step"], 0);
    EXPECT_EQ(p["sample_collection_method"], "rollout_until_finish_enough_tasks");
    EXPECT_TRUE(p["targets"].is_object());
    EXPECT_EQ(p["targets"]["tasks"], 1);
    EXPECT_EQ(p["targets"]["episodes"], 2);
    EXPECT_TRUE(p["progress"].is_object());
    ASSERT_TRUE(p["running_episodes"].is_array());
    ASSERT_EQ(p["running_episodes"].size(), 3u) << p.dump();
    bool saw_a = false;
    for (const json& e : p["running_episodes"]) {
      EXPECT_TRUE(e["client_uuid"].is_string());
      EXPECT_TRUE(e["llm_calls"].is_number_integer());
      EXPECT_TRUE(e["seconds_idle"].is_number());
      EXPECT_EQ(e["discard_episode_timeout"], 120.0);
      if (e["episode_uuid"] == a.episode_uuid) {
        saw_a = true;
        EXPECT_EQ(e["client_uuid"], "client-a");
        EXPECT_EQ(e["llm_calls"], 3);
      }
    }
    EXPECT_TRUE(saw_a);
    EXPECT_TRUE(p["tasks"].is_array());
    EXPECT_TRUE(p["recent_rewards"].is_array());
    EXPECT_TRUE(p["counters"].is_object());
    EXPECT_EQ(p["counters"]["claimed"], 3);
  }

  // ---- abort one, end one (top-level task_id)
  EXPECT_EQ(post_json(c, "/abort_episode",
                      {{"client_uuid", "client-a"}, {"episode_uuid", doomed.episode_uuid}})["success"],
            true);
  {
    json req = {{"client_uuid", "client-a"},
                {"episode_uuid", a.episode_uuid},
                {"task_id", "task-1"},
                {"workflow_output",
                 {{"reward", 1.0},
                  {"is_success", true},
                  {"metadata", json::object()},
                  {"log_metrics", json::object()}}}};
    EXPECT_EQ(post_json(c, "/end_episode", req)["success"], true);
  }
  {
    json p = get_json(c, "/get_current_batch_rollout_pool_information");
    ASSERT_EQ(p["tasks"].size(), 1u) << p.dump();
    const json& t = p["tasks"][0];
    EXPECT_EQ(t["task_id"], "task-1");
    EXPECT_EQ(t["episodes"], 1);
    EXPECT_DOUBLE_EQ(t["reward_mean"].get<double>(), 1.0);
    EXPECT_TRUE(t["reward_std"].is_number());
    ASSERT_EQ(p["recent_rewards"].size(), 1u);
    EXPECT_EQ(p["running_episodes"].size(), 1u);
    EXPECT_EQ(p["counters"]["aborted"], 1);
    EXPECT_EQ(p["counters"]["ended"], 1);
  }

  // ---- metrics
  {
    auto r = c.request("GET", "/metrics");
    ASSERT_EQ(r.status, 200);
    EXPECT_NE(header_of(r, "content-type").find("text/plain"), std::string::npos);
    for (const char* needle :
         {"swarm_engine_state{state=\"ENGINE.ROLLING\"} 1", "swarm_global_step 0",
          "swarm_episodes_total{event=\"claimed\"} 3",
          "swarm_http_requests_total{route=\"/claim_episode\",status=\"200\"}",
          "swarm_http_request_duration_seconds_bucket{route=\"/v1/chat/completions\",le=\"+Inf\"}"})
      EXPECT_NE(r.body.find(needle), std::string::npos) << "missing " << needle << " in\n" << r.body;
  }

  // ---- the second episode of the task ends with task_id only inside "task": batch complete
  {
    json req = {{"client_uuid", "client-b"},
                {"episode_uuid", b.episode_uuid},
                {"task",
                 {{"task_id", "task-1"},
                  {"main_query", "q"},
                  {"init_messages", json::array()},
                  {"env_type", "test"},
                  {"metadata", json::object()}}},
                {"workflow_output",
                 {{"reward", 0.0},
                  {"is_success", false},
                  {"metadata", {{"k", "v"}}},
                  {"log_metrics", {{"turns", 2}}}}}};
    EXPECT_EQ(post_json(c, "/end_episode", req)["success"], true);
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  json status;
  do {
    status = get_json(c, "/get_engine_status");
    if (status["global_step"] == 1) break;
    std::this_thread::sleep_for(2ms);
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(status["global_step"], 1) << status.dump();
  EXPECT_EQ(status["policy_version"], 1);
  auto batches = server.batches->copy();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].episodes.size(), 2u);
  for (const auto& e : batches[0].episodes) {
    EXPECT_EQ(e.task_id, "task-1");
    EXPECT_TRUE(e.episode_uuid == a.episode_uuid || e.episode_uuid == b.episode_uuid);
  }

  // ---- the ended episodes' keys are revoked
  {
    json req = {{"model", "mock-model"}, {"messages", {{{"role", "user"}, {"content", "late"}}}}};
    post_json(llm_a, "/chat/completions", req, 401, bearer(a));
  }

  // ---- stop
  EXPECT_EQ(post_json(c, "/stop_engine", json::object())["success"], true);
  EXPECT_EQ(get_json(c, "/get_engine_status")["engine_status"], "ENGINE.OFFLINE");
  EXPECT_EQ(get_json(c, "/health")["engine_status"], "ENGINE.OFFLINE");
}

// What AgentJet's Python client may send in workflow_output: log_metrics whose values are
// lists (recorded as their mean) or objects (flattened to "name/key", non-numbers skipped),
// and a list reward (one per turn): read as turn rewards, the episode trained on their sum (a
// length other than the episode's calls is no error: AgentJet counts turns its own way).
TEST(WireProtocol, AgentJetShapedWorkflowOutputs) {
  TestServer server;
  HttpClient c(server.url());
  const uint16_t port = server.port();
  ASSERT_NO_FATAL_FAILURE(start_rolling(c, kConfig));

  json req = {{"client_uuid", "eval-client"}, {"episode_type", "eval"}, {"discard_episode_timeout", 120}};
  json ev = post_json(c, "/claim_episode", req);
  ASSERT_EQ(ev["success"], true) << ev.dump();
  json metrics = {
      {"score", 2},
      {"per_turn", {1, 3}},
      {"reward_stats", {{"final_reward", 0.5}, {"steps", {2, 4, 6}}, {"tag", "x"}, {"none", nullptr}}}};
  json end = post_json(c, "/end_episode",
                       {{"client_uuid", "eval-client"},
                        {"episode_uuid", ev["episode_uuid"]},
                        {"task_id", "t-eval"},
                        {"declare_client_active", true},
                        {"workflow_output",
                         {{"reward", 1.0},
                          {"is_success", true},
                          {"metadata", {{"task_id", "t-eval"}}},
                          {"log_metrics", metrics}}}});
  EXPECT_EQ(end["success"], true) << end.dump();
  json eval = get_json(c, "/get_current_batch_rollout_pool_information")["eval_metrics"];
  EXPECT_DOUBLE_EQ(eval.value("eval/score", -1.0), 2.0) << eval.dump();
  EXPECT_DOUBLE_EQ(eval.value("eval/per_turn", -1.0), 2.0) << eval.dump();
  EXPECT_DOUBLE_EQ(eval.value("eval/reward_stats/final_reward", -1.0), 0.5) << eval.dump();
  EXPECT_DOUBLE_EQ(eval.value("eval/reward_stats/steps", -1.0), 4.0) << eval.dump();
  EXPECT_FALSE(eval.contains("eval/reward_stats/tag")) << eval.dump();
  EXPECT_FALSE(eval.contains("eval/reward_stats/none")) << eval.dump();

  Claimed t = claim(c, "train-client", port);
  json list_reward =
      post_json(c, "/end_episode",
                {{"client_uuid", "train-client"},
                 {"episode_uuid", t.episode_uuid},
                 {"task_id", "t1"},
                 {"workflow_output", {{"reward", {1.0, 0.0, 0.5}}, {"metadata", {{"task_id", "t1"}}}}}});
  EXPECT_EQ(list_reward["success"], true) << list_reward.dump();
  EXPECT_EQ(list_reward["accepted"], true) << list_reward.dump();
  EXPECT_NE(list_reward.value("note", "")
                .find("list reward of 3 values for 0 LLM calls: trained on their sum (1.5"),
            std::string::npos)
      << list_reward.dump();
  json info = get_json(c, "/get_current_batch_rollout_pool_information");
  EXPECT_EQ(info["counters"]["ended_without_reward"], 0) << info.dump();
  EXPECT_EQ(info["counters"]["ended_with_turn_rewards"], 1) << info.dump();
  ASSERT_EQ(info["turn_reward_episodes"].size(), 1u) << info.dump();
  EXPECT_EQ(info["turn_reward_episodes"][0]["episode_uuid"], t.episode_uuid);
  EXPECT_EQ(info["turn_reward_episodes"][0]["task_id"], "t1");
  EXPECT_EQ(info["turn_reward_episodes"][0]["turn_rewards"], json({1.0, 0.0, 0.5}));
  EXPECT_EQ(info["completed_episodes"], 1) << info.dump();

  // Still refused: a list with something other than numbers, a top-level string metric.
  Claimed u = claim(c, "train-client", port);
  json bad = post_json(c, "/end_episode",
                       {{"client_uuid", "train-client"},
                        {"episode_uuid", u.episode_uuid},
                        {"task_id", "t1"},
                        {"workflow_output", {{"reward", {1.0, "high"}}}}},
                       400);
  EXPECT_NE(bad.value("detail", "").find("workflow_output.reward"), std::string::npos) << bad.dump();
  bad = post_json(c, "/end_episode",
                  {{"client_uuid", "train-client"},
                   {"episode_uuid", u.episode_uuid},
                   {"task_id", "t1"},
                   {"workflow_output", {{"reward", 1.0}, {"log_metrics", {{"per_turn", {1, "x"}}}}}}},
                  400);
  EXPECT_NE(bad.value("detail", "").find("log_metrics.per_turn"), std::string::npos) << bad.dump();
}

// AgentJet's client discards an episode quietly only on a 400 whose `detail` names
// WEIGHT_SYNCING; any other answer makes it raise (and rerun the whole rollout).
TEST(WireProtocol, LateEndDuringWeightSyncIs400NamingTheState) {
  TestServer server;
  HttpClient c(server.url());
  const uint16_t port = server.port();
  const std::string config =
      "model: mock-model\nbatch_size: 1\nnum_repeat: 1\nmax_parallel_episodes: 2\nmock_train_seconds: 30\n";
  ASSERT_NO_FATAL_FAILURE(start_rolling(c, config));
  Claimed a = claim(c, "client-a", port);
  Claimed b = claim(c, "client-b", port);
  auto end_body = [](const std::string& client, const Claimed& e) {
    return json{{"client_uuid", client},
                {"episode_uuid", e.episode_uuid},
                {"task_id", "t"},
                {"workflow_output", {{"reward", 1.0}, {"metadata", {{"task_id", "t"}}}}}};
  };
  EXPECT_EQ(post_json(c, "/end_episode", end_body("client-a", a))["success"], true);
  // b is still running: ROLLING_POST; it gives up, the batch is drained, the step trains.
  EXPECT_EQ(post_json(c, "/abort_episode",
                      {{"client_uuid", "client-b"}, {"episode_uuid", b.episode_uuid}})["success"],
            true);
  ASSERT_TRUE(poll_engine_status(c, "ENGINE.WEIGHT_SYNCING"));
  json late = post_json(c, "/end_episode", end_body("client-b", b), 400);
  EXPECT_NE(late.value("detail", "").find("WEIGHT_SYNCING"), std::string::npos) << late.dump();
  EXPECT_EQ(post_json(c, "/stop_engine", json::object())["success"], true);
}

// AgentJet's client names the task an episode is for in throttle_policy.current_task_id;
// the pool shows it as the running episode's optional_task_id.
TEST(WireProtocol, ThrottlePolicyTaskIdIsTheRunningEpisodesOptionalTaskId) {
  TestServer server;
  HttpClient c(server.url());
  ASSERT_NO_FATAL_FAILURE(start_rolling(c, kConfig));
  json claimed = post_json(c, "/claim_episode",
                           {{"client_uuid", "throttled"},
                            {"episode_type", "train"},
                            {"discard_episode_timeout", 240},
                            {"throttle_policy",
                             {{"ratio", 1.5},
                              {"expected_batch_size", 1},
                              {"expected_num_repeat", 2},
                              {"current_task_id", "task-7"}}}});
  ASSERT_EQ(claimed["success"], true) << claimed.dump();
  json plain = post_json(c, "/claim_episode", {{"client_uuid", "plain"}, {"throttle_policy", nullptr}});
  ASSERT_EQ(plain["success"], true) << plain.dump();
  json running = get_json(c, "/get_current_batch_rollout_pool_information")["running_episodes"];
  ASSERT_EQ(running.size(), 2u) << running.dump();
  EXPECT_EQ(running[0]["episode_uuid"], claimed["episode_uuid"]);
  EXPECT_EQ(running[0]["optional_task_id"], "task-7");
  EXPECT_EQ(running[1]["optional_task_id"], "");
  json bad = post_json(c, "/claim_episode",
                       {{"client_uuid", "x"}, {"throttle_policy", {{"current_task_id", 7}}}}, 400);
  EXPECT_NE(bad.value("detail", "").find("current_task_id"), std::string::npos) << bad.dump();
  bad = post_json(c, "/claim_episode", {{"client_uuid", "x"}, {"throttle_policy", "fast"}}, 400);
  EXPECT_NE(bad.value("detail", "").find("throttle_policy"), std::string::npos) << bad.dump();
}

// A backend whose first token takes a while (a long prefill, a full KV cache).
// A generation in flight holds the engine's backend (its lease), so the last reference can drop
// on one of these threads once the server has stopped: that thread is detached, not joined.
class SlowFirstTokenBackend : public swarm::MockBackend {
 public:
  ~SlowFirstTokenBackend() override {
    for (auto& t : threads_) {
      if (t.get_id() == std::this_thread::get_id())
        t.detach();
      else
        t.join();
    }
  }
  void generate(swarm::GenerationRequest request,
                std::shared_ptr<swarm::GenerationObserver> observer) override {
    std::lock_guard lk(mu_);
    threads_.emplace_back([this, request = std::move(request), observer = std::move(observer)]() mutable {
      std::this_thread::sleep_for(600ms);
      MockBackend::generate(std::move(request), std::move(observer));
    });
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

// Streamed answers open at once and carry SSE comments while silent, so clients and proxies
// with idle watchdogs keep waiting; SSE clients skip comment lines.
TEST(WireProtocol, SilentStreamsGetKeepAliveComments) {
  TestServer server([] { return std::make_unique<SlowFirstTokenBackend>(); }, 0.05, 100ms);
  HttpClient c(server.url());
  ASSERT_NO_FATAL_FAILURE(start_rolling(c, kConfig));
  Claimed a = claim(c, "client-a", server.port());
  HttpClient llm(a.base_url);
  json req = {{"model", "m"},
              {"messages", {{{"role", "user"}, {"content", "slow"}}}},
              {"stream", true},
              {"temperature", 0}};  // the mock then echoes exactly
  auto r = llm.request("POST", "/chat/completions", req.dump(), bearer(a));
  ASSERT_EQ(r.status, 200) << r.body;
  const size_t comment = r.body.find(": keep-alive\n\n");
  const size_t first_text = r.body.find("\"content\":\"s\"");
  ASSERT_NE(comment, std::string::npos) << r.body;
  ASSERT_NE(first_text, std::string::npos) << r.body;
  EXPECT_LT(comment, first_text);
  auto events = sse_events(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i)
    EXPECT_FALSE(json::parse(events[i], nullptr, false).is_discarded());
  // AgentJet's overwatch replays the last call: the request as sent, the stream as one completion.
  json replay = post_json(c, "/replay_latest_llm_call", json::object());
  EXPECT_EQ(replay["input"], req);
  EXPECT_EQ(replay["output"]["object"], "chat.completion");
  EXPECT_EQ(replay["output"]["choices"][0]["message"]["content"], "slow") << replay.dump();
}

// A backend that keeps its generations until it is released and then, after a pause, ends each
// with an error, as the torch engine's scheduler does when the server stops.
class HoldingBackend : public swarm::MockBackend {
 public:
  struct Probe {
    std::atomic<int> held{0};
    std::atomic<bool> released{false};
  };
  explicit HoldingBackend(std::shared_ptr<Probe> probe) : probe_(std::move(probe)) {}
  void generate(swarm::GenerationRequest, std::shared_ptr<swarm::GenerationObserver> observer) override {
    std::lock_guard lk(mu_);
    held_.push_back(std::move(observer));
    ++probe_->held;
  }
  void release() override {
    std::this_thread::sleep_for(300ms);
    std::vector<std::shared_ptr<swarm::GenerationObserver>> held;
    {
      std::lock_guard lk(mu_);
      held.swap(held_);
    }
    for (auto& o : held) o->on_error(swarm::ErrorKind::UNAVAILABLE, "the engine was stopped");
    probe_->released = true;
  }

 private:
  std::shared_ptr<Probe> probe_;
  std::mutex mu_;
  std::vector<std::shared_ptr<swarm::GenerationObserver>> held_;
};

// Stopping the server with generations in flight: stop() returns only once the engine has
// shut down, its backend released and every generation ended, so nothing the answers touch
// (the metrics, the last call, the service) is destroyed under them (docs/reliability.md,
// "Shutdown"). Before, stop() only posted the release, and the server's members went while
// the backend still ended generations.
TEST(WireProtocol, StopWaitsForTheGenerationsInFlightToEnd) {
  auto probe = std::make_shared<HoldingBackend::Probe>();
  auto server = std::make_unique<TestServer>([probe] { return std::make_unique<HoldingBackend>(probe); });
  HttpClient c(server->url());
  ASSERT_NO_FATAL_FAILURE(start_rolling(c, kConfig));
  Claimed a = claim(c, "client-a", server->port());
  std::vector<std::thread> clients;
  for (bool stream : {true, false}) {
    clients.emplace_back([&, stream] {
      HttpClient llm(a.base_url, 30s);
      json req = {
          {"model", "m"}, {"messages", {{{"role", "user"}, {"content", "held"}}}}, {"stream", stream}};
      try {
        (void)llm.request("POST", "/chat/completions", req.dump(), bearer(a));
      } catch (const std::exception&) {
        // the server closes the connection as it stops: either is fine here
      }
    });
  }
  for (int i = 0; i < 400 && probe->held < 2; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(probe->held, 2);
  server->server->stop();
  EXPECT_TRUE(probe->released) << "stop() returned before the backend was released";
  for (auto& t : clients) t.join();
  server.reset();  // the members go; the ended generations touched only what they share
}

// Turn 2 of every OpenAI-SDK / LangChain tool loop: the assistant turn that called a tool
// comes back with content null, the tool's answer may be a list of text parts.
TEST(WireProtocol, ToolLoopMessagesRender) {
  TestServer server;
  HttpClient c(server.url());
  ASSERT_NO_FATAL_FAILURE(start_rolling(c, kConfig));
  Claimed a = claim(c, "client-a", server.port());
  HttpClient llm(a.base_url);
  const json call = {
      {"id", "call_1"}, {"type", "function"}, {"function", {{"name", "add"}, {"arguments", "{\"a\":2}"}}}};
  json req = {
      {"model", "m"},
      {"temperature", 0},
      {"tools", json::array({{{"type", "function"}, {"function", {{"name", "add"}}}}})},
      {"tool_choice", "auto"},
      {"parallel_tool_calls", false},
      {"messages",
       json::array({{{"role", "user"}, {"content", "add 2"}},
                    {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({call})}},
                    {{"role", "tool"},
                     {"tool_call_id", "call_1"},
                     {"content", json::array({{{"type", "text"}, {"text", "4"}},
                                              {{"type", "text"}, {"text", "2"}}})}}})}};
  json r = post_json(llm, "/chat/completions", req, 200, bearer(a));
  EXPECT_EQ(r["choices"][0]["message"]["content"], "42")
      << r.dump();  // the mock answers with the tool's text
}

// The mock answers a user message with its text, so a scripted `<tool_call>` comes back as a
// generated tool call: parsed (hermes, detected from the template) into message.tool_calls.
TEST(WireProtocol, GeneratedToolCallsAndReasoningAreParsed) {
  TestServer server;
  HttpClient c(server.url());
  const std::string config = std::string(kConfig) + "reasoning_parser: think\n";
  ASSERT_NO_FATAL_FAILURE(start_rolling(c, config));
  Claimed a = claim(c, "client-a", server.port());
  HttpClient llm(a.base_url);
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "add"}}}}});
  const std::string scripted =
      "<think>\nadd them\n</think>\n\nLet me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": "
      "2,  \"b\": 3}}\n</tool_call>";
  auto request = [&](bool stream, const json& extra = json::object()) {
    json req = {{"model", "m"},
                {"temperature", 0},
                {"tools", tools},
                {"messages", {{{"role", "user"}, {"content", scripted}}}}};
    if (stream) req["stream"] = true;
    for (auto it = extra.begin(); it != extra.end(); ++it) req[it.key()] = it.value();
    return llm.request("POST", "/chat/completions", req.dump(), bearer(a));
  };
  // Non-streamed.
  json r = parse_body(request(false));
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
  EXPECT_EQ(choice["message"]["content"], "Let me add.");
  EXPECT_EQ(choice["message"]["reasoning_content"], "add them");
  EXPECT_EQ(choice["message"]["reasoning"], "add them");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.dump();
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "add");
  EXPECT_EQ(call["function"]["arguments"], "{\"a\": 2,  \"b\": 3}");  // exactly as generated
  // Streamed: role first, reasoning and content deltas, then the call (id + name first).
  auto sr = request(true);
  ASSERT_EQ(sr.status, 200) << sr.body;
  std::string reasoning, content, args;
  json first_call;
  std::string finish;
  for (const std::string& ev : sse_events(sr.body)) {
    if (ev == "[DONE]") break;
    json j = json::parse(ev);
    const json& d = j["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      const json& tc = d["tool_calls"][0];
      if (first_call.is_null()) first_call = tc;
      args += tc["function"].value("arguments", "");
    }
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "add them");
  EXPECT_EQ(content, "Let me add.");
  EXPECT_EQ(first_call["index"], 0) << sr.body;
  EXPECT_TRUE(first_call["id"].is_string()) << sr.body;
  EXPECT_EQ(first_call["function"]["name"], "add") << sr.body;
  EXPECT_EQ(args, "{\"a\": 2,  \"b\": 3}");
  EXPECT_EQ(finish, "tool_calls");
  // tool_choice none: nothing parsed, the text stays content.
  r = parse_body(request(false, {{"tool_choice", "none"}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_NE(r["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos);
  // A block that does not parse stays in content, is counted, and is never a 500.
  json bad = {{"model", "m"},
              {"temperature", 0},
              {"tools", tools},
              {"messages", {{{"role", "user"}, {"content", "<tool_call>{\"name\": add}</tool_call>"}}}}};
  auto br = llm.request("POST", "/chat/completions", bad.dump(), bearer(a));
  ASSERT_EQ(br.status, 200) << br.body;
  EXPECT_EQ(parse_body(br)["choices"][0]["message"]["content"], "<tool_call>{\"name\": add}</tool_call>");
  auto metrics = c.request("GET", "/metrics");
  EXPECT_NE(metrics.body.find("swarm_tool_call_parse_failures_total 1"), std::string::npos) << metrics.body;
}

// Structured outputs on the mock engine, which answers a constrained request with a
// random sentence of the grammar: the content is JSON of the schema, a forced tool call is a
// call of the named tool with arguments of its parameters schema.
TEST(WireProtocol, ResponseFormatAndForcedToolCallsAreConstrained) {
  TestServer server;
  HttpClient c(server.url());
  ASSERT_NO_FATAL_FAILURE(start_rolling(c, kConfig));
  Claimed a = claim(c, "client-a", server.port());
  HttpClient llm(a.base_url);
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"city", {{"type", "string"}, {"maxLength", 12}}},
                         {"rank", {{"type", "integer"}, {"minimum", 1}, {"maximum", 9}}},
                         {"kind", {{"enum", {"big", "small"}}}}}},
                       {"required", {"city", "rank", "kind"}},
                       {"additionalProperties", false}};
  for (int seed = 0; seed < 8; ++seed) {
    json req = {{"model", "m"},
                {"seed", seed},
                {"max_tokens", 200},
                {"messages", {{{"role", "user"}, {"content", "a city"}}}},
                {"response_format",
                 {{"type", "json_schema"},
                  {"json_schema", {{"name", "city"}, {"schema", schema}, {"strict", true}}}}}};
    json r = post_json(llm, "/chat/completions", req, 200, bearer(a));
    const std::string content = r["choices"][0]["message"]["content"];
    const json doc = json::parse(content, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << content;
    EXPECT_TRUE(doc["city"].is_string() && doc["city"].get<std::string>().size() <= 12 * 4) << content;
    EXPECT_TRUE(doc["rank"].is_number_integer() && doc["rank"] >= 1 && doc["rank"] <= 9) << content;
    EXPECT_TRUE(doc["kind"] == "big" || doc["kind"] == "small") << content;
    EXPECT_EQ(doc.size(), 3u) << content;
    req["response_format"] = {{"type", "json_object"}};
    r = post_json(llm, "/chat/completions", req, 200, bearer(a));
    EXPECT_TRUE(
        json::parse(r["choices"][0]["message"]["content"].get<std::string>(), nullptr, false).is_object())
        << r.dump();
  }
  const json tools = json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "add"},
          {"parameters",
           {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}}}}}},
       {{"type", "function"},
        {"function",
         {{"name", "echo"},
          {"parameters",
           {{"type", "object"}, {"properties", {{"s", {{"type", "string"}}}}}, {"required", {"s"}}}}}}}});
  for (const json& choice :
       {json("required"), json{{"type", "function"}, {"function", {{"name", "echo"}}}}}) {
    for (int seed = 0; seed < 4; ++seed) {
      json req = {{"model", "m"},
                  {"seed", seed},
                  {"max_tokens", 200},
                  {"tools", tools},
                  {"tool_choice", choice},
                  {"parallel_tool_calls", false},
                  {"messages", {{{"role", "user"}, {"content", "go"}}}}};
      json r = post_json(llm, "/chat/completions", req, 200, bearer(a));
      const json& ch = r["choices"][0];
      ASSERT_EQ(ch["finish_reason"], "tool_calls") << r.dump();
      ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << r.dump();
      const json& fn = ch["message"]["tool_calls"][0]["function"];
      const json args = json::parse(fn["arguments"].get<std::string>());
      if (choice.is_object()) {
        EXPECT_EQ(fn["name"], "echo");
      }
      if (fn["name"] == "add") {
        EXPECT_TRUE(args["a"].is_number_integer()) << r.dump();
      } else {
        EXPECT_TRUE(args["s"].is_string()) << r.dump();
      }
    }
  }
}

TEST(WireProtocol, StartAndStopAcceptAnEmptyBodyAsPythonRequestsSendsIt) {
  TestServer server;
  HttpClient c(server.url());
  EXPECT_EQ(post_json(c, "/sync_train_config", {{"yaml_as_string", kConfig}})["success"], true);
  auto r = c.request("POST", "/start_engine", "", {}, "application/json");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse_body(r)["success"], true);
  ASSERT_TRUE(server.engine().wait_for_state(swarm::EngineState::ROLLING, 10s));
  r = c.request("POST", "/stop_engine", "", {}, "application/json");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse_body(r)["success"], true);
  EXPECT_EQ(get_json(c, "/get_engine_status")["engine_status"], "ENGINE.OFFLINE");
}

}  // namespace

namespace {

// Finer rewards and agent names: `swarm.agent` / `x-swarm-agent` name each call's
// agent, workflow_output.turn_rewards / token_rewards must match the episode's calls (400s
// naming the numbers), and what is accepted reaches the training batch: the episode's turn
// rewards, each merged call's agent and turn index, the token rewards on the generated tokens.
TEST(WireProtocol, AgentNamesTurnRewardsAndTokenRewardsReachTheBatch) {
  TestServer server;
  HttpClient c(server.url());
  ASSERT_NO_FATAL_FAILURE(
      start_rolling(c, "model: mock-model\nbatch_size: 1\nnum_repeat: 1\ngroup_by: task_agent_turn\n"));
  const Claimed e = claim(c, "client-a", server.port());
  HttpClient llm(e.base_url);
  json messages = json::array({{{"role", "user"}, {"content", "plan it"}}});
  json first = post_json(llm, "/chat/completions",
                         {{"messages", messages},
                          {"temperature", 0},
                          {"return_token_ids", true},
                          {"swarm", {{"agent", "planner"}}}},
                         200, bearer(e));
  messages.push_back(first["choices"][0]["message"]);
  messages.push_back({{"role", "user"}, {"content", "check it"}});
  Headers checker = bearer(e);
  checker.push_back({"x-swarm-agent", "checker"});
  json second =
      post_json(llm, "/chat/completions",
                {{"messages", messages}, {"temperature", 0}, {"return_token_ids", true}}, 200, checker);
  post_json(llm, "/chat/completions", {{"messages", messages}, {"swarm", 5}}, 400, bearer(e));
  post_json(llm, "/chat/completions", {{"messages", messages}, {"swarm", {{"agent", std::string(65, 'a')}}}},
            400, bearer(e));
  const size_t n0 = first["choices"][0]["token_ids"].size(), n1 = second["choices"][0]["token_ids"].size();

  const auto end = [&](json output, int status) {
    output["metadata"] = json::object();
    return post_json(c, "/end_episode",
                     {{"client_uuid", "client-a"},
                      {"episode_uuid", e.episode_uuid},
                      {"task_id", "t"},
                      {"workflow_output", output}},
                     status);
  };
  json bad = end({{"reward", 1.0}, {"turn_rewards", {1.0, 0.0, 0.0}}}, 400);
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("turn_rewards has 3 numbers but episode"),
            std::string::npos)
      << bad.dump();
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("made 2 LLM calls"), std::string::npos)
      << bad.dump();
  bad = end(
      {{"reward", 1.0}, {"token_rewards", {std::vector<double>(n0, 0.0), std::vector<double>(n1 + 1, 0.0)}}},
      400);
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("token_rewards[1] has " + std::to_string(n1 + 1) +
                                                            " numbers"),
            std::string::npos)
      << bad.dump();
  end({{"reward", 1.0}, {"turn_rewards", {1.0, "x"}}}, 400);
  end({{"reward", {1.0, 2.0}}, {"turn_rewards", {1.0, 0.0}}}, 400);  // a list reward and turn_rewards: which?

  std::vector<double> tr0(n0, 0.0), tr1(n1, 0.0);
  tr0.back() = 1.0;
  tr1.front() = -1.0;
  json ok = end({{"reward", 1.0}, {"turn_rewards", {1.0, 0.25}}, {"token_rewards", {tr0, tr1}}}, 200);
  EXPECT_EQ(ok["accepted"], true) << ok.dump();
  ASSERT_TRUE(server.engine().wait_for_step(1, 10s));
  const auto batches = server.batches->copy();
  ASSERT_EQ(batches.size(), 1u);
  const auto& ep = batches[0].episodes.at(0);
  EXPECT_EQ(ep.turn_rewards, (std::vector<double>{1.0, 0.25}));
  ASSERT_EQ(ep.samples.size(), 1u);
  const auto& s = ep.samples[0];
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].agent, "planner");
  EXPECT_EQ(s.calls[1].agent, "checker");
  EXPECT_EQ(s.calls[1].index, 1);
  EXPECT_EQ(s.calls[1].turn, 0);  // the checker's first call
  ASSERT_EQ(s.token_rewards.size(), s.token_ids.size());
  ASSERT_EQ(s.token_call.size(), s.token_ids.size());
  // Token by token: rewards only where they were earned, on the call that earned them.
  std::vector<float> earned;
  for (size_t t = 0; t < s.token_ids.size(); ++t) {
    if (s.token_call[t] < 0) {
      EXPECT_EQ(s.token_rewards[t], 0.0f) << t;
      EXPECT_EQ(s.loss_mask[t], 0) << t;
      continue;
    }
    earned.push_back(s.token_rewards[t]);
  }
  std::vector<float> expected(tr0.begin(), tr0.end());
  expected.insert(expected.end(), tr1.begin(), tr1.end());
  EXPECT_EQ(earned, expected);
}

}  // namespace
