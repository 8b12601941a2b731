// PPO with a critic on the real TinyStories weights: the critic's values and
// clipped value loss with their gradients against an independent python3-torch reference
// (tests/reference/value_reference.py), a PPO step that fits the critic and follows per-token
// rewards, critic warm-up, and a checkpoint round trip that continues bit for bit.
#include <cstring>
#include <filesystem>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.hpp"
#include "inference/decoder_model_torch.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"
#include "support/scratch_dir.hpp"
#include "support/train_batches.hpp"
#include "trainer/checkpoint_torch.hpp"
#include "trainer/policy_trainer_torch.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path tinystories() { return fs::path(SWARM_FIXTURES_DIR) / "models" / "tinystories-656k"; }

double rel_error(const torch::Tensor& ours, const torch::Tensor& ref) {
  const double denom = ref.to(torch::kDouble).norm().item<double>();
  const double diff = (ours.to(torch::kDouble) - ref.to(torch::kDouble)).norm().item<double>();
  return denom == 0 ? diff : diff / denom;
}

// The padded inputs of some sequences as the trainer builds them: ids [B, T], lengths [B], the
// flat positions t - 1 of the trained tokens t (t >= 1, mask 1), in order.
struct Inputs {
  torch::Tensor ids, lengths, positions;
  std::vector<int64_t> counts;
};
Inputs inputs_of(const std::vector<const Sample*>& samples) {
  Inputs in;
  int64_t T = 0;
  for (const Sample* s : samples) T = std::max<int64_t>(T, static_cast<int64_t>(s->token_ids.size()));
  const auto B = static_cast<int64_t>(samples.size());
  in.ids = torch::zeros({B, T}, torch::kLong);
  std::vector<int64_t> lengths, positions;
  for (int64_t b = 0; b < B; ++b) {
    const Sample& s = *samples[static_cast<size_t>(b)];
    lengths.push_back(static_cast<int64_t>(s.token_ids.size()));
    int64_t count = 0;
    for (size_t t = 0; t < s.token_ids.size(); ++t) {
      in.ids[b][static_cast<int64_t>(t)] = s.token_ids[t];
      if (t >= 1 && s.loss_mask[t]) positions.push_back(b * T + static_cast<int64_t>(t) - 1), ++count;
    }
    in.counts.push_back(count);
  }
  in.lengths = torch::tensor(lengths, torch::kLong);
  in.positions = torch::tensor(positions, torch::kLong);
  return in;
}

TrainBatch batch_with_token_rewards(uint32_t seed) {
  return swarm::testing::with_token_rewards(swarm::testing::random_batch(2, 4, seed));
}

TrainerOptions ppo_options() {
  TrainerOptions o;
  o.ppo = true;
  o.advantage_estimator = AdvantageEstimator::GAE;
  o.learning_rate = 1e-3;
  o.critic_learning_rate = 1e-3;
  o.gamma = 1.0;
  o.lam = 0.95;
  o.micro_batch_max_tokens = 64;
  return o;
}

const PolicyTrainer::ExclusiveRunner kInline = [](const std::function<void()>& fn) { fn(); };

TEST(CriticParity, ValuesAndClippedValueLossMatchPythonTorch) {
  auto model = DecoderModel::load(tinystories(), DType::F32);
  Critic critic(*model, make_single_process_collectives());
  // A value head away from zero, so the trunk gets gradients too.
  std::mt19937 rng(4);
  std::normal_distribution<float> n01(0.f, 1.f);
  auto w = critic.weights();
  torch::Tensor head = torch::empty_like(w.at("value_head.weight"));
  for (int64_t i = 0; i < head.numel(); ++i) head[i] = 0.2f * n01(rng);
  std::map<std::string, torch::Tensor> named;
  for (const auto& [k, v] : w) named[k] = v.clone();
  named["value_head.weight"] = head;
  named["value_head.bias"] = torch::full({1}, 0.3f);
  critic.load_weights(named);

  const TrainBatch batch = swarm::testing::random_batch(2, 3, 5);
  std::vector<const Sample*> samples;
  for (const auto& ep : batch.episodes) samples.push_back(&ep.samples[0]);
  const Inputs in = inputs_of(samples);
  torch::Tensor now;
  {
    torch::NoGradGuard no_grad;
    now = critic.values(in.ids, in.lengths, in.positions);
  }
  const int64_t N = now.numel();
  // Old values near the current ones (some beyond the clip range), returns elsewhere.
  const torch::Tensor old = now + 0.2f * torch::sin(torch::arange(N, torch::kFloat) * 1.3f);
  torch::Tensor returns = torch::empty({N});
  for (int64_t i = 0; i < N; ++i) returns[i] = n01(rng);
  const double cliprange = 0.1;
  critic.zero_gradients();
  const ValueLossSums sums = critic.accumulate_gradients(in.ids, in.lengths, in.positions, returns, old,
                                                         torch::ones({N}), static_cast<double>(N), cliprange);

  swarm::testing::ScratchDir scratch("swarm-critic");
  json req;
  req["model_dir"] = tinystories().string();
  std::vector<std::string> names;
  for (const auto& [name, t] : model->parameters()) names.push_back(name);
  req["param_names"] = names;
  req["head"] = {
      {"weight", std::vector<float>(head.data_ptr<float>(), head.data_ptr<float>() + head.numel())},
      {"bias", 0.3}};
  int64_t at = 0;
  for (size_t k = 0; k < samples.size(); ++k) {
    const int64_t c = in.counts[k];
    json js;
    js["ids"] = samples[k]->token_ids;
    js["mask"] = samples[k]->loss_mask;
    js["returns"] = std::vector<float>(returns.data_ptr<float>() + at, returns.data_ptr<float>() + at + c);
    js["old_values"] = std::vector<float>(old.data_ptr<float>() + at, old.data_ptr<float>() + at + c);
    req["sequences"].push_back(js);
    at += c;
  }
  req["norm"] = static_cast<double>(N);
  req["agg"] = "token-mean";
  req["cliprange"] = cliprange;
  req["out_grads"] = (scratch.path() / "grads.f32").string();
  const json ref = swarm::testing::run_python_reference(
      fs::path(SWARM_SOURCE_DIR) / "tests/reference/value_reference.py", req, scratch.path());

  at = 0;
  for (size_t k = 0; k < samples.size(); ++k)
    for (int64_t i = 0; i < in.counts[k]; ++i, ++at)
      EXPECT_NEAR(now[at].item<float>(), ref["values"][k][static_cast<size_t>(i)].get<double>(), 1e-4)
          << k << "," << i;
  EXPECT_NEAR(sums.loss, ref["loss"].get<double>(), 1e-5 * std::max(1.0, ref["loss"].get<double>()));
  EXPECT_EQ(sums.clipped, ref["clipped"].get<double>());
  EXPECT_GT(sums.clipped, 0) << "the case should exercise the clipped side";
  EXPECT_LT(sums.clipped, static_cast<double>(N)) << "and the unclipped one";

  // Gradients: the trunk's, then the head's, raw float32 in that order.
  std::ifstream f(req["out_grads"].get<std::string>(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t off = 0;
  double worst = 0;
  const FlatParameters& p = critic.parameters();
  for (size_t i = 0; i < p.size(); ++i) {
    const torch::Tensor g = p.gradient(i);
    torch::Tensor r = torch::empty(g.sizes(), torch::kFloat);
    const size_t nbytes = static_cast<size_t>(g.numel()) * sizeof(float);
    ASSERT_LE(off + nbytes, bytes.size());
    std::memcpy(r.data_ptr<float>(), bytes.data() + off, nbytes);
    off += nbytes;
    const double e = rel_error(g, r);
    EXPECT_LE(e, 1e-4) << p.name(i);
    worst = std::max(worst, e);
  }
  EXPECT_EQ(off, bytes.size());
  std::printf("critic parity: loss %.9g vs %.9g, %g of %lld tokens clipped, grad rel err max %.3g\n",
              sums.loss, ref["loss"].get<double>(), sums.clipped, static_cast<long long>(N), worst);
}

// Repeated PPO steps on one batch with per-token rewards: the critic fits the returns, and the
// policy makes the rewarded tokens likelier than the penalised ones (measured: log-prob gap 0.67
// -> 13.4). Broken on purpose (checked by hand): with the advantage's sign flipped in
// compute_advantages the gap goes to -14.0 and this test fails.
TEST(Ppo, StepsFitTheCriticAndFollowTokenRewards) {
  auto model = DecoderModel::load(tinystories(), DType::F32);
  TrainerOptions o = ppo_options();
  o.lam = 1.0;  // returns = the rewards still to come: a fixed target for the critic
  o.critic_learning_rate = 3e-3;
  PolicyTrainer trainer(model, o);
  ASSERT_NE(trainer.critic(), nullptr);
  const TrainBatch batch = batch_with_token_rewards(9);
  // The mean log-prob of the +1 tokens minus that of the -1 tokens, under the current policy.
  auto gap = [&] {
    const PreparedBatch p = prepare_batch(batch, AdvantageEstimator::GAE);
    std::vector<size_t> all(p.sequences.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    const auto lps = trainer.token_logprobs(p, all);
    double good = 0, bad = 0, ng = 0, nb = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const Sample& s = *p.sequences[i].sample;
      int64_t k = 0;
      for (size_t t = 1; t < s.token_ids.size(); ++t) {
        if (!s.loss_mask[t]) continue;
        const double lp = lps[i][k++].item<double>();
        if (s.token_rewards[t] > 0)
          good += lp, ++ng;
        else
          bad += lp, ++nb;
      }
    }
    return good / ng - bad / nb;
  };
  const double gap0 = gap();
  std::map<std::string, double> first, last;
  for (int step = 1; step <= 12; ++step) {
    last = trainer.train(batch, step, kInline);
    if (step == 1) first = last;
  }
  const double gap1 = gap();
  std::printf("ppo: critic value mse %.4f -> %.4f, good-bad log-prob gap %.4f -> %.4f\n",
              first["critic_value_mse"], last["critic_value_mse"], gap0, gap1);
  ASSERT_TRUE(first.count("critic_loss") && first.count("critic_value_mse") && first.count("gae_seconds"));
  EXPECT_EQ(first["weights_updated"], 1);
  EXPECT_EQ(last["critic_optimizer_steps"], 1);
  // The returns of a fixed batch are a fixed target: 12 steps at lr 3e-3 halve the error (the
  // first step's error is that of a zero value head: the returns' mean square; measured 4.97 ->
  // 0.67 with these seeds, monotone).
  EXPECT_LT(last["critic_value_mse"], 0.5 * first["critic_value_mse"]);
  EXPECT_GT(gap1, gap0 + 0.5) << "the policy should favour the rewarded tokens";
}

TEST(Ppo, CriticWarmupTrainsOnlyTheCritic) {
  auto model = DecoderModel::load(tinystories(), DType::F32);
  TrainerOptions o = ppo_options();
  o.critic_warmup = 2;
  PolicyTrainer trainer(model, o);
  const TrainBatch batch = batch_with_token_rewards(3);
  const torch::Tensor policy0 = trainer.weights().begin()->second.clone();
  const torch::Tensor head0 = trainer.critic()->weights().at("value_head.weight").clone();
  for (int step = 1; step <= 2; ++step) {
    const auto m = trainer.train(batch, step, kInline);
    EXPECT_EQ(m.at("weights_updated"), 0) << step;
    EXPECT_EQ(m.at("critic_optimizer_steps"), 1) << step;
  }
  EXPECT_TRUE(torch::equal(trainer.weights().begin()->second, policy0)) << "the policy waits for the critic";
  EXPECT_FALSE(torch::equal(trainer.critic()->weights().at("value_head.weight"), head0));
  EXPECT_EQ(trainer.train(batch, 3, kInline).at("weights_updated"), 1);
  EXPECT_FALSE(torch::equal(trainer.weights().begin()->second, policy0));
}

// Save after two steps, load into a fresh trainer (model from the saved directory), and the
// third step is the same on both, bit for bit: policy, critic and both optimizers restored.
TEST(Ppo, CheckpointRoundTripContinuesBitExactly) {
  swarm::testing::ScratchDir scratch("swarm-ppo-ckpt");
  const TrainBatch batch = batch_with_token_rewards(13);
  TrainerOptions o = ppo_options();
  o.ppo_mini_batch_size = 1;  // two optimizer steps per policy step: the moments matter
  auto model = DecoderModel::load(tinystories(), DType::F32);
  PolicyTrainer a(model, o);
  a.train(batch, 1, kInline);
  a.train(batch, 2, kInline);
  save_hf_model(scratch.path() / "ckpt", *model, tinystories());
  save_trainer_state(scratch.path() / "ckpt" / "trainer_state", a);
  ASSERT_TRUE(fs::exists(scratch.path() / "ckpt" / "trainer_state" / "critic.safetensors"));

  auto model_b = DecoderModel::load(scratch.path() / "ckpt", DType::F32);
  PolicyTrainer b(model_b, o);
  load_trainer_state(scratch.path() / "ckpt" / "trainer_state", b);
  const auto ma = a.train(batch, 3, kInline);
  const auto mb = b.train(batch, 3, kInline);
  EXPECT_EQ(ma.at("loss"), mb.at("loss"));
  EXPECT_EQ(ma.at("critic_loss"), mb.at("critic_loss"));
  for (const auto& [name, t] : a.weights()) EXPECT_TRUE(torch::equal(t, b.weights().at(name))) << name;
  for (const auto& [name, t] : a.critic()->weights())
    EXPECT_TRUE(torch::equal(t, b.critic()->weights().at(name))) << "critic " << name;

  // A GRPO checkpoint has no critic to resume PPO from: a clear error, not a silent fresh critic.
  TrainerOptions grpo;
  PolicyTrainer g(DecoderModel::load(tinystories(), DType::F32), grpo);
  save_trainer_state(scratch.path() / "grpo", g);
  PolicyTrainer c(DecoderModel::load(tinystories(), DType::F32), o);
  try {
    load_trainer_state(scratch.path() / "grpo", c);
    ADD_FAILURE() << "loading a GRPO checkpoint into PPO should fail";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("critic"), std::string::npos) << e.what();
  }
}

// On a CPU without bf16 dot products a bf16 model's PPO trains in fp32, the critic too: its
// steps equal an fp32 model's bit for bit, the critic's weights are fp32 (its checkpoint file
// holds them rounded to bf16), and a resume from the bf16 files continues bit for bit.
TEST(Ppo, Bf16CriticTrainsInFp32WhereBf16MatmulsWiden) {
  if (!swarm::bf16_matmul_widens())
    GTEST_SKIP() << "this CPU has bf16 dot products (SWARM_CPU_LEVEL=avx2 emulates one without)";
  swarm::testing::ScratchDir scratch("swarm-ppo-bf16");
  const TrainBatch batch = batch_with_token_rewards(17);
  TrainerOptions o = ppo_options();
  o.ppo_mini_batch_size = 1;  // two optimizer steps per policy step
  auto master = DecoderModel::load(tinystories(), DType::F32);
  auto bf16_model = DecoderModel::load(tinystories(), DType::BF16);
  PolicyTrainer want(DecoderModel::load(tinystories(), DType::F32), o),
      got(bf16_model, o, nullptr, master ? &master->parameters() : nullptr);
  for (int step = 1; step <= 2; ++step) {
    const auto mw = want.train(batch, step, kInline), mg = got.train(batch, step, kInline);
    for (const char* key : {"loss", "critic_loss", "critic_value_mse", "critic_grad_norm"})
      EXPECT_EQ(mg.at(key), mw.at(key)) << key << " at step " << step;
  }
  const FlatParameters& cw = want.critic()->parameters();
  const FlatParameters& cg = got.critic()->parameters();
  ASSERT_EQ(cg.size(), cw.size());
  for (size_t i = 0; i < cg.size(); ++i) {
    EXPECT_EQ(cg.view(i).scalar_type(), torch::kFloat) << cg.name(i);
    EXPECT_TRUE(torch::equal(cg.view(i), cw.view(i))) << cg.name(i);
  }
  for (const auto& [name, w] : got.critic()->weights()) {
    EXPECT_EQ(w.scalar_type(), torch::kBFloat16) << name;
    EXPECT_TRUE(torch::equal(w, want.critic()->weights().at(name).to(torch::kBFloat16))) << name;
  }

  save_hf_model(scratch.path() / "ckpt", *bf16_model, tinystories());
  save_trainer_state(scratch.path() / "ckpt" / "trainer_state", got);
  PolicyTrainer resumed(DecoderModel::load(scratch.path() / "ckpt", DType::BF16), o);
  load_trainer_state(scratch.path() / "ckpt" / "trainer_state", resumed);
  const auto mg = got.train(batch, 3, kInline), mr = resumed.train(batch, 3, kInline);
  EXPECT_EQ(mr.at("loss"), mg.at("loss"));
  EXPECT_EQ(mr.at("critic_loss"), mg.at("critic_loss"));
  for (const auto& [name, w] : got.weights())
    EXPECT_TRUE(torch::equal(w, resumed.weights().at(name))) << name;
  for (size_t i = 0; i < cg.size(); ++i)
    EXPECT_TRUE(torch::equal(cg.view(i), resumed.critic()->parameters().view(i))) << "critic " << cg.name(i);

  // With the option off the critic computes in bf16, as its model does.
  o.fp32_compute_without_bf16_dot = false;
  PolicyTrainer bf16_compute(DecoderModel::load(tinystories(), DType::BF16), o);
  EXPECT_EQ(bf16_compute.critic()->parameters().view(0).scalar_type(), torch::kBFloat16);
}

}  // namespace
}  // namespace swarm
