// The agent harnesses' APIs on a claimed episode, spoken with raw HTTP as Claude
// Code (Anthropic Messages) and Codex (OpenAI Responses) speak them, on the mock engine (which
// answers with the last user / tool message at temperature 0, so a user message holding a
// `<tool_call>` makes the "model" call that tool). Each tool loop must train as one sample,
// exactly as a chat-completions loop does; every streamed event carries its `event:` line.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <iterator>
#include <random>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "http/http_client.hpp"
#include "support/http_helpers.hpp"
#include "support/test_server.hpp"

using json = nlohmann::json;
using namespace std::chrono_literals;
using swarm::HttpClient;
using swarm::testing::get_json;
using swarm::testing::Headers;
using swarm::testing::parse_body;
using swarm::testing::post_json;
using swarm::testing::post_raw;
using swarm::testing::TestServer;

namespace {

const std::string kBashCall =
    R"(<tool_call>{"name": "Bash", "arguments": {"command": "echo 42"}}</tool_call>)";

struct Episode {
  std::string uuid, key;
};

Episode start_and_claim(HttpClient& c) {
  EXPECT_EQ(post_json(c, "/sync_train_config",
                      {{"yaml_as_string", "model: mock-model\nbatch_size: 1\nnum_repeat: 1\n"}})["success"],
            true);
  EXPECT_EQ(post_json(c, "/start_engine", json::object())["success"], true);
  for (int i = 0; i < 500 && get_json(c, "/get_engine_status")["engine_status"] != "ENGINE.ROLLING"; ++i)
    std::this_thread::sleep_for(10ms);
  json r = post_json(c, "/claim_episode", {{"client_uuid", "harness"}, {"discard_episode_timeout", 120}});
  EXPECT_EQ(r["success"], true) << r.dump();
  EXPECT_EQ(r["anthropic_base_url"].get<std::string>() + "/v1", r["openai_base_url"].get<std::string>());
  return {r["episode_uuid"], r["openai_api_key"]};
}

// Ends the episode and returns its samples once the (batch of one) step has run.
std::vector<swarm::Sample> end_and_train(TestServer& server, HttpClient& c, const Episode& e) {
  json req = {{"client_uuid", "harness"},
              {"episode_uuid", e.uuid},
              {"task_id", "t"},
              {"workflow_output", {{"reward", 1.0}, {"metadata", json::object()}}}};
  EXPECT_EQ(post_json(c, "/end_episode", req)["success"], true);
  EXPECT_TRUE(server.engine().wait_for_step(1, 10s));
  const auto batches = server.batches->copy();
  if (batches.empty() || batches[0].episodes.empty()) return {};
  return batches[0].episodes.at(0).samples;
}

struct Event {
  std::string type;  // the `event:` line
  json data;
};

// Every SSE event of a body; an event without an `event:` line fails the test (the Anthropic
// SDK drops such events, and Claude Code then re-sends the request non-streamed).
std::vector<Event> sse(const std::string& body) {
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string block = body.substr(pos, end - pos);
    pos = end + 2;
    if (block.empty() || block[0] == ':') continue;
    Event e;
    size_t ls = 0;
    while (ls < block.size()) {
      size_t nl = block.find('\n', ls);
      if (nl == std::string::npos) nl = block.size();
      const std::string line = block.substr(ls, nl - ls);
      if (line.rfind("event: ", 0) == 0) e.type = line.substr(7);
      if (line.rfind("data: ", 0) == 0) e.data = json::parse(line.substr(6));
      ls = nl + 1;
    }
    EXPECT_FALSE(e.type.empty()) << "an event without its event: line: " << block;
    if (e.data.is_object()) {
      EXPECT_EQ(e.data.value("type", ""), e.type) << block;
    }
    out.push_back(std::move(e));
  }
  return out;
}

Headers anthropic(const Episode& e) {
  return {{"x-api-key", e.key}, {"anthropic-version", "2023-06-01"}, {"anthropic-beta", "x"}};
}

TEST(HarnessApis, AnthropicToolLoopAnswersInAnthropicShapeAndTrainsAsOneSample) {
  TestServer server;
  HttpClient c(server.url());
  const Episode e = start_and_claim(c);
  // What Claude Code sends, cut down: system blocks with cache_control, a system message in
  // `messages`, custom tools with input_schema, a server tool, metadata / thinking ignored,
  // max_tokens far beyond what the job allows (clamped, not refused), ?beta=true.
  json tools = json::array({{{"name", "Bash"},
                             {"description", "Run a command"},
                             {"input_schema",
                              {{"type", "object"},
                               {"properties", {{"command", {{"type", "string"}}}}},
                               {"required", {"command"}}}},
                             {"cache_control", {{"type", "ephemeral"}}}},
                            {{"type", "web_search_20250305"}, {"name", "web_search"}}});
  json messages = json::array({{{"role", "system"}, {"content", "You are in a test."}},
                               {{"role", "user"},
                                {"content", json::array({{{"type", "text"},
                                                          {"text", kBashCall},
                                                          {"cache_control", {{"type", "ephemeral"}}}}})}}});
  json req = {
      {"model", "claude-test"},
      {"max_tokens", 128000},
      {"temperature", 0},
      {"system",
       json::array({{{"type", "text"}, {"text", "Be brief."}, {"cache_control", {{"type", "ephemeral"}}}}})},
      {"messages", messages},
      {"tools", tools},
      {"tool_choice", {{"type", "auto"}}},
      {"metadata", {{"user_id", "u"}}},
      {"thinking", {{"type", "disabled"}}}};
  const json counted = post_json(c, "/v1/messages/count_tokens", req, 200, anthropic(e));
  const json first = post_json(c, "/v1/messages?beta=true", req, 200, anthropic(e));
  EXPECT_EQ(first["type"], "message");
  EXPECT_EQ(first["role"], "assistant");
  EXPECT_EQ(first["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(first["stop_reason"], "tool_use");
  EXPECT_TRUE(first["stop_sequence"].is_null());
  ASSERT_EQ(first["content"].size(), 1u) << first.dump();
  const json& use = first["content"][0];
  EXPECT_EQ(use["type"], "tool_use");
  EXPECT_EQ(use["name"], "Bash");
  EXPECT_EQ(use["input"], json({{"command", "echo 42"}}));
  EXPECT_EQ(use["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(counted["input_tokens"], first["usage"]["input_tokens"]);
  EXPECT_GT(first["usage"]["output_tokens"].get<int64_t>(), 0);

  // The harness runs the tool and sends its result back with the assistant turn, streamed.
  messages.push_back({{"role", "assistant"}, {"content", first["content"]}});
  messages.push_back(
      {{"role", "user"},
       {"content", json::array({{{"type", "tool_result"},
                                 {"tool_use_id", use["id"]},
                                 {"content", json::array({{{"type", "text"}, {"text", "42"}}})}}})}});
  req["messages"] = messages;
  req["stream"] = true;
  const auto r = post_raw(c, "/v1/messages", req.dump(), anthropic(e));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body.find("[DONE]"), std::string::npos);
  const std::vector<Event> events = sse(r.body);
  ASSERT_GE(events.size(), 6u) << r.body;
  EXPECT_EQ(events.front().type, "message_start");
  EXPECT_EQ(events.front().data["message"]["usage"]["output_tokens"], 0);
  EXPECT_EQ(events.back().type, "message_stop");
  std::string text;
  int starts = 0, stops = 0;
  json delta;
  for (const Event& ev : events) {
    if (ev.type == "content_block_start") {
      ++starts;
      EXPECT_EQ(ev.data["content_block"]["type"], "text");
    }
    if (ev.type == "content_block_delta") text += ev.data["delta"]["text"].get<std::string>();
    if (ev.type == "content_block_stop") ++stops;
    if (ev.type == "message_delta") delta = ev.data;
  }
  EXPECT_EQ(text, "42");
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(stops, 1);
  EXPECT_EQ(delta["delta"]["stop_reason"], "end_turn");
  EXPECT_GT(delta["usage"]["output_tokens"].get<int64_t>(), 0);

  const json replay = post_json(c, "/replay_latest_llm_call", json::object());
  EXPECT_EQ(replay["api"], "anthropic_messages");
  EXPECT_EQ(replay["output"]["content"][0]["text"], "42");

  const auto samples = end_and_train(server, c, e);
  ASSERT_EQ(samples.size(), 1u) << "the tool_use turn sent back must splice onto the generated ids";
  EXPECT_EQ(samples[0].num_calls, 2);
  EXPECT_EQ(server.engine().pool_snapshot().counters.episodes_split_by_drift, 0);
}

TEST(HarnessApis, ResponsesToolLoopAnswersInResponsesShapeAndTrainsAsOneSample) {
  TestServer server;
  HttpClient c(server.url());
  const Episode e = start_and_claim(c);
  const Headers auth = swarm::testing::bearer(e.key);
  // What Codex sends, cut down: instructions, developer messages, input_text parts, function
  // tools, a namespace of functions, a built-in tool (dropped), the fields it always sets.
  json input = json::array({{{"type", "message"},
                             {"role", "developer"},
                             {"content", json::array({{{"type", "input_text"}, {"text", "sandbox: none"}}})}},
                            {{"type", "message"},
                             {"role", "user"},
                             {"content", json::array({{{"type", "input_text"}, {"text", kBashCall}}})}}});
  json req = {
      {"model", "codex-test"},
      {"instructions", "You are Codex."},
      {"input", input},
      {"tools",
       json::array(
           {{{"type", "function"},
             {"name", "Bash"},
             {"description", "run"},
             {"strict", false},
             {"parameters", {{"type", "object"}, {"properties", {{"command", {{"type", "string"}}}}}}}},
            {{"type", "namespace"},
             {"name", "mcp"},
             {"tools",
              json::array({{{"type", "function"}, {"name", "ping"}, {"parameters", {{"type", "object"}}}}})}},
            {{"type", "web_search"}}})},
      {"tool_choice", "auto"},
      {"parallel_tool_calls", false},
      {"temperature", 0},
      {"store", false},
      {"stream", false},
      {"include", json::array({"reasoning.encrypted_content"})},
      {"reasoning", {{"effort", "medium"}, {"summary", "auto"}}},
      {"prompt_cache_key", "k"},
      {"text", {{"verbosity", "low"}}}};
  const json first = post_json(c, "/v1/responses", req, 200, auth);
  EXPECT_EQ(first["object"], "response");
  EXPECT_EQ(first["status"], "completed");
  EXPECT_EQ(first["id"].get<std::string>().rfind("resp_", 0), 0u);
  ASSERT_EQ(first["output"].size(), 1u) << first.dump();
  const json& call = first["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "Bash");
  EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), json({{"command", "echo 42"}}));
  EXPECT_EQ(first["usage"]["total_tokens"].get<int64_t>(),
            first["usage"]["input_tokens"].get<int64_t>() + first["usage"]["output_tokens"].get<int64_t>());

  input.push_back(call);
  input.push_back({{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "42"}});
  req["input"] = input;
  req["stream"] = true;
  const auto r = post_raw(c, "/v1/responses", req.dump(), auth);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<Event> events = sse(r.body);
  ASSERT_GE(events.size(), 8u) << r.body;
  EXPECT_EQ(events[0].type, "response.created");
  EXPECT_EQ(events[1].type, "response.in_progress");
  EXPECT_EQ(events.back().type, "response.completed");
  std::string text;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].data["sequence_number"], static_cast<int64_t>(i));
    if (events[i].type == "response.output_text.delta") text += events[i].data["delta"].get<std::string>();
  }
  EXPECT_EQ(text, "42");
  const json& done = events.back().data["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 1u);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "42");
  EXPECT_GT(done["usage"]["output_tokens"].get<int64_t>(), 0);

  const auto samples = end_and_train(server, c, e);
  ASSERT_EQ(samples.size(), 1u) << "the function_call item sent back must splice onto the generated ids";
  EXPECT_EQ(samples[0].num_calls, 2);
}

TEST(HarnessApis, StopSequencesAndMaxTokensEndAsEachApiSays) {
  TestServer server;
  HttpClient c(server.url());
  const Episode e = start_and_claim(c);
  const json stopped =
      post_json(c, "/v1/messages",
                {{"max_tokens", 50},
                 {"temperature", 0},
                 {"stop_sequences", {"STOP"}},
                 {"messages", json::array({{{"role", "user"}, {"content", "hello STOP world"}}})}},
                200, anthropic(e));
  EXPECT_EQ(stopped["stop_reason"], "stop_sequence");
  EXPECT_EQ(stopped["stop_sequence"], "STOP");
  EXPECT_EQ(stopped["content"][0]["text"], "hello ");
  const json cut =
      post_json(c, "/v1/messages",
                {{"max_tokens", 2},
                 {"temperature", 0},
                 {"messages", json::array({{{"role", "user"}, {"content", "a long answer here"}}})}},
                200, anthropic(e));
  EXPECT_EQ(cut["stop_reason"], "max_tokens");
  const json incomplete = post_json(
      c, "/v1/responses", {{"max_output_tokens", 2}, {"temperature", 0}, {"input", "a long answer here"}},
      200, swarm::testing::bearer(e.key));
  EXPECT_EQ(incomplete["status"], "incomplete");
  EXPECT_EQ(incomplete["incomplete_details"]["reason"], "max_output_tokens");
  const auto r = post_raw(
      c, "/v1/responses",
      json({{"max_output_tokens", 2}, {"temperature", 0}, {"stream", true}, {"input", "a long answer here"}})
          .dump(),
      swarm::testing::bearer(e.key));
  const std::vector<Event> events = sse(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type, "response.incomplete");
}

TEST(HarnessApis, BadInputGetsEachApisErrorShape) {
  TestServer server;
  HttpClient c(server.url());
  const Episode e = start_and_claim(c);
  const auto anthropic_error = [&](const std::string& body, int status, const std::string& type,
                                   const std::string& needle, const Headers& h) {
    const auto r = post_raw(c, "/v1/messages", body, h);
    EXPECT_EQ(r.status, status) << body << " -> " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["type"], "error") << r.body;
    EXPECT_EQ(j["error"]["type"], type) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r.body;
  };
  anthropic_error("{\"messages\": [", 400, "invalid_request_error", "JSON", anthropic(e));
  anthropic_error(R"({"messages": []})", 401, "authentication_error", "API key",
                  {{"x-api-key", "sk-nobody"}});
  anthropic_error(R"({"messages": []})", 401, "authentication_error", "x-api-key", {});
  anthropic_error(R"({"messages": "hi"})", 400, "invalid_request_error", "messages", anthropic(e));
  anthropic_error(
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})",
      400, "invalid_request_error", "text-only", anthropic(e));
  anthropic_error(
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})", 400,
      "invalid_request_error", "tool_use_id", anthropic(e));
  anthropic_error(
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}})",
      400, "invalid_request_error", "tools", anthropic(e));
  anthropic_error(R"({"messages": [{"role": "robot", "content": "x"}]})", 400, "invalid_request_error",
                  "role", anthropic(e));
  anthropic_error(
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", 400,
      "invalid_request_error", "temperature", anthropic(e));
  // What the API requires: max_tokens, a message, each message's content, a tool_use for each
  // tool_result.
  anthropic_error(R"({"messages": [{"role": "user", "content": "x"}]})", 400, "invalid_request_error",
                  "missing required field 'max_tokens'", anthropic(e));
  anthropic_error(R"({"max_tokens": 8, "messages": []})", 400, "invalid_request_error",
                  "at least one message", anthropic(e));
  anthropic_error(R"({"max_tokens": 8, "messages": [{"role": "user"}]})", 400, "invalid_request_error",
                  "messages[0].content", anthropic(e));
  anthropic_error(R"({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result",
                  "tool_use_id": "toolu_x", "content": "r"}]}]})",
                  400, "invalid_request_error", "no earlier tool_use", anthropic(e));
  {
    const auto r = c.request("GET", "/v1/messages");
    EXPECT_EQ(r.status, 405);
    EXPECT_EQ(json::parse(r.body)["type"], "error");
  }
  const auto responses_error = [&](const std::string& body, int status, const std::string& needle) {
    const auto r = post_raw(c, "/v1/responses", body, swarm::testing::bearer(e.key));
    EXPECT_EQ(r.status, status) << body << " -> " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r.body;
  };
  responses_error("[1, 2]", 400, "object");
  responses_error(R"({"input": "x", "previous_response_id": "resp_1"})", 400, "previous_response_id");
  responses_error(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})",
                  400, "text-only");
  responses_error(R"({"input": [{"type": "item_reference", "id": "x"}]})", 400, "item_reference");
  responses_error(R"({"input": [{"type": "function_call", "name": "f"}]})", 400, "call_id");
  responses_error(R"({"input": 42})", 400, "input");
  responses_error(R"({})", 400, "input");
  responses_error(R"({"input": "x", "tool_choice": "required"})", 400, "tools");
  responses_error(R"({"input": [{"role": "user"}]})", 400, "input[0].content");
  responses_error(R"({"input": []})", 400, "at least one item");
  // Chat completions: the fields the API requires, in OpenAI's shape.
  const auto chat_error = [&](const std::string& body, const std::string& needle) {
    const auto r = post_raw(c, "/v1/chat/completions", body, swarm::testing::bearer(e.key));
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r.body;
  };
  chat_error(R"({"messages": []})", "at least one message");
  chat_error(R"({"messages": [{"role": "user"}]})", "missing required field 'messages[0].content'");
  chat_error(R"({"messages": [{"content": "x"}]})", "messages[0].role");
  chat_error(R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role");
  chat_error(R"({"messages": [{"role": "function", "name": "f", "content": "x"}]})", "deprecated");
  chat_error(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]})",
             "required unless the message has 'tool_calls'");
  chat_error(R"({"messages": [{"role": "user", "content": 7}]})", "string or an array of content parts");
  // The server still serves this episode after all of that.
  const json ok = post_json(c, "/v1/messages",
                            {{"max_tokens", 8},
                             {"temperature", 0},
                             {"messages", json::array({{{"role", "user"}, {"content", "fine"}}})}},
                            200, anthropic(e));
  EXPECT_EQ(ok["content"][0]["text"], "fine");
}

// Mutated harness requests (keys dropped, values replaced by other JSON types, blocks
// duplicated), seeded: every answer is 200 or a 4xx in the route's own shape, never a 5xx, and
// the episode keeps being served.
TEST(HarnessApis, MutatedRequestsNeverGetA5xx) {
  TestServer server;
  HttpClient c(server.url());
  const Episode e = start_and_claim(c);
  const json anthropic_req = {
      {"max_tokens", 16},
      {"temperature", 0},
      {"stream", false},
      {"system", json::array({{{"type", "text"}, {"text", "s"}}})},
      {"messages",
       json::array(
           {{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "hi"}}})}},
            {{"role", "assistant"},
             {"content",
              json::array(
                  {{{"type", "thinking"}, {"thinking", "t"}, {"signature", "x"}},
                   {{"type", "tool_use"}, {"id", "a"}, {"name", "Bash"}, {"input", {{"command", "ls"}}}}})}},
            {{"role", "user"},
             {"content",
              json::array({{{"type", "tool_result"}, {"tool_use_id", "a"}, {"content", "ok"}}})}}})},
      {"tools", json::array({{{"name", "Bash"}, {"input_schema", {{"type", "object"}}}}})},
      {"tool_choice", {{"type", "auto"}}},
      {"stop_sequences", {"Z"}}};
  const json responses_req = {
      {"max_output_tokens", 16},
      {"temperature", 0},
      {"instructions", "i"},
      {"input",
       json::array(
           {{{"role", "developer"}, {"content", "d"}},
            {{"type", "message"},
             {"role", "user"},
             {"content", json::array({{{"type", "input_text"}, {"text", "hi"}}})}},
            {{"type", "reasoning"}, {"summary", json::array({{{"type", "summary_text"}, {"text", "r"}}})}},
            {{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", "{}"}},
            {{"type", "function_call_output"}, {"call_id", "c"}, {"output", "o"}}})},
      {"tools", json::array({{{"type", "function"}, {"name", "f"}, {"parameters", {{"type", "object"}}}},
                             {{"type", "namespace"},
                              {"name", "n"},
                              {"tools", json::array({{{"type", "function"}, {"name", "g"}}})}}})},
      {"tool_choice", "auto"},
      {"text", {{"format", {{"type", "text"}}}}}};
  std::mt19937_64 rng(22);
  const json replacements[] = {nullptr,
                               7,
                               -1,
                               2.5,
                               "s",
                               true,
                               json::array(),
                               json::object(),
                               json::array({1, "x"}),
                               json({{"type", "image"}})};
  // Replaces one random node of `j` (or drops an object key, or duplicates an array element).
  std::function<void(json&, int)> mutate = [&](json& j, int depth) {
    if ((j.is_object() || j.is_array()) && !j.empty() && depth < 6 && rng() % 4 != 0) {
      auto it = j.begin();
      std::advance(it, static_cast<long>(rng() % j.size()));
      if (rng() % 8 == 0) {
        if (j.is_object())
          j.erase(it.key());
        else
          j.push_back(*it);
        return;
      }
      return mutate(*it, depth + 1);
    }
    j = replacements[rng() % std::size(replacements)];
  };
  int ok = 0, refused = 0;
  for (int i = 0; i < 1500; ++i) {
    const bool anthropic_route = i % 2 == 0;
    json req = anthropic_route ? anthropic_req : responses_req;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) mutate(req, 0);
    const auto r = post_raw(c, anthropic_route ? "/v1/messages" : "/v1/responses", req.dump(),
                            anthropic_route ? anthropic(e) : swarm::testing::bearer(e.key));
    ASSERT_LT(r.status, 500) << req.dump() << " -> " << r.body;
    if (r.status == 200) {
      ++ok;
      continue;
    }
    ++refused;
    EXPECT_GE(r.status, 400) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    if (anthropic_route) {
      EXPECT_EQ(j["type"], "error") << r.body;
    }
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(refused, 100);
  const json still = post_json(c, "/v1/messages",
                               {{"max_tokens", 8},
                                {"temperature", 0},
                                {"messages", json::array({{{"role", "user"}, {"content", "fine"}}})}},
                               200, anthropic(e));
  EXPECT_EQ(still["content"][0]["text"], "fine");
}

}  // namespace
