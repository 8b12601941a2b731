// Tests of src/text/tool_calls: tool-call and reasoning parsing of generated text (Qwen2.5/Qwen3
// hermes calls, Llama-3.1 JSON calls, <think> blocks), the streamed parser's equivalence with the
// whole-text one over many splits, detection from the real chat templates, and a round trip
// through Qwen3's template that reproduces the generated text byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "text/chat_template.hpp"
#include "text/tool_calls.hpp"

namespace swarm {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kFixtures = SWARM_FIXTURES_DIR;
const std::string kSource = SWARM_SOURCE_DIR;
const std::string kQwen3Dir = kFixtures + "/tokenizers/qwen3";
const std::string kSmolTemplate = kFixtures + "/models/smollm2-135m-instruct-noweights/chat_template.jinja";
const std::string kLlamaTemplate = kSource + "/tests/data/llama3_chat_template.jinja";

constexpr auto H = ToolCallFormat::HERMES;
constexpr auto L = ToolCallFormat::LLAMA3_JSON;
constexpr auto NO_TOOLS = ToolCallFormat::NONE;
constexpr auto THINK = ReasoningFormat::THINK;
constexpr auto NO_THINK = ReasoningFormat::NONE;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "missing test fixture " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string qwen3_template() {
  return nlohmann::json::parse(read_file(kQwen3Dir + "/tokenizer_config.json"))["chat_template"]
      .get<std::string>();
}

ParsedToolCall call(std::string name, std::string arguments) {
  return {std::move(name), std::move(arguments)};
}

// ------------------------------------------------------------------ names and detection

TEST(ToolCallFormats, NamesRoundTrip) {
  for (auto f : {ToolCallFormat::NONE, ToolCallFormat::HERMES, ToolCallFormat::LLAMA3_JSON}) {
    ToolCallFormat parsed = ToolCallFormat::NONE;
    ASSERT_TRUE(parse_tool_call_format(tool_call_format_name(f), &parsed));
    EXPECT_EQ(parsed, f);
  }
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::LLAMA3_JSON), "llama3_json");
  ToolCallFormat untouched = ToolCallFormat::HERMES;
  for (const char* bad : {"auto", "Hermes", "", "llama3", "none "}) {
    EXPECT_FALSE(parse_tool_call_format(bad, &untouched)) << bad;
    EXPECT_EQ(untouched, ToolCallFormat::HERMES);
  }
  for (auto f : {ReasoningFormat::NONE, ReasoningFormat::THINK}) {
    ReasoningFormat parsed = ReasoningFormat::NONE;
    ASSERT_TRUE(parse_reasoning_format(reasoning_format_name(f), &parsed));
    EXPECT_EQ(parsed, f);
  }
  ReasoningFormat r = ReasoningFormat::THINK;
  EXPECT_FALSE(parse_reasoning_format("auto", &r));
  EXPECT_FALSE(parse_reasoning_format("deepseek_r1", &r));
  EXPECT_EQ(r, ReasoningFormat::THINK);
}

TEST(ToolCallFormats, DetectFromRealTemplates) {
  const std::string qwen3 = qwen3_template();
  EXPECT_EQ(detect_tool_call_format(qwen3), H);
  EXPECT_EQ(detect_reasoning_format(qwen3), THINK);

  const std::string llama = read_file(kLlamaTemplate);
  EXPECT_EQ(detect_tool_call_format(llama), L);
  EXPECT_EQ(detect_reasoning_format(llama), NO_THINK);

  const std::string smol = read_file(kSmolTemplate);  // plain ChatML, no tools
  EXPECT_EQ(detect_tool_call_format(smol), NO_TOOLS);
  EXPECT_EQ(detect_reasoning_format(smol), NO_THINK);
}

TEST(ToolCallFormats, DetectFromSnippets) {
  // Qwen2.5: hermes calls, no thinking.
  const std::string qwen25 =
      "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
      "within "
      "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
      "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}";
  EXPECT_EQ(detect_tool_call_format(qwen25), H);
  EXPECT_EQ(detect_reasoning_format(qwen25), NO_THINK);
  // Llama 3.0: the headers but no tool rendering.
  const std::string llama30 =
      "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
      "message['content'] | trim + '<|eot_id|>' }}{% endfor %}";
  EXPECT_EQ(detect_tool_call_format(llama30), NO_TOOLS);
  // Llama 3.2 style: only the python tag for built-in tools.
  EXPECT_EQ(detect_tool_call_format(llama30 + "{{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}"), L);
  // "parameters" without Llama headers (some other family) is not Llama JSON.
  EXPECT_EQ(detect_tool_call_format("{{ tool | tojson }} \"parameters\""), NO_TOOLS);
  // DeepSeek-R1 opens <think> in the generation prompt; others only mention </think>.
  EXPECT_EQ(detect_reasoning_format("{{'<｜Assistant｜><think>\\n'}}"), THINK);
  EXPECT_EQ(detect_reasoning_format("{% set content = content.split('</think>')[-1] %}"), THINK);
  EXPECT_EQ(detect_tool_call_format(""), NO_TOOLS);
  EXPECT_EQ(detect_reasoning_format(""), NO_THINK);
}

TEST(ToolCallFormats, ReasoningStartFromPrompt) {
  EXPECT_EQ(reasoning_start_from_prompt("<|im_start|>assistant\n"), ReasoningStart::AUTO);
  EXPECT_EQ(reasoning_start_from_prompt("<|im_start|>assistant\n<think>\n"), ReasoningStart::IN_REASONING);
  EXPECT_EQ(reasoning_start_from_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            ReasoningStart::AFTER_REASONING);
  EXPECT_EQ(reasoning_start_from_prompt(""), ReasoningStart::AUTO);
  // The real Qwen3 prompt with enable_thinking=false.
  const ChatTemplate t = ChatTemplate::from_directory(kQwen3Dir);
  const ojson messages = ojson::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(reasoning_start_from_prompt(
                t.render(messages, ojson(nullptr), true, ojson{{"enable_thinking", false}})),
            ReasoningStart::AFTER_REASONING);
  EXPECT_EQ(reasoning_start_from_prompt(t.render(messages, ojson(nullptr), true)), ReasoningStart::AUTO);
}

// ------------------------------------------------------------------ hermes (Qwen2.5 / Qwen3)

TEST(HermesToolCalls, SingleCall) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}}\n"
      "</tool_call>";
  const ParsedAssistant p = parse_assistant_output(text, H, NO_THINK);
  EXPECT_FALSE(p.content.has_value());
  EXPECT_FALSE(p.reasoning.has_value());
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0], call("get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}"));
  EXPECT_EQ(p.parse_failures, 0);
}

// A model that generates arguments nested past the bound (common/json_nesting.hpp) gets its
// text back as text, not a call whose arguments would later be dumped level by level.
TEST(HermesToolCalls, ArgumentsNestedTooDeepStayText) {
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  const std::string text =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}\n</tool_call>";
  const ParsedAssistant p = parse_assistant_output(text, H, NO_THINK);
  EXPECT_TRUE(p.tool_calls.empty());
  EXPECT_EQ(p.parse_failures, 1);
  ASSERT_TRUE(p.content.has_value());
  EXPECT_NE(p.content->find(deep), std::string::npos);
  // Within the bound it is a call: 2 levels (the call object, "arguments") + 125 = 127.
  const std::string ok_deep = std::string(126, '[') + std::string(126, ']');
  const ParsedAssistant q = parse_assistant_output(
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": " + ok_deep.substr(1, ok_deep.size() - 2) +
          "}}\n</tool_call>",
      H, NO_THINK);
  EXPECT_EQ(q.tool_calls.size(), 1u);
}

TEST(HermesToolCalls, ContentBeforeAndSeveralCalls) {
  const std::string text =
      "I'll look up both cities.  \n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Tokyo\"}}\n</tool_call>\n";
  const ParsedAssistant p = parse_assistant_output(text, H, THINK);
  EXPECT_EQ(p.content, "I'll look up both cities.");
  EXPECT_FALSE(p.reasoning.has_value());
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0], call("get_weather", "{\"city\": \"Paris\"}"));
  EXPECT_EQ(p.tool_calls[1], call("get_weather", "{\"city\": \"Tokyo\"}"));
  EXPECT_EQ(p.parse_failures, 0);

  const ParsedAssistant first_only = parse_assistant_output(text, H, THINK, /*parallel_tool_calls=*/false);
  EXPECT_EQ(first_only.content, "I'll look up both cities.");
  ASSERT_EQ(first_only.tool_calls.size(), 1u);
  EXPECT_EQ(first_only.tool_calls[0], p.tool_calls[0]);
}

TEST(HermesToolCalls, Qwen3ThinkingThenCall) {
  const std::string text =
      "<think>\nThe user wants the weather in Paris.\nI should call get_weather.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const ParsedAssistant p = parse_assistant_output(text, H, THINK);
  EXPECT_EQ(p.reasoning, "The user wants the weather in Paris.\nI should call get_weather.");
  EXPECT_FALSE(p.content.has_value());
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  // A <tool_call> inside the reasoning is not a call: tools are parsed after the reasoning.
  const ParsedAssistant inside = parse_assistant_output(
      "<think>maybe <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>?</think>\n\nNo tool needed.",
      H, THINK);
  EXPECT_EQ(inside.reasoning, "maybe <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>?");
  EXPECT_EQ(inside.content, "No tool needed.");
  EXPECT_TRUE(inside.tool_calls.empty());
}

TEST(HermesToolCalls, ArgumentsAreTheRawGeneratedText) {
  // Nested objects, arrays, odd spacing, key order, numbers as written, escapes: all verbatim.
  const std::string args =
      "{ \"query\" "
      ":{\"filters\":[{\"field\":\"price\",\"op\":\"<\",\"value\":10.50}],\"sort\":{\"desc\":true,"
      "\"by\":\"date\"}} , \"limit\":null,\"note\":\"a \\\"quoted\\\" } brace\\n\"}";
  const ParsedAssistant p = parse_assistant_output(
      "<tool_call>\n{\"name\": \"search\", \"arguments\": " + args + "}\n</tool_call>", H, NO_THINK);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, args);
  EXPECT_TRUE(nlohmann::json::parse(p.tool_calls[0].arguments).is_object());

  // Arguments before the name, and a key spelled with an escape.
  const ParsedAssistant q = parse_assistant_output(
      "<tool_call>{\"argu\\u006dents\": {\"x\": [1, 2]}, \"name\": \"f\"}</tool_call>", H, NO_THINK);
  ASSERT_EQ(q.tool_calls.size(), 1u);
  EXPECT_EQ(q.tool_calls[0], call("f", "{\"x\": [1, 2]}"));
}

TEST(HermesToolCalls, Unicode) {
  const std::string args =
      "{\"text\": \"héllo wörld 日本語 🙂\", \"escaped\": \"\\u00e9\\ud83d\\ude42\"}";
  const ParsedAssistant p = parse_assistant_output(
      "Überprüfe… 🙂\n<tool_call>\n{\"name\": \"übersetzen\", \"arguments\": " + args +
          "}\n</tool_call>",
      H, NO_THINK);
  EXPECT_EQ(p.content, "Überprüfe… 🙂");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0], call("übersetzen", args));
}

TEST(HermesToolCalls, WhitespaceVariations) {
  for (const std::string& text : {
           std::string("<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>"),
           std::string("<tool_call>  {\"name\" : \"f\" ,\"arguments\" : {}}\t</tool_call>"),
           std::string(
               "\n\n<tool_call>\r\n{\n  \"name\": \"f\",\n  \"arguments\": {}\n}\r\n</tool_call>\n\n"),
       }) {
    const ParsedAssistant p = parse_assistant_output(text, H, NO_THINK);
    EXPECT_FALSE(p.content.has_value()) << text;
    ASSERT_EQ(p.tool_calls.size(), 1u) << text;
    EXPECT_EQ(p.tool_calls[0], call("f", "{}")) << text;
    EXPECT_EQ(p.parse_failures, 0);
  }
  // Calls back to back with nothing between them.
  const ParsedAssistant p = parse_assistant_output(
      "<tool_call>{\"name\":\"a\",\"arguments\":{}}</"
      "tool_call><tool_call>{\"name\":\"b\",\"arguments\":{\"k\":1}}"
      "</tool_call>",
      H, NO_THINK);
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[1], call("b", "{\"k\":1}"));
}

TEST(HermesToolCalls, ArgumentsGivenAsAString) {
  const ParsedAssistant p = parse_assistant_output(
      "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": "
      "[\\\"x\\\"]}\"}\n</tool_call>",
      H, NO_THINK);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0], call("f", "{\"a\": 1, \"b\": [\"x\"]}"));
  EXPECT_EQ(p.parse_failures, 0);
  // A string that is not a JSON object is not a call.
  for (const char* bad : {"\"not json\"", "\"[1, 2]\"", "\"\"", "null", "[1]", "3"}) {
    const std::string text =
        std::string("<tool_call>{\"name\": \"f\", \"arguments\": ") + bad + "}</tool_call>";
    const ParsedAssistant q = parse_assistant_output(text, H, NO_THINK);
    EXPECT_TRUE(q.tool_calls.empty()) << bad;
    EXPECT_EQ(q.content, text) << bad;
    EXPECT_EQ(q.parse_failures, 1) << bad;
  }
}

TEST(HermesToolCalls, ParametersAliasAccepted) {
  const ParsedAssistant p = parse_assistant_output(
      "<tool_call>{\"name\": \"f\", \"parameters\": {\"a\": 1}}</tool_call>", H, NO_THINK);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0], call("f", "{\"a\": 1}"));
}

TEST(HermesToolCalls, MalformedBlocksStayInContent) {
  const std::string bad_json = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>";
  const std::string no_name = "<tool_call>\n{\"arguments\": {\"a\": 1}}\n</tool_call>";
  const std::string good = "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
  for (const std::string& block :
       {bad_json, no_name, std::string("<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>"),
        std::string("<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>"),
        std::string("<tool_call>{\"name\": \"f\"}</tool_call>"), std::string("<tool_call>[1, 2]</tool_call>"),
        std::string("<tool_call></tool_call>"),
        std::string("<tool_call>{\"name\": \"f\", \"arguments\": {}} trailing</tool_call>")}) {
    const ParsedAssistant alone = parse_assistant_output("Let me try.\n" + block, H, NO_THINK);
    EXPECT_EQ(alone.content, "Let me try.\n" + block);  // no call: nothing is trimmed
    EXPECT_TRUE(alone.tool_calls.empty());
    EXPECT_EQ(alone.parse_failures, 1) << block;

    // Next to a good call: the bad block is text before the first call (right-trimmed).
    const ParsedAssistant mixed = parse_assistant_output("Let me try.\n" + block + "\n" + good, H, NO_THINK);
    EXPECT_EQ(mixed.content, "Let me try.\n" + block);
    ASSERT_EQ(mixed.tool_calls.size(), 1u);
    EXPECT_EQ(mixed.tool_calls[0].name, "g");
    EXPECT_EQ(mixed.parse_failures, 1);
  }
}

TEST(HermesToolCalls, TruncatedOutput) {
  const std::string start = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"argu";
  const ParsedAssistant p = parse_assistant_output(start, H, NO_THINK);
  EXPECT_EQ(p.content, start);
  EXPECT_TRUE(p.tool_calls.empty());
  EXPECT_EQ(p.parse_failures, 1);

  // A good call, then one cut off: the first is kept, the rest is content.
  const std::string good = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>";
  const ParsedAssistant q = parse_assistant_output(good + "\n<tool_call>\n{\"name\"", H, NO_THINK);
  ASSERT_EQ(q.tool_calls.size(), 1u);
  EXPECT_EQ(q.content, "\n<tool_call>\n{\"name\"");
  EXPECT_EQ(q.parse_failures, 1);

  // Only a partial tag at the end: plain text, no failure.
  const ParsedAssistant r = parse_assistant_output("Hello <tool_ca", H, NO_THINK);
  EXPECT_EQ(r.content, "Hello <tool_ca");
  EXPECT_EQ(r.parse_failures, 0);
}

TEST(HermesToolCalls, TextBetweenAndAfterCalls) {
  const std::string c1 = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
  const std::string c2 = "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
  // Whitespace-only text between and after calls is dropped.
  EXPECT_FALSE(parse_assistant_output(" \n" + c1 + "\n\n" + c2 + " \n", H, NO_THINK).content.has_value());
  // Other text is kept, appended verbatim after the (right-trimmed) text before the first call.
  const ParsedAssistant p =
      parse_assistant_output("Both:\n" + c1 + "\nand then\n" + c2 + "\nDone. ", H, NO_THINK);
  EXPECT_EQ(p.content, "Both:\nand then\n\nDone. ");
  EXPECT_EQ(p.tool_calls.size(), 2u);
  const ParsedAssistant first_only =
      parse_assistant_output("Both:\n" + c1 + "\nand then\n" + c2, H, NO_THINK, false);
  EXPECT_EQ(first_only.content, "Both:\nand then\n");
  ASSERT_EQ(first_only.tool_calls.size(), 1u);
  EXPECT_EQ(first_only.tool_calls[0].name, "a");
}

TEST(HermesToolCalls, PlainTextAndLookalikes) {
  for (const std::string& text : {std::string("Paris is sunny today."), std::string(""), std::string("  \n"),
                                  std::string("Use <tool_call_fix> or </tool_call> or <tool call>."),
                                  std::string("a < b and c <tool")}) {
    const ParsedAssistant p = parse_assistant_output(text, H, NO_THINK);
    EXPECT_EQ(p.content, text);  // no calls: kept verbatim, "" included
    EXPECT_TRUE(p.tool_calls.empty());
    EXPECT_EQ(p.parse_failures, 0) << text;
  }
}

TEST(HermesToolCalls, NoneFormatLeavesEverythingInContent) {
  const std::string text = "<think>x</think><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  const ParsedAssistant p = parse_assistant_output(text, NO_TOOLS, NO_THINK);
  EXPECT_EQ(p.content, text);
  EXPECT_FALSE(p.reasoning.has_value());
  EXPECT_TRUE(p.tool_calls.empty());
}

// ------------------------------------------------------------------ reasoning

TEST(Reasoning, ThinkBlockAtTheStart) {
  const ParsedAssistant p =
      parse_assistant_output("<think>\nStep 1.\n\nStep 2.\n</think>\n\nThe answer is 4.\n", NO_TOOLS, THINK);
  EXPECT_EQ(p.reasoning, "Step 1.\n\nStep 2.");  // '\n' stripped at both ends, kept inside
  EXPECT_EQ(p.content, "The answer is 4.\n");    // leading '\n' stripped, the rest verbatim
  // Leading whitespace before <think>; spaces inside are kept.
  const ParsedAssistant q = parse_assistant_output(" \n<think> hmm </think>  ok", NO_TOOLS, THINK);
  EXPECT_EQ(q.reasoning, " hmm ");
  EXPECT_EQ(q.content, "  ok");
  // An empty block: no reasoning, content "".
  const ParsedAssistant r = parse_assistant_output("<think>\n\n</think>\n\n", NO_TOOLS, THINK);
  EXPECT_FALSE(r.reasoning.has_value());
  EXPECT_EQ(r.content, "");
}

TEST(Reasoning, ClosedButNotOpened) {
  // The prompt opened <think> (Qwen3-Thinking, DeepSeek-R1): everything before </think>.
  const ParsedAssistant p = parse_assistant_output("Let me think.\n</think>\n\nFour.", NO_TOOLS, THINK);
  EXPECT_EQ(p.reasoning, "Let me think.");
  EXPECT_EQ(p.content, "Four.");
  // Only the first </think> ends it.
  const ParsedAssistant q = parse_assistant_output("a</think>b</think>c", NO_TOOLS, THINK);
  EXPECT_EQ(q.reasoning, "a");
  EXPECT_EQ(q.content, "b</think>c");
}

TEST(Reasoning, UnterminatedThinkIsAllReasoning) {
  const ParsedAssistant p = parse_assistant_output("<think>\nStill thinking about <tool_call>", H, THINK);
  EXPECT_EQ(p.reasoning, "Still thinking about <tool_call>");
  EXPECT_EQ(p.content, "");  // no tool calls: "" is kept
  EXPECT_TRUE(p.tool_calls.empty());
  EXPECT_EQ(p.parse_failures, 0);
}

TEST(Reasoning, NoTagsIsAllContent) {
  const ParsedAssistant p = parse_assistant_output("Just an answer.", H, THINK);
  EXPECT_FALSE(p.reasoning.has_value());
  EXPECT_EQ(p.content, "Just an answer.");
  // <think> not at the start and no </think>: content.
  EXPECT_EQ(parse_assistant_output("Say <think> please", NO_TOOLS, THINK).content, "Say <think> please");
}

TEST(Reasoning, ReasoningStartFromThePrompt) {
  const std::string text =
      "\nweighing options\n</think>\n\nI'll call it.\n"
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  const ParsedAssistant in = parse_assistant_output(text, H, THINK, true, ReasoningStart::IN_REASONING);
  EXPECT_EQ(in.reasoning, "weighing options");
  EXPECT_EQ(in.content, "I'll call it.");
  EXPECT_EQ(in.tool_calls.size(), 1u);
  // IN_REASONING with no </think>: all reasoning, even a tool call (cut off while thinking).
  const ParsedAssistant cut =
      parse_assistant_output("thinking <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", H, THINK,
                             true, ReasoningStart::IN_REASONING);
  EXPECT_EQ(cut.reasoning, "thinking <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
  EXPECT_EQ(cut.content, "");
  EXPECT_TRUE(cut.tool_calls.empty());
  // AFTER_REASONING: no split at all (enable_thinking=false already closed the block).
  const ParsedAssistant after =
      parse_assistant_output("a</think>b", NO_TOOLS, THINK, true, ReasoningStart::AFTER_REASONING);
  EXPECT_FALSE(after.reasoning.has_value());
  EXPECT_EQ(after.content, "a</think>b");
  // Reasoning NONE ignores the start.
  EXPECT_EQ(
      parse_assistant_output("a</think>b", NO_TOOLS, NO_THINK, true, ReasoningStart::IN_REASONING).content,
      "a</think>b");
}

// ------------------------------------------------------------------ Llama-3 JSON

TEST(Llama3JsonToolCalls, SingleCall) {
  const ParsedAssistant p = parse_assistant_output(
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco\"}}", L, NO_THINK);
  EXPECT_FALSE(p.content.has_value());
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0], call("get_weather", "{\"city\": \"San Francisco\"}"));
  EXPECT_EQ(p.parse_failures, 0);
}

TEST(Llama3JsonToolCalls, PythonTagArgumentsKeyAndWhitespace) {
  const ParsedAssistant p = parse_assistant_output(
      "\n<|python_tag|> {\"name\": \"f\", \"arguments\": {\"nested\": {\"a\": [1, {\"b\": null}]}}}\n", L,
      NO_THINK);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0], call("f", "{\"nested\": {\"a\": [1, {\"b\": null}]}}"));
  EXPECT_FALSE(p.content.has_value());
}

TEST(Llama3JsonToolCalls, SeveralCallsSeparatedBySemicolons) {
  const std::string text =
      "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}};";
  const ParsedAssistant p = parse_assistant_output(text, L, NO_THINK);
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0], call("a", "{\"x\": 1}"));
  EXPECT_EQ(p.tool_calls[1], call("b", "{}"));
  const ParsedAssistant first = parse_assistant_output(text, L, NO_THINK, false);
  ASSERT_EQ(first.tool_calls.size(), 1u);
  EXPECT_EQ(first.tool_calls[0].name, "a");
  EXPECT_FALSE(first.content.has_value());
}

TEST(Llama3JsonToolCalls, PlainTextIsContentWithoutFailure) {
  for (const std::string& text :
       {std::string("The weather is nice."), std::string("Call {\"name\": \"f\"} later"), std::string(""),
        std::string("<|python_tag|>brave_search.call(query=\"x\")")}) {
    const ParsedAssistant p = parse_assistant_output(text, L, NO_THINK);
    EXPECT_EQ(p.content, text);
    EXPECT_TRUE(p.tool_calls.empty());
    EXPECT_EQ(p.parse_failures, 0) << text;
  }
}

TEST(Llama3JsonToolCalls, JsonThatIsNotACallIsAFailure) {
  for (const std::string& text :
       {std::string("{\"answer\": 4}"), std::string("{\"name\": \"f\", \"parameters\": {\"a\": 1}"),
        std::string("{\"name\": \"f\", \"parameters\": {}} and some text"),
        std::string("{\"name\": \"f\", \"parameters\": {}}; {\"oops\": 1}"),
        std::string("<|python_tag|>{bad json}"),
        std::string("{\"name\": \"f\", \"parameters\": {}} {\"name\": \"g\", \"parameters\": {}}")}) {
    const ParsedAssistant p = parse_assistant_output(text, L, NO_THINK);
    EXPECT_EQ(p.content, text);
    EXPECT_TRUE(p.tool_calls.empty()) << text;
    EXPECT_EQ(p.parse_failures, 1) << text;
  }
}

TEST(Llama3JsonToolCalls, AfterReasoning) {
  const ParsedAssistant p = parse_assistant_output(
      "<think>\nneed a call\n</think>\n\n{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}", L, THINK);
  EXPECT_EQ(p.reasoning, "need a call");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, "{\"q\": \"x\"}");
}

// ------------------------------------------------------------------ round trip through Qwen3

// What Qwen3's template renders for an assistant turn built from the parsed fields must be the
// generated text itself: the reason `arguments` is the raw text.
TEST(RoundTrip, Qwen3TemplateReproducesTheGeneratedText) {
  const ChatTemplate t = ChatTemplate::from_directory(kQwen3Dir);
  const std::string calls[] = {
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\",  "
      "\"days\":3}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"日本 🙂\", \"opts\": {\"n\": "
      "[1,2]}}}\n</tool_call>",
  };
  const std::string generations[] = {
      "<think>\nThe user asks about Paris.\n</think>\n\n" + calls[0],
      "<think>\nTwo lookups.\n</think>\n\nLet me check both.\n" + calls[0] + "\n" + calls[1],
      "<think>\nNo tool.\n</think>\n\nIt is sunny.",
  };
  for (const std::string& generated : generations) {
    const ParsedAssistant p = parse_assistant_output(generated, H, THINK);
    ojson assistant = {{"role", "assistant"}, {"content", p.content.value_or("")}};
    if (p.reasoning) assistant["reasoning_content"] = *p.reasoning;
    if (!p.tool_calls.empty()) {
      assistant["tool_calls"] = ojson::array();
      for (const auto& c : p.tool_calls)
        assistant["tool_calls"].push_back({{"id", "call_1"},
                                           {"type", "function"},
                                           {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    const ojson messages = ojson::array({ojson{{"role", "user"}, {"content", "Weather?"}}, assistant});
    const std::string rendered = t.render(messages, ojson(nullptr), false);
    EXPECT_NE(rendered.find("<|im_start|>assistant\n" + generated + "<|im_end|>\n"), std::string::npos)
        << "generated:\n"
        << generated << "\nrendered:\n"
        << rendered;
  }
}

// ------------------------------------------------------------------ message content

TEST(MessageContentText, Shapes) {
  using nlohmann::json;
  EXPECT_EQ(message_content_text(json("hello")), "hello");
  EXPECT_EQ(message_content_text(json(nullptr)), "");
  EXPECT_EQ(message_content_text(json::parse(R"([{"type": "text", "text": "a"}, {"type": "image_url",
      "image_url": {"url": "x"}}, {"type": "text", "text": "b"}, {"text": "c"}, "d", {"type": "text", "text": 5},
      {"type": "text"}, 7, null, [1]])")),
            "abcd");
  EXPECT_EQ(message_content_text(json::array()), "");
  EXPECT_EQ(message_content_text(json(5)), "");
  EXPECT_EQ(message_content_text(json(true)), "");
  EXPECT_EQ(message_content_text(json::object({{"text", "x"}})), "");
  EXPECT_EQ(
      message_content_text(ojson::parse(R"([{"type": "text", "text": "é"}, {"type": "text", "text": "!"}])")),
      "é!");
  EXPECT_EQ(message_content_text(ojson("s")), "s");
}

// ------------------------------------------------------------------ streaming

struct Streamed {
  std::string content;
  std::string reasoning;
  std::vector<ParsedToolCall> calls;
  int failures = 0;
  std::vector<StreamEvent> events;
};

// Checks the event protocol and folds the events into whole fields.
void collect(const std::vector<StreamEvent>& events, Streamed* s) {
  for (const StreamEvent& e : events) {
    s->events.push_back(e);
    switch (e.kind) {
      case StreamEvent::CONTENT:
        EXPECT_FALSE(e.text.empty());
        s->content += e.text;
        break;
      case StreamEvent::REASONING:
        EXPECT_FALSE(e.text.empty());
        s->reasoning += e.text;
        break;
      case StreamEvent::TOOL_CALL_START:
        EXPECT_EQ(e.index, static_cast<int>(s->calls.size()));
        EXPECT_FALSE(e.name.empty());
        s->calls.push_back({e.name, ""});
        break;
      case StreamEvent::TOOL_CALL_ARGUMENTS:
        ASSERT_FALSE(s->calls.empty());
        EXPECT_EQ(e.index, static_cast<int>(s->calls.size()) - 1);
        s->calls.back().arguments += e.text;
        break;
    }
  }
}

Streamed stream(const std::vector<std::string>& deltas, ToolCallFormat tools, ReasoningFormat reasoning,
                bool parallel = true, ReasoningStart start = ReasoningStart::AUTO) {
  StreamingAssistantParser parser(tools, reasoning, parallel, start);
  Streamed s;
  for (const std::string& d : deltas) collect(parser.feed(d), &s);
  collect(parser.finish(), &s);
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_TRUE(parser.feed("more").empty());
  s.failures = parser.parse_failures();
  return s;
}

std::vector<std::string> split_at(const std::string& text, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::string> parts;
  size_t prev = 0;
  for (size_t c : cuts) {
    parts.push_back(text.substr(prev, c - prev));
    prev = c;
  }
  parts.push_back(text.substr(prev));
  return parts;
}

// The splits tried for a text: whole, one byte at a time, every single cut (short texts, when
// asked), and random ones.
std::vector<std::vector<std::string>> splits_of(const std::string& text, std::mt19937& rng, int random_splits,
                                                bool single_cuts) {
  std::vector<std::vector<std::string>> out;
  out.push_back({text});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  out.push_back(bytes);
  if (single_cuts && text.size() <= 200)
    for (size_t i = 1; i < text.size(); ++i) out.push_back(split_at(text, {i}));
  for (int r = 0; r < random_splits && !text.empty(); ++r) {
    std::uniform_int_distribution<size_t> pos(0, text.size());
    std::uniform_int_distribution<int> count(1, 1 + static_cast<int>(std::min<size_t>(text.size(), 12)));
    std::vector<size_t> cuts;
    for (int k = count(rng); k > 0; --k) cuts.push_back(pos(rng));
    out.push_back(split_at(text, cuts));  // empty deltas included
  }
  return out;
}

// The property: streamed == whole, for every split. Returns false after the first mismatch.
bool expect_stream_matches(const std::string& text, ToolCallFormat tools, ReasoningFormat reasoning,
                           bool parallel, ReasoningStart start, std::mt19937& rng, int random_splits,
                           bool single_cuts) {
  const ParsedAssistant whole = parse_assistant_output(text, tools, reasoning, parallel, start);
  for (const auto& deltas : splits_of(text, rng, random_splits, single_cuts)) {
    const Streamed s = stream(deltas, tools, reasoning, parallel, start);
    const bool same = s.content == whole.content.value_or("") &&
                      s.reasoning == whole.reasoning.value_or("") && s.calls == whole.tool_calls &&
                      s.failures == whole.parse_failures;
    if (!same) {
      std::string shown;
      for (const auto& d : deltas) shown += "[" + d + "]";
      ADD_FAILURE() << "stream differs from whole parse\n  tools=" << tool_call_format_name(tools)
                    << " reasoning=" << reasoning_format_name(reasoning) << " parallel=" << parallel
                    << " start=" << static_cast<int>(start) << "\n  deltas: " << shown << "\n  content: ["
                    << s.content << "] vs [" << whole.content.value_or("") << "]\n  reasoning: ["
                    << s.reasoning << "] vs [" << whole.reasoning.value_or("")
                    << "]\n  calls: " << s.calls.size() << " vs " << whole.tool_calls.size()
                    << "\n  failures: " << s.failures << " vs " << whole.parse_failures;
      return false;
    }
  }
  return true;
}

bool expect_stream_matches_all_settings(const std::string& text, std::mt19937& rng, int random_splits,
                                        bool single_cuts = false) {
  for (auto tools : {NO_TOOLS, H, L})
    for (auto reasoning : {NO_THINK, THINK})
      for (bool parallel : {true, false})
        for (auto start :
             {ReasoningStart::AUTO, ReasoningStart::IN_REASONING, ReasoningStart::AFTER_REASONING}) {
          if (reasoning == NO_THINK && start != ReasoningStart::AUTO) continue;
          if (!expect_stream_matches(text, tools, reasoning, parallel, start, rng, random_splits,
                                     single_cuts))
            return false;
        }
  return true;
}

const std::string kCall1 =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const std::string kCall2 =
    "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": {\"nested\": [1, \"}\"]}, \"u\": "
    "\"日本\"}}\n</tool_call>";
const std::string kLlamaCall = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";

const char kBinary[] =
    "bin\0ary\xff\xfe<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\xff\"}}</tool_call>";

// Realistic outputs and edge cases; every test below runs them through every setting.
std::vector<std::string> corpus() {
  return {
      "",
      "Plain answer.",
      "  padded answer \n",
      kCall1,
      "I'll check.\n" + kCall1,
      "I'll check both.\n" + kCall1 + "\n" + kCall2 + "\n",
      "<think>\nreasoning here\n</think>\n\n" + kCall1,
      "<think>\nTwo calls.\n</think>\n\nLet me look.  \n" + kCall1 + "\n" + kCall2,
      "<think>\n\n</think>\n\nDirect answer.",
      "<think>unterminated thought with <tool_call> inside",
      "\n <think>\nleading space\n\n</think>\n\n\nanswer\n\n",
      "implicit reasoning\n</think>\n\nthe answer",
      "implicit\n</think>" + kCall1,
      "a</think>b</think>c<think>d",
      "Say <think> please",
      "<thin",
      "<think",
      "</thin",
      "<tool_call",
      "text <tool_call>\n{\"name\": \"f\", \"argu",
      "text <tool_call>{bad json}</tool_call> more " + kCall1 + " after\n",
      kCall1 + "\n\nDone: " + kCall2 + "   ",
      kCall1 + kCall2 + "\n<tool_call>{\"name\": \"x\"}</tool_call>\n",
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> trailing </tool_call>",
      "</tool_call><tool_call><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
      "Use <tool_call_fix> and <tool > and <<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>",
      kLlamaCall,
      "<|python_tag|>" + kLlamaCall,
      " \n<|python_tag|>\n" + kLlamaCall + " ; " + kLlamaCall + ";\n",
      "{\"answer\": 4}",
      kLlamaCall + " trailing",
      "<|python_tag|>brave_search.call(query=\"x\")",
      "<|python_t",
      "<think>\nplan\n</think>\n\n" + kLlamaCall,
      "\n\n\n",
      "\r\n\t ",
      "é🙂日本\n<tool_call>\n{\"name\": \"ü\", \"arguments\": {\"k\": \"\\u00e9\"}}\n</tool_call>",
      std::string(kBinary, sizeof(kBinary) - 1),
  };
}

TEST(Streaming, EventsForOneCall) {
  const Streamed s = stream({"I'll check.", "\n<tool", "_call>\n{\"name\": \"get_weather\", ",
                             "\"arguments\": ", "{\"city\": \"Paris\"}}\n</tool_call>"},
                            H, NO_THINK);
  ASSERT_EQ(s.events.size(), 3u);
  EXPECT_EQ(s.events[0].kind, StreamEvent::CONTENT);
  EXPECT_EQ(s.events[0].text, "I'll check.");
  EXPECT_EQ(s.events[1].kind, StreamEvent::TOOL_CALL_START);
  EXPECT_EQ(s.events[1].index, 0);
  EXPECT_EQ(s.events[1].name, "get_weather");
  EXPECT_EQ(s.events[2].kind, StreamEvent::TOOL_CALL_ARGUMENTS);
  EXPECT_EQ(s.events[2].index, 0);
  EXPECT_EQ(s.events[2].text, "{\"city\": \"Paris\"}");
}

TEST(Streaming, HoldsBackOnlyWhatMayStillChange) {
  StreamingAssistantParser parser(H, THINK);
  // "<thi" may become "<think>": nothing yet.
  EXPECT_TRUE(parser.feed("<thi").empty());
  // Reasoning flows as it comes; the trailing '\n' waits (it is stripped before </think>).
  auto e = parser.feed("nk>\nFirst step.\n");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, StreamEvent::REASONING);
  EXPECT_EQ(e[0].text, "First step.");
  e = parser.feed("Second.</th");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "\nSecond.");
  e = parser.feed("ink>\n\nHello");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, StreamEvent::CONTENT);
  EXPECT_EQ(e[0].text, "Hello");
  // A space and a possible tag start wait; text after them flows once they cannot be a tag.
  EXPECT_TRUE(parser.feed(" <tool").empty());
  e = parser.feed("box> fine");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, " <toolbox> fine");
  // A block is held until it closes.
  EXPECT_TRUE(parser.feed("\n<tool_call>{\"name\": \"f\", ").empty());
  e = parser.feed("\"arguments\": {}}</tool_call>");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].kind, StreamEvent::TOOL_CALL_START);
  EXPECT_EQ(e[1].text, "{}");
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_EQ(parser.parse_failures(), 0);
}

TEST(Streaming, FailedAndUnclosedBlocksBecomeContent) {
  StreamingAssistantParser parser(H, NO_THINK);
  auto e = parser.feed("x <tool_call>{oops}</tool_call>");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "x <tool_call>{oops}</tool_call>");
  EXPECT_EQ(parser.parse_failures(), 1);
  EXPECT_TRUE(parser.feed("<tool_call>{\"name\"").empty());
  e = parser.finish();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "<tool_call>{\"name\"");
  EXPECT_EQ(parser.parse_failures(), 2);
}

TEST(Streaming, PlainContentIsNotHeld) {
  StreamingAssistantParser llama(L, NO_THINK);
  auto e = llama.feed("Sure");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "Sure");
  StreamingAssistantParser llama_json(L, NO_THINK);
  EXPECT_TRUE(llama_json.feed(" {\"name\": \"f\", \"parameters\": {}}").empty());  // held to the end
  e = llama_json.finish();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].name, "f");
  // IN_REASONING streams the reasoning at once; AUTO must wait for </think> or the end.
  StreamingAssistantParser in(NO_TOOLS, THINK, true, ReasoningStart::IN_REASONING);
  e = in.feed("pondering");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, StreamEvent::REASONING);
  StreamingAssistantParser autostart(NO_TOOLS, THINK);
  EXPECT_TRUE(autostart.feed("pondering").empty());
  e = autostart.finish();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, StreamEvent::CONTENT);
}

TEST(Streaming, ParallelFalseStreamsOnlyTheFirstCall) {
  const Streamed s = stream({kCall1, "\n", kCall2}, H, NO_THINK, false);
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_TRUE(s.content.empty());
}

TEST(Streaming, MatchesWholeParseOnCorpusForEverySplit) {
  std::mt19937 rng(20);
  for (const std::string& text : corpus()) {
    SCOPED_TRACE(text);
    if (!expect_stream_matches_all_settings(text, rng, 30, /*single_cuts=*/true)) return;
  }
}

TEST(Streaming, MatchesWholeParseOnEveryPrefix) {
  // Generation cut off at every byte of every corpus text.
  std::mt19937 rng(21);
  for (const std::string& text : corpus())
    for (size_t n = 0; n <= text.size(); ++n) {
      const std::string prefix = text.substr(0, n);
      SCOPED_TRACE(prefix);
      if (!expect_stream_matches_all_settings(prefix, rng, 2)) return;
    }
}

// Random texts built from the pieces that matter (tags, JSON fragments, whitespace, unicode,
// random bytes), plus random bytes alone: never a throw, always the same as the whole parse.
TEST(Streaming, FuzzMatchesWholeParse) {
  // clang-format off
  const std::vector<std::string> pieces = {
      "<think>", "</think>", "<tool_call>", "</tool_call>", "<|python_tag|>", "<", "</", "<tool", "<thi", "</th",
      "think>", "_call>", "{", "}", "[", "]", "\"", "\\", ":", ",", ";", "\"name\"", "\"arguments\"", "\"parameters\"",
      "\"f\"", "{}", "{\"a\": 1}", "\"{\\\"b\\\": 2}\"", "null", "1e999", " ", "\n", "\n\n", "\t", "\r\n", "é", "日本",
      "🙂", "text", "x", kCall1, kLlamaCall, "{\"name\": \"g\", \"arguments\": {\"k\": [1, {\"z\": \"}\"}]}}"};
  // clang-format on
  std::mt19937 rng(2020);
  std::uniform_int_distribution<size_t> pick(0, pieces.size() - 1);
  std::uniform_int_distribution<int> length(0, 14);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int round = 0; round < 1500; ++round) {
    std::string text;
    if (round % 10 == 9) {
      for (int i = length(rng) * 4; i > 0; --i) text.push_back(static_cast<char>(byte(rng)));
    } else {
      for (int i = length(rng); i > 0; --i) {
        if (byte(rng) < 8)
          text.push_back(static_cast<char>(byte(rng)));
        else
          text += pieces[pick(rng)];
      }
    }
    SCOPED_TRACE(text);
    if (!expect_stream_matches_all_settings(text, rng, 3)) return;
  }
}

TEST(Streaming, DeeplyNestedAndLongInputsDoNotThrow) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}</tool_call>";
  const ParsedAssistant p = parse_assistant_output(text, H, NO_THINK);
  EXPECT_TRUE(p.tool_calls.empty());  // past the nesting bound: text (ArgumentsNestedTooDeepStayText)
  EXPECT_EQ(p.parse_failures, 1);
  const ParsedAssistant unbalanced = parse_assistant_output("{" + std::string(100000, '{'), L, NO_THINK);
  EXPECT_EQ(unbalanced.parse_failures, 1);
  // A long reasoning and a long block, fed a few bytes at a time (stays linear): the deep
  // block is text, then a call with long (flat) arguments is a call.
  const std::string long_args = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"" +
                                std::string(100000, 'x') + "\"}}</tool_call>";
  std::string long_text = "<think>" + std::string(200000, 'r') + "</think>" + text + long_args;
  StreamingAssistantParser parser(H, THINK);
  Streamed s;
  for (size_t i = 0; i < long_text.size(); i += 7)
    collect(parser.feed(std::string_view(long_text).substr(i, 7)), &s);
  collect(parser.finish(), &s);
  EXPECT_EQ(s.reasoning.size(), 200000u);
  ASSERT_EQ(s.calls.size(), 1u);
}

}  // namespace
}  // namespace swarm
