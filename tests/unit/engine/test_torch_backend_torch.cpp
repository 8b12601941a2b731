// The torch backend as the engine drives it: a policy step changes the served weights and
// stamps the new version, checkpoints are loadable Hugging Face directories, and resuming from
// one continues bit-exactly (2 steps + checkpoint + resume + 2 steps == 4 steps, fp32, 1 rank).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.hpp"
#include "engine/torch_backend.hpp"
#include "inference/decoder_model_torch.hpp"
#include "model/model_config.hpp"
#include "model/model_tools.hpp"
#include "inference/serving_engine.hpp"
#include "trainer/policy_trainer_torch.hpp"
#include "support/scratch_dir.hpp"
#include "support/train_batches.hpp"
#include "swarm/job.hpp"
#include "text/tokenizer.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using swarm::testing::random_batch;

fs::path tinystories() { return fs::path(SWARM_FIXTURES_DIR) / "models" / "tinystories-656k"; }

struct ScratchDir : swarm::testing::ScratchDir {
  ScratchDir() : swarm::testing::ScratchDir("swarm-torch-backend") {}
};

using swarm::testing::read_file;

Job tiny_job(const std::string& dtype = "fp32") {
  Job job;
  job.model = tinystories().string();
  job.dtype = dtype;
  job.engine_threads = 2;
  job.kv_cache_tokens = 1024;
  job.learning_rate = 2e-3;
  job.micro_batch_max_tokens = 64;
  return job;
}

std::unique_ptr<Backend> booted(const Job& job, const fs::path& resume = {}) {
  auto b = make_torch_backend();
  if (!resume.empty()) b->set_resume_checkpoint(resume);
  b->boot(job, {});
  return b;
}

struct Collect : GenerationObserver {
  std::promise<GenerationResult> done;
  void on_complete(GenerationResult r) override { done.set_value(std::move(r)); }
  void on_error(ErrorKind, const std::string& m) override {
    done.set_exception(std::make_exception_ptr(std::runtime_error(m)));
  }
};

// A greedy request with log-probs for `prompt`, handed to `submit` (a backend's generate, an
// engine's submit), and its result.
using Submit = std::function<void(GenerationRequest, std::shared_ptr<GenerationObserver>)>;
GenerationResult greedy_result(std::vector<TokenId> prompt, int64_t max_tokens, const Submit& submit) {
  GenerationRequest req;
  req.prompt_ids = std::move(prompt);
  req.params.temperature = 0;
  req.params.max_tokens = max_tokens;
  req.params.logprobs = true;
  auto obs = std::make_shared<Collect>();
  auto fut = obs->done.get_future();
  submit(std::move(req), obs);
  return fut.get();
}

GenerationResult generate_greedy(Backend& b, const std::string& prompt) {
  return greedy_result(b.encode(prompt), 12, [&](GenerationRequest r, std::shared_ptr<GenerationObserver> o) {
    b.generate(std::move(r), o);
  });
}

TEST(TorchBackend, APolicyStepChangesTheServedWeightsAndStampsTheVersion) {
  Job job = tiny_job();
  job.learning_rate = 2e-2;
  auto b = booted(job);
  const GenerationResult before = generate_greedy(*b, "Once upon a time");
  EXPECT_EQ(before.policy_version, 0);
  const TrainStepReport r = b->train_step(random_batch(3, 4, 1), 1, {});
  b->set_policy_version(1);  // as the engine does after train_step
  EXPECT_EQ(r.global_step, 1);
  EXPECT_EQ(r.metrics.at("weights_updated"), 1);
  EXPECT_GT(r.metrics.at("trainer_tokens_per_second"), 0);
  EXPECT_GE(r.metrics.at("weight_sync_seconds"), 0);
  EXPECT_GT(r.seconds, 0);
  const GenerationResult after = generate_greedy(*b, "Once upon a time");
  EXPECT_EQ(after.policy_version, 1);
  // Same prompt, greedy: the log-probs can only differ if the engine samples from new weights.
  EXPECT_NE(before.choices[0].logprobs, after.choices[0].logprobs);
  b->release();
}

// One weight copy (max_staleness 0): the serving engine reads the trainer's flat buffer (laid
// out so that the merged q/k/v and gate/up projections are views of it) and holds no weights of
// its own; it answers exactly as from the loaded copy that asynchronous training keeps, and a
// checkpoint of one resumes in the other. (Models whose flat order changes:
// PolicyTrainer.SharedServingWeightsServeAsTheLoadedModelAndReCutTheirState.)
TEST(TorchBackend, OneWeightCopyWhenSynchronous) {
  ScratchDir scratch;
  Job sync = tiny_job();
  Job async = tiny_job();
  async.max_staleness = 1;
  auto shared = booted(sync);
  auto copied = booted(async);
  EXPECT_EQ(shared->memory().at(0).serving_weights_bytes, 0);
  EXPECT_EQ(copied->memory().at(0).serving_weights_bytes, copied->memory().at(0).weights_bytes);
  for (const char* prompt : {"Once upon a time", "The little dog"}) {
    const GenerationResult a = generate_greedy(*shared, prompt), b = generate_greedy(*copied, prompt);
    EXPECT_EQ(a.choices[0].ids, b.choices[0].ids) << prompt;
    EXPECT_EQ(a.choices[0].logprobs, b.choices[0].logprobs) << prompt;  // the same GEMMs on the same values
  }
  copied->release();
  shared->train_step(random_batch(2, 4, 51), 1, {});
  const fs::path saved = scratch.path() / "sync", resaved = scratch.path() / "async";
  fs::create_directories(saved);
  shared->save_checkpoint(saved);
  shared->release();
  // Resumed asynchronously (parameter order) and saved at once: the same state.
  auto resumed = booted(async, saved);
  fs::create_directories(resaved);
  resumed->save_checkpoint(resaved);
  resumed->release();
  // TinyStories (Llama) has q/k/v and gate/up side by side already: the same flat layout.
  EXPECT_EQ(read_file(saved / "trainer_state/optimizer-rank0-of-1.safetensors"),
            read_file(resaved / "trainer_state/optimizer-rank0-of-1.safetensors"));
  EXPECT_EQ(read_file(saved / "model.safetensors"), read_file(resaved / "model.safetensors"));
}

// A Qwen2-layout model (q/k/v biases after each weight, so the merged order differs from the
// parameters' own): the trainer's shared serving model generates exactly as the loaded one
// does (merged projections as views of the flat buffer), and its optimizer state, saved in
// that order, is re-cut into the parameters' own order by a trainer that keeps a copy.
TEST(PolicyTrainer, SharedServingWeightsServeAsTheLoadedModelAndReCutTheirState) {
  ScratchDir scratch;
  const fs::path dir = scratch.path() / "qwen2";
  InitModelOptions init;
  init.from = fs::path(SWARM_FIXTURES_DIR) / "models/smollm2-135m-instruct-noweights";
  init.out = dir;
  init.dtype = DType::F32;
  init.seed = 7;
  init.config_overrides = {{"architectures", "[\"Qwen2ForCausalLM\"]"},
                           {"model_type", "\"qwen2\""},
                           {"hidden_size", "64"},
                           {"intermediate_size", "96"},
                           {"num_hidden_layers", "2"},
                           {"num_attention_heads", "4"},
                           {"num_key_value_heads", "2"},
                           {"head_dim", "16"},
                           {"tie_word_embeddings", "true"}};
  init_random_model(init);
  auto loaded = DecoderModel::load(dir, DType::F32);
  const std::vector<size_t> merged = loaded->merged_order();
  std::vector<size_t> own(merged.size());
  for (size_t i = 0; i < own.size(); ++i) own[i] = i;
  ASSERT_NE(merged, own) << "a Qwen2 layout should need another flat order";

  TrainerOptions o;
  o.learning_rate = 1e-2;
  o.share_serving_weights = true;
  PolicyTrainer shared(DecoderModel::load(dir, DType::F32), o);
  ASSERT_TRUE(shared.shares_serving_weights());
  // Generation on the serving path: the loaded model (merged copies) and the shared one.
  const auto tokenizer = std::shared_ptr<const Tokenizer>(Tokenizer::from_directory(dir.string()));
  const auto greedy = [&](std::shared_ptr<DecoderModel> model) {
    ServingConfig sc;
    sc.kv_cache_tokens = 256;
    ServingEngine engine(std::move(model), tokenizer, sc);
    return greedy_result(
        {11, 220, 3081, 42, 17}, 16,
        [&](GenerationRequest r, std::shared_ptr<GenerationObserver> o) { engine.submit(std::move(r), o); });
  };
  const GenerationResult a = greedy(loaded), b = greedy(shared.serving_model());
  EXPECT_EQ(a.choices[0].ids, b.choices[0].ids);
  EXPECT_EQ(a.choices[0].logprobs, b.choices[0].logprobs);

  // One step; the served weights are the trained ones, with no sync copy.
  const TrainBatch batch = random_batch(2, 4, 61, static_cast<int>(loaded->config().vocab_size));
  shared.train(batch, 1, nullptr);
  for (const auto& [name, w] : shared.weights())
    EXPECT_TRUE(torch::equal(shared.serving_model()->parameter(name), w)) << name;
  const auto state = shared.optimizer_state();
  ASSERT_TRUE(state.contains("order"));

  // A trainer with its own serving copy (parameter order) from the same weights takes that state.
  std::map<std::string, torch::Tensor> weights;
  for (const auto& [n, w] : shared.weights()) weights[n] = w.clone();
  TrainerOptions copy_options = o;
  copy_options.share_serving_weights = false;
  PolicyTrainer copied(DecoderModel::from_state_dict(loaded->config(), weights, DType::F32), copy_options);
  ASSERT_FALSE(copied.shares_serving_weights());
  copied.load_optimizer_state(state);
  const auto recut = copied.optimizer_state();
  EXPECT_FALSE(recut.contains("order"));
  // Each parameter's moments, found through each layout's offsets.
  std::vector<int64_t> sizes;
  for (const auto& [name, t] : loaded->parameters()) sizes.push_back(t.numel());
  const torch::Tensor order = state.at("order").to(torch::kLong);
  std::vector<int64_t> at_shared(sizes.size()), at_own(sizes.size());
  int64_t at = 0;
  for (int64_t k = 0; k < order.numel(); ++k) {
    const auto i = static_cast<size_t>(order[k].item<int64_t>());
    at_shared[i] = at;
    at += sizes[i];
  }
  at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) at_own[i] = at, at += sizes[i];
  for (const char* key : {"exp_avg", "exp_avg_sq"}) {
    ASSERT_GT(state.at(key).abs().sum().item<double>(), 0.0) << key;
    for (size_t i = 0; i < sizes.size(); ++i)
      EXPECT_TRUE(torch::equal(state.at(key).narrow(0, at_shared[i], sizes[i]),
                               recut.at(key).narrow(0, at_own[i], sizes[i])))
          << key << " of " << loaded->parameters()[i].first;
  }
  // Both continue alike: one more step gives the same weights.
  const TrainBatch next = random_batch(2, 4, 62, static_cast<int>(loaded->config().vocab_size));
  shared.train(next, 2, nullptr);
  copied.train(next, 2, nullptr);
  for (const auto& [name, w] : shared.weights())
    EXPECT_TRUE(torch::allclose(copied.weights().at(name), w, 1e-5, 1e-6)) << name;
}

// free_kv_cache_during_training: the step frees the serving KV cache (the metric says how much)
// and the engine has it back afterwards, serving the new weights; off (auto on the CPU), nothing
// is freed.
TEST(TorchBackend, TheKvCacheIsFreedDuringTheStepWhenAskedFor) {
  Job job = tiny_job();
  job.free_kv_cache_during_training = "true";
  auto b = booted(job);
  const int64_t kv = b->memory().at(0).kv_cache_bytes;
  ASSERT_GT(kv, 0);
  const TrainStepReport r = b->train_step(random_batch(2, 2, 3), 1, {});
  EXPECT_EQ(r.metrics.at("kv_cache_freed_bytes"), static_cast<double>(kv));
  EXPECT_EQ(b->memory().at(0).kv_cache_bytes, kv);
  b->set_policy_version(1);
  EXPECT_EQ(generate_greedy(*b, "Once upon a time").policy_version, 1);
  b->release();

  auto off = booted(tiny_job());
  EXPECT_EQ(off->train_step(random_batch(2, 2, 3), 1, {}).metrics.at("kv_cache_freed_bytes"), 0.0);
  off->release();
}

// fp32 on one rank: the masters are the weights (0 bytes of their own); the serving engine
// keeps its own copy; the report is there from the boot on.
TEST(TorchBackend, TheMemoryReportOfOneFp32Rank) {
  auto b = booted(tiny_job());
  const std::vector<RankMemory> at_boot = b->memory();
  ASSERT_EQ(at_boot.size(), 1u);
  const RankMemory& m = at_boot[0];
  const int64_t params = ModelConfig::from_directory(tinystories()).parameter_count();
  EXPECT_EQ(m.rank, 0);
  EXPECT_EQ(m.device, "cpu");
  EXPECT_EQ(m.weights_bytes, params * 4);
  EXPECT_EQ(m.serving_weights_bytes, 0);  // synchronous: the engine serves the trainer's weights
  EXPECT_EQ(m.gradients_bytes, params * 4);
  EXPECT_EQ(m.optimizer_bytes, params * 8);
  EXPECT_EQ(m.master_weights_bytes, 0);
  EXPECT_GT(m.kv_cache_bytes, 0);
  EXPECT_GE(m.peak_bytes, m.weights_bytes + m.serving_weights_bytes);
  b->train_step(random_batch(2, 2, 3), 1, {});
  EXPECT_GE(b->memory().at(0).peak_bytes, m.peak_bytes);
  b->release();
}

TEST(TorchBackend, CheckpointIsALoadableHuggingFaceDirectory) {
  ScratchDir scratch;
  auto b = booted(tiny_job());
  b->train_step(random_batch(2, 4, 2), 1, {});
  const fs::path cp = scratch.path() / "cp";
  fs::create_directories(cp);
  b->save_checkpoint(cp);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json", "trainer_state/trainer_state.json",
                        "trainer_state/optimizer-rank0-of-1.safetensors"})
    EXPECT_TRUE(fs::exists(cp / f)) << f;
  const auto config = nlohmann::json::parse(read_file(cp / "config.json"));
  EXPECT_EQ(config["torch_dtype"], "float32");
  auto saved = DecoderModel::load(cp, DType::F32);
  auto original = DecoderModel::load(tinystories(), DType::F32);
  int changed = 0;
  for (const auto& [name, t] : original->parameters()) changed += !torch::equal(saved->parameter(name), t);
  EXPECT_GT(changed, 0);
  EXPECT_NO_THROW(Tokenizer::from_directory(cp.string()));
  b->release();
}

TEST(TorchBackend, AStepStoppedBeforeItsFirstUpdateStillLetsTheLastStepBeSaved) {
  ScratchDir scratch;
  auto b = booted(tiny_job());
  b->train_step(random_batch(2, 4, 2), 1, {});
  const fs::path before = scratch.path() / "before", after = scratch.path() / "after";
  fs::create_directories(before);
  fs::create_directories(after);
  b->save_checkpoint(before);
  // stop_engine during WEIGHT_SYNCING: the step leaves before any optimizer step...
  std::stop_source stop;
  stop.request_stop();
  EXPECT_THROW(b->train_step(random_batch(2, 4, 3), 2, stop.get_token()), SwarmError);
  // ...so the weights are still those of step 1, and the checkpoint on stop can be written.
  ASSERT_NO_THROW(b->save_checkpoint(after));
  EXPECT_EQ(read_file(before / "model.safetensors"), read_file(after / "model.safetensors"));
  b->release();
}

// The resume test: 2 steps, checkpoint, resume in a new backend, 2 more steps equals
// 4 uninterrupted steps, bit for bit (weights and optimizer state).
// With use_kl_loss the reference is the job's initial model on both sides: the first resumed
// step's KL equals the uninterrupted run's (before, the resumed reference was the checkpoint).
void check_exact_resume(const std::string& dtype, bool ppo = false, bool kl = false) {
  ScratchDir scratch;
  Job job = tiny_job(dtype);
  if (kl) {
    job.use_kl_loss = true;
    job.kl_coef = 0.5;
  }
  if (ppo) {  // PPO: the critic's weights and optimizer shard travel with the checkpoint too
    job.algorithm = "ppo";
    job.advantage_estimator = "gae";
    job.lam = 0.95;
    job.critic_learning_rate = 2e-3;
  }
  const TrainBatch batches[4] = {random_batch(2, 4, 41), random_batch(2, 4, 42), random_batch(3, 3, 43),
                                 random_batch(2, 4, 44)};
  const fs::path at2 = scratch.path() / "at2", straight = scratch.path() / "straight",
                 resumed = scratch.path() / "resumed";
  for (const auto& d : {at2, straight, resumed}) fs::create_directories(d);
  std::map<std::string, double> straight3, resumed3;
  {
    auto a = booted(job);
    a->train_step(batches[0], 1, {});
    a->train_step(batches[1], 2, {});
    a->save_checkpoint(at2);
    straight3 = a->train_step(batches[2], 3, {}).metrics;
    a->train_step(batches[3], 4, {});
    a->save_checkpoint(straight);
    a->release();
  }
  {
    auto c = booted(job, at2);
    resumed3 = c->train_step(batches[2], 3, {}).metrics;
    c->train_step(batches[3], 4, {});
    c->save_checkpoint(resumed);
    c->release();
  }
  if (kl) {
    ASSERT_TRUE(straight3.count("kl") && resumed3.count("kl"));
    EXPECT_GT(straight3.at("kl"), 0.0) << "two steps should have moved the policy from the reference";
    EXPECT_EQ(resumed3.at("kl"), straight3.at("kl"));
  }
  EXPECT_EQ(read_file(straight / "model.safetensors"), read_file(resumed / "model.safetensors"));
  EXPECT_EQ(read_file(straight / "trainer_state/optimizer-rank0-of-1.safetensors"),
            read_file(resumed / "trainer_state/optimizer-rank0-of-1.safetensors"));
  EXPECT_NE(read_file(at2 / "model.safetensors"), read_file(straight / "model.safetensors"));
  if (ppo) {
    for (const char* f :
         {"trainer_state/critic.safetensors", "trainer_state/critic-optimizer-rank0-of-1.safetensors"})
      EXPECT_EQ(read_file(straight / f), read_file(resumed / f)) << f;
    EXPECT_NE(read_file(at2 / "trainer_state/critic.safetensors"),
              read_file(straight / "trainer_state/critic.safetensors"));
  }
}

// max_staleness 0 is the synchronous trainer, bit for bit: its `auto` correction is
// none, and the asynchronous knobs change nothing. The batches' rollout log-probs are far from the
// model's, so a correction applied by mistake (weights up to is_cap 1.1) would change the update.
TEST(TorchBackend, MaxStalenessZeroTrainsExactlyAsTheSynchronousTrainer) {
  ScratchDir scratch;
  auto weights_after_steps = [&](const Job& job, const std::string& name) {
    auto b = booted(job);
    b->train_step(random_batch(2, 4, 51), 1, {});
    b->train_step(random_batch(3, 3, 52), 2, {});
    const fs::path dir = scratch.path() / name;
    fs::create_directories(dir);
    b->save_checkpoint(dir);
    b->release();
    return read_file(dir / "model.safetensors");
  };
  Job plain = tiny_job();
  plain.ppo_epochs = 2;  // old log-probs recomputed, as with mini-batches
  Job zero = plain;
  zero.max_staleness = 0;
  zero.off_policy_correction = "auto";
  zero.is_cap = 1.1;
  zero.kv_cache_on_swap = "recompute";
  Job tis = plain;
  tis.off_policy_correction = "tis";
  tis.is_cap = 1.1;
  const std::string a = weights_after_steps(plain, "plain"), b = weights_after_steps(zero, "zero");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, weights_after_steps(tis, "tis")) << "the case should make a correction visible";
}

TEST(TorchBackend, ResumeContinuesBitExactlyFp32) { check_exact_resume("fp32"); }
TEST(TorchBackend, ResumeContinuesBitExactlyBf16) { check_exact_resume("bf16"); }
TEST(TorchBackend, PpoResumeContinuesBitExactlyFp32) { check_exact_resume("fp32", true); }
TEST(TorchBackend, PpoResumeContinuesBitExactlyBf16) { check_exact_resume("bf16", true); }
TEST(TorchBackend, KlResumeKeepsTheInitialModelAsReferenceFp32) { check_exact_resume("fp32", false, true); }
TEST(TorchBackend, KlResumeKeepsTheInitialModelAsReferenceBf16) { check_exact_resume("bf16", false, true); }

// A resumed run with use_kl_loss loads the job's model again as its reference: when it is gone
// the boot says so.
TEST(TorchBackend, KlResumeWithoutTheJobsModelSaysWhy) {
  ScratchDir scratch;
  Job job = tiny_job();
  job.use_kl_loss = true;
  const fs::path at1 = scratch.path() / "at1";
  fs::create_directories(at1);
  {
    auto a = booted(job);
    a->train_step(random_batch(2, 4, 61), 1, {});
    a->save_checkpoint(at1);
    a->release();
  }
  job.model = (scratch.path() / "gone").string();
  auto b = make_torch_backend();
  b->set_resume_checkpoint(at1);
  try {
    b->boot(job, {});
    FAIL() << "booted without the KL reference";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("KL reference"), std::string::npos) << e.what();
  }
}

// critic_model: the critic's trunk is another model directory (here a second TinyStories: the
// same vocabulary); one with another vocabulary is refused at boot, naming the key.
TEST(TorchBackend, PpoCriticModelIsAnotherDirectoryWithThePolicysVocabulary) {
  ScratchDir scratch;
  Job job = tiny_job();
  job.algorithm = "ppo";
  job.advantage_estimator = "gae";
  job.critic_model = tinystories().string();
  {
    auto b = booted(job);
    const TrainStepReport r = b->train_step(random_batch(2, 4, 41), 1, {});
    EXPECT_TRUE(r.metrics.count("critic_loss")) << "a PPO step reports its critic";
    EXPECT_EQ(r.metrics.at("weights_updated"), 1);
    b->release();
  }
  InitModelOptions other;
  other.preset = "tiny-char";
  other.out = scratch.path() / "tiny-char";
  other.dtype = DType::F32;
  init_random_model(other);
  job.critic_model = other.out.string();
  auto b = make_torch_backend();
  try {
    b->boot(job, {});
    ADD_FAILURE() << "a critic_model with another vocabulary should be refused";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT) << e.what();
    EXPECT_NE(std::string(e.what()).find("critic_model"), std::string::npos) << e.what();
  }
}

TEST(TorchBackend, ResumeFromADirectoryWithoutTrainerStateFails) {
  ScratchDir scratch;
  EXPECT_THROW(booted(tiny_job(), tinystories()), SwarmError);  // a model directory, not a checkpoint
}

}  // namespace
}  // namespace swarm

namespace swarm {
namespace {

// The job's `device`: cpu always boots on the CPU; cuda boots on the GPU where there
// is one and is a clear error where there is none (every CI machine: Debian's libtorch is
// CPU-only); a bad value is refused when the config is read.
TEST(TorchBackend, DeviceKeyChoosesTheDeviceOrSaysWhyNot) {
  Job cpu = tiny_job();
  cpu.device = "cpu";
  auto b = booted(cpu);
  EXPECT_FALSE(generate_greedy(*b, "Once upon a time").choices.at(0).ids.empty());
  Job cuda = tiny_job();
  cuda.device = "cuda";
  if (torch::cuda::is_available()) {
    EXPECT_NO_THROW(booted(cuda));
  } else {
    try {
      booted(cuda);
      FAIL() << "device: cuda booted without a GPU";
    } catch (const SwarmError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find("device: cuda, but this swarm-server's libtorch has no CUDA"),
                std::string::npos)
          << e.what();
    }
  }
  Job bad = tiny_job();
  bad.device = "tpu";
  EXPECT_THROW(bad.validate(), std::exception);
}

}  // namespace
}  // namespace swarm
