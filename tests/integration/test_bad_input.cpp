// Bad input over the wire: every bad request gets a fitting status and a clear JSON error,
// the server stays healthy, and a "bystander" episode that behaves well is never disturbed
// (it keeps chatting after each bad request and is trained on at the end).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "http/http_client.hpp"
#include "support/http_helpers.hpp"
#include "support/test_server.hpp"

using json = nlohmann::json;
using namespace std::chrono_literals;
using swarm::HttpClient;
using swarm::HttpClientResponse;
using swarm::testing::header_of;
using swarm::testing::Headers;
using swarm::testing::TestServer;

namespace {

constexpr size_t kMaxBody = 64 * 1024;
const char* kBaseConfig =
    "model: mock-model\n"
    "batch_size: 1\n"
    "num_repeat: 1\n"
    "max_parallel_episodes: 8\n";

const char* kBystanderClient = "bystander-client";
const char* kVictimClient = "victim-client";

struct Episode {
  std::string client_uuid;
  std::string episode_uuid;
  std::string api_key;
};

// Sends raw bytes on a fresh TCP connection and returns whatever comes back before the
// server closes (or 5 s pass, which fails the caller's expectations).
std::string raw_exchange(uint16_t port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "<socket failed>";
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "<connect failed>";
  }
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close on garbage before reading it all
    sent += static_cast<size_t>(n);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) out += "<timeout>";
    break;  // 0: closed; < 0: reset or timeout
  }
  ::close(fd);
  return out;
}

class BadInput : public ::testing::Test {
 protected:
  // Starts a server with `extra_yaml` appended to the base config, claims the bystander
  // (one chat call made) and a victim episode owned by another client (used as the target
  // of bad requests that name an episode).
  void start(const std::string& extra_yaml = "max_prompt_length: 8192\n") {
    server_ = std::make_unique<TestServer>(0.05, max_body_);
    c_ = std::make_unique<HttpClient>(server_->url(), 10s);
    swarm::testing::post_json(*c_, "/sync_train_config",
                              {{"yaml_as_string", std::string(kBaseConfig) + extra_yaml}});
    swarm::testing::post_json(*c_, "/start_engine", json::object());
    ASSERT_FALSE(HasFailure()) << "the config or the start was refused";
    ASSERT_TRUE(server_->engine().wait_for_state(swarm::EngineState::ROLLING, 10s));
    bystander_ = claim(kBystanderClient);
    victim_ = claim(kVictimClient);
    ASSERT_FALSE(bystander_.api_key.empty());
    ASSERT_FALSE(victim_.api_key.empty());
    bystander_llm_ = std::make_unique<HttpClient>(server_->url() + "/v1", 10s);
    bystander_turn();
  }

  HttpClientResponse post(const std::string& path, const std::string& body, const Headers& headers = {}) {
    return swarm::testing::post_raw(*c_, path, body, headers);
  }
  HttpClientResponse chat(const Episode& e, const std::string& body) {
    HttpClient llm(server_->url() + "/v1", 10s);
    return llm.request("POST", "/chat/completions", body, swarm::testing::bearer(e.api_key));
  }
  HttpClientResponse chat(const Episode& e, const json& body) { return chat(e, body.dump()); }

  Episode claim(const std::string& client, const std::string& type = "train") {
    auto r = post(
        "/claim_episode",
        json({{"client_uuid", client}, {"episode_type", type}, {"discard_episode_timeout", 120}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_EQ(j.value("success", false), true) << r.body;
    return {client, j.value("episode_uuid", ""), j.value("openai_api_key", "")};
  }

  // One more turn of the bystander's conversation. Each prompt extends the previous prompt
  // + completion, so all turns merge into one training sample.
  void bystander_turn() {
    conversation_.push_back({{"role", "user"}, {"content", "1"}});
    auto r = bystander_llm_->request("POST", "/chat/completions",
                                     json({{"model", "mock-model"}, {"messages", conversation_}}).dump(),
                                     swarm::testing::bearer(bystander_.api_key));
    ASSERT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.body;
    ASSERT_EQ(j["choices"][0]["finish_reason"], "stop") << r.body;
    conversation_.push_back({{"role", "assistant"}, {"content", j["choices"][0]["message"]["content"]}});
    ++turns_;
  }

  // After every bad request: the server answers, the bystander still chats and may go on.
  void expect_healthy(const std::string& after) {
    SCOPED_TRACE("after " + after);
    HttpClient fresh(server_->url(), 10s);
    auto h = fresh.request("GET", "/health");
    EXPECT_EQ(h.status, 200) << h.body;
    bystander_turn();
    auto r =
        post("/can_continue_episode",
             json({{"client_uuid", kBystanderClient}, {"episode_uuid", bystander_.episode_uuid}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body, nullptr, false), json({{"can_continue", true}})) << r.body;
  }

  // Checks the error shape; returns the message.
  std::string expect_error(const HttpClientResponse& r, int status, const std::string& needle,
                           bool command_route, const std::string& what) {
    EXPECT_EQ(r.status, status) << what << ": " << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.is_object()) << what << ": body is not a JSON object: " << r.body;
    if (!j.is_object()) return "";
    EXPECT_TRUE(j.contains("error") && j["error"].is_object()) << what << ": " << r.body;
    if (!j.contains("error") || !j["error"].is_object()) return "";
    const json& e = j["error"];
    EXPECT_TRUE(e.contains("message") && e["message"].is_string()) << what << ": " << r.body;
    EXPECT_TRUE(e.contains("type") && e["type"].is_string()) << what << ": " << r.body;
    EXPECT_TRUE(e.contains("code") && (e["code"].is_string() || e["code"].is_null()))
        << what << ": " << r.body;
    const std::string message = e.value("message", "");
    EXPECT_FALSE(message.empty()) << what;
    // FastAPI's top-level `detail`, which AgentJet's Python client reads, says the same.
    EXPECT_TRUE(j.contains("detail") && j["detail"].is_string()) << what << ": " << r.body;
    EXPECT_EQ(j.value("detail", ""), message) << what;
    if (!needle.empty()) {
      EXPECT_NE(message.find(needle), std::string::npos)
          << what << ": message '" << message << "' does not mention " << needle;
    }
    if (command_route) {
      EXPECT_EQ(j.value("success", true), false) << what << ": " << r.body;
    }
    return message;
  }

  // A command POST that must fail; then the health checks.
  void command_error(const std::string& path, const std::string& body, int status,
                     const std::string& needle) {
    const std::string what = "POST " + path + " " + body.substr(0, 80);
    expect_error(post(path, body), status, needle, /*command_route=*/true, what);
    expect_healthy(what);
  }
  void expect_nothing_to_abort(const std::string& client, const std::string& episode) {
    auto r = post("/abort_episode", json({{"client_uuid", client}, {"episode_uuid", episode}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_EQ(j.value("success", false), true) << r.body;
    EXPECT_NE(j.value("note", "").find("nothing to abort"), std::string::npos) << r.body;
    expect_healthy("abort of " + episode);
  }
  void chat_error(const Episode& e, const json& body, int status, const std::string& needle) {
    const std::string what = "chat " + body.dump().substr(0, 80);
    expect_error(chat(e, body), status, needle, /*command_route=*/false, what);
    expect_healthy(what);
  }

  json end_body(const Episode& e, const json& workflow_output = {{"reward", 1.0}}) const {
    return {{"client_uuid", e.client_uuid},
            {"episode_uuid", e.episode_uuid},
            {"task_id", "t"},
            {"workflow_output", workflow_output}};
  }

  // Ends the test: aborts the victim, ends the bystander, and checks it was trained on with
  // every call in one sample; then that no request anywhere got a 500.
  void finish() {
    auto r = post("/abort_episode",
                  json({{"client_uuid", kVictimClient}, {"episode_uuid", victim_.episode_uuid}}).dump());
    EXPECT_EQ(r.status, 200) << "the victim must still be abortable: " << r.body;
    json end = {{"client_uuid", kBystanderClient},
                {"episode_uuid", bystander_.episode_uuid},
                {"task_id", "bystander-task"},
                {"workflow_output",
                 {{"reward", 1.0},
                  {"is_success", true},
                  {"metadata", json::object()},
                  {"log_metrics", json::object()}}}};
    r = post("/end_episode", end.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_TRUE(server_->engine().wait_for_step(1, 10s)) << server_->engine().status().detail;
    auto batches = server_->batches->copy();
    ASSERT_EQ(batches.size(), 1u);
    ASSERT_EQ(batches[0].episodes.size(), 1u);
    const auto& ep = batches[0].episodes[0];
    EXPECT_EQ(ep.episode_uuid, bystander_.episode_uuid);
    EXPECT_EQ(ep.task_id, "bystander-task");
    ASSERT_EQ(ep.samples.size(), 1u);
    EXPECT_EQ(ep.samples[0].num_calls, turns_);
    expect_no_500();
  }

  void expect_no_500() {
    auto m = c_->request("GET", "/metrics");
    ASSERT_EQ(m.status, 200);
    size_t pos = 0;
    while ((pos = m.body.find("swarm_http_requests_total{", pos)) != std::string::npos) {
      size_t eol = m.body.find('\n', pos);
      std::string line = m.body.substr(pos, eol - pos);
      EXPECT_EQ(line.find("status=\"500\""), std::string::npos) << line;
      pos = eol;
    }
  }

  size_t max_body_ = kMaxBody;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<HttpClient> c_;
  std::unique_ptr<HttpClient> bystander_llm_;
  Episode bystander_, victim_;
  json conversation_ = json::array();
  int turns_ = 0;
};

const char* kCommandPosts[] = {"/sync_train_config",    "/start_engine",      "/stop_engine",
                               "/claim_episode",        "/end_episode",       "/abort_episode",
                               "/can_continue_episode", "/agree_sync_weight", "/get_episode_buffer"};

TEST_F(BadInput, MalformedAndNonObjectBodiesOnEveryCommandRoute) {
  start();
  for (const char* path : kCommandPosts) {
    command_error(path, "{\"client_uuid\": ", 400, "not valid JSON");
    command_error(path, "{'single': 'quotes'}", 400, "not valid JSON");
    command_error(path, "[1,2]", 400, "JSON object");
    command_error(path, "\"x\"", 400, "JSON object");
  }
  command_error("/claim_episode", "", 400, "empty");
  command_error("/end_episode", "   ", 400, "empty");
  // The OpenAI routes too.
  expect_error(chat(victim_, std::string("{not json")), 400, "not valid JSON", false, "chat: malformed JSON");
  expect_healthy("chat: malformed JSON");
  expect_error(chat(victim_, std::string("[1,2]")), 400, "JSON object", false, "chat: array body");
  expect_healthy("chat: array body");
  expect_error(chat(victim_, std::string("")), 400, "empty", false, "chat: empty body");
  expect_healthy("chat: empty body");
  finish();
}

TEST_F(BadInput, WrongTypesAreRejectedNamingTheField) {
  start();
  command_error(
      "/claim_episode",
      json({{"client_uuid", 42}, {"episode_type", "train"}, {"discard_episode_timeout", 60}}).dump(), 400,
      "client_uuid");
  command_error(
      "/claim_episode",
      json({{"client_uuid", "x"}, {"episode_type", "train"}, {"discard_episode_timeout", "soon"}}).dump(),
      400, "discard_episode_timeout");
  command_error(
      "/claim_episode",
      json({{"client_uuid", "x"}, {"episode_type", "banana"}, {"discard_episode_timeout", 60}}).dump(), 400,
      "episode_type");
  command_error(
      "/claim_episode",
      json({{"client_uuid", "x"}, {"episode_type", "train"}, {"discard_episode_timeout", -1}}).dump(), 400,
      "discard_episode_timeout");
  json end = end_body(victim_);
  end["workflow_output"] = "great";
  command_error("/end_episode", end.dump(), 400, "workflow_output");
  command_error("/end_episode", end_body(victim_, {{"reward", "high"}}).dump(), 400, "reward");
  command_error("/end_episode", end_body(victim_, {{"reward", 1.0}, {"is_success", "yes"}}).dump(), 400,
                "is_success");
  command_error("/end_episode",
                end_body(victim_, {{"reward", 1.0}, {"log_metrics", {{"turns", "many"}}}}).dump(), 400,
                "log_metrics");
  command_error("/end_episode", end_body(victim_, {{"reward", 1.0}, {"metadata", "none"}}).dump(), 400,
                "metadata");
  end = end_body(victim_);
  end["episode_uuid"] = 7;
  command_error("/end_episode", end.dump(), 400, "episode_uuid");
  command_error("/abort_episode", json({{"client_uuid", kVictimClient}, {"episode_uuid", true}}).dump(), 400,
                "episode_uuid");
  command_error("/sync_train_config", json({{"yaml_as_string", 3}}).dump(), 400, "yaml_as_string");

  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  chat_error(victim_, {{"messages", msgs}, {"temperature", "hot"}}, 400, "temperature");
  chat_error(victim_, {{"messages", "hi"}}, 400, "messages");
  chat_error(victim_, {{"messages", json::array()}}, 400, "messages");
  chat_error(victim_, {{"messages", json::array({"hi"})}}, 400, "messages[0]");
  chat_error(victim_, {{"messages", json::array({{{"role", "wizard"}, {"content", "hi"}}})}}, 400, "role");
  chat_error(victim_, {{"messages", msgs}, {"n", 0}}, 400, "'n'");
  // Tool fields: each error names the field.
  const json tool = {{"type", "function"}, {"function", {{"name", "add"}, {"parameters", json::object()}}}};
  chat_error(victim_, {{"messages", msgs}, {"tools", "add"}}, 400, "'tools'");
  chat_error(victim_, {{"messages", msgs}, {"tools", json::array({nullptr})}}, 400, "tools[0]");
  chat_error(
      victim_,
      {{"messages", msgs}, {"tools", json::array({{{"type", "function"}, {"function", json::object()}}})}},
      400, "tools[0].function.name");
  chat_error(victim_, {{"messages", msgs}, {"tools", json::array({tool})}, {"tool_choice", 5}}, 400,
             "tool_choice");
  chat_error(victim_, {{"messages", msgs}, {"tools", json::array({tool})}, {"tool_choice", "always"}}, 400,
             "tool_choice");
  chat_error(victim_, {{"messages", msgs}, {"tool_choice", "required"}}, 400, "offers no 'tools'");
  // Structured outputs: schemas that cannot be honoured are refused, naming what.
  const auto with_schema = [&](const json& schema) {
    return json{
        {"messages", msgs},
        {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
  };
  chat_error(victim_, with_schema({{"type", "string"}, {"pattern", "^(?=a)b$"}}), 400, "lookaround");
  chat_error(victim_, with_schema({{"type", "number"}, {"minimum", 1}, {"exclusiveMaximum", 1}}), 400,
             "no number");
  chat_error(victim_, with_schema({{"type", "strin"}}), 400, "unknown type 'strin'");
  chat_error(victim_, with_schema({{"$ref", "#/$defs/nope"}}), 400, "#/$defs/nope");
  chat_error(victim_, with_schema({{"type", "array"}, {"maxItems", 1000000}}), 400, "maxItems");
  // Small to send, too large to compile: 100 arrays of up to 256 items (the grammar is bounded).
  json huge = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 100; ++i)
    huge["properties"]["p" + std::to_string(i)] = {{"type", "array"}, {"maxItems", 256}};
  chat_error(victim_, with_schema(huge), 400, "schema too large");
  chat_error(victim_, {{"messages", msgs}, {"response_format", {{"type", "json_schema"}}}}, 400,
             "response_format.json_schema");
  chat_error(
      victim_,
      {{"messages", msgs},
       {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", 5}}}}}},
      400, "response_format.json_schema.schema");
  const json bad_tool = {
      {"type", "function"},
      {"function", {{"name", "add"}, {"parameters", {{"type", "object"}, {"not", json::object()}}}}}};
  chat_error(victim_, {{"messages", msgs}, {"tools", json::array({bad_tool})}, {"tool_choice", "required"}},
             400, "tools[0].function.parameters");
  chat_error(victim_,
             {{"messages", msgs},
              {"tools", json::array({tool})},
              {"tool_choice", {{"type", "function"}, {"function", {{"name", "mul"}}}}}},
             400, "'mul'");
  chat_error(victim_, {{"messages", msgs}, {"parallel_tool_calls", "yes"}}, 400, "parallel_tool_calls");
  chat_error(victim_, {{"messages", msgs}, {"response_format", "json"}}, 400, "response_format");
  chat_error(victim_, {{"messages", msgs}, {"response_format", {{"type", "yaml"}}}}, 400,
             "response_format.type");
  chat_error(victim_, {{"messages", msgs}, {"chat_template_kwargs", json::array()}}, 400,
             "chat_template_kwargs");
  chat_error(victim_,
             {{"messages",
               json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "tool"}, {"content", "5"}}})}},
             400, "messages[1].tool_call_id");
  chat_error(victim_, {{"messages", msgs}, {"max_tokens", -5}}, 400, "max_tokens");
  chat_error(victim_, {{"messages", msgs}, {"top_logprobs", 2}}, 400, "top_logprobs");
  chat_error(victim_, {{"messages", msgs}, {"stream", "yes"}}, 400, "stream");
  chat_error(victim_, {{"messages", msgs}, {"stop", 5}}, 400, "stop");
  chat_error(victim_, {{"messages", msgs}, {"top_p", 0}}, 400, "top_p");
  chat_error(victim_, {{"messages", msgs}, {"max_tokens", 1.5}}, 400, "max_tokens");
  chat_error(victim_, {{"messages", msgs}, {"n", 17}}, 400, "'n'");
  chat_error(victim_, {{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}}, 400, "top_logprobs");
  chat_error(victim_, {{"messages", msgs}, {"logprobs", "yes"}}, 400, "logprobs");
  chat_error(victim_, {{"messages", msgs}, {"stream_options", "usage"}}, 400, "stream_options");
  chat_error(victim_, {{"messages", msgs}, {"tools", "none"}}, 400, "tools");
  chat_error(victim_, {{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, 400, "content");
  chat_error(victim_, {{"messages", json::array({{{"content", "no role"}}})}}, 400, "role");
  {
    HttpClient llm(server_->url() + "/v1", 10s);
    const Headers auth = {{"Authorization", "Bearer " + victim_.api_key}};
    for (const json& bad :
         {json({{"prompt", json::array()}}), json({{"prompt", {-1}}}), json({{"prompt", {1.5}}}),
          json({{"prompt", 5}}), json({{"prompt", "x"}, {"logprobs", 6}})}) {
      const std::string what = "completions " + bad.dump();
      const char* field = bad.contains("logprobs") ? "logprobs" : "prompt";
      expect_error(llm.request("POST", "/completions", bad.dump(), auth), 400, field, false, what);
      expect_healthy(what);
    }
  }
  // A number too large for a double: not valid JSON, or not a finite temperature; 400 either way.
  expect_error(
      chat(victim_, std::string(R"({"messages":[{"role":"user","content":"hi"}],"temperature":1e400})")), 400,
      "1e400", false, "temperature 1e400");
  expect_healthy("temperature 1e400");
  finish();
}

TEST_F(BadInput, MissingFieldsAreRejectedNamingTheField) {
  start();
  command_error("/claim_episode", json({{"episode_type", "train"}, {"discard_episode_timeout", 60}}).dump(),
                400, "client_uuid");
  json end = end_body(victim_);
  end.erase("episode_uuid");
  command_error("/end_episode", end.dump(), 400, "episode_uuid");
  end = end_body(victim_);
  end.erase("task_id");
  command_error("/end_episode", end.dump(), 400, "task_id");
  end["task"] = {{"main_query", "no id here"}};
  command_error("/end_episode", end.dump(), 400, "task_id");
  end = end_body(victim_);
  end.erase("workflow_output");
  command_error("/end_episode", end.dump(), 400, "workflow_output");
  end = end_body(victim_);
  end.erase("client_uuid");
  command_error("/end_episode", end.dump(), 400, "client_uuid");
  command_error("/abort_episode", json({{"client_uuid", kVictimClient}}).dump(), 400, "episode_uuid");
  command_error("/can_continue_episode", json({{"episode_uuid", victim_.episode_uuid}}).dump(), 400,
                "client_uuid");
  command_error("/sync_train_config", json::object().dump(), 400, "yaml_as_string");
  chat_error(victim_, {{"model", "mock-model"}}, 400, "messages");
  {
    HttpClient llm(server_->url() + "/v1", 10s);
    auto r = llm.request("POST", "/completions", json({{"model", "mock-model"}}).dump(),
                         {{"Authorization", "Bearer " + victim_.api_key}});
    expect_error(r, 400, "prompt", false, "completions without prompt");
    expect_healthy("completions without prompt");
  }
  finish();
}

TEST_F(BadInput, ConfigAndEngineStateErrors) {
  start();
  const std::string before = server_->engine().config()->to_yaml();
  command_error("/sync_train_config",
                json({{"yaml_as_string", std::string(kBaseConfig) + "learning_rat: 0.1\n"}}).dump(), 400,
                "learning_rat");
  command_error("/sync_train_config", json({{"yaml_as_string", "model: [unclosed\nbatch_size: {"}}).dump(),
                400, "");
  command_error("/sync_train_config", json({{"yaml_as_string", "- just\n- a list\n"}}).dump(), 400, "");
  command_error("/sync_train_config",
                json({{"yaml_as_string", std::string(kBaseConfig) + "max_response_length: many\n"}}).dump(),
                400, "max_response_length");
  command_error("/sync_train_config",
                json({{"yaml_as_string", std::string(kBaseConfig) + "batch_size: 2\n"}}).dump(), 400,
                "batch_size");  // a key given twice
  command_error("/sync_train_config", json({{"yaml_as_string", "batch_size: 1\n"}}).dump(), 400, "model");
  // Valid, but the engine is ROLLING.
  command_error("/sync_train_config", json({{"yaml_as_string", kBaseConfig}}).dump(), 409, "ENGINE.ROLLING");
  command_error("/start_engine", "{}", 409, "ENGINE.ROLLING");
  command_error("/start_engine", "", 409, "ENGINE.ROLLING");
  command_error("/start_engine", R"({"resume": "yes"})", 400, "resume");  // the type first
  EXPECT_EQ(server_->engine().config()->to_yaml(), before)
      << "a rejected config must not replace the synced one";
  // AgentJet's nested config: what cannot be honoured names its path.
  command_error(
      "/sync_train_config",
      json({{"yaml_as_string", "ajet:\n  model:\n    path: m\n  lora:\n    lora_rank: 16\n"}}).dump(), 400,
      "ajet.lora.lora_rank");
  command_error("/sync_train_config",
                json({{"yaml_as_string", "ajet:\n  data:\n    train_batch_size: [1]\n"}}).dump(), 400,
                "ajet.data.train_batch_size");
  // AgentJet's routes: wrong method for this config, wrong types, not a zip, wrong state.
  command_error("/agree_sync_weight", json({{"client_uuid", kVictimClient}}).dump(), 409,
                "sample_collection_method");
  command_error("/agree_sync_weight", json({{"client_uuid", 42}}).dump(), 400, "client_uuid");
  command_error("/agree_sync_weight", json({{"client_uuid", ""}}).dump(), 400, "client_uuid");
  // Outside OFFLINE the state is the answer, whatever the body (AgentJet checks it first).
  command_error("/sync_train_code", "{\"zip\": true}", 409, "ENGINE.ROLLING");
  command_error("/sync_train_code", "", 409, "ENGINE.ROLLING");
  // A valid archive (one stored member, ajet/a.py, with an empty body) while ROLLING.
  std::string zip("PK\x03\x04\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x09\0\0\0ajet/a.py", 39);
  const uint32_t dir_offset = static_cast<uint32_t>(zip.size());
  zip += std::string(
      "PK\x01\x02\x14\0\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x09\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0aj"
      "et/a.py",
      55);
  zip += std::string("PK\x05\x06\0\0\0\0\x01\0\x01\0\x37\0\0\0", 16);
  for (int i = 0; i < 4; ++i) zip.push_back(static_cast<char>((dir_offset >> (8 * i)) & 0xff));
  zip += std::string("\0\0", 2);
  command_error("/sync_train_code", zip, 409, "ENGINE.ROLLING");
  json end = end_body(victim_);
  end["declare_client_active"] = "yes";
  command_error("/end_episode", end.dump(), 400, "declare_client_active");
  // Nothing to replay before the first chat call of this server? The bystander has made one.
  auto replay = post("/replay_latest_llm_call", "");
  EXPECT_EQ(replay.status, 200) << replay.body;
  finish();
}

TEST_F(BadInput, EpisodeOwnershipAndExistence) {
  start();
  const std::string unknown = "00000000-0000-4000-8000-000000000000";
  Episode ghost{kVictimClient, unknown, ""};
  command_error("/end_episode", end_body(ghost).dump(), 404, unknown);
  // An abort is idempotent (AgentJet's client turns late ends into aborts): nothing to abort
  // is a success that says so.
  expect_nothing_to_abort(kVictimClient, unknown);
  // The victim's episode, claimed by another client.
  Episode intruder{"intruder-client", victim_.episode_uuid, ""};
  command_error("/end_episode", end_body(intruder).dump(), 403, "another client");
  command_error("/abort_episode",
                json({{"client_uuid", "intruder-client"}, {"episode_uuid", victim_.episode_uuid}}).dump(),
                403, "another client");
  // The bystander's own episode attacked by the victim's client: refused, bystander unharmed.
  Episode hijack{kVictimClient, bystander_.episode_uuid, ""};
  command_error("/end_episode", end_body(hijack).dump(), 403, "another client");
  command_error("/abort_episode",
                json({{"client_uuid", kVictimClient}, {"episode_uuid", bystander_.episode_uuid}}).dump(), 403,
                "another client");
  // can_continue answers false (not an error) for someone else's episode.
  auto r = post("/can_continue_episode",
                json({{"client_uuid", "intruder-client"}, {"episode_uuid", victim_.episode_uuid}}).dump());
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body, nullptr, false), json({{"can_continue", false}}));
  // An episode ended twice by its client is a retry whose answer was lost: the same answer
  // (docs/reliability.md); by another client it is a 403.
  Episode eval = claim("eval-client", "eval");
  const HttpClientResponse first = post("/end_episode", end_body(eval, {{"reward", 0.5}}).dump());
  ASSERT_EQ(first.status, 200);
  const HttpClientResponse again = post("/end_episode", end_body(eval, {{"reward", 0.5}}).dump());
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(json::parse(again.body, nullptr, false), json::parse(first.body, nullptr, false));
  Episode other{"intruder-client", eval.episode_uuid, ""};
  command_error("/end_episode", end_body(other, {{"reward", 0.5}}).dump(), 403, "another client");
  expect_nothing_to_abort("eval-client", eval.episode_uuid);
  finish();
}

TEST_F(BadInput, OpenAIAuthentication) {
  start();
  const json body = {{"model", "mock-model"},
                     {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  HttpClient llm(server_->url() + "/v1", 10s);
  auto check = [&](const Headers& headers, const std::string& what) {
    auto r = llm.request("POST", "/chat/completions", body.dump(), headers);
    expect_error(r, 401, "", false, what);
    EXPECT_EQ(header_of(r, "www-authenticate"), "Bearer") << what;
    EXPECT_EQ(r.body.find(bystander_.api_key), std::string::npos) << "a key leaked";
    expect_healthy(what);
  };
  check({}, "no Authorization");
  check({{"Authorization", "Bearer wrong-key"}}, "wrong key");
  check({{"Authorization", "Basic xyz"}}, "Basic auth");
  check({{"Authorization", "Bearer"}}, "empty Bearer");
  check({{"Authorization", "Bearer " + bystander_.api_key + "x"}}, "key with a suffix");
  {
    auto r = llm.request("POST", "/completions", json({{"prompt", "x"}}).dump(),
                         {{"Authorization", "Bearer nope"}});
    expect_error(r, 401, "", false, "completions with a wrong key");
  }
  // Keys of ended episodes are revoked: an eval episode ended with a reward, a train episode
  // ended without one (dropped), and an aborted one.
  Episode eval = claim("eval-client", "eval");
  ASSERT_EQ(chat(eval, body).status, 200);
  ASSERT_EQ(post("/end_episode", end_body(eval, {{"reward", 0.5}}).dump()).status, 200);
  check({{"Authorization", "Bearer " + eval.api_key}}, "key of an ended eval episode");
  Episode dropped = claim("dropped-client");
  ASSERT_EQ(chat(dropped, body).status, 200);
  ASSERT_EQ(post("/end_episode", end_body(dropped, {{"reward", nullptr}}).dump()).status, 200);
  check({{"Authorization", "Bearer " + dropped.api_key}}, "key of an episode ended without reward");
  Episode aborted = claim("aborted-client");
  ASSERT_EQ(post("/abort_episode",
                 json({{"client_uuid", "aborted-client"}, {"episode_uuid", aborted.episode_uuid}}).dump())
                .status,
            200);
  check({{"Authorization", "Bearer " + aborted.api_key}}, "key of an aborted episode");
  finish();
}

TEST_F(BadInput, OversizedBodyIs413AndTheServerServesOn) {
  start();
  const std::string big = json({{"client_uuid", std::string(100 * 1024, 'x')},
                                {"episode_type", "train"},
                                {"discard_episode_timeout", 60}})
                              .dump();
  {
    HttpClient fresh(server_->url(), 10s);
    auto r = fresh.request("POST", "/claim_episode", big);
    expect_error(r, 413, "exceeds", /*command_route=*/true, "100 KiB claim");
  }
  expect_healthy("100 KiB claim");
  {
    HttpClient fresh(server_->url() + "/v1", 10s);
    json req = {{"messages", json::array({{{"role", "user"}, {"content", std::string(100 * 1024, 'y')}}})}};
    auto r = fresh.request("POST", "/chat/completions", req.dump(),
                           {{"Authorization", "Bearer " + victim_.api_key}});
    expect_error(r, 413, "exceeds", false, "100 KiB chat");
  }
  expect_healthy("100 KiB chat");
  // Just under the limit is fine (it is then a bad claim for other reasons, not a 413).
  command_error("/claim_episode", json({{"client_uuid", 1}, {"pad", std::string(60 * 1024, 'z')}}).dump(),
                400, "client_uuid");
  finish();
}

// `n` arrays nested around `leaf`.
std::string nested(size_t n, const std::string& leaf = "0") {
  return std::string(n, '[') + leaf + std::string(n, ']');
}

// An end_episode body whose metadata holds `deep` (JSON text) under "d": the metadata object is
// at depth 3 (body, workflow_output, metadata), so `deep` at depth d makes the body 3 + d deep.
std::string end_text(const std::string& client, const std::string& episode, const std::string& deep,
                     const std::string& log_metrics = "{}") {
  return R"({"client_uuid": ")" + client + R"(", "episode_uuid": ")" + episode +
         R"(", "task_id": "t", "workflow_output": {"reward": 1.0, "metadata": {"d": )" + deep +
         R"(}, "log_metrics": )" + log_metrics + "}}";
}

// Nesting past kMaxJsonNesting (128) is a 400 before anything recursive touches the value
// (docs/reliability.md, "Limits"). The first request is the crash this bound fixed: 100,000
// nested arrays (~200 KB) in an end_episode's metadata overflowed the stack where the metadata
// was dumped, and the server process was gone.
TEST_F(BadInput, DeeplyNestedJsonIsRefusedBeforeAnythingRecursesOnIt) {
  max_body_ = 1 << 20;
  start();
  command_error("/end_episode", end_text(kVictimClient, victim_.episode_uuid, nested(100000)), 400,
                "request body is nested deeper than 128 levels");
  command_error("/end_episode", end_text(kVictimClient, victim_.episode_uuid, nested(126)), 400,
                "nested deeper than 128");
  command_error("/claim_episode",
                "{\"client_uuid\": " + std::string(200000, '{') + std::string(200000, '}') + "}", 400,
                "nested deeper than 128");
  // Exactly at the bound is accepted: 3 + 125 = 128 levels.
  const Episode at_bound =
      claim("at-bound-client", "eval");  // eval: the bystander stays the only trained episode
  auto r = post("/end_episode", end_text(at_bound.client_uuid, at_bound.episode_uuid, nested(125)));
  EXPECT_EQ(r.status, 200) << r.body.substr(0, 300);
  expect_healthy("an end_episode 128 levels deep");

  // The OpenAI route: the body, and JSON held in a string field (tool-call arguments, which the
  // chat splice and the template parse).
  const std::string deep_chat_text = R"({"model": "mock-model", "messages": [{"role": "user", "content": )" +
                                     nested(100000, "\"x\"") + "}]}";
  expect_error(chat(victim_, deep_chat_text), 400, "request body is nested deeper than 128 levels", false,
               "deep chat");
  expect_healthy("deep chat");
  const json with_arguments = {
      {"model", "mock-model"},
      {"messages",
       json::array({{{"role", "user"}, {"content", "hi"}},
                    {{"role", "assistant"},
                     {"content", nullptr},
                     {"tool_calls",
                      json::array({{{"id", "c1"},
                                    {"type", "function"},
                                    {"function",
                                     {{"name", "f"}, {"arguments", "{\"a\": " + nested(20000) + "}"}}}}})}},
                    {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}})}};
  chat_error(victim_, with_arguments, 400,
             "messages[1].tool_calls[0].function.arguments is nested deeper than 128 levels");

  // Flattened log_metrics: names and their number are bounded.
  command_error(
      "/end_episode",
      end_text(kVictimClient, victim_.episode_uuid, "1", R"({")" + std::string(300, 'k') + R"(": 1})"), 400,
      "longer than 256 bytes");
  command_error(
      "/end_episode",
      end_text(kVictimClient, victim_.episode_uuid, "1",
               R"({"a": {")" + std::string(200, 'k') + R"(": {")" + std::string(100, 'j') + R"(": 1}}})"),
      400, "longer than 256 bytes");
  json many = json::object();
  for (int i = 0; i < 1025; ++i) many["m" + std::to_string(i)] = i;
  command_error("/end_episode", end_text(kVictimClient, victim_.episode_uuid, "1", many.dump()), 400,
                "more than 1024 metrics");
  finish();
}

TEST_F(BadInput, UnknownRoutesAndWrongMethods) {
  start();
  HttpClient fresh(server_->url(), 10s);
  expect_error(fresh.request("GET", "/no_such_route"), 404, "/no_such_route", true, "GET unknown");
  expect_healthy("GET unknown");
  expect_error(fresh.request("POST", "/claim_episode_v2", "{}"), 404, "", true, "POST unknown");
  expect_error(fresh.request("GET", "/v1/embeddings"), 404, "", false, "unknown /v1 route");
  expect_error(fresh.request("GET", "/claim_episode"), 405, "GET", true, "GET /claim_episode");
  expect_healthy("GET /claim_episode");
  expect_error(fresh.request("POST", "/health", "{}"), 405, "", true, "POST /health");
  expect_error(fresh.request("DELETE", "/end_episode"), 405, "", true, "DELETE /end_episode");
  expect_error(fresh.request("GET", "/v1/chat/completions"), 405, "", false, "GET /v1/chat/completions");
  expect_healthy("wrong methods");
  finish();
}

TEST_F(BadInput, HttpGarbageOnARawSocket) {
  start();
  auto check = [&](const std::string& bytes, const std::string& what) {
    std::string reply = raw_exchange(server_->port(), bytes);
    EXPECT_EQ(reply.find("<timeout>"), std::string::npos)
        << what << ": the server neither answered nor closed";
    if (!reply.empty() && reply.find("<timeout>") == std::string::npos) {
      EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << what << ": " << reply.substr(0, 200);
      EXPECT_NE(reply.find("\"error\""), std::string::npos) << what;
    }
    expect_healthy(what);
  };
  check("NOT HTTP AT ALL\r\n\r\n", "a non-HTTP line");
  std::mt19937 rng(1234);
  for (int i = 0; i < 4; ++i) {
    std::string bytes(512 + 256 * i, '\0');
    for (char& ch : bytes) ch = static_cast<char>(rng() & 0xff);
    bytes += "\r\n\r\n";
    check(bytes, "random bytes #" + std::to_string(i));
  }
  check("POST /claim_episode HTTP/1.1\r\nHost: x\r\nContent-Length: banana\r\n\r\n{}", "bad Content-Length");
  check("POST /claim_episode HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n",
        "bad chunk size");
  // Half a request, then the client hangs up: nothing to answer, nothing disturbed.
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server_->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string half =
        "POST /claim_episode HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"client";
    ASSERT_GT(::send(fd, half.data(), half.size(), MSG_NOSIGNAL), 0);
    ::close(fd);
    expect_healthy("half a request");
  }
  finish();
}

TEST_F(BadInput, PromptLongerThanMaxPromptLength) {
  // Tight limit: the bystander's conversation (two turns of one-character messages, 43
  // tokens in the mock chat template) still fits.
  start("max_prompt_length: 64\n");
  json req = {{"messages", json::array({{{"role", "user"}, {"content", std::string(1000, 'a')}}})}};
  chat_error(victim_, req, 400, "max_prompt_length");
  HttpClient llm(server_->url() + "/v1", 10s);
  auto r = llm.request("POST", "/completions", json({{"prompt", std::string(1000, 'b')}}).dump(),
                       {{"Authorization", "Bearer " + victim_.api_key}});
  expect_error(r, 400, "max_prompt_length", false, "long completions prompt");
  finish();
}

TEST_F(BadInput, InvalidUtf8NeverCrashesTheServer) {
  start();
  auto acceptable = [&](const HttpClientResponse& r, const std::string& what) {
    EXPECT_TRUE(r.status == 200 || r.status == 400) << what << ": " << r.status << " " << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << what << ": response is not valid JSON (UTF-8): " << r.body;
    if (r.status == 400) expect_error(r, 400, "", false, what);
  };
  // Raw invalid bytes inside a JSON string.
  const std::string raw =
      std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"bad \xff\xfe\xc3 bytes\"}]}");
  {
    auto r = chat(victim_, raw);
    acceptable(r, "raw invalid UTF-8");
    if (r.status == 400) {
      EXPECT_NE(r.body.find("UTF-8"), std::string::npos)
          << "the message should say what is wrong: " << r.body;
    }
  }
  expect_healthy("raw invalid UTF-8");
  // A lone surrogate escape.
  acceptable(
      chat(victim_, std::string(R"({"messages":[{"role":"user","content":"lone \udc00 surrogate"}]})")),
      "lone surrogate");
  expect_healthy("lone surrogate");
  // Invalid UTF-8 in a command field.
  {
    auto r =
        post("/claim_episode", std::string("{\"client_uuid\":\"\xc0\xaf\",\"discard_episode_timeout\":60}"));
    EXPECT_TRUE(r.status == 200 || r.status == 400) << r.status << " " << r.body;
    EXPECT_FALSE(json::parse(r.body, nullptr, false).is_discarded()) << r.body;
    json j = json::parse(r.body, nullptr, false);
    if (r.status == 200 && j.value("success", false)) {
      // Accepted: release the slot so the batch is not held up.
      post("/abort_episode",
           json({{"client_uuid", j["client_uuid"]}, {"episode_uuid", j["episode_uuid"]}}).dump());
    }
    expect_healthy("invalid UTF-8 client_uuid");
  }
  // Token-id prompts whose bytes are not UTF-8: the completion echoes them; the answer must
  // still be valid JSON, streamed or not, with logprobs.
  HttpClient llm(server_->url() + "/v1", 10s);
  const Headers auth = {{"Authorization", "Bearer " + victim_.api_key}};
  {
    auto r = llm.request("POST", "/completions",
                         json({{"prompt", {0xff, 0xfe, 0xc3}}, {"logprobs", 2}}).dump(), auth);
    EXPECT_EQ(r.status, 200) << r.body;
    acceptable(r, "token-id prompt of invalid UTF-8");
  }
  {
    auto r = llm.request("POST", "/completions",
                         json({{"prompt", {0xe2, 0x82}}, {"stream", true}, {"max_tokens", 8}}).dump(), auth);
    EXPECT_EQ(r.status, 200) << r.body;
    size_t pos = 0;
    int events = 0;
    while ((pos = r.body.find("data: ", pos)) != std::string::npos) {
      size_t end = r.body.find("\n\n", pos);
      std::string data = r.body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (data == "[DONE]") continue;
      ++events;
      EXPECT_FALSE(json::parse(data, nullptr, false).is_discarded()) << data;
    }
    EXPECT_GT(events, 0);
  }
  expect_healthy("token-id prompts");
  finish();
}

}  // namespace
