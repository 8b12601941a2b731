// N ranks train as one, through the real path: the torch backend of a 2-rank job (rank 0 in
// this process; rank 1 this binary started by LocalRanks, swarm-server --nproc's launcher,
// running run_torch_follower, swarm-server's follower loop) against the 1-rank backend on the
// same batch, for every training family. The followers get the batch through the control
// channel (serialize_train_batch), so a field the encoding drops, or one the followers read
// differently, shows up as a different update here.
//
// What is compared after one policy step: the AdamW moments of every parameter (the 2-rank
// shards put together) and the step's metrics. 1 rank and 2 ranks do the same arithmetic but
// for the order of fp32 sums (other micro-batches, the gradient summed over ranks):
// tests/unit/trainer/test_grpo_distributed_torch.cpp measured ~3e-6 of the largest moment, and
// allows 1e-5; a sequence trained on another reward, a lost micro-batch or a group that one
// rank sees and the other not changes the moments by O(1) of themselves. bf16 computes in
// bf16, whose roundings (2^-8) differ with the micro-batch shapes: the moments are held on
// average (5%), as the bf16 case of that test does.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/env.hpp"
#include "dist/dist_config.hpp"
#include "dist/rank_channel.hpp"
#include "dist/rank_launcher.hpp"
#include "engine/backend.hpp"
#include "engine/torch_backend.hpp"
#include "grammar/grammar.hpp"
#include "model/safetensors_torch.hpp"
#include "support/generation_results.hpp"
#include "support/scratch_dir.hpp"
#include "support/train_batches.hpp"
#include "swarm/job.hpp"
#include "trainer/flat_parameters_torch.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using Tensors = std::map<std::string, torch::Tensor>;
using Metrics = std::map<std::string, double>;
using namespace std::chrono_literals;

// ---------------------------------------------------------------- the follower rank

// In the copy LocalRanks starts (RANK=1): the follower loop, exactly as swarm-server runs it.
// Registered only there, so it never appears in the normal test list.
struct FollowerBody : ::testing::Test {
  void TestBody() override { EXPECT_EQ(run_torch_follower(DistConfig::from_env()), 0); }
};
const bool kIsFollower = [] {
  const auto rank = env_value("RANK");
  if (!rank || *rank == "0") return false;
  ::testing::RegisterTest("RankFollower", "Serve", nullptr, nullptr, __FILE__, __LINE__,
                          []() -> ::testing::Test* { return new FollowerBody; });
  return true;
}();

// The 2-rank job, started once for every test and ended when the program ends: its leader is
// what the torch backend registered as "torch" drives.
struct TwoRanks {
  DistConfig dist;
  std::unique_ptr<LocalRanks> ranks;
  std::shared_ptr<RankLeader> leader;
};
TwoRanks* g_two = nullptr;

class TwoRankJob : public ::testing::Environment {
 public:
  void SetUp() override {
    if (kIsFollower) return;
    // A follower that misses a collective fails in 30 s (a whole family times out, not the suite).
    ::setenv("SWARM_DIST_TIMEOUT_SECONDS", "30", 1);
    g_two = new TwoRanks;
    g_two->dist = DistConfig::from_env();
    g_two->dist.world_size = g_two->dist.local_world_size = 2;
    g_two->dist.master_addr = "127.0.0.1";
    g_two->dist.master_port = pick_free_port(g_two->dist.master_addr);
    g_two->dist.secret = "rank-equivalence";
    g_two->ranks = std::make_unique<LocalRanks>(
        g_two->dist, std::vector<std::string>{"/proc/self/exe", "--gtest_filter=RankFollower.Serve"});
    g_two->leader = RankLeader::accept(g_two->dist.master_addr, g_two->dist.master_port, 2,
                                       g_two->dist.timeout, g_two->dist.secret);
    register_torch_backend(g_two->leader, g_two->dist);
  }
  void TearDown() override {
    if (!g_two) return;
    g_two->leader->close();  // the follower sees the end of the job and exits 0
    g_two->ranks->wait_all(30s);
    delete g_two;
    g_two = nullptr;
  }
};
const auto* const kJob = ::testing::AddGlobalTestEnvironment(new TwoRankJob);

// ---------------------------------------------------------------- batches and jobs

fs::path tinystories() { return fs::path(SWARM_FIXTURES_DIR) / "models" / "tinystories-656k"; }

Job tiny_job(const std::string& dtype = "fp32") {
  Job job;
  job.model = tinystories().string();
  job.dtype = dtype;
  job.kv_cache_tokens = 1024;
  job.learning_rate = 2e-3;
  job.micro_batch_max_tokens = 64;  // several micro-batches on each rank
  job.batch_size = 3;
  job.num_repeat = 4;
  return job;
}

// testing::random_batch with what a real episode records: every generated token names its call
// (one call per sample, at temperature 0.7 here), and the calls their agent and turn.
TrainBatch recorded_batch(uint32_t seed) {
  TrainBatch b = testing::random_batch(3, 4, seed);
  for (auto& ep : b.episodes)
    for (Sample& s : ep.samples) {
      s.calls = {SampleCall{0, "", 0, 0.7f}};
      s.token_call.clear();
      for (uint8_t m : s.loss_mask) s.token_call.push_back(m ? 0 : -1);
    }
  return b;
}

// Two calls per sample, a planner's then a solver's (the generated tokens split in two), with a
// reward per call (workflow_output.turn_rewards) that differs within each (task, agent, turn).
TrainBatch two_call_batch(uint32_t seed) {
  TrainBatch b = recorded_batch(seed);
  int k = 0;
  for (auto& ep : b.episodes) {
    for (Sample& s : ep.samples) {
      s.calls = {SampleCall{0, "planner", 0, 1.0f}, SampleCall{1, "solver", 0, 1.0f}};
      s.num_calls = 2;
      const auto generated = std::count(s.loss_mask.begin(), s.loss_mask.end(), 1);
      int64_t seen = 0;
      for (size_t t = 0; t < s.token_call.size(); ++t)
        if (s.loss_mask[t]) s.token_call[t] = seen++ < (generated + 1) / 2 ? 0 : 1;
    }
    ep.turn_rewards = {0.25 * (k % 4), 1.0 - 0.3 * (k % 3)};
    ++k;
  }
  return b;
}

// Swarm experience sharing: the second task's group came from another node, whose behaviour
// log-probs are unknown (NaN) and which trains as an on-policy recomputation.
TrainBatch with_external_group(TrainBatch b) {
  for (auto& ep : b.episodes) {
    if (ep.task_id != "task-1") continue;
    ep.from_node = "node-b";
    for (Sample& s : ep.samples)
      for (size_t t = 0; t < s.rollout_logprobs.size(); ++t)
        if (s.loss_mask[t]) s.rollout_logprobs[t] = std::numeric_limits<float>::quiet_NaN();
  }
  return b;
}

// ---------------------------------------------------------------- one step, compared

struct StepResult {
  Metrics metrics;
  std::vector<RankMemory> memory;  // the backend's report after the step
  Tensors moments;  // "exp_avg", "exp_avg_sq", and "critic/..." for PPO: every rank's shards in order
};

// The shards of `prefix`optimizer-rank<r>-of-<world>.safetensors put together in the flat
// parameter order (each rank holds a piece of every gradient bucket: the layout's 4th number).
void read_moments(const fs::path& dir, int world, const std::string& prefix, const std::string& key_prefix,
                  Tensors& out) {
  for (const char* key : {"exp_avg", "exp_avg_sq"}) {
    std::vector<torch::Tensor> shards;
    int64_t piece = 0;
    for (int r = 0; r < world; ++r) {
      const fs::path file =
          dir / "trainer_state" /
          (prefix + "optimizer-rank" + std::to_string(r) + "-of-" + std::to_string(world) + ".safetensors");
      if (!fs::exists(file)) return;
      const Tensors state = load_state_dict(file);
      shards.push_back(state.at(key).reshape(-1).to(torch::kFloat64));
      const torch::Tensor layout = state.at("layout").to(torch::kDouble);
      ASSERT_EQ(layout.numel(), 4) << file;
      piece = static_cast<int64_t>(layout[3].item<double>());
    }
    out[key_prefix + key] = shards_in_flat_order(shards, piece);
  }
}

StepResult train_one_step(Backend& backend, const Job& job, const TrainBatch& batch, const fs::path& dir,
                          int world) {
  backend.boot(job, {});
  StepResult r;
  r.metrics = backend.train_step(batch, 1, {}).metrics;
  r.memory = backend.memory();
  fs::create_directories(dir);
  backend.save_checkpoint(dir);
  backend.release();
  read_moments(dir, world, "", "", r.moments);
  read_moments(dir, world, "critic-", "critic/", r.moments);
  return r;
}

bool timing(const std::string& name) {
  // activations_peak_bytes: what this rank's own step held (each rank trains its share).
  return name.ends_with("_seconds") || name == "trainer_tokens_per_second" ||
         name == "activations_peak_bytes";
}

// One step of `job` on `batch` with 1 rank and with 2 ranks through the channel: the same update.
// One step with 1 rank and with 2 (rank 0 here driving rank 1 through the channel).
std::pair<StepResult, StepResult> one_and_two_ranks(const Job& job, const TrainBatch& batch,
                                                    const fs::path& scratch) {
  auto one = make_torch_backend();
  StepResult single = train_one_step(*one, job, batch, scratch / "one", 1);
  auto two = make_backend("torch");
  StepResult pair = train_one_step(*two, job, batch, scratch / "two", 2);
  return {std::move(single), std::move(pair)};
}

void expect_two_ranks_train_as_one(const std::string& family, const Job& job, const TrainBatch& batch) {
  ASSERT_NE(g_two, nullptr);
  testing::ScratchDir scratch("swarm-rank-equivalence");
  const auto [single, pair] = one_and_two_ranks(job, batch, scratch.path());

  ASSERT_GT(single.metrics.at("sequences_trained"), 0) << family << ": the case must train something";
  const bool bf16 = job.dtype == "bf16";
  // Metrics: every rank computes them over the whole batch or all-reduces them.
  for (const auto& [name, want] : single.metrics) {
    if (timing(name)) continue;
    ASSERT_TRUE(pair.metrics.contains(name)) << family << ": 2 ranks did not report " << name;
    const double got = pair.metrics.at(name);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << family << " " << name;
      continue;
    }
    const double tolerance =
        bf16 ? 0.05 * std::max(1.0, std::abs(want)) : 1e-5 * std::max(1.0, std::abs(want));
    if (bf16 && name != "grad_norm" && name != "sequences_trained" && name != "groups") continue;
    EXPECT_LE(std::abs(got - want), tolerance)
        << family << " " << name << ": 2 ranks " << got << ", 1 rank " << want;
  }
  // The optimizer moments, every parameter (the last shard's padding beyond the parameters aside).
  ASSERT_FALSE(single.moments.empty());
  for (const auto& [key, want] : single.moments) {
    ASSERT_TRUE(pair.moments.contains(key)) << family << " " << key;
    const torch::Tensor got = pair.moments.at(key).narrow(0, 0, want.numel());
    const double scale = want.abs().max().item<double>();
    ASSERT_GT(scale, 0.0) << family << " " << key << ": nothing trained";
    const double max_diff = (got - want).abs().max().item<double>();
    const double mean_rel = ((got - want).abs().mean() / want.abs().mean()).item<double>();
    std::printf("%-28s %-18s max diff %.3g of the largest, mean diff %.3g of the mean\n", family.c_str(),
                key.c_str(), max_diff / scale, mean_rel);
    if (bf16) {
      EXPECT_LE(mean_rel, 0.05) << family << " " << key;
    } else {
      EXPECT_LE(max_diff, 1e-5 * scale) << family << " " << key;
    }
  }
}

TEST(RankEquivalence, OutcomeGrpoFp32) {
  expect_two_ranks_train_as_one("grpo fp32", tiny_job(), recorded_batch(51));
}

TEST(RankEquivalence, OutcomeGrpoBf16) {
  expect_two_ranks_train_as_one("grpo bf16", tiny_job("bf16"), recorded_batch(52));
}

// ZeRO-2 with gradient buckets of 64 KiB (the model's 2.6 MB of fp32 gradients in ~40 of them,
// reduce-scattered while the backward runs, each rank owning a piece of every bucket): the same
// update as one rank, to the same fp32 tolerance.
TEST(RankEquivalence, OutcomeGrpoFp32InSmallGradientBuckets) {
  Job job = tiny_job();
  job.reduce_bucket_mb = 1.0 / 16;
  expect_two_ranks_train_as_one("grpo fp32 buckets", job, recorded_batch(51));
}

// ZeRO-1 (whole fp32 gradients per rank, reduce-scattered at the optimizer step) still trains as
// one rank does.
TEST(RankEquivalence, OutcomeGrpoFp32ZeroStage1) {
  Job job = tiny_job();
  job.zero_stage = 1;
  expect_two_ranks_train_as_one("grpo fp32 zero-1", job, recorded_batch(51));
}

// Every safetensors file under `dir` (the model, each rank's optimizer shard, the critic) by
// its path relative to `dir`.
std::map<std::string, Tensors> checkpoint_tensors_under(const fs::path& dir) {
  std::map<std::string, Tensors> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      out[fs::relative(entry.path(), dir).string()] = load_state_dict(entry.path());
  return out;
}

// Two steps on 2 ranks with sharded gradients in small buckets, straight through or stopped
// after the first and resumed from its checkpoint: the same model and optimizer shards, bit for
// bit (the buckets and the pieces each rank owns come back the same).
TEST(RankEquivalence, ShardedGradientsResumeBitExactly) {
  ASSERT_NE(g_two, nullptr);
  testing::ScratchDir scratch("swarm-rank-resume");
  Job job = tiny_job("bf16");
  job.algorithm = "ppo";  // the critic's shards too
  job.advantage_estimator = "gae";
  job.reduce_bucket_mb = 1.0 / 16;
  const TrainBatch first = testing::with_token_rewards(recorded_batch(61));
  const TrainBatch second = testing::with_token_rewards(recorded_batch(62));
  auto two = make_backend("torch");
  const auto run = [&](const std::vector<const TrainBatch*>& batches, int64_t step, const fs::path& out) {
    two->boot(job, {});
    for (const TrainBatch* b : batches) two->train_step(*b, step++, {});
    two->save_checkpoint(out);
    two->release();
  };
  run({&first, &second}, 1, scratch.path() / "straight");
  run({&first}, 1, scratch.path() / "half");
  two->set_resume_checkpoint(scratch.path() / "half");
  run({&second}, 2, scratch.path() / "resumed");

  const auto straight = checkpoint_tensors_under(scratch.path() / "straight");
  const auto resumed = checkpoint_tensors_under(scratch.path() / "resumed");
  ASSERT_TRUE(straight.contains("trainer_state/optimizer-rank1-of-2.safetensors"));
  ASSERT_TRUE(straight.contains("trainer_state/critic-optimizer-rank1-of-2.safetensors"));
  ASSERT_EQ(straight.size(), resumed.size());
  int64_t compared = 0;
  for (const auto& [file, tensors] : straight) {
    ASSERT_TRUE(resumed.contains(file)) << file;
    for (const auto& [name, t] : tensors) {
      ASSERT_TRUE(resumed.at(file).contains(name)) << file << " " << name;
      EXPECT_TRUE(torch::equal(t, resumed.at(file).at(name)))
          << file << " " << name << " differs after resume";
      ++compared;
    }
  }
  std::printf("resume with sharded gradients: %lld tensors in %zu files bit-identical\n",
              static_cast<long long>(compared), straight.size());

  // The "half" checkpoint (64 KiB buckets) resumed at zero_stage 1 (one contiguous shard per
  // rank) and saved at once: the ranks re-cut the state, which holds the same values.
  Job stage1 = job;
  stage1.zero_stage = 1;
  two->set_resume_checkpoint(scratch.path() / "half");
  two->boot(stage1, {});
  two->save_checkpoint(scratch.path() / "recut");
  two->release();
  for (const std::string prefix : {"", "critic-"}) {
    Tensors before, after;
    read_moments(scratch.path() / "half", 2, prefix, "", before);
    read_moments(scratch.path() / "recut", 2, prefix, "", after);
    ASSERT_EQ(before.size(), 2u) << prefix;
    for (const auto& [key, want] : before) {
      const torch::Tensor got = after.at(key);
      const int64_t n = std::min(want.numel(), got.numel());  // each layout pads its own way
      EXPECT_TRUE(torch::equal(got.narrow(0, 0, n), want.narrow(0, 0, n))) << prefix << key << " re-cut";
      EXPECT_GT(want.abs().sum().item<double>(), 0.0) << prefix << key;
    }
  }
}

TEST(RankEquivalence, AtGrpoOnTurnRewards) {
  Job job = tiny_job();
  job.group_by = "task_agent_turn";
  expect_two_ranks_train_as_one("at-grpo turn rewards", job, two_call_batch(53));
}

TEST(RankEquivalence, PpoGaeOnTokenRewards) {
  Job job = tiny_job();
  job.algorithm = "ppo";
  job.advantage_estimator = "gae";
  job.reduce_bucket_mb = 1.0 / 16;  // the critic's gradients sharded in many buckets too
  expect_two_ranks_train_as_one("ppo gae token rewards", job,
                                testing::with_token_rewards(recorded_batch(54)));
}

TEST(RankEquivalence, PpoGaeOnTurnRewardsWithoutAtGrpo) {
  Job job = tiny_job();
  job.algorithm = "ppo";
  job.advantage_estimator = "gae";
  expect_two_ranks_train_as_one("ppo gae turn rewards", job, two_call_batch(55));
}

TEST(RankEquivalence, SapoExternalGroups) {
  expect_two_ranks_train_as_one("sapo external groups", tiny_job(), with_external_group(recorded_batch(56)));
}

TEST(RankEquivalence, AsynchronousWithTruncatedImportanceSampling) {
  Job job = tiny_job();
  job.max_staleness = 1;  // off_policy_correction auto: tis
  job.is_cap = 1.1;       // the batch's log-probs are far from the model's: the cap bites
  expect_two_ranks_train_as_one("async tis", job, recorded_batch(57));
}

// The memory report (get_engine_status's `memory`) covers every rank, and shows the sharding
// against the target formula: each of 2 ranks holds half the optimizer state, of the fp32
// masters and of the fp32 gradients (plus one bucket), all of the weights, and a KV cache.
TEST(RankEquivalence, TheMemoryReportCoversEveryRank) {
  ASSERT_NE(g_two, nullptr);
  testing::ScratchDir scratch("swarm-rank-memory");
  Job job = tiny_job("bf16");
  job.reduce_bucket_mb = 1.0 / 16;
  const auto [single, pair] = one_and_two_ranks(job, recorded_batch(58), scratch.path());
  ASSERT_EQ(single.memory.size(), 1u);
  ASSERT_EQ(pair.memory.size(), 2u);
  const RankMemory& one = single.memory[0];
  EXPECT_EQ(one.rank, 0);
  EXPECT_EQ(one.device, "cpu");
  EXPECT_GT(one.weights_bytes, 0);
  EXPECT_EQ(one.serving_weights_bytes, 0);                // synchronous: one weight copy, the trainer's
  EXPECT_EQ(one.gradients_bytes, 2 * one.weights_bytes);  // fp32 gradients of bf16 weights
  EXPECT_EQ(one.master_weights_bytes, 2 * one.weights_bytes);
  EXPECT_EQ(one.optimizer_bytes, 4 * one.weights_bytes);  // two fp32 moments
  EXPECT_GT(one.kv_cache_bytes, 0);
  EXPECT_GT(one.peak_bytes, one.weights_bytes);
  for (int r = 0; r < 2; ++r) {
    const RankMemory& m = pair.memory[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(m.rank, r);
    EXPECT_EQ(m.serving_weights_bytes, one.serving_weights_bytes);
    // The target per rank, bf16, N ranks (docs/concepts.md "Memory of a training step"), with
    // P parameters: weights 2P, master 4P/N, moments 8P/N, gradients 4P/N plus one bucket (its
    // fp32 staging and the rank's piece of it). The flat buffers are padded to a whole number of
    // pieces per bucket and rank: less than one element per bucket and rank.
    const double P = one.weights_bytes / 2.0, N = 2.0, bucket = job.reduce_bucket_mb * (1 << 20);
    const double padding = 4.0 * 2 * (P * 4 / bucket + 1);
    EXPECT_EQ(m.weights_bytes, one.weights_bytes);
    EXPECT_EQ(m.serving_weights_bytes, 0);
    EXPECT_NEAR(static_cast<double>(m.optimizer_bytes), 8 * P / N, 2 * padding);
    EXPECT_NEAR(static_cast<double>(m.master_weights_bytes), 4 * P / N, padding);
    EXPECT_GE(static_cast<double>(m.gradients_bytes), 4 * P / N);
    EXPECT_LE(static_cast<double>(m.gradients_bytes), 4 * P / N + bucket * (1 + 1 / N) + 3 * padding);
    std::printf(
        "rank %d of 2, P = %.0f parameters: weights %lld, gradients %lld (4P/N + bucket %.0f = %.0f), "
        "master %lld, moments %lld bytes\n",
        r, P, static_cast<long long>(m.weights_bytes), static_cast<long long>(m.gradients_bytes), bucket,
        4 * P / N + bucket * (1 + 1 / N), static_cast<long long>(m.master_weights_bytes),
        static_cast<long long>(m.optimizer_bytes));
    EXPECT_GT(m.peak_bytes, 0);
  }
  // Every rank serves, with the KV cache the job sizes.
  EXPECT_EQ(pair.memory[0].kv_cache_bytes, one.kv_cache_bytes);
  EXPECT_EQ(pair.memory[1].kv_cache_bytes, one.kv_cache_bytes);
}

// ---------------------------------------------------------------- every rank serves

// What a request's observer (the HTTP side) saw.
struct Seen {
  std::vector<std::pair<int64_t, std::string>> deltas;
  std::optional<GenerationResult> result;
  std::string error;
};

class Collecting final : public GenerationObserver {
 public:
  void on_text(int64_t choice, const std::string& delta) override {
    std::lock_guard lk(mu_);
    seen_.deltas.emplace_back(choice, delta);
  }
  void on_complete(GenerationResult r) override {
    std::lock_guard lk(mu_);
    seen_.result = std::move(r);
    done_ = true;
    cv_.notify_all();
  }
  void on_error(ErrorKind, const std::string& message) override {
    std::lock_guard lk(mu_);
    seen_.error = message;
    done_ = true;
    cv_.notify_all();
  }
  Seen wait() {
    std::unique_lock lk(mu_);
    EXPECT_TRUE(cv_.wait_for(lk, 60s, [&] { return done_; })) << "no answer within 60 s";
    return seen_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Seen seen_;
  bool done_ = false;
};

Seen generate(Backend& backend, GenerationRequest request) {
  auto observer = std::make_shared<Collecting>();
  backend.generate(std::move(request), observer);
  return observer->wait();
}

// Sampled at a temperature, seeded, with log-probs and alternatives, two choices.
GenerationRequest sampled_request(const std::string& affinity = "") {
  GenerationRequest r;
  r.prompt_ids = {1, 15, 230, 77, 1024, 9, 300};
  r.params.temperature = 0.8;
  r.params.seed = 1234;
  r.params.max_tokens = 20;
  r.params.n = 2;
  r.params.logprobs = true;
  r.params.top_logprobs = 2;
  r.affinity = affinity;
  return r;
}

// Constrained to lowercase letters and spaces (structured outputs take this path).
std::shared_ptr<const grammar::Grammar> letters_grammar() {
  grammar::Grammar g;
  const uint32_t word = g.add_rule("text");
  g.add_alternative(word, {grammar::Element::bytes('a', 'z'), grammar::Element::rule(word)});
  g.add_alternative(word, {grammar::Element::byte(' '), grammar::Element::rule(word)});
  g.add_alternative(word, {grammar::Element::bytes('a', 'z')});
  g.set_root(word);
  return std::make_shared<const grammar::Grammar>(std::move(g));
}

void expect_same_answer(const Seen& a, const Seen& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.error, "");
  ASSERT_EQ(b.error, "");
  ASSERT_TRUE(a.result && b.result);
  EXPECT_EQ(a.deltas, b.deltas);
  testing::expect_same_generation(*a.result, *b.result);
}

int64_t requests_on(const Backend& backend, int rank) {
  return backend.rank_serving().at(static_cast<size_t>(rank)).requests;
}

// Rank 1 answers through the serving link exactly what rank 0's own engine answers (an idle
// job takes turns: the first request goes to rank 0, the same request next to rank 1), before
// and after a policy step, whose weights reach both ranks' serving engines with its version.
TEST(RankEquivalence, EveryRankServesAndAnswersAsRankZeroDoes) {
  ASSERT_NE(g_two, nullptr);
  testing::ScratchDir scratch("swarm-rank-serving");
  auto two = make_backend("torch");
  two->boot(tiny_job(), {});
  two->set_policy_version(0);

  const Seen on0 = generate(*two, sampled_request());
  EXPECT_EQ(requests_on(*two, 0), 1);
  const Seen on1 = generate(*two, sampled_request());
  EXPECT_EQ(requests_on(*two, 1), 1);
  expect_same_answer(on0, on1, "sampled");
  ASSERT_TRUE(on0.result);
  EXPECT_FALSE(on0.deltas.empty());
  for (const auto& c : on0.result->choices) EXPECT_EQ(c.versions, std::vector<int64_t>(c.ids.size(), 0));

  GenerationRequest constrained = sampled_request();
  constrained.grammar = letters_grammar();
  const Seen c0 = generate(*two, constrained);
  const Seen c1 = generate(*two, constrained);
  EXPECT_EQ(requests_on(*two, 0), 2);
  EXPECT_EQ(requests_on(*two, 1), 2);
  expect_same_answer(c0, c1, "constrained");
  ASSERT_TRUE(c0.result);
  for (const auto& c : c0.result->choices)
    for (char ch : c.text) EXPECT_TRUE((ch >= 'a' && ch <= 'z') || ch == ' ') << c.text;

  // A policy step: both ranks' serving weights change, and both stamp the step's version.
  two->train_step(recorded_batch(59), 1, {});
  const Seen after0 = generate(*two, sampled_request());
  const Seen after1 = generate(*two, sampled_request());
  EXPECT_EQ(requests_on(*two, 0), 3);
  EXPECT_EQ(requests_on(*two, 1), 3);
  expect_same_answer(after0, after1, "after a step");
  ASSERT_TRUE(after0.result);
  for (const auto& c : after0.result->choices) EXPECT_EQ(c.versions, std::vector<int64_t>(c.ids.size(), 1));
  EXPECT_NE(std::memcmp(after0.result->choices[0].logprobs.data(), on0.result->choices[0].logprobs.data(),
                        sizeof(float)),
            0)
      << "the step changed the weights rank 1 serves with";

  // An episode stays on the rank that served it; the counters add up.
  const int64_t before = requests_on(*two, 1);
  generate(*two, sampled_request("episode-x"));  // rank 0 (a tie: the lower rank)
  generate(*two, sampled_request("episode-y"));  // rank 1
  generate(*two, sampled_request("episode-y"));  // rank 1 again, though it has served more
  EXPECT_EQ(requests_on(*two, 1), before + 2);
  int64_t generated = 0;
  for (const RankServing& r : two->rank_serving()) {
    EXPECT_TRUE(r.up);
    EXPECT_EQ(r.in_flight, 0);
    EXPECT_EQ(r.outstanding_tokens, 0);
    generated += r.generated_tokens;
  }
  EXPECT_GT(generated, 0);
  two->release();
}

}  // namespace
}  // namespace swarm
