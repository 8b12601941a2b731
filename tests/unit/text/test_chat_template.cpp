// Tests of ChatTemplate (src/text/chat_template): loading from model directories and
// byte-for-byte parity with Hugging Face's apply_chat_template, checked against Python's jinja2
// (tests/reference/render_chat_template.py) on the conversations of
// tests/data/chat_conversations.json with the Qwen3, SmolLM2 and a Llama-3 style template.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "text/chat_template.hpp"
#include "text/tool_calls.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const std::string kFixtures = SWARM_FIXTURES_DIR;
const std::string kSource = SWARM_SOURCE_DIR;
const std::string kQwen3Dir = kFixtures + "/tokenizers/qwen3";
const std::string kSmolDir = kFixtures + "/models/smollm2-135m-instruct-noweights";
const std::string kLlamaTemplate = kSource + "/tests/data/llama3_chat_template.jinja";
const std::string kQwen25Template = kSource + "/tests/data/qwen2.5_chat_template.jinja";
const std::string kConversations = kSource + "/tests/data/chat_conversations.json";
const std::string kReference = kSource + "/tests/reference/render_chat_template.py";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fails the test (never skips) when a fixture is missing.
::testing::AssertionResult fixture_exists(const std::string& path) {
  if (fs::exists(path)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "missing test fixture " << path << " (tests/fixtures and tests/data are required)";
}

ChatTemplate llama3() { return ChatTemplate(read_file(kLlamaTemplate), "<|begin_of_text|>", "<|eot_id|>"); }
ChatTemplate qwen25() { return ChatTemplate(read_file(kQwen25Template), "", "<|im_end|>"); }

std::chrono::system_clock::time_point at(int64_t epoch_seconds) {
  return std::chrono::system_clock::time_point(std::chrono::seconds(epoch_seconds));
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("swarm_chat_template_" + std::to_string(::getpid()) + "_" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path_ / name) << text; }

 private:
  fs::path path_;
};

// ------------------------------------------------------------------ loading

TEST(ChatTemplateLoad, FixturesArePresent) {
  EXPECT_TRUE(fixture_exists(kQwen3Dir + "/tokenizer_config.json"));
  EXPECT_TRUE(fixture_exists(kSmolDir + "/chat_template.jinja"));
  EXPECT_TRUE(fixture_exists(kLlamaTemplate));
  EXPECT_TRUE(fixture_exists(kConversations));
  EXPECT_TRUE(fixture_exists(kReference));
}

TEST(ChatTemplateLoad, Qwen3FromTokenizerConfig) {
  ASSERT_TRUE(fixture_exists(kQwen3Dir + "/tokenizer_config.json"));
  const ChatTemplate t = ChatTemplate::from_directory(kQwen3Dir);
  const auto config = nlohmann::json::parse(read_file(kQwen3Dir + "/tokenizer_config.json"));
  EXPECT_EQ(t.source(), config["chat_template"].get<std::string>());
  EXPECT_EQ(t.bos_token(), "");  // null in the config
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
}

TEST(ChatTemplateLoad, SmolLM2FromJinjaFile) {
  ASSERT_TRUE(fixture_exists(kSmolDir + "/chat_template.jinja"));
  const ChatTemplate t = ChatTemplate::from_directory(kSmolDir);
  EXPECT_EQ(t.source(), read_file(kSmolDir + "/chat_template.jinja"));
  EXPECT_EQ(t.bos_token(), "<|im_start|>");
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
}

TEST(ChatTemplateLoad, JinjaFileWinsOverConfigAndTokensMayBeObjects) {
  TempDir dir;
  dir.write("tokenizer_config.json",
            R"({"chat_template": "from config", "bos_token": {"content": "<s>", "lstrip": false},
                "eos_token": {"content": "</s>"}})");
  EXPECT_EQ(ChatTemplate::from_directory(dir.path()).render(nlohmann::json::array()), "from config");
  dir.write("chat_template.jinja", "from file {{ bos_token }}{{ eos_token }}\n");
  const ChatTemplate t = ChatTemplate::from_directory(dir.path());
  EXPECT_EQ(t.bos_token(), "<s>");
  EXPECT_EQ(t.eos_token(), "</s>");
  EXPECT_EQ(t.render(nlohmann::json::array()),
            "from file <s></s>");  // trailing newline dropped, as Jinja does
}

TEST(ChatTemplateLoad, NamedTemplateListUsesDefault) {
  TempDir dir;
  dir.write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]})");
  EXPECT_EQ(ChatTemplate::from_directory(dir.path()).render(nlohmann::json::array()), "plain");
  dir.write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "tools"}]})");
  EXPECT_THROW(ChatTemplate::from_directory(dir.path()), SwarmError);
}

TEST(ChatTemplateLoad, MissingTemplateThrows) {
  TempDir dir;
  try {
    ChatTemplate::from_directory(dir.path());
    ADD_FAILURE() << "expected an error";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("no chat template"), std::string::npos);
  }
  dir.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_THROW(ChatTemplate::from_directory(dir.path()), SwarmError);
  EXPECT_THROW(ChatTemplate::from_directory(dir.path() + "/does-not-exist"), SwarmError);
}

// ------------------------------------------------------------------ rendering

TEST(ChatTemplateRender, SmolLM2Golden) {
  ASSERT_TRUE(fixture_exists(kSmolDir + "/chat_template.jinja"));
  const ChatTemplate t = ChatTemplate::from_directory(kSmolDir);
  const auto messages = nlohmann::json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])");
  EXPECT_EQ(
      t.render(messages, nullptr, false),
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n");
  EXPECT_EQ(t.render(messages).substr(t.render(messages, nullptr, false).size()), "<|im_start|>assistant\n");
}

TEST(ChatTemplateRender, Qwen3ThinkingSwitch) {
  ASSERT_TRUE(fixture_exists(kQwen3Dir + "/tokenizer_config.json"));
  const ChatTemplate t = ChatTemplate::from_directory(kQwen3Dir);
  const auto messages =
      nlohmann::json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])");
  const std::string base =
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(t.render(messages), base);
  EXPECT_EQ(t.render(messages, nullptr, true, {{"enable_thinking", true}}), base);
  EXPECT_EQ(t.render(messages, nullptr, true, {{"enable_thinking", false}}),
            base + "<think>\n\n</think>\n\n");
}

TEST(ChatTemplateRender, Qwen3ToolCallsAndReasoning) {
  ASSERT_TRUE(fixture_exists(kQwen3Dir + "/tokenizer_config.json"));
  const ChatTemplate t = ChatTemplate::from_directory(kQwen3Dir);
  const auto messages = ojson::parse(R"([
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}]},
    {"role": "tool", "content": "cold"},
    {"role": "tool", "content": "windy"}])");
  EXPECT_EQ(
      t.render(messages, ojson(nullptr), false),
      "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": "
      "2}}\n</tool_call>"
      "<|im_end|>\n<|im_start|>user\n<tool_response>\ncold\n</tool_response>\n<tool_response>\nwindy\n"
      "</tool_response><|im_end|>\n");
}

TEST(ChatTemplateRender, OrderedJsonKeepsKeyOrderPlainJsonSortsIt) {
  const ChatTemplate t("{{ tools[0]|tojson }}");
  const std::string tools =
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  EXPECT_EQ(t.render(ojson::array(), ojson::parse(tools)),
            R"({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})");
  EXPECT_EQ(t.render(nlohmann::json::array(), nlohmann::json::parse(tools)),
            R"({"function": {"name": "f", "parameters": {"type": "object"}}, "type": "function"})");
}

TEST(ChatTemplateRender, VariablesSeenByTheTemplate) {
  const ChatTemplate t(
      "{{ messages|length }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ bos_token is defined "
      "}}|"
      "{{ eos_token }}|{{ extra }}|{{ raise_exception is defined }}{{ strftime_now is defined }}",
      "", "</s>");
  EXPECT_EQ(t.render(nlohmann::json::array({{{"role", "user"}, {"content", "x"}}}), nullptr, false,
                     {{"extra", 1.5}}),
            "1|None|None|False|False|</s>|1.5|TrueTrue");
  // extra_context overrides the standard variables, as keyword arguments do in HF.
  EXPECT_EQ(ChatTemplate("{{ add_generation_prompt }}")
                .render(nlohmann::json::array(), nullptr, true, {{"add_generation_prompt", "x"}}),
            "x");
}

TEST(ChatTemplateRender, StrftimeNowUsesInjectedClock) {
  ASSERT_TRUE(fixture_exists(kLlamaTemplate));
  ChatTemplate t = llama3();
  t.set_clock([] { return at(1721995200); });
  const std::time_t when = 1721995200;
  std::tm local{};
  localtime_r(&when, &local);
  char date[32];
  std::strftime(date, sizeof(date), "%d %b %Y", &local);
  const auto messages = nlohmann::json::parse(R"([{"role": "user", "content": "  Hi  "}])");
  EXPECT_EQ(
      t.render(messages),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
      "Today Date: " +
          std::string(date) +
          "\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_NE(
      t.render(messages, nullptr, true, {{"date_string", "01 Jan 2030"}}).find("Today Date: 01 Jan 2030\n"),
      std::string::npos);
}

TEST(ChatTemplateRender, ErrorsNameLineAndColumn) {
  try {
    ChatTemplate("{% for m in messages %}\n  {{ m.content | nosuchfilter }}\n{% endfor %}");
    ADD_FAILURE() << "expected a syntax error";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(), "chat template error at line 2, column 18: unknown filter 'nosuchfilter'");
  }
  ASSERT_TRUE(fixture_exists(kLlamaTemplate));
  const auto two_calls = nlohmann::json::parse(R"([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": {}}},
                                                           {"function": {"name": "b", "arguments": {}}}]}])");
  try {
    llama3().render(two_calls);
    ADD_FAILURE() << "expected raise_exception";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    EXPECT_STREQ(
        e.what(),
        "chat template error at line 75, column 17: This model only supports single tool-calls at once!");
  }
  EXPECT_THROW(
      ChatTemplate("{{ x }}").render(nlohmann::json::array(), nullptr, true, nlohmann::json::array()),
      SwarmError);
  // Pathologically nested input is rejected as bad input, not a crash.
  nlohmann::json deep = "x";
  for (int i = 0; i < 1000; ++i) deep = nlohmann::json::array({deep});
  try {
    ChatTemplate("{{ messages|length }}")
        .render(nlohmann::json::array({{{"role", "user"}, {"content", deep}}}));
    ADD_FAILURE() << "expected an error";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
  }
}

TEST(ChatTemplateRender, ConcurrentRenders) {
  ASSERT_TRUE(fixture_exists(kQwen3Dir + "/tokenizer_config.json"));
  const ChatTemplate t = ChatTemplate::from_directory(kQwen3Dir);
  std::vector<std::thread> threads;
  std::vector<std::string> got(8), want(8);
  auto conversation = [](int i) {
    nlohmann::json m = nlohmann::json::array();
    for (int k = 0; k <= i; ++k) {
      m.push_back({{"role", "user"}, {"content", "question " + std::to_string(k)}});
      m.push_back(
          {{"role", "assistant"}, {"content", "<think>\nr" + std::to_string(k) + "\n</think>\n\nanswer"}});
    }
    return m;
  };
  for (int i = 0; i < 8; ++i) want[i] = t.render(conversation(i));
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 100; ++rep) got[i] = t.render(conversation(i));
    });
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], want[i]);
}

// ------------------------------------------------------------------ parity with Python's jinja2

// Runs the Python reference on a list of cases and returns its JSON list; adds a failure (the
// parity check is an acceptance criterion, so it never skips) when it cannot run.
ojson run_reference(const ojson& cases) {
  if (!fs::exists(kReference)) {
    ADD_FAILURE() << "missing Python reference runner " << kReference;
    return ojson();
  }
  if (!fs::exists("/usr/bin/python3")) {
    ADD_FAILURE() << "/usr/bin/python3 not found: install python3 and python3-jinja2 for the parity tests";
    return ojson();
  }
  TempDir dir;
  dir.write("cases.json", cases.dump());
  const std::string cmd = "/usr/bin/python3 '" + kReference + "' < '" + dir.path() + "/cases.json' 2> '" +
                          dir.path() + "/stderr.txt'";
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return ojson();
  }
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0) {
    ADD_FAILURE() << "reference runner failed (status " << status
                  << "): " << read_file(dir.path() + "/stderr.txt")
                  << "\n(python3-jinja2 must be installed for /usr/bin/python3)";
    return ojson();
  }
  return ojson::parse(out);
}

struct TemplateUnderTest {
  std::string name;
  ChatTemplate tpl;
  std::vector<ojson> variants;  // extra_context variants rendered for every conversation
};

// First differing position, with context, for a readable failure.
std::string describe_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) +
         "\n  python: " + ojson(want.substr(from, 120)).dump() +
         "\n  c++:    " + ojson(got.substr(from, 120)).dump();
}

TEST(ChatTemplateParity, ConversationsRenderLikeHuggingFace) {
  ASSERT_TRUE(fixture_exists(kConversations));
  ASSERT_TRUE(fixture_exists(kQwen3Dir + "/tokenizer_config.json"));
  ASSERT_TRUE(fixture_exists(kSmolDir + "/chat_template.jinja"));
  ASSERT_TRUE(fixture_exists(kLlamaTemplate));
  const ojson doc = ojson::parse(read_file(kConversations));
  const int64_t now = doc.at("now").get<int64_t>();

  std::vector<TemplateUnderTest> templates;
  templates.push_back({"qwen3",
                       ChatTemplate::from_directory(kQwen3Dir),
                       {ojson::object(), {{"enable_thinking", true}}, {{"enable_thinking", false}}}});
  templates.push_back({"smollm2", ChatTemplate::from_directory(kSmolDir), {ojson::object()}});
  templates.push_back({"llama3", llama3(), {ojson::object()}});
  for (auto& t : templates) t.tpl.set_clock([now] { return at(now); });

  struct Case {
    std::string label;
    const ChatTemplate* tpl;
    ojson messages, tools, extra;
    bool add_generation_prompt;
  };
  std::vector<Case> cases;
  ojson reference_cases = ojson::array();
  for (const auto& t : templates) {
    for (const auto& conv : doc.at("conversations")) {
      for (bool agp : {true, false}) {
        for (const auto& variant : t.variants) {
          ojson extra = conv.contains("extra") ? conv["extra"] : ojson::object();
          for (auto it = variant.begin(); it != variant.end(); ++it) extra[it.key()] = it.value();
          Case c{t.name + "/" + conv.at("name").get<std::string>() + (agp ? " +gen" : " -gen") +
                     (variant.empty() ? "" : " " + variant.dump()),
                 &t.tpl,
                 conv.at("messages"),
                 conv.contains("tools") ? conv["tools"] : ojson(nullptr),
                 extra,
                 agp};
          reference_cases.push_back({{"template", t.tpl.source()},
                                     {"bos_token", t.tpl.bos_token()},
                                     {"eos_token", t.tpl.eos_token()},
                                     {"messages", c.messages},
                                     {"tools", c.tools},
                                     {"add_generation_prompt", agp},
                                     {"extra", extra},
                                     {"now", now}});
          cases.push_back(std::move(c));
        }
      }
    }
  }

  const ojson expected = run_reference(reference_cases);
  ASSERT_EQ(expected.size(), cases.size()) << "reference runner returned a wrong number of results";
  int mismatches = 0, errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string got;
    bool ok = true;
    try {
      got = c.tpl->render(c.messages, c.tools, c.add_generation_prompt, c.extra);
    } catch (const SwarmError& e) {
      ok = false;
      got = e.what();
    }
    const bool ref_ok = expected[i].at("ok").get<bool>();
    if (!ref_ok) ++errors;
    if (ok != ref_ok) {
      ++mismatches;
      ADD_FAILURE() << c.label << ": python "
                    << (ref_ok ? "rendered" : "failed: " + expected[i]["error"].get<std::string>())
                    << ", c++ " << (ok ? "rendered" : "failed: " + got);
    } else if (ok && got != expected[i].at("output").get<std::string>()) {
      ++mismatches;
      ADD_FAILURE() << c.label << ": " << describe_difference(expected[i]["output"].get<std::string>(), got);
    } else if (!ok) {
      // A template's raise_exception message must come through verbatim.
      const std::string ref_error = expected[i].at("error").get<std::string>();
      const std::string prefix = "TemplateError: ";
      if (ref_error.rfind(prefix, 0) == 0) {
        const std::string message = ref_error.substr(prefix.size());
        EXPECT_EQ(got.substr(got.size() - std::min(got.size(), message.size())), message) << c.label;
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " cases";
  // The fixture includes conversations that must fail on both sides; keep them honest.
  EXPECT_GT(errors, 0);
  EXPECT_LT(errors, static_cast<int>(cases.size()) / 4);
  std::printf("[ parity ] %zu cases (%d expected errors), %d mismatches\n", cases.size(), errors, mismatches);
}

// ------------------------------------------------------------------ tool-call arguments in a history

// A template that needs the arguments' JSON text, as DeepSeek-R1's does (string concatenation).
const char* kJoiningTemplate =
    "{% for m in messages %}{% if m['role'] == 'assistant' and m['tool_calls'] %}"
    "{% for tool in m['tool_calls'] %}{{ '<call>' + tool['function']['name'] + '\\n' + "
    "tool['function']['arguments'] + '</call>' }}{% endfor %}"
    "{% else %}{{ '<' + m['role'] + '>' + m['content'] }}{% endif %}{% endfor %}";

TEST(ChatTemplateToolArguments, FormComesFromTheTemplate) {
  ASSERT_TRUE(fixture_exists(kQwen25Template));
  EXPECT_EQ(detect_tool_arguments_form(ChatTemplate::from_directory(kQwen3Dir).source()),
            ToolArgumentsForm::OBJECT);
  EXPECT_EQ(detect_tool_arguments_form(ChatTemplate::from_directory(kSmolDir).source()),
            ToolArgumentsForm::OBJECT);
  EXPECT_EQ(detect_tool_arguments_form(llama3().source()), ToolArgumentsForm::OBJECT);
  EXPECT_EQ(detect_tool_arguments_form(qwen25().source()), ToolArgumentsForm::OBJECT);
  EXPECT_EQ(detect_tool_arguments_form(kJoiningTemplate), ToolArgumentsForm::STRING);
  EXPECT_EQ(detect_tool_arguments_form("{{ 'x' ~ call.function.arguments }}"), ToolArgumentsForm::STRING);
  EXPECT_EQ(detect_tool_arguments_form("{{ call.arguments + '\\n' }}"), ToolArgumentsForm::STRING);
  // Joined only where the template made sure it is a string: both forms work, objects win.
  EXPECT_EQ(detect_tool_arguments_form("{% if c.arguments is string %}{{ 'x' + c.arguments }}"
                                       "{% else %}{{ c.arguments | tojson }}{% endif %}"),
            ToolArgumentsForm::OBJECT);
  // The word in a literal, or another name ending in it, is no reference.
  EXPECT_EQ(detect_tool_arguments_form("{{ '\", \"arguments\": ' + x }}{{ a.arguments_text + 'y' }}"),
            ToolArgumentsForm::OBJECT);
}

TEST(ChatTemplateToolArguments, NormalizeToolCallsParsesObjectArgumentsOnly) {
  const auto call = [](const ojson& arguments) {
    ojson fn = {{"name", "f"}};
    if (!arguments.is_discarded()) fn["arguments"] = arguments;
    return ojson{{"id", "call_1"}, {"type", "function"}, {"function", fn}};
  };
  ojson messages = ojson::array();
  messages.push_back(
      {{"role", "user"}, {"content", "hi"}, {"tool_calls", ojson::array({call(R"({"a": 1})")})}});
  messages.push_back(
      {{"role", "assistant"},
       {"content", ""},
       {"tool_calls",
        ojson::array({call(R"({"z":1,"a":{"k":[1,2]}})"), call("not json {"), call("[1, 2]"),
                      call("\"text\""), call(""), call(nullptr), call(ojson(ojson::value_t::discarded)),
                      call(ojson{{"b", 2}}), call(std::string(100, '[') + std::string(100, ']'))})}});
  messages.push_back({{"role", "assistant"}, {"content", "x"}, {"tool_calls", ojson::array()}});
  const ojson original = messages;
  ojson strings = messages;
  normalize_tool_calls(messages, ToolArgumentsForm::OBJECT);
  EXPECT_TRUE(messages[0]["tool_calls"][0]["function"]["arguments"].is_string());  // not an assistant
  const ojson& calls = messages[1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"].dump(), R"({"z":1,"a":{"k":[1,2]}})");  // key order kept
  EXPECT_EQ(calls[1]["function"]["arguments"], "not json {");
  EXPECT_EQ(calls[2]["function"]["arguments"], "[1, 2]");
  EXPECT_EQ(calls[3]["function"]["arguments"], "\"text\"");
  EXPECT_EQ(calls[4]["function"]["arguments"], ojson::object());
  EXPECT_EQ(calls[5]["function"]["arguments"], ojson::object());
  EXPECT_EQ(calls[6]["function"]["arguments"], ojson::object());
  EXPECT_EQ(calls[7]["function"]["arguments"], ojson({{"b", 2}}));
  EXPECT_TRUE(calls[8]["function"]["arguments"].is_string());  // nested deeper than 64
  EXPECT_FALSE(messages[2].contains("tool_calls"));
  // STRING: only the empty list goes.
  normalize_tool_calls(strings, ToolArgumentsForm::STRING);
  EXPECT_EQ(strings[0], original[0]);
  EXPECT_EQ(strings[1], original[1]);
  EXPECT_FALSE(strings[2].contains("tool_calls"));
}

// A history whose assistant turn is a tool call the model generated, sent back by clients that
// re-serialise the arguments (JSON.stringify, Python's json.dumps, pretty-printed): normalised as
// the server does (normalize_tool_calls), every template renders it as jinja2 renders the same
// history with the arguments as an object, and the turn reads exactly as the model wrote it.
TEST(ChatTemplateParity, ToolCallArgumentsSentAsStringsRenderAsGenerated) {
  ASSERT_TRUE(fixture_exists(kQwen25Template));
  const std::string generated_args =
      R"({"city": "Paris", "days": 3, "units": ["C", "F"], "note": "café \"ok\"", "ratio": 0.5, "strict": true, "extra": null})";
  const ojson args = ojson::parse(generated_args);
  const std::vector<std::string> sent_forms = {
      args.dump(),               // JSON.stringify: no spaces, UTF-8 kept
      args.dump(-1, ' ', true),  // ASCII escapes (é as \u00e9), as Python's json.dumps
      args.dump(2),              // pretty-printed
      generated_args,            // exactly as generated (the server's own answer)
  };
  const ojson tools = ojson::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  struct Family {
    std::string name;
    ChatTemplate tpl;
    std::string turn;  // the generated assistant turn, as text
  };
  const std::string hermes_turn =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + generated_args +
      "}\n</tool_call><|im_end|>";
  std::vector<Family> families;
  families.push_back(
      {"qwen3", ChatTemplate::from_directory(kQwen3Dir), "<|im_start|>assistant\n" + hermes_turn});
  families.push_back({"qwen2.5", qwen25(), "<|im_start|>assistant\n" + hermes_turn});
  families.push_back(
      {"llama3", llama3(),
       "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": " +
           generated_args + "}<|eot_id|>"});
  for (auto& f : families) f.tpl.set_clock([] { return at(1767225600); });

  const auto history = [&](const ojson& arguments) {
    ojson call = {{"id", "call_1"},
                  {"type", "function"},
                  {"function", {{"name", "get_weather"}, {"arguments", arguments}}}};
    return ojson::array({{{"role", "user"}, {"content", "Weather in Paris?"}},
                         {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}},
                         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temp\": 21}"}}});
  };
  ojson reference_cases = ojson::array();
  std::vector<std::string> got, labels;
  for (const Family& f : families) {
    ASSERT_EQ(detect_tool_arguments_form(f.tpl.source()), ToolArgumentsForm::OBJECT) << f.name;
    reference_cases.push_back({{"template", f.tpl.source()},
                               {"bos_token", f.tpl.bos_token()},
                               {"eos_token", f.tpl.eos_token()},
                               {"messages", history(args)},
                               {"tools", tools},
                               {"add_generation_prompt", true},
                               {"now", 1767225600}});
    for (const std::string& sent : sent_forms) {
      ojson messages = history(sent);
      normalize_tool_calls(messages, detect_tool_arguments_form(f.tpl.source()));
      got.push_back(f.tpl.render(messages, tools, true));
      labels.push_back(f.name + " sent " + sent);
    }
  }
  const ojson expected = run_reference(reference_cases);
  ASSERT_EQ(expected.size(), families.size());
  for (size_t i = 0; i < families.size(); ++i) {
    ASSERT_TRUE(expected[i].at("ok").get<bool>()) << families[i].name << ": " << expected[i].dump();
    const std::string want = expected[i].at("output").get<std::string>();
    EXPECT_NE(want.find(families[i].turn), std::string::npos)
        << families[i].name << ": jinja2's render does not hold the generated turn\n"
        << want;
    for (size_t k = 0; k < sent_forms.size(); ++k) {
      const size_t j = i * sent_forms.size() + k;
      EXPECT_EQ(got[j], want) << labels[j] << ": " << describe_difference(want, got[j]);
      EXPECT_NE(got[j].find(families[i].turn), std::string::npos) << labels[j];
    }
  }
}

// A template that joins the arguments as text keeps getting the string the client sent.
TEST(ChatTemplateParity, JoiningTemplatesKeepTheArgumentString) {
  const ChatTemplate tpl(kJoiningTemplate);
  ojson messages = ojson::array(
      {{{"role", "user"}, {"content", "go"}},
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls", ojson::array({{{"type", "function"},
                                      {"function", {{"name", "f"}, {"arguments", "{\"a\": 1}"}}}}})}}});
  const ojson before = messages;
  normalize_tool_calls(messages, detect_tool_arguments_form(tpl.source()));
  EXPECT_EQ(messages, before);
  const ojson expected = run_reference(ojson::array({{{"template", tpl.source()},
                                                      {"messages", messages},
                                                      {"tools", nullptr},
                                                      {"add_generation_prompt", false}}}));
  ASSERT_EQ(expected.size(), 1u);
  ASSERT_TRUE(expected[0].at("ok").get<bool>()) << expected[0].dump();
  EXPECT_EQ(tpl.render(messages, nullptr, false), expected[0].at("output").get<std::string>());
  EXPECT_EQ(expected[0].at("output").get<std::string>(), "<user>go<call>f\n{\"a\": 1}</call>");
}

}  // namespace
}  // namespace swarm
