// chat_splice: recognising the server's own assistant turns in a later request (whatever the
// SDK re-serialized) and continuing from the exact ids generated. On the mock
// engine, whose ChatML rendering is plain text.
#include "api/chat_splice.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/mock_backend.hpp"

namespace swarm {
namespace {

using ojson = nlohmann::ordered_json;

ojson tools() {
  return ojson::parse(R"([{"type":"function","function":{"name":"add","parameters":{"type":"object"}}}])");
}

ojson assistant_call(const std::string& arguments, const ojson& content = nullptr) {
  return ojson{
      {"role", "assistant"},
      {"content", content},
      {"tool_calls", ojson::array({ojson{{"id", "call_x"},
                                         {"type", "function"},
                                         {"function", {{"name", "add"}, {"arguments", arguments}}}}})}};
}

std::vector<TokenId> cat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// An episode's recorded calls, as the pool keeps them: turn key -> prompt + completion ids.
struct Recorded {
  std::map<std::string, std::vector<TokenId>> calls;
  TurnLookup lookup() const {
    return [this](const std::string& key) -> std::optional<std::vector<TokenId>> {
      auto it = calls.find(key);
      if (it == calls.end()) return std::nullopt;
      return it->second;
    };
  }
};

TEST(ChatSplice, AnswerKeyIgnoresWhitespaceKeyOrderAndNullContent) {
  const std::vector<ParsedToolCall> generated{{"add", R"({"a": 2, "b": 3})"}};
  const std::string key = answer_key(std::nullopt, generated);
  EXPECT_EQ(key, answer_key(std::string(""), {{"add", R"({"b":3,"a":2})"}}));
  EXPECT_EQ(key, answer_key(std::string("  \n"), {{"add", "{\n  \"a\": 2,\n  \"b\": 3\n}"}}));
  EXPECT_NE(key, answer_key(std::nullopt, {{"add", R"({"a": 2, "b": 4})"}}));
  EXPECT_NE(key, answer_key(std::nullopt, {{"sub", R"({"a": 2, "b": 3})"}}));
  EXPECT_NE(key, answer_key(std::string("Let me add."), generated));
  EXPECT_EQ(answer_key(std::string("Hi"), {}), answer_key(std::string(" Hi\n"), {}));
  EXPECT_NE(answer_key(std::string("Hi"), {}), answer_key(std::string("hi"), {}));
  // Arguments that are not JSON are compared as text.
  EXPECT_NE(answer_key(std::nullopt, {{"add", "{a: 2"}}), answer_key(std::nullopt, {{"add", "{a: 3"}}));
}

TEST(ChatSplice, TurnKeysMatchTheKeyAnAnswerWasRecordedUnder) {
  const ojson first = ojson::array({{{"role", "user"}, {"content", "add 2 and 3"}}});
  const std::string answer = answer_key(std::nullopt, {{"add", R"({"a": 2, "b": 3})"}});
  const std::string recorded = answer_turn_key(chat_keys(first, tools(), ojson::object()), answer);

  ojson later = first;
  later.push_back(assistant_call(R"({"b":3,"a":2})"));  // LangChain's JSON.stringify, keys reordered
  later.push_back({{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "5"}});
  // Tools and kwargs compare by value: key order does not matter.
  const ojson same_tools =
      ojson::parse(R"([{"function":{"parameters":{"type":"object"},"name":"add"},"type":"function"}])");
  const ChatKeys keys = chat_keys(later, same_tools, ojson::object());
  ASSERT_EQ(keys.turn_keys.size(), 3u);
  EXPECT_EQ(keys.turn_keys[1], recorded);
  EXPECT_NE(keys.turn_keys[0], recorded);
  // Another history, other tools or other template kwargs: another conversation.
  ojson edited = later;
  edited[0]["content"] = "add 2 and 4";
  EXPECT_NE(chat_keys(edited, tools(), ojson::object()).turn_keys[1], recorded);
  EXPECT_NE(chat_keys(later, ojson::array(), ojson::object()).turn_keys[1], recorded);
  EXPECT_NE(chat_keys(later, tools(), ojson{{"enable_thinking", false}}).turn_keys[1], recorded);
}

class ChatSpliceMock : public ::testing::Test {
 protected:
  MockBackend backend;
  const ojson kwargs = ojson::object();

  std::vector<TokenId> render(const ojson& messages, bool gen = true) const {
    return backend.render_chat_with_kwargs(messages, tools(), gen, kwargs);
  }
  std::vector<TokenId> text(const std::string& s) const { return backend.encode_rendered(s); }
};

TEST_F(ChatSpliceMock, ReserializedToolCallContinuesFromTheGeneratedIds) {
  const ojson first = ojson::array({{{"role", "user"}, {"content", "add 2 and 3"}}});
  const std::vector<TokenId> prompt = render(first);
  // What the model generated: a tool call with its own spacing, then its stop token.
  std::vector<TokenId> completion =
      text(R"(<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>)");
  completion.push_back(MockBackend::kImEnd);
  Recorded rec;
  rec.calls[answer_turn_key(chat_keys(first, tools(), kwargs),
                            answer_key(std::nullopt, {{"add", R"({"a": 2, "b": 3})"}}))] =
      cat(prompt, completion);

  ojson later = first;
  later.push_back(assistant_call(R"({"a":2,"b":3})"));
  later.push_back({{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "5"}});
  const auto spliced =
      splice_chat_prompt(backend, later, tools(), kwargs, chat_keys(later, tools(), kwargs), rec.lookup());
  ASSERT_TRUE(spliced.has_value());
  // Exactly: the first prompt, the generated ids, then the rest of the end-of-turn text (the
  // generated <|im_end|> is not repeated), the tool result and the generation prompt.
  const auto expected =
      cat(cat(prompt, completion), text("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(*spliced, expected);
  // A fresh render differs: the mock prints the SDK's call object, not what was generated.
  EXPECT_NE(render(later), expected);
}

// The server hands templates tool-call arguments as objects (normalize_tool_calls): the keys
// and the splice see the same turn whichever form the arguments arrive in.
TEST_F(ChatSpliceMock, ArgumentsParsedIntoObjectsStillSplice) {
  const ojson first = ojson::array({{{"role", "user"}, {"content", "add 2 and 3"}}});
  const std::vector<TokenId> prompt = render(first);
  std::vector<TokenId> completion =
      text(R"(<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>)");
  completion.push_back(MockBackend::kImEnd);
  Recorded rec;
  rec.calls[answer_turn_key(chat_keys(first, tools(), kwargs),
                            answer_key(std::nullopt, {{"add", R"({"a": 2, "b": 3})"}}))] =
      cat(prompt, completion);

  ojson sent = first;
  sent.push_back(assistant_call(R"({"a":2,"b":3})"));
  sent.push_back({{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "5"}});
  ojson later = sent;
  normalize_tool_calls(later, detect_tool_arguments_form(backend.chat_template_source()));
  ASSERT_TRUE(later[1]["tool_calls"][0]["function"]["arguments"].is_object());
  EXPECT_EQ(chat_keys(later, tools(), kwargs).turn_keys, chat_keys(sent, tools(), kwargs).turn_keys);
  const auto spliced =
      splice_chat_prompt(backend, later, tools(), kwargs, chat_keys(later, tools(), kwargs), rec.lookup());
  ASSERT_TRUE(spliced.has_value());
  EXPECT_EQ(*spliced,
            cat(cat(prompt, completion), text("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")));

  // A call without arguments, generated as {} and sent back as "", is the same answer now.
  Recorded none;
  none.calls[answer_turn_key(chat_keys(first, tools(), kwargs), answer_key(std::nullopt, {{"add", "{}"}}))] =
      cat(prompt, completion);
  ojson empty = first;
  empty.push_back(assistant_call(""));
  empty.push_back({{"role", "tool"}, {"tool_call_id", "call_x"}, {"content", "0"}});
  normalize_tool_calls(empty, ToolArgumentsForm::OBJECT);
  EXPECT_TRUE(
      splice_chat_prompt(backend, empty, tools(), kwargs, chat_keys(empty, tools(), kwargs), none.lookup()));
}

TEST_F(ChatSpliceMock, SameTextSplicesToTheFreshRender) {
  ojson msgs =
      ojson::array({{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}});
  const std::vector<TokenId> prompt = render(msgs);
  std::vector<TokenId> completion = text("hello there");
  completion.push_back(MockBackend::kImEnd);
  Recorded rec;
  rec.calls[answer_turn_key(chat_keys(msgs, tools(), kwargs), answer_key(std::string("hello there"), {}))] =
      cat(prompt, completion);
  msgs.push_back({{"role", "assistant"}, {"content", "hello there"}});
  msgs.push_back({{"role", "user"}, {"content", "and?"}});
  const auto spliced =
      splice_chat_prompt(backend, msgs, tools(), kwargs, chat_keys(msgs, tools(), kwargs), rec.lookup());
  ASSERT_TRUE(spliced.has_value());
  EXPECT_EQ(*spliced, render(msgs));
}

TEST_F(ChatSpliceMock, LatestRecognisedTurnWinsAndCutOffAnswersGetTheWholeEndOfTurn) {
  ojson msgs = ojson::array({{{"role", "user"}, {"content", "one"}}});
  Recorded rec;
  const std::vector<TokenId> p1 = render(msgs);
  std::vector<TokenId> c1 = text("first");
  c1.push_back(MockBackend::kImEnd);
  rec.calls[answer_turn_key(chat_keys(msgs, tools(), kwargs), answer_key(std::string("first"), {}))] =
      cat(p1, c1);
  msgs.push_back({{"role", "assistant"}, {"content", "first"}});
  msgs.push_back({{"role", "user"}, {"content", "two"}});
  const auto p2 =
      splice_chat_prompt(backend, msgs, tools(), kwargs, chat_keys(msgs, tools(), kwargs), rec.lookup());
  ASSERT_TRUE(p2.has_value());
  // The second answer hit max_tokens: no stop token was generated.
  const std::vector<TokenId> c2 = text("seco");
  rec.calls[answer_turn_key(chat_keys(msgs, tools(), kwargs), answer_key(std::string("seco"), {}))] =
      cat(*p2, c2);
  msgs.push_back({{"role", "assistant"}, {"content", "seco"}});
  msgs.push_back({{"role", "user"}, {"content", "three"}});
  const auto p3 =
      splice_chat_prompt(backend, msgs, tools(), kwargs, chat_keys(msgs, tools(), kwargs), rec.lookup());
  ASSERT_TRUE(p3.has_value());
  EXPECT_EQ(
      *p3, cat(cat(*p2, c2), text("<|im_end|>\n<|im_start|>user\nthree<|im_end|>\n<|im_start|>assistant\n")));
  EXPECT_EQ(*p3, render(msgs));  // the same text: the fresh render agrees

  // An assistant turn the server never produced (the agent wrote it) is rendered, after the
  // last one it did produce.
  msgs.push_back({{"role", "assistant"}, {"content", "made up"}});
  msgs.push_back({{"role", "user"}, {"content", "four"}});
  const auto p4 =
      splice_chat_prompt(backend, msgs, tools(), kwargs, chat_keys(msgs, tools(), kwargs), rec.lookup());
  ASSERT_TRUE(p4.has_value());
  EXPECT_EQ(*p4, render(msgs));
  EXPECT_EQ(std::vector<TokenId>(p4->begin(), p4->begin() + static_cast<long>(p2->size() + c2.size())),
            cat(*p2, c2));
}

TEST_F(ChatSpliceMock, UnknownOrEditedHistoryIsRenderedAfresh) {
  ojson msgs = ojson::array({{{"role", "user"}, {"content", "one"}}});
  Recorded rec;
  rec.calls[answer_turn_key(chat_keys(msgs, tools(), kwargs), answer_key(std::string("first"), {}))] =
      cat(render(msgs), text("first<|im_end|>"));
  ojson edited = msgs;
  edited.push_back({{"role", "assistant"}, {"content", "first, edited"}});
  edited.push_back({{"role", "user"}, {"content", "two"}});
  EXPECT_FALSE(
      splice_chat_prompt(backend, edited, tools(), kwargs, chat_keys(edited, tools(), kwargs), rec.lookup()));
  ojson truncated =
      ojson::array({{{"role", "assistant"}, {"content", "first"}}, {{"role", "user"}, {"content", "two"}}});
  EXPECT_FALSE(splice_chat_prompt(backend, truncated, tools(), kwargs, chat_keys(truncated, tools(), kwargs),
                                  rec.lookup()));
  ojson plain = msgs;  // no assistant turn at all
  EXPECT_FALSE(
      splice_chat_prompt(backend, plain, tools(), kwargs, chat_keys(plain, tools(), kwargs), rec.lookup()));
}

}  // namespace
}  // namespace swarm
