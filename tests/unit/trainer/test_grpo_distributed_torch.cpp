// The GRPO trainer sharded over 2 Gloo ranks on loopback, against the same training in one
// process: the weights after two policy steps, each rank's half of the optimizer state, the
// all-reduced metrics, bf16 with fp32 master shards, and a rank that dies mid-job.
//
// A rank is this binary re-executed (posix_spawn: no fork of a process that already runs torch
// threads) with SWARM_TEST_GRPO_DIST_ROLE naming the GrpoDistRank.<role> test it runs; that
// variable registers the rank bodies, so they never appear in the normal test list. Ranks
// write what they computed into a scratch directory (torch pickles) for the parent to compare.
#include "trainer/policy_trainer_torch.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/error.hpp"
#include "inference/decoder_model_torch.hpp"
#include "support/rank_job.hpp"
#include "support/scratch_dir.hpp"
#include "support/train_batches.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Tensors = std::map<std::string, torch::Tensor>;
using Metrics = std::map<std::string, double>;

constexpr const char* kRoleVar = "SWARM_TEST_GRPO_DIST_ROLE";
constexpr const char* kDirVar = "SWARM_TEST_GRPO_DIST_DIR";
constexpr const char* kPortVar = "SWARM_TEST_GRPO_DIST_PORT";
constexpr const char* kRankVar = "SWARM_TEST_GRPO_DIST_RANK";
constexpr int kWorld = 2;

// Metrics that train() all-reduces (or that every rank computes from the same whole batch):
// they must agree across ranks. Timings are per rank and are left out.
const std::vector<std::string> kSharedMetrics = {"loss",
                                                 "pg_loss",
                                                 "kl",
                                                 "entropy",
                                                 "clip_frac_low",
                                                 "clip_frac_high",
                                                 "logprob_mismatch_mean",
                                                 "logprob_mismatch_max",
                                                 "grad_norm",
                                                 "grad_norm_max",
                                                 "optimizer_steps",
                                                 "weights_updated",
                                                 "trained_tokens",
                                                 "lr",
                                                 "sequences_trained"};

fs::path tinystories() { return fs::path(SWARM_FIXTURES_DIR) / "models" / "tinystories-656k"; }

TrainerOptions options() {
  TrainerOptions o;
  o.learning_rate = 2e-3;
  o.micro_batch_max_tokens = 64;  // several micro-batches per rank
  // The bf16 jobs here test bf16 compute with fp32 master shards, on every CPU (by default a
  // CPU without bf16 dot products trains a bf16 model in fp32).
  o.fp32_compute_without_bf16_dot = false;
  return o;
}

const std::vector<TrainBatch>& batches() {
  // Per-token rewards: GRPO ignores them, PPO's GAE credits them.
  static const std::vector<TrainBatch> b = {testing::with_token_rewards(testing::random_batch(2, 4, 51)),
                                            testing::with_token_rewards(testing::random_batch(3, 3, 52))};
  return b;
}

TrainerOptions ppo_options() {
  TrainerOptions o = options();
  o.ppo = true;
  o.advantage_estimator = AdvantageEstimator::GAE;
  o.lam = 0.95;
  o.critic_learning_rate = 2e-3;
  return o;
}

// ---------------------------------------------------------------- files between processes

void save_tensors(const fs::path& path, const Tensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().to(torch::kCPU).contiguous().clone());
  const std::vector<char> bytes = torch::pickle_save(dict);
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    SWARM_CHECK(out.good(), "cannot write " + tmp.string());
  }
  fs::rename(tmp, path);  // the parent never sees half a file
}

Tensors load_tensors(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  SWARM_CHECK(in.good(), "cannot read " + path.string());
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Tensors out;
  for (const auto& entry : torch::pickle_load(bytes).toGenericDict())
    out[entry.key().toStringRef()] = entry.value().toTensor();
  return out;
}

Tensors metrics_as_tensors(const Metrics& m, const std::string& prefix) {
  Tensors out;
  for (const auto& [k, v] : m) out[prefix + k] = torch::tensor({v}, torch::kDouble);
  return out;
}

Metrics metrics_from_tensors(const Tensors& t, const std::string& prefix) {
  Metrics out;
  for (const auto& [k, v] : t)
    if (k.rfind(prefix, 0) == 0) out[k.substr(prefix.size())] = v.item<double>();
  return out;
}

Tensors cloned(const Tensors& t) {
  Tensors out;
  for (const auto& [k, v] : t) out[k] = v.detach().clone();
  return out;
}

// ---------------------------------------------------------------- what one run computes

struct TrainResult {
  Tensors weights;               // full, by name, compute dtype
  Tensors state;                 // optimizer_state() of this rank
  std::vector<Metrics> metrics;  // per policy step
  Tensors critic, critic_state;  // PPO: the critic's weights and this rank's optimizer state
};

std::shared_ptr<DecoderModel> load_model(DType dtype) { return DecoderModel::load(tinystories(), dtype); }

// A freshly loaded model's weights by name (the state before any training).
Tensors initial_weights(DType dtype) {
  const auto model = load_model(dtype);
  Tensors out;
  for (const auto& [name, t] : model->parameters()) out[name] = t.detach().clone();
  return out;
}

TrainResult train_two_steps(PolicyTrainer& trainer) {
  TrainResult r;
  for (size_t i = 0; i < batches().size(); ++i)
    r.metrics.push_back(trainer.train(batches()[i], static_cast<int64_t>(i + 1), nullptr));
  r.weights = cloned(trainer.weights());
  r.state = cloned(trainer.optimizer_state());
  if (const Critic* c = trainer.critic()) {
    r.critic = cloned(c->weights());
    r.critic_state = cloned(c->parameters().state());
  }
  return r;
}

TrainResult train_one_rank(DType dtype) {
  auto model = load_model(dtype);
  std::shared_ptr<DecoderModel> master = dtype == DType::F32 ? nullptr : load_model(DType::F32);
  PolicyTrainer trainer(model, options(), nullptr, master ? &master->parameters() : nullptr);
  return train_two_steps(trainer);
}

// The parameters' names in the trainer's flat order (the model's parameter order).
std::vector<std::string> flat_order() {
  const auto model = load_model(DType::F32);
  std::vector<std::string> names;
  for (const auto& [name, t] : model->parameters()) names.push_back(name);
  return names;
}

torch::Tensor flatten(const Tensors& weights, const std::vector<std::string>& order) {
  std::vector<torch::Tensor> parts;
  for (const auto& n : order) parts.push_back(weights.at(n).reshape(-1).to(torch::kFloat));
  return torch::cat(parts);
}

// ---------------------------------------------------------------- spawning ranks

struct ScratchDir : swarm::testing::ScratchDir {
  ScratchDir() : swarm::testing::ScratchDir("swarm-grpo-dist") {}
};

// The 2 ranks of a job running GrpoDistRank.<role>, writing into `dir`.
class RankJob : public swarm::testing::RankJob {
 public:
  RankJob(const std::string& role, const fs::path& dir, int port = swarm::testing::free_loopback_port())
      : swarm::testing::RankJob(kWorld, "GrpoDistRank." + role, [&](int rank) {
          SWARM_CHECK(port > 0, "no free loopback port");
          return std::map<std::string, std::string>{{kRoleVar, role},
                                                    {kDirVar, dir.string()},
                                                    {kPortVar, std::to_string(port)},
                                                    {kRankVar, std::to_string(rank)}};
        }) {}
};

// ---------------------------------------------------------------- comparisons

// How far `got` is from `want`, tensor by tensor, each difference measured against a scale of
// its own tensor (`scale` by name: the size of that tensor's update, or of its moment).
struct Closeness {
  double max_abs = 0.0;    // max |got - want| over every element
  double max_rel = 0.0;    // max over tensors of max |got - want| / scale
  double frac_over = 0.0;  // fraction of all elements with |got - want| > tight * scale
};

Closeness closeness(const Tensors& got, const Tensors& want, const std::map<std::string, double>& scale,
                    double tight) {
  Closeness c;
  int64_t over = 0, total = 0;
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    if (!got.contains(name)) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    const torch::Tensor diff = (got.at(name).to(torch::kDouble) - w.to(torch::kDouble)).abs();
    const double abs = diff.max().item<double>(), s = scale.at(name);
    c.max_abs = std::max(c.max_abs, abs);
    c.max_rel = std::max(c.max_rel, s > 0 ? abs / s : (abs > 0 ? INFINITY : 0.0));
    over += (diff > tight * s).sum().item<int64_t>();
    total += diff.numel();
  }
  c.frac_over = total > 0 ? static_cast<double>(over) / static_cast<double>(total) : 0.0;
  return c;
}

// Each tensor's largest |after - before|.
std::map<std::string, double> update_scale(const Tensors& after, const Tensors& before) {
  std::map<std::string, double> out;
  for (const auto& [name, t] : after)
    out[name] = (t.to(torch::kDouble) - before.at(name).to(torch::kDouble)).abs().max().item<double>();
  return out;
}

// Each tensor's largest |value|.
std::map<std::string, double> value_scale(const Tensors& t) {
  std::map<std::string, double> out;
  for (const auto& [name, v] : t) out[name] = v.abs().max().item<double>();
  return out;
}

// Cuts a flat vector in the trainer's layout (parameter order, `like`'s shapes) into named tensors.
Tensors unflatten(const torch::Tensor& flat, const std::vector<std::string>& order, const Tensors& like) {
  Tensors out;
  int64_t at = 0;
  for (const auto& n : order) {
    const torch::Tensor& t = like.at(n);
    out[n] = flat.narrow(0, at, t.numel()).view(t.sizes());
    at += t.numel();
  }
  return out;
}

void expect_bit_identical(const Tensors& a, const Tensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.contains(name)) << name;
    EXPECT_EQ(t.scalar_type(), b.at(name).scalar_type()) << name;
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name << " differs between the ranks";
  }
}

void expect_metrics_agree(const Metrics& a, const Metrics& b, const std::string& what) {
  for (const auto& key : kSharedMetrics) {
    ASSERT_TRUE(a.contains(key) && b.contains(key)) << what << ": no metric " << key;
    const double x = a.at(key), y = b.at(key);
    EXPECT_LE(std::abs(x - y), 1e-6 * std::max({std::abs(x), std::abs(y), 1e-12})) << what << " " << key;
  }
}

double rel(double a, double b) { return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-12}); }

struct RankOutputs {
  TrainResult rank[kWorld];
  double job_seconds = 0.0;
};

// Runs a 2-rank training job of `role` and reads what each rank wrote.
RankOutputs run_training_job(const std::string& role, const fs::path& dir) {
  RankOutputs out;
  const auto start = Clock::now();
  RankJob job(role, dir);
  const std::vector<int> codes = job.wait(std::chrono::seconds(150));
  out.job_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(codes, (std::vector<int>{0, 0})) << "rank exit codes (-1: killed)";
  for (int r = 0; r < kWorld; ++r) {
    const fs::path file = dir / ("rank" + std::to_string(r) + ".pt");
    if (!fs::exists(file)) throw std::runtime_error("rank " + std::to_string(r) + " wrote no results");
    const Tensors all = load_tensors(file);
    TrainResult& res = out.rank[r];
    for (const auto& [k, v] : all) {
      if (k.rfind("weight/", 0) == 0) res.weights[k.substr(7)] = v;
      if (k.rfind("state/", 0) == 0) res.state[k.substr(6)] = v;
      if (k.rfind("critic/", 0) == 0) res.critic[k.substr(7)] = v;
      if (k.rfind("cstate/", 0) == 0) res.critic_state[k.substr(7)] = v;
    }
    for (size_t s = 0; s < batches().size(); ++s)
      res.metrics.push_back(metrics_from_tensors(all, "metric" + std::to_string(s + 1) + "/"));
  }
  return out;
}

// What every comparison of a 2-rank job with the 1-rank run shares: bit-identical weights and
// agreeing metrics across ranks, and each rank holding its half of the optimizer state.
void check_sharding(const RankOutputs& job, const TrainResult& single, int64_t params) {
  expect_bit_identical(job.rank[0].weights, job.rank[1].weights);
  for (size_t s = 0; s < single.metrics.size(); ++s) {
    expect_metrics_agree(job.rank[0].metrics[s], job.rank[1].metrics[s], "step " + std::to_string(s + 1));
    EXPECT_EQ(job.rank[0].metrics[s].at("weights_updated"), 1);
    EXPECT_EQ(job.rank[0].metrics[s].at("trained_tokens"), single.metrics[s].at("trained_tokens"));
  }
  const int64_t half = (params + kWorld - 1) / kWorld;
  ASSERT_EQ(single.state.at("exp_avg").numel(), params);
  for (int r = 0; r < kWorld; ++r) {
    const Tensors& st = job.rank[r].state;
    for (const char* key : {"exp_avg", "exp_avg_sq", "master"}) {
      ASSERT_TRUE(st.contains(key)) << "rank " << r << " has no " << key;
      EXPECT_EQ(st.at(key).numel(), half) << "rank " << r << " " << key;
      EXPECT_EQ(st.at(key).scalar_type(), torch::kFloat);
    }
    EXPECT_EQ(st.at("step").item<double>(), 2);
    // One gradient bucket (the model is smaller than the default bucket): each rank a contiguous half.
    EXPECT_TRUE(torch::equal(
        st.at("layout"),
        torch::tensor({double(params), double(kWorld), double(r), double(half)}, torch::kDouble)));
  }
}

// Parent side: the 1-rank reference, then the 2-rank job, then the comparisons.
TEST(GrpoDistributed, TwoRanksMatchOneRank) {
  ScratchDir scratch;
  const Tensors initial = initial_weights(DType::F32);
  const std::vector<std::string> order = flat_order();
  auto t0 = Clock::now();
  const TrainResult single = train_one_rank(DType::F32);
  const double single_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t params = single.state.at("exp_avg").numel();

  const RankOutputs job = run_training_job("Fp32", scratch.path());
  check_sharding(job, single, params);
  std::printf("fp32: %lld parameters; each rank holds %lld of exp_avg / exp_avg_sq / master\n",
              static_cast<long long>(params),
              static_cast<long long>(job.rank[0].state.at("exp_avg").numel()));

  // The shards are the 1-rank state cut in two: the fp32 masters concatenate to the weights
  // exactly (the padding of the last shard stays 0).
  const torch::Tensor masters = torch::cat({job.rank[0].state.at("master"), job.rank[1].state.at("master")});
  EXPECT_TRUE(torch::equal(masters.narrow(0, 0, params), flatten(job.rank[0].weights, order)));
  if (masters.numel() > params) {
    EXPECT_EQ(masters.narrow(0, params, masters.numel() - params).abs().max().item<double>(), 0.0);
  }

  // 1 rank vs 2 ranks do the same arithmetic except the order of fp32 sums: the micro-batches
  // hold other sequences (other padded shapes, so other matmul blockings) and the gradient is
  // summed over ranks. The step's metrics and both AdamW moments (linear in the gradients) agree
  // to a few fp32 roundings of their scale (measured: ~3e-6 of each tensor's largest moment);
  // 1e-5 of it still catches any real error (a lost or doubled micro-batch, a wrong loss
  // normaliser, a misplaced shard changes them by O(1) of themselves).
  for (size_t s = 0; s < single.metrics.size(); ++s) {
    const Metrics &a = job.rank[0].metrics[s], &b = single.metrics[s];
    EXPECT_LE(std::abs(a.at("loss") - b.at("loss")), 1e-5 * std::max(1.0, std::abs(b.at("loss")))) << s;
    EXPECT_LE(rel(a.at("grad_norm"), b.at("grad_norm")), 1e-5) << s;
    std::printf("fp32 step %zu: loss %.9g vs %.9g, grad_norm %.9g vs %.9g (2 ranks vs 1)\n", s + 1,
                a.at("loss"), b.at("loss"), a.at("grad_norm"), b.at("grad_norm"));
  }
  for (const char* key : {"exp_avg", "exp_avg_sq"}) {
    const torch::Tensor shards = torch::cat({job.rank[0].state.at(key), job.rank[1].state.at(key)});
    const Tensors got = unflatten(shards, order, initial),
                  want = unflatten(single.state.at(key), order, initial);
    const Closeness c = closeness(got, want, value_scale(want), 1e-5);
    std::printf("fp32 %s: max abs diff %.3g, max rel to the tensor's largest value %.3g\n", key, c.max_abs,
                c.max_rel);
    EXPECT_LE(c.max_rel, 1e-5) << key;
  }

  // The weights cannot be held to that elementwise. AdamW moves every element by about lr
  // whatever the size of its gradient (lr * m_hat / (sqrt(v_hat) + eps)), so an element's
  // update carries the relative error of its *own* gradient: for an element whose gradient is
  // 1e-4 of its tensor's largest (a sum that nearly cancels), fp32 roundings of 1e-7 of the
  // large terms are 1e-3 of it, and at the eps scale (1e-8) a rounding of 1e-10 moves the
  // update by a percent of lr. One rank shows the same when only its micro-batch plan changes
  // (measured alongside). So: at most 0.2% of the elements off by more than 1e-4 of their
  // tensor's largest update (measured: 0.02% for 2 ranks, 0.03% for 1 rank re-planned), none
  // by more than 10% of it (measured: 1.5% and 1.9%). A lost micro-batch or a misplaced shard
  // moves most elements by O(1) of their update.
  const auto scale = update_scale(single.weights, initial);
  const Closeness w = closeness(job.rank[0].weights, single.weights, scale, 1e-4);
  TrainerOptions replanned_options = options();
  replanned_options.micro_batch_max_tokens = 8192;  // every mini-batch in one micro-batch
  PolicyTrainer replanned(load_model(DType::F32), replanned_options);
  const Closeness plan = closeness(train_two_steps(replanned).weights, single.weights, scale, 1e-4);
  std::printf(
      "fp32 weights, 2 ranks vs 1: max abs %.3g, max rel to update %.3g, %.4f%% of elements over 1e-4 of it "
      "(1 rank re-planned vs 1: max abs %.3g, max rel %.3g, %.4f%%); 1 rank %.2f s, 2-rank job %.2f s\n",
      w.max_abs, w.max_rel, 100 * w.frac_over, plan.max_abs, plan.max_rel, 100 * plan.frac_over,
      single_seconds, job.job_seconds);
  EXPECT_LE(w.frac_over, 2e-3);
  EXPECT_LE(w.max_rel, 0.1);
}

TEST(GrpoDistributed, Bf16TwoRanksTrain) {
  ScratchDir scratch;
  const Tensors initial = initial_weights(DType::BF16);
  const Tensors initial32 = initial_weights(DType::F32);
  auto t0 = Clock::now();
  const TrainResult single = train_one_rank(DType::BF16);
  const double single_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t params = single.state.at("exp_avg").numel();

  const RankOutputs job = run_training_job("Bf16", scratch.path());
  check_sharding(job, single, params);
  for (const auto& [name, w] : job.rank[0].weights) EXPECT_EQ(w.scalar_type(), torch::kBFloat16) << name;

  // The fp32 master weights. Forward and backward run in bf16, where the other micro-batch
  // shapes change roundings by bf16 ulps (2^-8 relative), not fp32 ones: gradients differ by
  // about a percent and an element whose gradient is near 0 can flip the sign of its Adam
  // update. An AdamW update is at most lr * 1.0014 per element in either of the first two steps
  // (|m_hat| / sqrt(v_hat) <= 1 at step 1, <= 1.0014 at step 2 with the default betas), so no
  // element may differ by more than 2 steps x 2 x that. That bound holds for any gradient, so
  // it is backed by the mean: a lost micro-batch or a wrong normaliser changes the updates of
  // most elements, while rounding noise moves a few (measured: mean diff ~0.5% of the mean
  // update; 5% allowed).
  const std::vector<std::string> order = flat_order();
  const torch::Tensor master2 =
      torch::cat({job.rank[0].state.at("master"), job.rank[1].state.at("master")}).narrow(0, 0, params);
  const torch::Tensor master1 = single.state.at("master");
  const torch::Tensor start = flatten(initial32, order);
  const double lr = options().learning_rate;
  const double master_max = (master2 - master1).abs().max().item<double>();
  const double master_mean = (master2 - master1).abs().mean().item<double>();
  const double update_mean = (master1 - start).abs().mean().item<double>();
  EXPECT_LE(master_max, 4 * lr * 1.0014 + 1e-7);
  EXPECT_LE(master_mean, 0.05 * update_mean);  // on average the updates agree to within 5%

  // The bf16 weights are those masters rounded: where the masters differ slightly, the rounding
  // can fall either side, so they may differ by the master difference plus one bf16 ulp of the
  // value (2^-8 relative, 2^-7 to cover rounding both ways).
  const Closeness d =
      closeness(job.rank[0].weights, single.weights, update_scale(single.weights, initial), 1e-5);
  double worst = 0.0;  // max over elements of |diff| / (4 lr + 2^-7 |w|): must stay <= 1
  for (const auto& [name, w] : single.weights) {
    const torch::Tensor a = job.rank[0].weights.at(name).to(torch::kDouble), b = w.to(torch::kDouble);
    const torch::Tensor bound = 4 * lr + a.abs().maximum(b.abs()) * std::ldexp(1.0, -7);
    worst = std::max(worst, ((a - b).abs() / bound).max().item<double>());
  }
  const double differing = [&] {
    int64_t n = 0;
    for (const auto& [name, w] : single.weights)
      n += (job.rank[0].weights.at(name) != w).sum().item<int64_t>();
    return static_cast<double>(n) / static_cast<double>(params);
  }();
  std::printf(
      "bf16 1 rank vs 2 ranks: weights max abs %.3g (rel to update %.3g, %.2f%% of elements differ, "
      "worst/bound %.3g); "
      "masters max abs %.3g mean %.3g (mean update %.3g) (1 rank %.2f s, 2-rank job %.2f s)\n",
      d.max_abs, d.max_rel, 100 * differing, worst, master_max, master_mean, update_mean, single_seconds,
      job.job_seconds);
  EXPECT_LE(worst, 1.0);
  EXPECT_LT(differing, 0.05);
  // The gradient norm is a sum over all elements: bf16 rounding noise averages out (5% allowed).
  for (size_t s = 0; s < single.metrics.size(); ++s) {
    const Metrics &a = job.rank[0].metrics[s], &b = single.metrics[s];
    std::printf("bf16 step %zu: loss %.6g vs %.6g, grad_norm %.6g vs %.6g (2 ranks vs 1)\n", s + 1,
                a.at("loss"), b.at("loss"), a.at("grad_norm"), b.at("grad_norm"));
    EXPECT_LE(rel(a.at("grad_norm"), b.at("grad_norm")), 0.05) << s;
  }
}

// PPO over 2 ranks: the critic is sharded like the policy (each rank holds half of its AdamW
// state), GAE's whitening spans both ranks' tokens, and the result is the 1-rank run's up to
// the order of fp32 sums (the same tolerances as TwoRanksMatchOneRank, for the policy and the
// critic alike).
TEST(GrpoDistributed, PpoTwoRanksMatchOneRank) {
  ScratchDir scratch;
  const Tensors initial = initial_weights(DType::F32);
  PolicyTrainer one(load_model(DType::F32), ppo_options());
  Tensors critic0 = cloned(one.critic()->weights());
  const TrainResult single = train_two_steps(one);
  const int64_t params = single.state.at("exp_avg").numel();
  const RankOutputs job = run_training_job("Ppo", scratch.path());
  check_sharding(job, single, params);
  expect_bit_identical(job.rank[0].critic, job.rank[1].critic);
  const int64_t critic_params = single.critic_state.at("exp_avg").numel();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(job.rank[r].critic_state.at("exp_avg").numel(), (critic_params + kWorld - 1) / kWorld) << r;
    EXPECT_EQ(job.rank[r].critic_state.at("step").item<double>(), 2) << r;
  }
  for (size_t s = 0; s < single.metrics.size(); ++s) {
    const Metrics &a = job.rank[0].metrics[s], &b = single.metrics[s];
    for (const char* key :
         {"critic_loss", "critic_value_mse", "critic_value_mean", "critic_grad_norm", "advantage_std"}) {
      ASSERT_TRUE(a.contains(key) && b.contains(key)) << key;
      EXPECT_LE(std::abs(a.at(key) - job.rank[1].metrics[s].at(key)),
                1e-9 * std::max(1.0, std::abs(a.at(key))))
          << "ranks disagree on " << key;
      EXPECT_LE(std::abs(a.at(key) - b.at(key)), 1e-5 * std::max(1.0, std::abs(b.at(key))))
          << key << " step " << s;
    }
    std::printf("ppo step %zu: critic loss %.9g vs %.9g, value mse %.9g vs %.9g (2 ranks vs 1)\n", s + 1,
                a.at("critic_loss"), b.at("critic_loss"), a.at("critic_value_mse"), b.at("critic_value_mse"));
  }
  const Closeness w =
      closeness(job.rank[0].weights, single.weights, update_scale(single.weights, initial), 1e-4);
  const Closeness c =
      closeness(job.rank[0].critic, single.critic, update_scale(single.critic, critic0), 1e-4);
  std::printf("ppo 2 ranks vs 1: policy max rel to update %.3g (%.4f%% over 1e-4), critic %.3g (%.4f%%)\n",
              w.max_rel, 100 * w.frac_over, c.max_rel, 100 * c.frac_over);
  EXPECT_LE(w.frac_over, 2e-3);
  EXPECT_LE(w.max_rel, 0.1);
  EXPECT_LE(c.frac_over, 2e-3);
  EXPECT_LE(c.max_rel, 0.1);
}

TEST(GrpoDistributed, DeadRankFailsTheOtherClearly) {
  ScratchDir scratch;
  const auto start = Clock::now();
  RankJob job("DeadRank", scratch.path());
  EXPECT_EQ(job.wait(std::chrono::seconds(60)), (std::vector<int>{0, 0}));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("dead-rank job finished after %.2f s\n", seconds);
  EXPECT_LT(seconds, 30.0);
}

// ---------------------------------------------------------------- rank bodies

DistConfig rank_config(std::chrono::milliseconds timeout) {
  DistConfig c;
  c.rank = std::atoi(std::getenv(kRankVar));
  c.world_size = kWorld;
  c.master_addr = "127.0.0.1";
  c.master_port = std::atoi(std::getenv(kPortVar));
  c.timeout = timeout;
  return c;
}

void training_rank(DType dtype, bool ppo = false) {
  const DistConfig config = rank_config(std::chrono::seconds(20));
  std::shared_ptr<Collectives> comm = make_collectives(config);
  ASSERT_EQ(comm->backend_name(), "gloo");
  auto model = load_model(dtype);
  std::shared_ptr<DecoderModel> master = dtype == DType::F32 ? nullptr : load_model(DType::F32);
  PolicyTrainer trainer(model, ppo ? ppo_options() : options(), comm,
                        master ? &master->parameters() : nullptr);
  const TrainResult r = train_two_steps(trainer);
  Tensors out;
  for (const auto& [k, v] : r.weights) out["weight/" + k] = v;
  for (const auto& [k, v] : r.state) out["state/" + k] = v;
  for (const auto& [k, v] : r.critic) out["critic/" + k] = v;
  for (const auto& [k, v] : r.critic_state) out["cstate/" + k] = v;
  for (size_t s = 0; s < r.metrics.size(); ++s) {
    const Tensors m = metrics_as_tensors(r.metrics[s], "metric" + std::to_string(s + 1) + "/");
    out.insert(m.begin(), m.end());
  }
  save_tensors(fs::path(std::getenv(kDirVar)) / ("rank" + std::to_string(config.rank) + ".pt"), out);
}

void fp32_rank() { training_rank(DType::F32); }
void ppo_rank() { training_rank(DType::F32, true); }
void bf16_rank() { training_rank(DType::BF16); }

// Rank 1 dies (no clean shutdown) right after building its trainer; rank 0's train() must fail
// with UNAVAILABLE within the 3 s collective timeout's reach, not hang.
void dead_rank() {
  const DistConfig config = rank_config(std::chrono::seconds(3));
  std::shared_ptr<Collectives> comm = make_collectives(config);
  PolicyTrainer trainer(load_model(DType::F32), options(), comm);
  if (config.rank == 1) std::_Exit(0);
  const auto start = Clock::now();
  try {
    trainer.train(batches()[0], 1, nullptr);
    ADD_FAILURE() << "train() with a dead rank returned";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UNAVAILABLE) << e.what();
    std::printf("dead rank detected after %.2f s: %s\n",
                std::chrono::duration<double>(Clock::now() - start).count(), e.what());
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

// In a spawned rank only: registers GrpoDistRank.<role>.
[[maybe_unused]] const bool kRankTestRegistered = swarm::testing::register_rank_test(
    kRoleVar, "GrpoDistRank",
    {{"Fp32", fp32_rank}, {"Bf16", bf16_rank}, {"Ppo", ppo_rank}, {"DeadRank", dead_rank}});

}  // namespace
}  // namespace swarm
