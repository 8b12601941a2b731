// The serving engine (continuous batching over the paged KV cache) on the real TinyStories-656K
// weights. The reference is the plain full forward (DecoderModel::forward_full, itself checked
// against python3-torch in test_decoder_model_torch): whatever the engine does to schedule —
// chunked prefill, mixing requests in one step, preempting and recomputing — a greedy
// sequence must come out exactly as a one-sequence full-forward greedy loop would produce it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "grammar/json_schema_grammar.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/serving_engine.hpp"
#include "support/generation_collector.hpp"
#include "text/tokenizer.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;

fs::path tinystories() { return fs::path(SWARM_FIXTURES_DIR) / "models" / "tinystories-656k"; }

using Collector = testing::GenerationCollector;

struct Reference {
  std::vector<TokenId> ids;     // greedy continuation (stops after an eos id, included)
  std::vector<float> logprobs;  // log_softmax of the full-forward logits at each step
};

class ServingEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    set_compute_threads(2);
    model_ = DecoderModel::load(tinystories(), DType::F32);
    tokenizer_ = Tokenizer::from_directory(tinystories().string());
  }
  static void TearDownTestSuite() {
    model_.reset();
    tokenizer_.reset();
  }

  static ServingConfig config() {
    ServingConfig c;
    c.kv_cache_tokens = 4096;
    c.block_size = 16;
    c.eos_token_ids = {2};
    return c;
  }

  static std::vector<TokenId> prompt(const std::string& text) { return tokenizer_->encode(text, true); }

  // Greedy decoding with the full forward pass over the whole sequence at every step.
  static Reference greedy_reference(const std::vector<TokenId>& prompt, int64_t max_new,
                                    const std::vector<TokenId>& stop_ids = {2}) {
    c10::InferenceMode guard;
    Reference ref;
    std::vector<int64_t> seq(prompt.begin(), prompt.end());
    for (int64_t i = 0; i < max_new; ++i) {
      const int64_t n = static_cast<int64_t>(seq.size());
      at::Tensor ids = at::tensor(seq, at::kLong).view({1, n});
      at::Tensor logits = model_->forward_full(ids, at::tensor(std::vector<int64_t>{n}, at::kLong));
      at::Tensor last = logits[0][n - 1].log_softmax(-1);
      const int64_t id = last.argmax().item<int64_t>();
      ref.ids.push_back(static_cast<TokenId>(id));
      ref.logprobs.push_back(last[id].item<float>());
      seq.push_back(id);
      if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) break;
    }
    return ref;
  }

  static GenerationRequest greedy(const std::vector<TokenId>& prompt_ids, int64_t max_tokens) {
    GenerationRequest r;
    r.prompt_ids = prompt_ids;
    r.params.temperature = 0.0;
    r.params.max_tokens = max_tokens;
    r.params.logprobs = true;
    return r;
  }

  static std::shared_ptr<Collector> run(ServingEngine& engine, GenerationRequest request) {
    auto c = std::make_shared<Collector>();
    engine.submit(std::move(request), c);
    EXPECT_TRUE(c->wait());
    return c;
  }

  static void expect_blocks_all_free(ServingEngine& engine) {
    // Stats are published after each loop iteration: give the loop a moment to go idle.
    for (int i = 0; i < 200; ++i) {
      const ServingStats s = engine.stats();
      if (s.kv_blocks_free == s.kv_blocks_total && s.running == 0 && s.waiting == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const ServingStats s = engine.stats();
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.waiting, 0);
  }

  static inline std::shared_ptr<DecoderModel> model_;
  static inline std::shared_ptr<const Tokenizer> tokenizer_;
};

const std::vector<std::string> kPrompts = {
    "Once upon a time, there was a little girl named Lily.",
    "Tom had a big red ball. One day",
    "The sun was shining and the birds were singing in the park. A small dog ran to",
    "Sam",
    "Mom said, \"Let's go to the store!\" Ben was happy because",
    "There was a tree.",
};

TEST_F(ServingEngineTest, GreedyMatchesFullForwardWithLogprobs) {
  ServingEngine engine(model_, tokenizer_, config());
  const auto ids = prompt(kPrompts[0]);
  const Reference ref = greedy_reference(ids, 64);
  auto c = run(engine, greedy(ids, 64));
  ASSERT_TRUE(c->result) << c->error;
  const GenerationChoice& ch = c->result->choices.at(0);
  EXPECT_EQ(ch.ids, ref.ids);
  ASSERT_EQ(ch.logprobs.size(), ref.logprobs.size());
  for (size_t i = 0; i < ch.logprobs.size(); ++i) EXPECT_NEAR(ch.logprobs[i], ref.logprobs[i], 1e-4) << i;
  EXPECT_EQ(ch.finish_reason, ref.ids.size() < 64 ? "stop" : "length");
  EXPECT_EQ(ch.text, tokenizer_->decode(ch.ids, true));
  EXPECT_EQ(c->streamed[0], ch.text);  // the streamed deltas add up to the final text
  expect_blocks_all_free(engine);
}

// Many requests at once with a tiny step budget: prompts are prefilled in chunks of a few
// tokens while others decode in the same step. Every sequence equals its solo reference.
TEST_F(ServingEngineTest, ConcurrentChunkedPrefillMatchesSoloGreedy) {
  ServingConfig cfg = config();
  cfg.max_step_tokens = 5;
  ServingEngine engine(model_, tokenizer_, cfg);
  std::vector<std::shared_ptr<Collector>> cs;
  std::vector<Reference> refs;
  for (const auto& p : kPrompts) refs.push_back(greedy_reference(prompt(p), 24));
  for (const auto& p : kPrompts) {  // all submitted together, after the slow references
    auto c = std::make_shared<Collector>();
    engine.submit(greedy(prompt(p), 24), c);
    cs.push_back(c);
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    ASSERT_TRUE(cs[i]->wait());
    ASSERT_TRUE(cs[i]->result) << cs[i]->error;
    EXPECT_EQ(cs[i]->result->choices[0].ids, refs[i].ids) << kPrompts[i];
  }
  const ServingStats s = engine.stats();
  EXPECT_GT(s.steps, 0);
  EXPECT_EQ(s.completed_requests, static_cast<int64_t>(kPrompts.size()));
  // The latency window saw every request; with a 5-token budget the later ones waited for
  // admission, and a request's first token never comes before its admission.
  EXPECT_EQ(s.latency_samples, static_cast<int64_t>(kPrompts.size()));
  EXPECT_GT(s.queue_wait_p99_seconds, 0.0);
  EXPECT_LE(s.queue_wait_p50_seconds, s.ttft_p50_seconds);
  EXPECT_LE(s.queue_wait_p99_seconds, s.ttft_p99_seconds);
  EXPECT_LE(s.ttft_p50_seconds, s.ttft_p99_seconds);
  EXPECT_GT(s.step_p50_seconds, 0.0);
  EXPECT_LE(s.step_p50_seconds, s.step_p99_seconds);
  expect_blocks_all_free(engine);
}

// A KV cache far too small for all sequences at once: requests wait, decoding sequences
// preempt others (recomputed later), and still every result equals the solo reference.
TEST_F(ServingEngineTest, TinyKvCacheWaitsAndPreemptsWithoutChangingResults) {
  ServingConfig cfg = config();
  cfg.kv_cache_tokens = 80;
  cfg.block_size = 8;
  cfg.eos_token_ids = {};  // run every sequence to max_tokens so the cache really fills
  ServingEngine engine(model_, tokenizer_, cfg);
  std::vector<std::shared_ptr<Collector>> cs;
  std::vector<Reference> refs;
  for (const auto& p : kPrompts) refs.push_back(greedy_reference(prompt(p), 30, {}));
  for (const auto& p : kPrompts) {
    auto c = std::make_shared<Collector>();
    engine.submit(greedy(prompt(p), 30), c);
    cs.push_back(c);
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    ASSERT_TRUE(cs[i]->wait());
    ASSERT_TRUE(cs[i]->result) << cs[i]->error;
    EXPECT_EQ(cs[i]->result->choices[0].ids, refs[i].ids) << kPrompts[i];
  }
  EXPECT_GT(engine.stats().preemptions, 0) << "the cache was meant to be too small for every sequence";
  expect_blocks_all_free(engine);
}

// Asynchronous training swaps weights while sequences generate: every token keeps
// the version that sampled it, and the swap changes nothing else (here the weights stay the same,
// so the ids are the greedy reference's) whether the KV cache is kept or recomputed.
void check_generation_across_a_swap(std::shared_ptr<DecoderModel> model,
                                    std::shared_ptr<const Tokenizer> tokenizer, ServingConfig cfg,
                                    const std::vector<TokenId>& ids, const Reference& ref, bool recompute) {
  cfg.eos_token_ids = {};
  ServingEngine engine(model, tokenizer, cfg);
  engine.set_policy_version(3);
  GenerationRequest r;
  r.prompt_ids = ids;
  r.params.temperature = 0.0;
  r.params.max_tokens = static_cast<int64_t>(ref.ids.size());
  r.params.logprobs = true;
  auto c = std::make_shared<Collector>();
  engine.submit(r, c);
  for (int i = 0; i < 2000 && c->text_events < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int64_t preemptions_before = engine.stats().preemptions;
  engine.run_exclusive([&] {
    engine.set_policy_version(4);
    if (recompute) engine.recompute_running();
  });
  ASSERT_TRUE(c->wait());
  ASSERT_TRUE(c->result) << c->error;
  const GenerationChoice& ch = c->result->choices.at(0);
  EXPECT_EQ(ch.ids, ref.ids);
  ASSERT_EQ(ch.logprobs.size(), ref.logprobs.size());
  for (size_t i = 0; i < ch.logprobs.size(); ++i) EXPECT_NEAR(ch.logprobs[i], ref.logprobs[i], 1e-4) << i;
  ASSERT_EQ(ch.versions.size(), ch.ids.size());
  EXPECT_EQ(ch.versions.front(), 3);
  EXPECT_EQ(ch.versions.back(), 4) << "the swap came after the generation ended; lengthen it";
  EXPECT_TRUE(std::is_sorted(ch.versions.begin(), ch.versions.end()));
  EXPECT_EQ(c->result->policy_version, 3);  // the oldest version in it
  EXPECT_EQ(engine.stats().preemptions - preemptions_before, recompute ? 1 : 0);
}

TEST_F(ServingEngineTest, AGenerationAcrossASwapKeepsItsKvCacheAndCarriesBothVersions) {
  const auto ids = prompt(kPrompts[2]);
  check_generation_across_a_swap(model_, tokenizer_, config(), ids, greedy_reference(ids, 160, {}), false);
}

TEST_F(ServingEngineTest, AGenerationAcrossASwapRecomputedCarriesBothVersions) {
  const auto ids = prompt(kPrompts[2]);
  check_generation_across_a_swap(model_, tokenizer_, config(), ids, greedy_reference(ids, 160, {}), true);
}

// The trainer's step frees the KV cache (free_kv_cache_during_training): a sequence running
// then gives its blocks back, nothing generates while the cache is gone (a request submitted
// meanwhile waits), and after the restore both finish exactly as they would have.
TEST_F(ServingEngineTest, AReleasedKvCacheHoldsGenerationUntilRestored) {
  ServingConfig cfg = config();
  cfg.eos_token_ids = {};
  ServingEngine engine(model_, tokenizer_, cfg);
  const int64_t bytes = engine.kv_cache_bytes();
  ASSERT_GT(bytes, 0);
  const auto first_ids = prompt(kPrompts[2]), second_ids = prompt(kPrompts[0]);
  const Reference first_ref = greedy_reference(first_ids, 120, {}),
                  second_ref = greedy_reference(second_ids, 20, {});
  auto first = std::make_shared<Collector>();
  engine.submit(greedy(first_ids, 120), first);
  for (int i = 0; i < 2000 && first->text_events < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int64_t preemptions_before = engine.stats().preemptions;
  EXPECT_EQ(engine.pause_generation(true), bytes);
  EXPECT_EQ(engine.kv_cache_bytes(), 0);
  EXPECT_EQ(engine.pause_generation(true), 0);  // paused already
  auto second = std::make_shared<Collector>();
  engine.submit(greedy(second_ids, 20), second);
  // No step can run without the cache: whatever the loop does meanwhile, no token comes.
  const int seen = first->text_events.load();
  engine.run_exclusive([] {});  // the loop has taken the new request and gone round
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(first->text_events.load(), seen);
  EXPECT_EQ(second->text_events.load(), 0);
  EXPECT_FALSE(first->result.has_value()) << "the generation ended before the release; lengthen it";
  engine.resume_generation();
  EXPECT_EQ(engine.kv_cache_bytes(), bytes);
  ASSERT_TRUE(first->wait());
  ASSERT_TRUE(second->wait());
  ASSERT_TRUE(first->result) << first->error;
  ASSERT_TRUE(second->result) << second->error;
  EXPECT_EQ(first->result->choices[0].ids, first_ref.ids);
  EXPECT_EQ(second->result->choices[0].ids, second_ref.ids);
  EXPECT_EQ(engine.stats().preemptions - preemptions_before, 1);  // the running one, prefilled again
  expect_blocks_all_free(engine);
}

// Paused without freeing (one weight copy: the trainer writes the weights the engine reads), a
// running sequence keeps its KV blocks and simply waits; resumed, it finishes as it would have.
TEST_F(ServingEngineTest, APausedEngineKeepsItsSequencesAndFinishesThemAfterTheResume) {
  ServingConfig cfg = config();
  cfg.eos_token_ids = {};
  ServingEngine engine(model_, tokenizer_, cfg);
  const auto ids = prompt(kPrompts[2]);
  const Reference ref = greedy_reference(ids, 120, {});
  auto c = std::make_shared<Collector>();
  engine.submit(greedy(ids, 120), c);
  for (int i = 0; i < 2000 && c->text_events < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int64_t preemptions_before = engine.stats().preemptions;
  EXPECT_EQ(engine.pause_generation(false), 0);
  EXPECT_GT(engine.kv_cache_bytes(), 0);
  const int seen = c->text_events.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(c->text_events.load(), seen);
  EXPECT_LT(engine.stats().kv_blocks_free, engine.stats().kv_blocks_total);  // its blocks stay
  engine.resume_generation();
  ASSERT_TRUE(c->wait());
  ASSERT_TRUE(c->result) << c->error;
  EXPECT_EQ(c->result->choices[0].ids, ref.ids);
  EXPECT_EQ(engine.stats().preemptions, preemptions_before);
  expect_blocks_all_free(engine);
}

TEST_F(ServingEngineTest, SameSeedSameTokensWhateverTheBatch) {
  ServingEngine engine(model_, tokenizer_, config());
  GenerationRequest r;
  r.prompt_ids = prompt(kPrompts[1]);
  r.params.temperature = 1.0;
  r.params.max_tokens = 40;
  r.params.seed = 1234;
  auto solo = run(engine, r);
  ASSERT_TRUE(solo->result) << solo->error;

  // The same request again, this time sharing steps with other sampled requests.
  std::vector<std::shared_ptr<Collector>> others;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest o;
    o.prompt_ids = prompt(kPrompts[static_cast<size_t>(i + 2)]);
    o.params.temperature = 1.0;
    o.params.max_tokens = 40;
    auto c = std::make_shared<Collector>();
    engine.submit(o, c);
    others.push_back(c);
  }
  auto again = run(engine, r);
  for (auto& o : others) ASSERT_TRUE(o->wait());
  ASSERT_TRUE(again->result);
  EXPECT_EQ(again->result->choices[0].ids, solo->result->choices[0].ids);
  // Log-probs may differ in the last bits: a batched matmul blocks the sums differently.
  ASSERT_EQ(again->result->choices[0].logprobs.size(), solo->result->choices[0].logprobs.size());
  for (size_t i = 0; i < solo->result->choices[0].logprobs.size(); ++i)
    EXPECT_NEAR(again->result->choices[0].logprobs[i], solo->result->choices[0].logprobs[i], 1e-4);

  r.params.seed = 1235;
  auto other_seed = run(engine, r);
  ASSERT_TRUE(other_seed->result);
  EXPECT_NE(other_seed->result->choices[0].ids, solo->result->choices[0].ids);
}

TEST_F(ServingEngineTest, NChoicesAreIndependentSequences) {
  ServingEngine engine(model_, tokenizer_, config());
  GenerationRequest r;
  r.prompt_ids = prompt(kPrompts[4]);
  r.params.temperature = 1.0;
  r.params.max_tokens = 30;
  r.params.seed = 99;
  auto one = run(engine, r);
  r.params.n = 3;
  auto three = run(engine, r);
  ASSERT_TRUE(one->result && three->result);
  ASSERT_EQ(three->result->choices.size(), 3u);
  // Choice 0 uses the seed itself, so it equals the n=1 request; the others differ.
  EXPECT_EQ(three->result->choices[0].ids, one->result->choices[0].ids);
  EXPECT_NE(three->result->choices[1].ids, three->result->choices[0].ids);
  EXPECT_NE(three->result->choices[2].ids, three->result->choices[1].ids);
  for (int64_t c = 0; c < 3; ++c)
    EXPECT_EQ(three->streamed[c], three->result->choices[static_cast<size_t>(c)].text);
}

TEST_F(ServingEngineTest, StopTokenIdEndsTheSequenceAndIsRecorded) {
  ServingEngine engine(model_, tokenizer_, config());
  const auto ids = prompt(kPrompts[0]);
  const Reference ref = greedy_reference(ids, 40);
  // The first position >= 3 whose token did not occur before it.
  size_t at = 3;
  while (at < ref.ids.size() && std::find(ref.ids.begin(), ref.ids.begin() + static_cast<long>(at),
                                          ref.ids[at]) != ref.ids.begin() + static_cast<long>(at))
    ++at;
  ASSERT_LT(at, ref.ids.size());
  GenerationRequest r = greedy(ids, 40);
  r.params.stop_token_ids = {ref.ids[at]};
  auto c = run(engine, r);
  ASSERT_TRUE(c->result) << c->error;
  const auto& ch = c->result->choices[0];
  EXPECT_EQ(ch.ids, std::vector<TokenId>(ref.ids.begin(), ref.ids.begin() + static_cast<long>(at) + 1));
  EXPECT_EQ(ch.finish_reason, "stop");
  // The stop token is recorded (ids, logprobs) but is not part of the text.
  EXPECT_EQ(ch.logprobs.size(), ch.ids.size());
  EXPECT_EQ(ch.text, tokenizer_->decode(std::vector<TokenId>(ch.ids.begin(), ch.ids.end() - 1), true));
}

TEST_F(ServingEngineTest, StopStringCutsTextAndIsNeverStreamed) {
  ServingConfig cfg = config();
  cfg.eos_token_ids = {};  // a long enough text to cut
  ServingEngine engine(model_, tokenizer_, cfg);
  const auto ids = prompt(kPrompts[2]);
  GenerationRequest full = greedy(ids, 48);
  auto base = run(engine, full);
  ASSERT_TRUE(base->result);
  const std::string text = base->result->choices[0].text;
  ASSERT_GT(text.size(), 30u);
  // A stop string from the middle of the text, spanning a few characters.
  const std::string stop = text.substr(text.size() / 2, 4);
  const size_t cut = text.find(stop);
  GenerationRequest r = full;
  r.params.stop = {"never appears in a story \x01", stop};
  auto c = run(engine, r);
  ASSERT_TRUE(c->result) << c->error;
  const auto& ch = c->result->choices[0];
  EXPECT_EQ(ch.text, text.substr(0, cut));
  EXPECT_EQ(ch.finish_reason, "stop");
  EXPECT_EQ(c->streamed[0], ch.text);  // the stop string was held back, never sent
  // The sampled ids run up to the token that completed the stop string: a prefix of the base.
  ASSERT_LE(ch.ids.size(), base->result->choices[0].ids.size());
  EXPECT_TRUE(std::equal(ch.ids.begin(), ch.ids.end(), base->result->choices[0].ids.begin()));
  EXPECT_NE(tokenizer_->decode(ch.ids, true).find(stop), std::string::npos);
}

TEST_F(ServingEngineTest, MaxTokensEndsWithLength) {
  ServingEngine engine(model_, tokenizer_, config());
  auto c = run(engine, greedy(prompt(kPrompts[2]), 5));
  ASSERT_TRUE(c->result);
  EXPECT_EQ(c->result->choices[0].ids.size(), 5u);
  EXPECT_EQ(c->result->choices[0].finish_reason, "length");
}

TEST_F(ServingEngineTest, TopLogprobsStartWithTheGreedyToken) {
  ServingEngine engine(model_, tokenizer_, config());
  GenerationRequest r = greedy(prompt(kPrompts[3]), 10);
  r.params.top_logprobs = 3;
  auto c = run(engine, r);
  ASSERT_TRUE(c->result);
  const auto& ch = c->result->choices[0];
  ASSERT_EQ(ch.top.size(), ch.ids.size());
  for (size_t i = 0; i < ch.ids.size(); ++i) {
    ASSERT_EQ(ch.top[i].size(), 3u);
    EXPECT_EQ(ch.top[i][0].id, ch.ids[i]);
    EXPECT_FLOAT_EQ(ch.top[i][0].logprob, ch.logprobs[i]);
    EXPECT_GE(ch.top[i][1].logprob, ch.top[i][2].logprob);
  }
}

TEST_F(ServingEngineTest, CancelledRequestEndsAndFreesItsBlocks) {
  ServingConfig cfg = config();
  cfg.eos_token_ids = {};
  ServingEngine engine(model_, tokenizer_, cfg);
  auto c = std::make_shared<Collector>();
  c->cancel_on_text = true;
  engine.submit(greedy(prompt(kPrompts[0]), 400), c);
  ASSERT_TRUE(c->wait());
  EXPECT_FALSE(c->result);
  ASSERT_TRUE(c->error_kind);
  EXPECT_EQ(*c->error_kind, ErrorKind::CONFLICT);
  EXPECT_EQ(c->ends, 1);
  EXPECT_EQ(engine.stats().cancelled_requests, 1);
  expect_blocks_all_free(engine);
  // The engine keeps serving.
  auto after = run(engine, greedy(prompt(kPrompts[3]), 4));
  EXPECT_TRUE(after->result);
}

TEST_F(ServingEngineTest, BadRequestsFailAtOnceWithClearErrors) {
  ServingConfig cfg = config();
  cfg.max_context = 16;
  ServingEngine engine(model_, tokenizer_, cfg);
  const auto expect_invalid = [&](GenerationRequest r, const std::string& fragment) {
    auto c = std::make_shared<Collector>();
    engine.submit(std::move(r), c);
    ASSERT_EQ(c->ends, 1) << "must fail before submit returns";
    ASSERT_TRUE(c->error_kind);
    EXPECT_EQ(*c->error_kind, ErrorKind::INVALID_ARGUMENT);
    EXPECT_NE(c->error.find(fragment), std::string::npos) << c->error;
  };
  expect_invalid(greedy({}, 4), "empty");
  expect_invalid(greedy({1, 5000}, 4), "outside the vocabulary");
  expect_invalid(greedy(prompt(kPrompts[2]), 4), "context length is 16");
  GenerationRequest bad_stop = greedy({1, 5}, 4);
  bad_stop.params.stop_token_ids = {-3};
  expect_invalid(bad_stop, "stop token id");
  // A prompt just under the context is served, and capped at the context.
  auto c = run(engine, greedy(std::vector<TokenId>(14, 5), 100));
  ASSERT_TRUE(c->result) << c->error;
  EXPECT_LE(c->result->choices[0].ids.size(), 2u);
}

TEST_F(ServingEngineTest, ShutdownFailsWhatIsPendingAndRefusesNewWork) {
  ServingConfig cfg = config();
  cfg.eos_token_ids = {};
  auto engine = std::make_unique<ServingEngine>(model_, tokenizer_, cfg);
  std::vector<std::shared_ptr<Collector>> cs;
  for (int i = 0; i < 3; ++i) {
    auto c = std::make_shared<Collector>();
    engine->submit(greedy(prompt(kPrompts[static_cast<size_t>(i)]), 450), c);
    cs.push_back(c);
  }
  engine->shutdown("test shutdown");
  for (auto& c : cs) {
    ASSERT_TRUE(c->wait());
    EXPECT_EQ(c->ends, 1);
    if (!c->result) {
      ASSERT_TRUE(c->error_kind);
      EXPECT_EQ(*c->error_kind, ErrorKind::UNAVAILABLE);
      EXPECT_NE(c->error.find("test shutdown"), std::string::npos);
    }
  }
  auto late = std::make_shared<Collector>();
  engine->submit(greedy({1, 5}, 4), late);
  ASSERT_TRUE(late->error_kind);
  EXPECT_EQ(*late->error_kind, ErrorKind::UNAVAILABLE);
  engine.reset();  // destructor after shutdown is fine
}

TEST_F(ServingEngineTest, RunExclusiveRunsBetweenStepsAndRethrows) {
  ServingEngine engine(model_, tokenizer_, config());
  auto c = std::make_shared<Collector>();
  engine.submit(greedy(prompt(kPrompts[0]), 30), c);
  bool ran = false;
  engine.run_exclusive([&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_THROW(engine.run_exclusive([] { throw SwarmError(ErrorKind::INTERNAL, "boom"); }), SwarmError);
  ASSERT_TRUE(c->wait());
  EXPECT_TRUE(c->result);
  engine.set_policy_version(7);
  auto v = run(engine, greedy(prompt(kPrompts[3]), 2));
  ASSERT_TRUE(v->result);
  EXPECT_EQ(v->result->policy_version, 7);
}

// Constrained decoding samples from the masked logits but records the model's own
// log-prob of each token (what the trainer recomputes from the weights): checked against the
// full forward's unmasked log_softmax at every step. The test also shows the two distributions
// differ at some step (renormalising over the allowed tokens would give other numbers).
TEST_F(ServingEngineTest, ConstrainedSamplingRecordsTheModelsOwnLogprobs) {
  ServingEngine engine(model_, tokenizer_, config());
  const auto g =
      std::make_shared<const grammar::Grammar>(grammar::json_schema_grammar(nlohmann::ordered_json::parse(
          R"({"type": "string", "minLength": 3, "maxLength": 12})")));  // the vocabulary has '"', not '{'
  const std::vector<TokenId> p = prompt(kPrompts[1]);
  GenerationRequest r;
  r.prompt_ids = p;
  r.params.temperature = 1.0;
  r.params.max_tokens = 40;
  r.params.seed = 11;
  r.params.logprobs = true;
  r.grammar = g;
  auto c = run(engine, r);
  ASSERT_TRUE(c->result) << c->error;
  const GenerationChoice& ch = c->result->choices[0];
  ASSERT_GE(ch.ids.size(), 3u);
  ASSERT_EQ(ch.logprobs.size(), ch.ids.size());
  ASSERT_FALSE(ch.text.empty());
  EXPECT_EQ(ch.text[0], '"') << ch.text;
  if (ch.finish_reason == "stop") {
    const auto doc = nlohmann::json::parse(ch.text);
    ASSERT_TRUE(doc.is_string()) << ch.text;
    EXPECT_GE(doc.get<std::string>().size(), 3u) << ch.text;
  }
  c10::InferenceMode guard;
  std::vector<int64_t> seq(p.begin(), p.end());
  seq.insert(seq.end(), ch.ids.begin(), ch.ids.end());
  const int64_t n = static_cast<int64_t>(seq.size());
  const at::Tensor logits = model_->forward_full(at::tensor(seq, at::kLong).view({1, n}),
                                                 at::tensor(std::vector<int64_t>{n}, at::kLong));
  double largest_gap = 0;  // between the model's log-prob and the best any renormalisation could give
  for (size_t i = 0; i < ch.ids.size(); ++i) {
    const at::Tensor row = logits[0][static_cast<int64_t>(p.size() + i) - 1].log_softmax(-1);
    const float model_lp = row[ch.ids[i]].item<float>();
    EXPECT_NEAR(ch.logprobs[i], model_lp, 1e-4) << "token " << i;
    largest_gap = std::max(largest_gap, static_cast<double>(-model_lp));
  }
  // A masked, renormalised distribution gives forced tokens (e.g. the '"name"' key) log-prob ~0;
  // the model's own distribution does not: some recorded value is far below 0.
  EXPECT_GT(largest_gap, 1.0);
}

}  // namespace
}  // namespace swarm
