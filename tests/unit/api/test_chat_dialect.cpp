// The four APIs' dialects (chat_dialect.hpp) fed parser events directly: block and item order
// for reasoning, whitespace, several tool calls; OpenAI chat's and completions' chunks for
// several choices; the conversions' edge cases; the thinking signature.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/chat_dialect.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

struct Sse {
  std::string event;
  json data;
};

std::vector<Sse> parse(const std::string& text) {
  std::vector<Sse> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    const std::string block = text.substr(pos, end - pos);
    pos = end + 2;
    Sse e;
    const size_t nl = block.find('\n');
    EXPECT_EQ(block.rfind("event: ", 0), 0u) << block;
    e.event = block.substr(7, nl - 7);
    e.data = json::parse(block.substr(nl + 7));
    out.push_back(e);
  }
  return out;
}

std::vector<StreamEvent> reasoning_then_two_calls() {
  return {{StreamEvent::REASONING, "Let me", 0, ""},
          {StreamEvent::REASONING, " think.", 0, ""},
          {StreamEvent::CONTENT, "\n\n", 0, ""},
          {StreamEvent::TOOL_CALL_START, "", 0, "Bash"},
          {StreamEvent::TOOL_CALL_ARGUMENTS, "{\"command\": ", 0, ""},
          {StreamEvent::TOOL_CALL_ARGUMENTS, "\"ls\"}", 0, ""},
          {StreamEvent::TOOL_CALL_START, "", 1, "Read"},
          {StreamEvent::TOOL_CALL_ARGUMENTS, "{}", 1, ""}};
}

DialectAnswer answer_of_two_calls() {
  DialectAnswer a;
  DialectChoice& c = a.choices.emplace_back();
  c.parsed.reasoning = "Let me think.";
  c.parsed.tool_calls = {{"Bash", "{\"command\": \"ls\"}"}, {"Read", "{}"}};
  c.finish_reason = "stop";
  a.prompt_tokens = 10;
  a.completion_tokens = 20;
  return a;
}

TEST(AnthropicDialect, StreamsThinkingWithItsSignatureThenOneBlockPerToolCall) {
  auto d = make_anthropic_dialect("m");
  std::string text = d->stream_start(10);
  text += d->stream_events(0, reasoning_then_two_calls());
  text += d->stream_finish(answer_of_two_calls());
  const auto events = parse(text);
  std::vector<std::string> kinds;
  for (const auto& e : events) kinds.push_back(e.event);
  const std::vector<std::string> expected = {"message_start",       "ping",
                                             "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_delta",
                                             "content_block_stop",  "content_block_start",
                                             "content_block_delta", "content_block_delta",
                                             "content_block_stop",  "content_block_start",
                                             "content_block_delta", "content_block_stop",
                                             "message_delta",       "message_stop"};
  ASSERT_EQ(kinds, expected) << text;
  EXPECT_EQ(events[2].data["content_block"]["type"], "thinking");
  EXPECT_EQ(events[5].data["delta"]["type"], "signature_delta");
  EXPECT_TRUE(thinking_signature_valid("Let me think.", events[5].data["delta"]["signature"]));
  EXPECT_EQ(events[7].data["content_block"]["name"], "Bash");
  EXPECT_EQ(events[7].data["index"], 1);
  EXPECT_EQ(events[11].data["content_block"]["name"], "Read");
  EXPECT_EQ(events[11].data["index"], 2);
  EXPECT_EQ(events[14].data["delta"]["stop_reason"], "tool_use");
  const json whole = d->answer(answer_of_two_calls());
  ASSERT_EQ(whole["content"].size(), 3u);
  EXPECT_EQ(whole["content"][0]["signature"], events[5].data["delta"]["signature"]);
  EXPECT_EQ(whole["content"][1]["input"], json({{"command", "ls"}}));
}

TEST(AnthropicDialect, SignatureIsKeyedToTheText) {
  const std::string sig = thinking_signature("abc");
  EXPECT_TRUE(thinking_signature_valid("abc", sig));
  EXPECT_FALSE(thinking_signature_valid("abd", sig));
  EXPECT_FALSE(
      thinking_signature_valid("abc", sig.substr(0, sig.size() - 1) + (sig.back() == '0' ? "1" : "0")));
}

TEST(ResponsesDialect, StreamsItemsInOrderWithSequenceNumbersAndAFullCompletedResponse) {
  auto d = make_responses_dialect("m", ojson::object(), {});
  std::string text = d->stream_start(10);
  text += d->stream_events(0, reasoning_then_two_calls());
  text += d->stream_finish(answer_of_two_calls());
  const auto events = parse(text);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].data["sequence_number"], static_cast<int64_t>(i));
    EXPECT_EQ(events[i].data["type"], events[i].event);
  }
  ASSERT_EQ(events.back().event, "response.completed");
  const json& output = events.back().data["response"]["output"];
  ASSERT_EQ(output.size(), 3u) << output.dump();
  EXPECT_EQ(output[0]["type"], "reasoning");
  EXPECT_EQ(output[0]["summary"][0]["text"], "Let me think.");
  EXPECT_EQ(output[1]["type"], "function_call");
  EXPECT_EQ(output[1]["arguments"], "{\"command\": \"ls\"}");
  EXPECT_EQ(output[2]["name"], "Read");
  int added = 0, done = 0;
  for (const auto& e : events)
    added += e.event == "response.output_item.added", done += e.event == "response.output_item.done";
  EXPECT_EQ(added, 3);
  EXPECT_EQ(done, 3);
}

TEST(AnthropicConversion, ToolResultsComeFirstAndAssistantBlocksMerge) {
  std::vector<std::string> notes;
  const ojson chat = anthropic_to_chat(ojson::parse(R"({
    "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    "messages": [
      {"role": "user", "content": "go"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "x"},
                                         {"type": "tool_use", "id": "u1", "name": "f", "input": {"b": 1, "a": 2}}]},
      {"role": "user", "content": [{"type": "text", "text": "also"}, {"type": "tool_result", "tool_use_id": "u1",
                                    "content": [{"type": "text", "text": "r1"}], "is_error": true}]}],
    "tools": [{"name": "f", "input_schema": {"type": "object"}}, {"type": "bash_20250124", "name": "bash"}],
    "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true}, "max_tokens": 5})"),
                                       notes);
  const ojson& m = chat["messages"];
  ASSERT_EQ(m.size(), 5u) << chat.dump();
  EXPECT_EQ(m[0]["content"], "a\nb");
  EXPECT_EQ(m[2]["reasoning_content"], "t");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], R"({"b":1,"a":2})");  // key order kept
  EXPECT_EQ(m[3]["role"], "tool");
  EXPECT_EQ(m[3]["content"], "r1");
  EXPECT_EQ(m[4]["content"], "also");
  EXPECT_EQ(chat["tools"].size(), 1u);
  EXPECT_EQ(notes.size(), 1u);
  EXPECT_EQ(chat["tool_choice"]["function"]["name"], "f");
  EXPECT_EQ(chat["parallel_tool_calls"], false);
}

// What the Messages API requires is required here, each refusal naming the field.
TEST(AnthropicConversion, RequiredFieldsAreRequired) {
  auto error_of = [](const std::string& body, AnthropicRoute route = AnthropicRoute::MESSAGES) {
    std::vector<std::string> notes;
    try {
      anthropic_to_chat(ojson::parse(body), notes, route);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string user = R"({"role": "user", "content": "hi"})";
  EXPECT_NE(error_of(R"({"messages": [)" + user + "]}").find("missing required field 'max_tokens'"),
            std::string::npos);
  EXPECT_EQ(error_of(R"({"messages": [)" + user + "]}", AnthropicRoute::COUNT_TOKENS), "(accepted)")
      << "count_tokens takes no max_tokens";
  EXPECT_NE(error_of(R"({"max_tokens": 0, "messages": [)" + user + "]}")
                .find("'max_tokens' must be an integer >= 1"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"max_tokens": 9, "messages": []})").find("'messages' must hold at least one"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"max_tokens": 9, "messages": [{"role": "user"}]})")
                .find("missing required field 'messages[0].content'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"max_tokens": 9, "messages": [{"role": "tool", "content": "x"}]})")
                .find("'messages[0].role' must be"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"max_tokens": 9, "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]}]})")
                .find("'messages[0].content[0].tool_use_id' is 'toolu_1', which no earlier tool_use"),
            std::string::npos);
  EXPECT_EQ(error_of(R"({"max_tokens": 9, "messages": [{"role": "system", "content": "s"}, )" + user + "]}"),
            "(accepted)")
      << "the system turn Claude Code sends";
}

TEST(ResponsesConversion, ContentIsAStringOrPartsWhereverTheApiSaysSo) {
  std::vector<std::string> notes;
  // The easy input message (with and without type), output as a string or parts, reasoning
  // with content null (as Codex sends it) or absent.
  const ojson chat = responses_to_chat(ojson::parse(R"({"input": [
      {"role": "user", "content": "plain"},
      {"type": "message", "role": "system", "content": "sys"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "parts"}]},
      {"type": "reasoning", "summary": [], "content": null, "encrypted_content": null},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "o-string"},
      {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "o-parts"}]},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
      {"type": "message", "role": "assistant", "content": "answer"}]})"),
                                       notes);
  const ojson& m = chat["messages"];
  ASSERT_EQ(m.size(), 8u) << chat.dump();
  EXPECT_EQ(m[0]["content"], "plain");
  EXPECT_EQ(m[1]["content"], "sys");
  EXPECT_EQ(m[2]["content"], "parts");
  EXPECT_EQ(m[4]["content"], "o-string");
  EXPECT_EQ(m[6]["content"], "o-parts");
  EXPECT_EQ(m[7]["content"], "answer");
  EXPECT_EQ(m[7]["reasoning_content"], "s");
  auto error_of = [](const std::string& body) {
    std::vector<std::string> notes;
    try {
      responses_to_chat(ojson::parse(body), notes);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(error_of(R"({"input": [{"role": "user"}]})").find("missing required field 'input[0].content'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"input": [{"role": "user", "content": 5}]})")
                .find("'input[0].content' must be a string or"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})")
                .find("missing required field 'input[0].output'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"input": [{"type": "reasoning", "summary": "s"}]})")
                .find("'input[0].summary' must be an array"),
            std::string::npos);
}

TEST(ResponsesConversion, ItemsFormTurnsAndCustomToolsBecomeFunctions) {
  std::vector<std::string> notes;
  const ojson chat = responses_to_chat(ojson::parse(R"({
    "instructions": "sys",
    "input": [
      {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
      {"role": "user", "content": "q"},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": null},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"},
      {"type": "function_call_output", "call_id": "c1", "output": "o1"},
      {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "o2"}]},
      {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "next"}], "summary": []},
      {"type": "message", "role": "assistant", "content": "done"}],
    "tools": [{"type": "function", "name": "f"}, {"type": "custom", "name": "apply_patch"}, {"type": "tool_search"}],
    "max_output_tokens": 9, "text": {"format": {"type": "json_object"}}})"),
                                       notes);
  const ojson& m = chat["messages"];
  ASSERT_EQ(m.size(), 7u) << chat.dump();
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[1]["role"], "system");
  EXPECT_EQ(m[3]["reasoning_content"], "plan");
  EXPECT_EQ(m[3]["content"], "calling");
  ASSERT_EQ(m[3]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[3]["tool_calls"][1]["function"]["arguments"], R"({"input":"*** Begin"})");
  EXPECT_EQ(m[4]["tool_call_id"], "c1");
  EXPECT_EQ(m[5]["content"], "o2");
  EXPECT_EQ(m[6]["reasoning_content"], "next");
  EXPECT_EQ(m[6]["content"], "done");
  EXPECT_EQ(chat["tools"].size(), 2u);
  EXPECT_EQ(chat["tools"][1]["function"]["parameters"]["required"][0], "input");
  EXPECT_EQ(notes.size(), 1u);
  EXPECT_EQ(chat["max_tokens"], 9);
  EXPECT_EQ(chat["response_format"]["type"], "json_object");
}

// OpenAI's `data:` lines (the [DONE] trailer excluded).
std::vector<json> data_lines(const std::string& text) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\n\n", pos);
    const std::string block = text.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(block.rfind("data: ", 0), 0u) << block;
    out.push_back(json::parse(block.substr(6)));
  }
  return out;
}

OpenAIDialectOptions two_choices() {
  OpenAIDialectOptions o;
  o.model = "m";
  o.n = 2;
  o.include_usage = true;
  o.episode_uuid = "ep";
  o.token_text = [](TokenId id) { return "<" + std::to_string(id) + ">"; };
  return o;
}

// Choice 0 calls a tool while streaming, choice 1 answers text: each choice's flushed events
// come right before its own finish chunk, then the usage chunk; the whole answer names both.
TEST(ChatCompletionsDialect, StreamsEachChoiceThenItsFinishThenUsage) {
  auto d = make_chat_completions_dialect(two_choices());
  EXPECT_TRUE(d->splits_text());
  EXPECT_FALSE(d->needs_a_choice());
  std::string text = d->stream_start(7);
  text += d->stream_events(0, {{StreamEvent::TOOL_CALL_START, "", 0, "f"}});
  text += d->stream_events(1, {{StreamEvent::CONTENT, "hi", 0, ""}});
  GenerationChoice g0, g1;
  g0.ids = {1, 2};
  g0.text = "call";
  g0.finish_reason = "stop";
  g1.ids = {3};
  g1.text = "hi!";
  g1.finish_reason = "length";
  DialectAnswer a;
  a.prompt_tokens = 7;
  a.completion_tokens = 3;
  a.policy_version = 4;
  a.choices.push_back({&g0, {}, "stop", "", {{StreamEvent::TOOL_CALL_ARGUMENTS, "{}", 0, ""}}});
  a.choices.push_back({&g1, {}, "length", "", {{StreamEvent::CONTENT, "!", 0, ""}}});
  a.choices[0].parsed.tool_calls = {{"f", "{}"}};
  a.choices[1].parsed.content = "hi!";
  text += d->stream_finish(a);
  EXPECT_EQ(d->stream_trailer(), "data: [DONE]\n\n");
  const auto chunks = data_lines(text);
  ASSERT_EQ(chunks.size(), 9u) << text;
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks[1]["choices"][0]["index"], 1);
  EXPECT_EQ(chunks[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(chunks[3]["choices"][0]["delta"]["content"], "hi");
  EXPECT_EQ(chunks[4]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(chunks[5]["choices"][0]["finish_reason"], "tool_calls");  // a call was streamed
  EXPECT_EQ(chunks[6]["choices"][0]["delta"]["content"], "!");
  EXPECT_EQ(chunks[7]["choices"][0]["index"], 1);
  EXPECT_EQ(chunks[7]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(chunks[8]["choices"].empty());
  EXPECT_EQ(chunks[8]["usage"]["total_tokens"], 10);
  for (const auto& c : chunks) EXPECT_EQ(c["id"], chunks[0]["id"]);
  const json whole = d->answer(a);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(whole["choices"][1]["message"]["content"], "hi!");
  EXPECT_EQ(whole["swarm"], json({{"episode_uuid", "ep"}, {"policy_version", 4}}));
  const auto recorded = d->recorded(a, nullptr);  // streamed: assembled into one chat.completion
  ASSERT_TRUE(recorded.has_value());
  EXPECT_EQ(json::parse(*recorded)["choices"].size(), 2u);
  EXPECT_EQ(d->recorded(a, &whole), whole.dump());
}

TEST(CompletionsDialect, StreamsRawTextAndAnswersTextCompletions) {
  OpenAIDialectOptions o = two_choices();
  o.logprobs = true;
  o.return_token_ids = true;
  o.prompt = {5, 6};
  auto d = make_completions_dialect(std::move(o));
  EXPECT_FALSE(d->splits_text());
  EXPECT_EQ(d->stream_start(2), "");
  std::string text = d->stream_text(1, "<think>");  // never split
  GenerationChoice g;
  g.ids = {9};
  g.text = "<think>";
  g.logprobs = {-0.5f};
  g.finish_reason = "stop";
  DialectAnswer a;
  a.prompt_tokens = 2;
  a.completion_tokens = 1;
  a.choices.push_back({&g, {}, "stop", "", {}});
  text += d->stream_finish(a);
  const auto chunks = data_lines(text);
  ASSERT_EQ(chunks.size(), 3u) << text;
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "<think>");
  EXPECT_EQ(chunks[0]["choices"][0]["index"], 1);
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chunks[2]["object"], "text_completion");
  const json whole = d->answer(a);
  EXPECT_EQ(whole["choices"][0]["text"], "<think>");
  EXPECT_EQ(whole["choices"][0]["logprobs"]["tokens"], json::array({"<9>"}));
  EXPECT_EQ(whole["choices"][0]["token_ids"], json::array({9}));
  EXPECT_EQ(whole["prompt_token_ids"], json::array({5, 6}));
  EXPECT_FALSE(d->recorded(a, &whole).has_value());  // replay shows chat-like calls only
  EXPECT_EQ(d->stream_error(ErrorKind::UNAVAILABLE, "busy").rfind("data: {", 0), 0u);
}

TEST(AnthropicDialect, ErrorsInAnthropicsShapeAndNeedsAChoice) {
  auto d = make_anthropic_dialect("m");
  EXPECT_EQ(d->error_style(), ErrorStyle::ANTHROPIC);
  EXPECT_TRUE(d->needs_a_choice());
  const HttpResponse r = error_response(d->error_style(), ErrorKind::NOT_FOUND, "no such episode");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(
      json::parse(r.body),
      json::parse(R"({"type":"error","error":{"type":"not_found_error","message":"no such episode"}})"));
}

}  // namespace
}  // namespace swarm
