// The mock backend: deterministic, template-consistent, honours sampling limits.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "common/utf8.hpp"
#include "engine/mock_backend.hpp"
#include "swarm/job.hpp"

using namespace swarm;

namespace {

struct Collect : GenerationObserver {
  std::vector<std::string> deltas;
  std::optional<GenerationResult> result;
  std::optional<std::pair<ErrorKind, std::string>> error;
  void on_text(int64_t, const std::string& d) override { deltas.push_back(d); }
  void on_complete(GenerationResult r) override { result = std::move(r); }
  void on_error(ErrorKind k, const std::string& m) override { error = {k, m}; }
};

class MockBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Job job;
    job.model = "m";
    job.max_prompt_length = 100;
    job.max_response_length = 50;
    backend.boot(job, std::stop_token{});
  }
  std::shared_ptr<Collect> run(const std::string& user, SamplingParams p = {}) {
    auto obs = std::make_shared<Collect>();
    auto msgs = nlohmann::json::array({{{"role", "user"}, {"content", user}}});
    backend.generate({backend.render_chat(msgs, nullptr, true), p}, obs);
    return obs;
  }
  MockBackend backend;
};

TEST_F(MockBackendTest, ChatTemplateIsChatMLOverBytes) {
  auto msgs =
      nlohmann::json::array({{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "hi"}}});
  std::vector<TokenId> ids = backend.render_chat(msgs, nullptr, true);
  std::vector<TokenId> expected = {MockBackend::kImStart,
                                   's',
                                   'y',
                                   's',
                                   't',
                                   'e',
                                   'm',
                                   '\n',
                                   'S',
                                   MockBackend::kImEnd,
                                   '\n',
                                   MockBackend::kImStart,
                                   'u',
                                   's',
                                   'e',
                                   'r',
                                   '\n',
                                   'h',
                                   'i',
                                   MockBackend::kImEnd,
                                   '\n',
                                   MockBackend::kImStart,
                                   'a',
                                   's',
                                   's',
                                   'i',
                                   's',
                                   't',
                                   'a',
                                   'n',
                                   't',
                                   '\n'};
  EXPECT_EQ(ids, expected);
}

TEST_F(MockBackendTest, BadMessagesAreInvalidArguments) {
  for (auto bad : {nlohmann::json::array(), nlohmann::json::array({42}),
                   nlohmann::json::array({{{"content", "no role"}}}),
                   nlohmann::json::array({{{"role", "wizard"}, {"content", "x"}}}),
                   nlohmann::json::array({{{"role", "user"}, {"content", 5}}})}) {
    try {
      backend.render_chat(bad, nullptr, true);
      FAIL() << bad.dump();
    } catch (const SwarmError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT) << bad.dump();
    }
  }
}

// The mock runs the torch engine's prefix cache over the ids it serves, so /metrics shows the
// same counters without libtorch: the same prompt again finds all its full blocks but the one
// holding its last token, the choices of one request find the first one's, and a new weights
// version finds nothing of the old one.
TEST_F(MockBackendTest, ReportsThePrefixCacheOfTheIdsItServes) {
  auto prompt_len = [&](const std::string& user) {
    return static_cast<double>(
        backend.render_chat(nlohmann::json::array({{{"role", "user"}, {"content", user}}}), nullptr, true)
            .size());
  };
  const std::string user(70, 'p');
  const double len = prompt_len(user), cached = std::floor((len - 1) / 16) * 16;
  ASSERT_GE(cached, 64);
  auto m = backend.inference_metrics();
  EXPECT_EQ(m.at("prefix_cache_queries_tokens_total"), 0);
  EXPECT_EQ(m.at("kv_blocks_free"), m.at("kv_blocks_total"));
  run(user);
  m = backend.inference_metrics();
  EXPECT_EQ(m.at("prefix_cache_queries_tokens_total"), len);
  EXPECT_EQ(m.at("prefix_cache_hit_tokens_total"), 0);
  EXPECT_GE(m.at("kv_blocks_cached"), cached / 16);
  run(user);
  m = backend.inference_metrics();
  EXPECT_EQ(m.at("prefix_cache_hit_tokens_total"), cached);
  SamplingParams p;
  p.n = 4;
  run(user, p);
  m = backend.inference_metrics();
  EXPECT_EQ(m.at("prefix_cache_queries_tokens_total"), 6 * len);
  EXPECT_EQ(m.at("prefix_cache_hit_tokens_total"), 5 * cached);
  backend.set_policy_version(1);
  run(user);
  EXPECT_EQ(backend.inference_metrics().at("prefix_cache_hit_tokens_total"), 5 * cached);
  EXPECT_EQ(backend.inference_metrics().at("kv_blocks_free"),
            backend.inference_metrics().at("kv_blocks_total"));
}

TEST_F(MockBackendTest, SameRequestSameCompletion) {
  SamplingParams p;
  p.seed = 3;
  auto a = run("deterministic please", p);
  auto b = run("deterministic please", p);
  ASSERT_TRUE(a->result && b->result);
  EXPECT_EQ(a->result->choices[0].ids, b->result->choices[0].ids);
  EXPECT_EQ(a->result->choices[0].logprobs, b->result->choices[0].logprobs);
  p.seed = 4;
  auto c = run("deterministic please", p);
  EXPECT_NE(a->result->choices[0].ids, c->result->choices[0].ids);  // different seed, different sample
}

TEST_F(MockBackendTest, CompletionEndsWithImEndAndMatchesItsText) {
  auto r = run("echo this");
  ASSERT_TRUE(r->result);
  const auto& ch = r->result->choices[0];
  EXPECT_EQ(ch.finish_reason, "stop");
  ASSERT_FALSE(ch.ids.empty());
  EXPECT_EQ(ch.ids.back(), MockBackend::kImEnd);
  EXPECT_EQ(ch.ids.size(), ch.logprobs.size());
  EXPECT_EQ(backend.decode(ch.ids), ch.text);
  std::string streamed;
  for (const auto& d : r->deltas) streamed += d;
  EXPECT_EQ(streamed, ch.text);
  for (float lp : ch.logprobs) EXPECT_LT(lp, 0.f);
}

TEST_F(MockBackendTest, GreedyEchoesExactly) {
  SamplingParams p;
  p.temperature = 0;
  auto r = run("exact copy", p);
  EXPECT_EQ(r->result->choices[0].text, "exact copy");
}

// A scripted tool loop: the user's text is the tool call, the tool's result the answer.
TEST(MockBackend, EchoesTheLastUserOrToolMessage) {
  MockBackend backend;
  Job job;
  job.model = "m";
  backend.boot(job, std::stop_token{});
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 200;
  const std::string call = R"(<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>)";
  auto msgs = nlohmann::json::array({{{"role", "user"}, {"content", call}}});
  auto obs = std::make_shared<Collect>();
  backend.generate({backend.render_chat(msgs, nullptr, true), p}, obs);
  ASSERT_TRUE(obs->result) << (obs->error ? obs->error->second : "");
  EXPECT_EQ(obs->result->choices[0].text, call);
  msgs.push_back({{"role", "assistant"}, {"content", call}});
  msgs.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "5"}});
  obs = std::make_shared<Collect>();
  backend.generate({backend.render_chat(msgs, nullptr, true), p}, obs);
  ASSERT_TRUE(obs->result) << (obs->error ? obs->error->second : "");
  EXPECT_EQ(obs->result->choices[0].text, "5");
}

TEST_F(MockBackendTest, CorruptionFallsWithPolicyVersion) {
  EXPECT_GT(MockBackend::corruption_rate(0, 1.0), MockBackend::corruption_rate(1, 1.0));
  EXPECT_GT(MockBackend::corruption_rate(1, 1.0), MockBackend::corruption_rate(5, 1.0));
  EXPECT_EQ(MockBackend::corruption_rate(3, 0.0), 0.0);
}

TEST_F(MockBackendTest, MaxTokensCutsWithLength) {
  SamplingParams p;
  p.max_tokens = 4;
  auto r = run("a long message to echo", p);
  EXPECT_EQ(r->result->choices[0].ids.size(), 4u);
  EXPECT_EQ(r->result->choices[0].finish_reason, "length");
}

TEST_F(MockBackendTest, StopStringTruncatesWithoutStopToken) {
  SamplingParams p;
  p.temperature = 0;
  p.stop = {"STOP"};
  auto r = run("before STOP after", p);
  EXPECT_EQ(r->result->choices[0].text, "before ");
  EXPECT_EQ(r->result->choices[0].finish_reason, "stop");
  EXPECT_NE(r->result->choices[0].ids.back(), MockBackend::kImEnd);
}

TEST_F(MockBackendTest, NChoicesAndTopLogprobs) {
  SamplingParams p;
  p.n = 3;
  p.logprobs = true;
  p.top_logprobs = 2;
  auto r = run("many", p);
  ASSERT_EQ(r->result->choices.size(), 3u);
  for (const auto& ch : r->result->choices) {
    ASSERT_EQ(ch.top.size(), ch.ids.size());
    for (size_t i = 0; i < ch.ids.size(); ++i) {
      ASSERT_EQ(ch.top[i].size(), 2u);
      EXPECT_EQ(ch.top[i][0].id, ch.ids[i]);
      EXPECT_GT(ch.top[i][0].logprob, ch.top[i][1].logprob);
    }
  }
}

TEST_F(MockBackendTest, PromptLongerThanContextIsAnError) {
  auto r = run(std::string(200, 'x'));
  ASSERT_TRUE(r->error.has_value());
  EXPECT_EQ(r->error->first, ErrorKind::INVALID_ARGUMENT);
  EXPECT_NE(r->error->second.find("context length"), std::string::npos);
}

TEST_F(MockBackendTest, StreamedDeltasAreWholeUtf8Characters) {
  SamplingParams p;
  p.temperature = 0;
  auto r = run("naïve 日本語 🙂", p);
  for (const auto& d : r->deltas) EXPECT_EQ(utf8_complete_prefix(d), d.size()) << d;
  EXPECT_EQ(r->result->choices[0].text, "naïve 日本語 🙂");
}

TEST(Utf8, CompletePrefixHoldsBackTruncatedSequences) {
  std::string s = "a\xE6\x97";  // 'a' + first two bytes of a 3-byte character
  EXPECT_EQ(utf8_complete_prefix(s), 1u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("\xF0\x9F\x99\x82"), 4u);
  EXPECT_EQ(utf8_sanitize("ok\xFF"), "ok\xEF\xBF\xBD");
}

}  // namespace
