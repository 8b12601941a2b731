// Prefix caching in the serving engine on the real TinyStories-656K weights, fp32 and bf16:
// what a sequence reads from cached blocks gives the same greedy ids, and log-probs within
// float noise, as the same requests on an engine with prefix_caching off (a fresh prefill of
// everything); a group landing together prefills its prompt once; a conversation's next turn
// reuses the previous prompt and answer; blocks of one weights version never serve another;
// and reference counts come back to an all-free pool under preemption and cancellation.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/json_schema_grammar.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/serving_engine.hpp"
#include "support/generation_collector.hpp"
#include "text/tokenizer.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using testing::GenerationCollector;
using Results = std::vector<GenerationResult>;

fs::path tinystories() { return fs::path(SWARM_FIXTURES_DIR) / "models" / "tinystories-656k"; }

std::vector<TokenId> random_ids(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<TokenId>(3 + rng() % 2000));
  return ids;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

GenerationRequest greedy(std::vector<TokenId> prompt, int64_t max_tokens, int64_t n = 1) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0.0;
  r.params.max_tokens = max_tokens;
  r.params.logprobs = true;
  r.params.n = n;
  return r;
}

class PrefixCacheTest : public ::testing::TestWithParam<DType> {
 protected:
  static void SetUpTestSuite() {
    set_compute_threads(2);
    tokenizer_ = Tokenizer::from_directory(tinystories().string());
  }
  static void TearDownTestSuite() { tokenizer_.reset(); }
  void SetUp() override { model_ = DecoderModel::load(tinystories(), GetParam()); }

  // Greedy ids equal; log-probs within what recomputing K/V in another batch layout moves
  // them: float rounding in fp32, one bf16 rounding of K/V in bf16.
  double tolerance() const { return GetParam() == DType::F32 ? 1e-4 : 5e-2; }

  std::unique_ptr<ServingEngine> engine(bool prefix_caching, int64_t kv_tokens = 4096) const {
    ServingConfig c;
    c.kv_cache_tokens = kv_tokens;
    c.block_size = 16;
    c.prefix_caching = prefix_caching;
    return std::make_unique<ServingEngine>(model_, tokenizer_, c);  // no eos: every answer runs to length
  }

  // Submits every request while generation is paused, so that they land in one scheduler
  // step, then waits for all; `cancel_on_text[i]` makes request i go away at its first text.
  static std::vector<std::shared_ptr<GenerationCollector>> submit_together(
      ServingEngine& e, const std::vector<GenerationRequest>& requests,
      const std::vector<bool>& cancel_on_text = {}) {
    e.pause_generation(false);
    std::vector<std::shared_ptr<GenerationCollector>> cs;
    for (size_t i = 0; i < requests.size(); ++i) {
      cs.push_back(std::make_shared<GenerationCollector>());
      cs.back()->cancel_on_text = i < cancel_on_text.size() && cancel_on_text[i];
      e.submit(requests[i], cs.back());
    }
    e.resume_generation();
    for (auto& c : cs) EXPECT_TRUE(c->wait());
    return cs;
  }
  // submit_together's results, each expected to succeed.
  static Results run_together(ServingEngine& e, const std::vector<GenerationRequest>& requests) {
    Results out;
    for (auto& c : submit_together(e, requests)) {
      EXPECT_FALSE(c->error_kind.has_value()) << c->error;
      out.push_back(c->result.value_or(GenerationResult{}));
    }
    return out;
  }
  static GenerationResult run_one(ServingEngine& e, const GenerationRequest& r) {
    return run_together(e, {r})[0];
  }

  // The engine's counters once the step that completed the last request has ended (an
  // observer hears of its result inside that step).
  static ServingStats settled(ServingEngine& e) {
    e.run_exclusive([] {});
    return e.stats();
  }

  void expect_same_answers(const Results& cached, const Results& fresh) const {
    ASSERT_EQ(cached.size(), fresh.size());
    for (size_t i = 0; i < cached.size(); ++i) {
      ASSERT_EQ(cached[i].choices.size(), fresh[i].choices.size());
      for (size_t c = 0; c < cached[i].choices.size(); ++c) {
        const GenerationChoice &x = cached[i].choices[c], &y = fresh[i].choices[c];
        ASSERT_EQ(x.ids, y.ids) << "request " << i << " choice " << c;
        ASSERT_EQ(x.logprobs.size(), y.logprobs.size());
        for (size_t k = 0; k < x.logprobs.size(); ++k)
          EXPECT_NEAR(x.logprobs[k], y.logprobs[k], tolerance()) << "request " << i << " token " << k;
      }
    }
  }

  static std::shared_ptr<DecoderModel> model_;
  static std::shared_ptr<const Tokenizer> tokenizer_;
};
std::shared_ptr<DecoderModel> PrefixCacheTest::model_;
std::shared_ptr<const Tokenizer> PrefixCacheTest::tokenizer_;

TEST_P(PrefixCacheTest, AGroupLandingTogetherPrefillsItsPromptOnce) {
  const std::vector<TokenId> prompt = random_ids(200, 1);
  std::vector<GenerationRequest> group(16, greedy(prompt, 8));
  auto cached = engine(true);
  auto fresh = engine(false);
  const Results a = run_together(*cached, group);
  const Results b = run_together(*fresh, group);
  expect_same_answers(a, b);

  // One sequence prefills 200 tokens; the other 15 find 192 (12 full blocks; the partial last
  // block is never shared) and prefill the last 8.
  const ServingStats s = settled(*cached);
  EXPECT_EQ(s.prefill_tokens, 200 + 15 * 8);
  EXPECT_EQ(s.prefix_cache_queries_tokens, 16 * 200);
  EXPECT_EQ(s.prefix_cache_hit_tokens, 15 * 192);
  const ServingStats f = settled(*fresh);
  EXPECT_EQ(f.prefill_tokens, 16 * 200);
  EXPECT_EQ(f.prefix_cache_queries_tokens, 0);
  EXPECT_EQ(f.prefix_cache_hit_tokens, 0);

  // The same group as one request of n = 16 (one sequence per choice) on a fresh cache.
  auto cached_n = engine(true);
  const Results c = run_together(*cached_n, {greedy(prompt, 8, 16)});
  ASSERT_EQ(c[0].choices.size(), 16u);
  for (const GenerationChoice& choice : c[0].choices) EXPECT_EQ(choice.ids, a[0].choices[0].ids);
  EXPECT_EQ(settled(*cached_n).prefill_tokens, 200 + 15 * 8);
}

TEST_P(PrefixCacheTest, TheNextTurnReusesThePromptAndTheAnswer) {
  const std::vector<TokenId> prompt = random_ids(100, 2);
  auto cached = engine(true);
  auto fresh = engine(false);
  const GenerationResult turn1 = run_one(*cached, greedy(prompt, 30));
  const std::vector<TokenId>& answer = turn1.choices.at(0).ids;
  ASSERT_EQ(answer.size(), 30u);
  expect_same_answers({turn1}, {run_one(*fresh, greedy(prompt, 30))});

  // Turn 2 = turn 1's prompt and answer and 40 new tokens (a tool's output). Everything turn 1
  // fed the model (all but the last sampled id: 129 tokens) is in 8 full blocks.
  const std::vector<TokenId> prompt2 = concat(concat(prompt, answer), random_ids(40, 3));
  const ServingStats before = settled(*cached);
  const GenerationResult turn2 = run_one(*cached, greedy(prompt2, 20));
  const ServingStats after = settled(*cached);
  EXPECT_EQ(after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens, 128);
  EXPECT_EQ(after.prefill_tokens - before.prefill_tokens, 170 - 128);
  expect_same_answers({turn2}, {run_one(*fresh, greedy(prompt2, 20))});
}

TEST_P(PrefixCacheTest, BlocksOfOneWeightsVersionNeverServeAnother) {
  const std::vector<TokenId> prompt = random_ids(100, 4);
  auto e = engine(true);
  run_one(*e, greedy(prompt, 4));
  EXPECT_GT(settled(*e).kv_blocks_cached, 0);
  e->set_policy_version(1);  // new weights (the same numbers here: only the version is known)
  const int64_t hits0 = settled(*e).prefix_cache_hit_tokens;
  const GenerationResult r = run_one(*e, greedy(prompt, 4));
  EXPECT_EQ(settled(*e).prefix_cache_hit_tokens, hits0) << "a block of version 0 served version 1";
  EXPECT_EQ(r.policy_version, 1);
  run_one(*e, greedy(prompt, 4));  // version 1's own blocks are reused
  EXPECT_EQ(settled(*e).prefix_cache_hit_tokens, hits0 + 96);
}

// Asynchronous training with kv_cache_on_swap keep: a sequence generating across the swap
// keeps its own K/V, but nothing computed under the old weights, nor anything it computes
// afterwards on top of that, is offered to requests of the new version.
TEST_P(PrefixCacheTest, ASequenceKeptAcrossASwapPublishesNothingMixed) {
  const std::vector<TokenId> prompt = random_ids(64, 5);
  auto e = engine(true);
  auto c = std::make_shared<GenerationCollector>();
  e->submit(greedy(prompt, 300), c);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (c->text_events.load() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  e->run_exclusive([&] { e->set_policy_version(1); });
  ASSERT_TRUE(c->wait());
  ASSERT_TRUE(c->result.has_value());
  const std::vector<TokenId>& ids = c->result->choices.at(0).ids;
  ASSERT_EQ(ids.size(), 300u);
  ASSERT_EQ(c->result->choices[0].versions.back(), 1);  // it did run across the swap
  EXPECT_EQ(settled(*e).kv_blocks_cached, 0);
  const int64_t hits0 = settled(*e).prefix_cache_hit_tokens;
  run_one(*e, greedy(concat(prompt, std::vector<TokenId>(ids.begin(), ids.begin() + 100)), 2));
  EXPECT_EQ(settled(*e).prefix_cache_hit_tokens, hits0);
}

// A small cache and more sequences than fit: admission waits, decoding sequences preempt
// others, cached blocks are evicted and re-made; answers stay those of the uncached engine, and
// when everything has ended (some cancelled midway) every block is free again.
TEST_P(PrefixCacheTest, EvictionPreemptionAndCancellationKeepAnswersAndCounts) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 12; ++i)
    requests.push_back(greedy(concat(random_ids(80, 10 + i % 3), random_ids(5 + 3 * i, 100 + i)), 40));
  auto cached = engine(true, 384);
  auto fresh = engine(false, 384);
  const Results a = run_together(*cached, requests);
  const Results b = run_together(*fresh, requests);
  expect_same_answers(a, b);
  ServingStats s = settled(*cached);
  EXPECT_GT(s.prefix_cache_hit_tokens, 0);
  EXPECT_GT(s.preemptions, 0);  // the cache was too small for all of them at once
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);

  // Half the sharers of one prompt go away after their first text.
  const std::vector<GenerationRequest> sharers(8, greedy(random_ids(120, 77), 30));
  const auto cs = submit_together(*cached, sharers, {true, false, true, false, true, false, true, false});
  for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(cs[i]->error_kind.has_value(), i % 2 == 0);
  s = settled(*cached);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  EXPECT_GT(s.kv_blocks_cached, 0);
}

// What is per sequence stays per sequence when the prompt's blocks are shared: a grammar's
// state, a stop string, the streamed text. Three requests on one prompt land together (two of
// them attach the first's blocks) and give what the uncached engine gives, text and stream.
TEST_P(PrefixCacheTest, GrammarsStopStringsAndStreamsStayPerSequence) {
  std::string story;
  for (int i = 0; i < 4; ++i)
    story +=
        "Once upon a time there was a little girl named Lily. She loved to play in the park with her "
        "friends. ";
  const std::vector<TokenId> prompt =
      tokenizer_->encode(story + "One day she found a shiny red ball and", true);
  ASSERT_GT(prompt.size(), 33u);  // two full blocks to share
  auto fresh = engine(false);
  const std::string plain_text = run_one(*fresh, greedy(prompt, 30)).choices.at(0).text;
  ASSERT_GE(plain_text.size(), 12u) << plain_text;
  GenerationRequest constrained = greedy(prompt, 30);
  constrained.grammar =
      std::make_shared<const grammar::Grammar>(grammar::json_schema_grammar(nlohmann::ordered_json::parse(
          R"({"type": "string", "minLength": 3, "maxLength": 12})")));  // the vocabulary has '"', not '{'
  GenerationRequest stopped = greedy(prompt, 30);
  stopped.params.stop = {plain_text.substr(6, 4)};
  const std::vector<GenerationRequest> requests = {greedy(prompt, 30), constrained, stopped};

  auto cached = engine(true);
  const auto a = submit_together(*cached, requests);
  const auto b = submit_together(*fresh, requests);
  EXPECT_EQ(settled(*cached).prefix_cache_hit_tokens,
            2 * ((static_cast<int64_t>(prompt.size()) - 1) / 16) * 16);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(a[i]->result && b[i]->result) << a[i]->error << b[i]->error;
    const GenerationChoice &x = a[i]->result->choices.at(0), &y = b[i]->result->choices.at(0);
    EXPECT_EQ(x.ids, y.ids) << "request " << i;
    EXPECT_EQ(x.text, y.text) << "request " << i;
    EXPECT_EQ(x.finish_reason, y.finish_reason) << "request " << i;
    EXPECT_EQ(a[i]->streamed[0], b[i]->streamed[0]) << "request " << i;
    ASSERT_EQ(x.logprobs.size(), y.logprobs.size());
    for (size_t k = 0; k < x.logprobs.size(); ++k) EXPECT_NEAR(x.logprobs[k], y.logprobs[k], tolerance());
  }
  EXPECT_EQ(a[1]->result->choices[0].text.front(), '"');  // the grammar held
  EXPECT_EQ(a[2]->result->choices[0].finish_reason, "stop");
  EXPECT_EQ(a[2]->result->choices[0].text, plain_text.substr(0, plain_text.find(stopped.params.stop[0])));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PrefixCacheTest, ::testing::Values(DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(i.param == DType::F32 ? "fp32" : "bf16");
                         });

}  // namespace
}  // namespace swarm
