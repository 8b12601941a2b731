// A group shared by a node on one tokenizer and chat template, re-encoded by a node on another:
// the prompt rendered with the receiver's template, the completion in the receiver's ids, the
// loss mask on the completion only. Real tokenizers and templates from the fixtures (Qwen3 and
// SmolLM2: different vocabularies), no torch.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/backend.hpp"
#include "engine/mock_backend.hpp"
#include "engine/sapo.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

using namespace swarm;
using OJson = nlohmann::ordered_json;

namespace {

// The text half of a backend: a Hugging Face tokenizer and chat template.
class TextBackend : public Backend {
 public:
  TextBackend(const std::string& tokenizer_dir, const std::string& template_dir)
      : tok_(Tokenizer::from_directory(tokenizer_dir)), tmpl_(ChatTemplate::from_directory(template_dir)) {}
  std::string name() const override { return "text"; }
  void boot(const Job&, std::stop_token) override {}
  std::string model_id() const override { return "text"; }
  int64_t max_context_length() const override { return 4096; }
  void set_policy_version(int64_t) override {}
  std::optional<std::string> render_chat_text(const OJson& messages, const OJson& tools,
                                              bool add_generation_prompt,
                                              const OJson& kwargs) const override {
    return tmpl_.render(messages, tools, add_generation_prompt, kwargs);
  }
  std::vector<TokenId> render_chat(const OJson& messages, const OJson& tools,
                                   bool add_generation_prompt) const override {
    return encode_rendered(*render_chat_text(messages, tools, add_generation_prompt, OJson::object()));
  }
  std::vector<TokenId> encode_rendered(const std::string& text) const override {
    return tok_->encode(text, false);
  }
  std::string token_text(TokenId id) const override { return tok_->token_bytes(id); }
  const Tokenizer& tokenizer() const { return *tok_; }

 private:
  std::shared_ptr<const Tokenizer> tok_;
  ChatTemplate tmpl_;
};

const std::string kFixtures = SWARM_FIXTURES_DIR;

SapoGroup chat_group() {
  SapoGroup g;
  g.node_id = "qwen-node";
  g.model = "qwen3";
  g.policy_step = 4;
  g.task_id = "add";
  for (double r : {1.0, 0.0}) {
    SapoEpisode e;
    e.reward = r;
    e.calls.push_back({{"messages", OJson::array({{{"role", "system"}, {"content", "Be brief."}},
                                                  {{"role", "user"}, {"content", "What is 2+2?"}}})},
                       {"completion", {{"role", "assistant"}, {"content", r > 0 ? "4" : "5"}}},
                       {"text", r > 0 ? "4<|im_end|>" : "5<|im_end|>"},
                       {"finish_reason", "stop"}});
    g.episodes.push_back(std::move(e));
  }
  return g;
}

TEST(SapoReencode, ChatGroupFromAnotherTokenizerGetsThisNodesIds) {
  const TextBackend qwen(kFixtures + "/tokenizers/qwen3", kFixtures + "/tokenizers/qwen3");
  const TextBackend smol(kFixtures + "/models/smollm2-135m-instruct-noweights",
                         kFixtures + "/models/smollm2-135m-instruct-noweights");
  const Tokenizer& st = smol.tokenizer();
  const TokenId im_end = *st.token_to_id("<|im_end|>");
  ASSERT_NE(im_end, *qwen.tokenizer().token_to_id("<|im_end|>"))
      << "the fixtures should differ in vocabulary";

  const std::vector<FinishedEpisode> eps = reencode_sapo_group(chat_group(), smol, 9, 4096);
  ASSERT_EQ(eps.size(), 2u);
  // SmolLM2's template, written out: its prompt, then the answer and its end-of-turn token.
  const std::string prompt_text =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
      "<|im_start|>assistant\n";
  const std::vector<TokenId> prompt = st.encode(prompt_text, false);
  for (size_t e = 0; e < eps.size(); ++e) {
    const FinishedEpisode& ep = eps[e];
    EXPECT_EQ(ep.task_id, "sapo/qwen-node/add");
    EXPECT_EQ(ep.from_node, "qwen-node");
    EXPECT_EQ(ep.min_version, 9);
    EXPECT_EQ(ep.reward, e == 0 ? 1.0 : 0.0);
    ASSERT_EQ(ep.samples.size(), 1u);
    const Sample& s = ep.samples[0];
    std::vector<TokenId> expected = prompt;
    for (TokenId id : st.encode(e == 0 ? "4" : "5", false)) expected.push_back(id);
    expected.push_back(im_end);
    ASSERT_EQ(s.token_ids, expected);
    for (size_t t = 0; t < s.token_ids.size(); ++t) {
      EXPECT_EQ(s.loss_mask[t], t >= prompt.size() ? 1 : 0) << "token " << t;
      if (s.loss_mask[t]) {
        EXPECT_TRUE(std::isnan(s.rollout_logprobs[t]));
        EXPECT_EQ(s.policy_versions[t], 9);
      }
    }
  }
  // The same group on a Qwen3 node: Qwen3's template (an empty think block before the answer
  // of the last turn) in Qwen3's ids.
  // A generation cut by max_tokens gets no end-of-turn token in its copy either.
  SapoGroup cut = chat_group();
  cut.episodes[0].calls[0]["finish_reason"] = "length";
  cut.episodes[0].calls[0]["text"] = "4";
  const auto cut_eps = reencode_sapo_group(cut, smol, 9, 4096);
  std::vector<TokenId> cut_expected = prompt;
  for (TokenId id : st.encode("4", false)) cut_expected.push_back(id);
  EXPECT_EQ(cut_eps.at(0).samples.at(0).token_ids, cut_expected);

  const std::vector<FinishedEpisode> back = reencode_sapo_group(chat_group(), qwen, 9, 4096);
  const Tokenizer& qt = qwen.tokenizer();
  std::vector<TokenId> qexpected = qt.encode(prompt_text, false);
  for (TokenId id : qt.encode("<think>\n\n</think>\n\n4<|im_end|>", false)) qexpected.push_back(id);
  EXPECT_EQ(back.at(0).samples.at(0).token_ids, qexpected);
}

TEST(SapoReencode, ToolCallsAndMultiTurnCallsMergeIntoOneSample) {
  const TextBackend qwen(kFixtures + "/tokenizers/qwen3", kFixtures + "/tokenizers/qwen3");
  const OJson tools = OJson::array(
      {{{"type", "function"}, {"function", {{"name", "add"}, {"parameters", {{"type", "object"}}}}}}});
  const OJson call = {
      {"id", "call_1"}, {"type", "function"}, {"function", {{"name", "add"}, {"arguments", "{\"a\": 2}"}}}};
  OJson first_messages = OJson::array({{{"role", "user"}, {"content", "add 2"}}});
  OJson first_answer = {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", OJson::array({call})}};
  OJson second_messages = first_messages;
  second_messages.push_back(first_answer);
  second_messages.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "4"}});
  SapoGroup g;
  g.node_id = "n";
  g.task_id = "tools";
  SapoEpisode e;
  e.reward = 1;
  e.calls.push_back(
      {{"messages", first_messages}, {"tools", tools}, {"completion", first_answer}, {"text", "x"}});
  e.calls.push_back({{"messages", second_messages},
                     {"tools", tools},
                     {"completion", {{"role", "assistant"}, {"content", "It is 4."}}},
                     {"text", "x"}});
  g.episodes.push_back(e);
  // A ChatML template that renders history as it renders answers: the second call's prompt
  // extends the first call's ids, so the episode is one sample of two calls.
  const MockBackend chatml;
  const auto merged = reencode_sapo_group(g, chatml, 0, 4096);
  ASSERT_EQ(merged.at(0).samples.size(), 1u) << "the second call's prompt should extend the first call's ids";
  EXPECT_EQ(merged[0].samples[0].num_calls, 2);
  // Qwen3's template writes an empty think block before the last answer only, so the history of
  // the second call differs from the first answer: two samples, each call's answer trained once.
  const auto eps = reencode_sapo_group(g, qwen, 0, 4096);
  ASSERT_EQ(eps.size(), 1u);
  EXPECT_EQ(eps[0].samples.size(), 2u);
  std::vector<TokenId> trained;
  for (const Sample& s : eps[0].samples)
    for (size_t t = 0; t < s.token_ids.size(); ++t)
      if (s.loss_mask[t]) trained.push_back(s.token_ids[t]);
  const std::string text = qwen.tokenizer().decode(trained, false);
  EXPECT_NE(text.find("<tool_call>"), std::string::npos) << text;
  EXPECT_NE(text.find("\"name\": \"add\""), std::string::npos) << text;
  EXPECT_NE(text.find("It is 4.<|im_end|>"), std::string::npos) << text;
  EXPECT_EQ(text.find("<tool_response>"), std::string::npos) << "the tool's answer is not trained: " << text;
}

TEST(SapoReencode, CompletionCallsEncodeTheirTextAndOversizedGroupsThrow) {
  const TextBackend smol(kFixtures + "/models/smollm2-135m-instruct-noweights",
                         kFixtures + "/models/smollm2-135m-instruct-noweights");
  SapoGroup g;
  g.node_id = "n";
  g.task_id = "story";
  SapoEpisode e;
  e.reward = 0.5;
  e.calls.push_back({{"prompt", "Once upon"}, {"text", " a time<|im_end|>"}});
  g.episodes.push_back(e);
  const auto eps = reencode_sapo_group(g, smol, 1, 4096);
  const Tokenizer& st = smol.tokenizer();
  std::vector<TokenId> expected = st.encode("Once upon", false);
  const size_t prompt = expected.size();
  for (TokenId id : st.encode(" a time<|im_end|>", false)) expected.push_back(id);
  ASSERT_EQ(eps.at(0).samples.at(0).token_ids, expected);
  EXPECT_EQ(eps[0].samples[0].loss_mask[prompt - 1], 0);
  EXPECT_EQ(eps[0].samples[0].loss_mask[prompt], 1);
  EXPECT_THROW(reencode_sapo_group(g, smol, 1, 3), SwarmError);
  // Trained at the sender's temperature when it says one, else at 1 (an on-policy recomputation).
  EXPECT_EQ(eps[0].samples[0].calls.at(0).temperature, 1.0f);
  g.episodes[0].calls[0]["temperature"] = 0.6;
  EXPECT_EQ(reencode_sapo_group(g, smol, 1, 4096).at(0).samples.at(0).calls.at(0).temperature, 0.6f);
}

TEST(SapoReencode, BatchGroupsCarryEveryLocalEpisodeByTask) {
  TrainBatch batch;
  for (int k = 0; k < 4; ++k) {
    FinishedEpisode e;
    e.task_id = k < 2 ? "t0" : "t1";
    e.reward = k;
    e.exchange_calls = {R"({"prompt": "p", "text": "t"})"};
    e.metadata_json = R"({"level": 3})";
    e.task_metadata_json = R"({"answer": "7"})";
    batch.episodes.push_back(e);
  }
  FinishedEpisode foreign;
  foreign.task_id = "sapo/x/t9";
  foreign.from_node = "x";
  foreign.exchange_calls = {R"({"prompt": "p", "text": "t"})"};
  batch.episodes.push_back(foreign);  // never republished
  FinishedEpisode silent;
  silent.task_id = "t2";  // no text recorded (published off when it ran)
  batch.episodes.push_back(silent);
  const auto groups = sapo_groups_of_batch(batch, "me", "m", 5, 1.5e9);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].task_id, "t0");
  EXPECT_EQ(groups[1].task_id, "t1");
  EXPECT_EQ(groups[1].episodes.size(), 2u);
  EXPECT_EQ(groups[1].episodes[1].reward, 3.0);
  EXPECT_EQ(groups[0].episodes[0].metadata["level"], 3);
  EXPECT_EQ(groups[1].task_metadata["answer"], "7");
  EXPECT_EQ(groups[0].policy_step, 5);
  EXPECT_EQ(groups[0].node_id, "me");
}

}  // namespace
