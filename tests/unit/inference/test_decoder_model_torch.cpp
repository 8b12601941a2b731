// The decoder forward pass against an independent python3-torch reference
// (tests/reference/llama_reference.py, run with /usr/bin/python3), and the paged-cache step
// against the full forward.
//
// Tolerances. fp32: max|ours - ref| / max|ref| per sequence <= 1e-4 (the bar); both sides
// do the same math in fp32 with different op orders and blockings, so real differences are
// ~1e-6 and any bug in RoPE, masking, GQA or norms shows up as O(1). bf16: every matmul output is
// rounded to 8 mantissa bits (relative step 2^-8 = 0.4%), and two implementations that fuse or
// block differently round at different places (here: the padded batch vs the reference's
// one-sequence matmuls; measured max rel ~1e-2, mean/spread ~1e-3), so logits legitimately
// differ by up to a few 1e-2 absolute. We require top-1 agreement on >= 95% of positions (random
// prompts have near-ties), mean |error| <= 1% of the logits' spread and max relative error <= 5%,
// whereas a real bug (wrong rotation, mask or head mapping) drops top-1 agreement towards chance
// and the errors to O(100%).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/kv_cache_torch.hpp"
#include "model/model_config.hpp"
#include "model/safetensors.hpp"
#include "support/scratch_dir.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path tinystories() { return fs::path(SWARM_FIXTURES_DIR) / "models" / "tinystories-656k"; }
fs::path reference_script() {
  return fs::path(SWARM_SOURCE_DIR) / "tests" / "reference" / "llama_reference.py";
}

// A fresh scratch directory per test, removed afterwards.
struct ScratchDir : swarm::testing::ScratchDir {
  ScratchDir() : swarm::testing::ScratchDir("swarm-decoder") {}
};

// Runs the python reference on `request`; throws (failing the test) with its stderr on error.
json run_reference(const json& request, const fs::path& scratch) {
  return swarm::testing::run_python_reference(reference_script(), request, scratch);
}

// The reference's logits of sequence b as a [T, V] tensor.
torch::Tensor reference_logits(const json& ref, size_t b) {
  const json& rows = ref.at("logits").at(b);
  const int64_t T = static_cast<int64_t>(rows.size()), V = static_cast<int64_t>(rows.at(0).size());
  torch::Tensor out = torch::empty({T, V}, torch::kFloat);
  float* p = out.data_ptr<float>();
  for (const json& row : rows) {
    for (const json& v : row) *p++ = v.get<float>();
  }
  return out;
}

struct Errors {
  double max_rel = 0;  // max over sequences of max|a - b| / max|b|
  double max_abs = 0;
  double mean_abs = 0;  // over all compared logits
  double mean_abs_over_spread = 0;
  int64_t positions = 0, top1_agree = 0;
  int64_t elements = 0;

  void add(const torch::Tensor& ours, const torch::Tensor& ref) {
    ASSERT_EQ(ours.sizes(), ref.sizes());
    const torch::Tensor diff = (ours.to(torch::kDouble) - ref.to(torch::kDouble)).abs();
    const double scale = ref.abs().max().item<double>();
    max_rel = std::max(max_rel, diff.max().item<double>() / scale);
    max_abs = std::max(max_abs, diff.max().item<double>());
    const double spread = (ref.max() - ref.min()).item<double>();
    const int64_t n = diff.numel();
    mean_abs = (mean_abs * static_cast<double>(elements) + diff.sum().item<double>()) /
               static_cast<double>(elements + n);
    mean_abs_over_spread = std::max(mean_abs_over_spread, diff.mean().item<double>() / spread);
    elements += n;
    positions += ours.size(0);
    top1_agree += ours.argmax(-1).eq(ref.argmax(-1)).sum().item<int64_t>();
  }
  double top1() const {
    return positions ? static_cast<double>(top1_agree) / static_cast<double>(positions) : 0;
  }
  std::string str() const {
    std::ostringstream s;
    s << "max rel " << max_rel << ", max abs " << max_abs << ", mean abs " << mean_abs << ", top-1 agreement "
      << top1_agree << "/" << positions;
    return s.str();
  }
};

// Fixed-seed random prompts, lengths 1..100.
std::vector<std::vector<int32_t>> random_prompts(int64_t vocab, std::vector<int> lengths, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int len : lengths) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
    out.push_back(std::move(p));
  }
  return out;
}

// A right-padded [B, T] batch (padding id `pad`) and its lengths.
std::pair<torch::Tensor, torch::Tensor> pad_batch(const std::vector<std::vector<int32_t>>& seqs,
                                                  int64_t pad = 0) {
  int64_t T = 0;
  for (const auto& s : seqs) T = std::max<int64_t>(T, static_cast<int64_t>(s.size()));
  torch::Tensor ids = torch::full({static_cast<int64_t>(seqs.size()), T}, pad, torch::kLong);
  torch::Tensor lens = torch::empty({static_cast<int64_t>(seqs.size())}, torch::kLong);
  for (size_t b = 0; b < seqs.size(); ++b) {
    for (size_t t = 0; t < seqs[b].size(); ++t)
      ids[static_cast<int64_t>(b)][static_cast<int64_t>(t)] = seqs[b][t];
    lens[static_cast<int64_t>(b)] = static_cast<int64_t>(seqs[b].size());
  }
  return {ids, lens};
}

torch::Tensor full_logits(const DecoderModel& m, const std::vector<int32_t>& seq) {
  auto [ids, lens] = pad_batch({seq});
  return m.forward_full(ids, lens)[0];
}

// The sequences end to end in one row, as the trainer packs a micro-batch.
TrainingTokens pack_tokens(const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<int64_t> ids, lengths;
  for (const auto& s : seqs) {
    ids.insert(ids.end(), s.begin(), s.end());
    lengths.push_back(static_cast<int64_t>(s.size()));
  }
  return TrainingTokens{torch::tensor(ids, torch::kLong), lengths, /*packed=*/true};
}

json batch_json(const std::vector<std::vector<int32_t>>& seqs) {
  json b = json::array();
  for (const auto& s : seqs) b.push_back(s);
  return b;
}

class DecoderModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_directory(tinystories()))
        << "test fixture missing: " << tinystories() << " (SWARM_FIXTURES_DIR=" SWARM_FIXTURES_DIR ")";
    set_compute_threads(2);
  }
  // The prompts of the TinyStories parity tests (fixed seed, lengths 1..100).
  static std::vector<std::vector<int32_t>> prompts() {
    return random_prompts(2048, {1, 3, 9, 28, 57, 100}, 20240611);
  }
};

// ---------------------------------------------------------------- parity with the reference

TEST_F(DecoderModelTest, TinyStoriesFp32LogitsMatchReference) {
  ScratchDir scratch;
  const auto seqs = prompts();
  const json ref =
      run_reference({{"model_dir", tinystories().string()}, {"batch", batch_json(seqs)}, {"dtype", "fp32"}},
                    scratch.path());
  auto model = DecoderModel::load(tinystories(), DType::F32);
  ASSERT_EQ(model->config().vocab_size, 2048);

  Errors single, padded;
  for (size_t b = 0; b < seqs.size(); ++b) single.add(full_logits(*model, seqs[b]), reference_logits(ref, b));
  // The same prompts as one right-padded batch of different lengths.
  auto [ids, lens] = pad_batch(seqs, /*pad=*/7);
  const torch::Tensor batched = model->forward_full(ids, lens);
  ASSERT_EQ(batched.sizes(), (std::vector<int64_t>{6, 100, 2048}));
  EXPECT_TRUE(batched.isfinite().all().item<bool>()) << "padded positions must stay finite";
  for (size_t b = 0; b < seqs.size(); ++b) {
    padded.add(batched[static_cast<int64_t>(b)].narrow(0, 0, static_cast<int64_t>(seqs[b].size())),
               reference_logits(ref, b));
  }
  std::cout << "[fp32 single ] " << single.str() << "\n[fp32 padded ] " << padded.str() << std::endl;
  EXPECT_LE(single.max_rel, 1e-4) << single.str();
  EXPECT_LE(padded.max_rel, 1e-4) << padded.str();
  EXPECT_LE(single.max_abs, 1e-3) << single.str();
  EXPECT_LE(padded.max_abs, 1e-3) << padded.str();
  EXPECT_EQ(single.top1_agree, single.positions);
}

TEST_F(DecoderModelTest, TinyStoriesBf16LogitsMatchBf16Reference) {
  ScratchDir scratch;
  const auto seqs = prompts();
  const json ref =
      run_reference({{"model_dir", tinystories().string()}, {"batch", batch_json(seqs)}, {"dtype", "bf16"}},
                    scratch.path());
  auto model = DecoderModel::load(tinystories(), DType::BF16);
  EXPECT_EQ(model->parameters()[0].second.scalar_type(), torch::kBFloat16);
  Errors single, padded;
  for (size_t b = 0; b < seqs.size(); ++b) single.add(full_logits(*model, seqs[b]), reference_logits(ref, b));
  auto [ids, lens] = pad_batch(seqs);
  const torch::Tensor batched = model->forward_full(ids, lens);
  for (size_t b = 0; b < seqs.size(); ++b) {
    padded.add(batched[static_cast<int64_t>(b)].narrow(0, 0, static_cast<int64_t>(seqs[b].size())),
               reference_logits(ref, b));
  }
  std::cout << "[bf16 single ] " << single.str() << " (mean/spread " << single.mean_abs_over_spread << ")\n"
            << "[bf16 padded ] " << padded.str() << " (mean/spread " << padded.mean_abs_over_spread << ")"
            << std::endl;
  for (const Errors* e : {&single, &padded}) {
    EXPECT_GE(e->top1(), 0.95) << e->str();
    EXPECT_LE(e->mean_abs_over_spread, 0.01) << e->str();
    EXPECT_LE(e->max_rel, 0.05) << e->str();
  }
}

// Prefill all prompts in one step (the 1-token prompt joins the decode group), then decode them
// together, 64 tokens each, argmax; the reference re-runs a full forward for every token.
TEST_F(DecoderModelTest, GreedyGenerationWithCacheMatchesReference) {
  ScratchDir scratch;
  const auto seqs = random_prompts(2048, {1, 12, 45}, 777);
  constexpr int kTokens = 64;
  const json ref = run_reference({{"model_dir", tinystories().string()},
                                  {"batch", batch_json(seqs)},
                                  {"dtype", "fp32"},
                                  {"greedy_tokens", kTokens}},
                                 scratch.path());
  auto model = DecoderModel::load(tinystories(), DType::F32);
  KvCache cache = KvCache::for_model(model->config(), /*num_blocks=*/64, /*block_size=*/16, torch::kFloat);

  std::vector<StepInput> step;
  for (size_t s = 0; s < seqs.size(); ++s) {
    ASSERT_TRUE(
        cache.ensure_capacity(static_cast<int64_t>(s), static_cast<int64_t>(seqs[s].size()) + kTokens));
    step.push_back({static_cast<int64_t>(s), seqs[s], 0});
  }
  std::vector<std::vector<int64_t>> generated(seqs.size());
  torch::Tensor logits = model->forward_step(step, cache);
  for (int t = 0; t < kTokens; ++t) {
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{3, 2048}));
    const torch::Tensor next = logits.argmax(-1);
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t tok = next[static_cast<int64_t>(s)].item<int64_t>();
      generated[s].push_back(tok);
      step[s].start_pos += static_cast<int64_t>(step[s].tokens.size());
      step[s].tokens = {static_cast<int32_t>(tok)};
    }
    if (t + 1 < kTokens) logits = model->forward_step(step, cache);
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    EXPECT_EQ(generated[s], ref.at("greedy").at(s).get<std::vector<int64_t>>()) << "prompt " << s;
  }
}

// ---------------------------------------------------------------- cache == full forward

struct StepRun {
  StepRun(std::vector<int32_t> tokens_, int64_t slot_, int64_t chunk_)
      : tokens(std::move(tokens_)), slot(slot_), chunk(chunk_) {}
  std::vector<int32_t> tokens;
  int64_t slot;
  int64_t chunk;  // tokens per step
  int64_t done = 0;
  std::vector<torch::Tensor> logits;  // [n, V] per step
};

// Runs several sequences through forward_step in the same step batches (each advancing by its
// own chunk size every step), and returns the concatenated per-token logits of each.
std::vector<torch::Tensor> run_interleaved(const DecoderModel& model, KvCache& cache,
                                           std::vector<StepRun> runs) {
  while (true) {
    std::vector<StepInput> step;
    std::vector<size_t> who;
    for (size_t r = 0; r < runs.size(); ++r) {
      StepRun& run = runs[r];
      const int64_t left = static_cast<int64_t>(run.tokens.size()) - run.done;
      if (left == 0) continue;
      const int64_t n = std::min(left, run.chunk);
      EXPECT_TRUE(cache.ensure_capacity(run.slot, run.done + n));
      step.push_back({run.slot,
                      std::vector<int32_t>(run.tokens.begin() + run.done, run.tokens.begin() + run.done + n),
                      run.done});
      who.push_back(r);
    }
    if (step.empty()) break;
    const torch::Tensor all = model.forward_step(step, cache, /*all_logits=*/true);
    int64_t row = 0;
    for (size_t i = 0; i < step.size(); ++i) {
      const int64_t n = static_cast<int64_t>(step[i].tokens.size());
      runs[who[i]].logits.push_back(all.narrow(0, row, n));
      runs[who[i]].done += n;
      row += n;
    }
    EXPECT_EQ(row, all.size(0));
  }
  std::vector<torch::Tensor> out;
  for (auto& run : runs) out.push_back(at::cat(run.logits, 0));
  return out;
}

double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST_F(DecoderModelTest, CachedDecodingEqualsFullForwardAtEveryPosition) {
  auto model = DecoderModel::load(tinystories(), DType::F32);
  const auto seqs = random_prompts(2048, {100, 61, 30}, 99);
  std::vector<torch::Tensor> full;
  for (const auto& s : seqs) full.push_back(full_logits(*model, s));

  // Token by token, last-token logits only (the decode path).
  {
    KvCache cache = KvCache::for_model(model->config(), 32, 4, torch::kFloat);
    double worst = 0;
    for (int64_t pos = 0; pos < 100; ++pos) {
      ASSERT_TRUE(cache.ensure_capacity(0, pos + 1));
      const torch::Tensor l = model->forward_step({{0, {seqs[0][static_cast<size_t>(pos)]}, pos}}, cache);
      ASSERT_EQ(l.sizes(), (std::vector<int64_t>{1, 2048}));
      worst = std::max(worst, rel_error(l[0], full[0][pos]));
    }
    std::cout << "[token by token] max rel " << worst << std::endl;
    EXPECT_LE(worst, 1e-5);
  }
  // Chunked prefill (chunks of 7) with small blocks shared out between three sequences that
  // advance together: one prefilling in chunks of 7, one decoding token by token, one in chunks
  // of 13 — so decode and prefill groups meet in the same steps and block tables interleave.
  {
    KvCache cache = KvCache::for_model(model->config(), 64, 4, torch::kFloat);
    const auto got = run_interleaved(*model, cache, {{seqs[0], 10, 7}, {seqs[1], 11, 1}, {seqs[2], 12, 13}});
    for (size_t s = 0; s < seqs.size(); ++s) {
      const double err = rel_error(got[s], full[s]);
      std::cout << "[interleaved " << s << "] max rel " << err << std::endl;
      EXPECT_LE(err, 1e-5) << "sequence " << s;
    }
    EXPECT_EQ(cache.free_blocks(), 64 - (25 + 16 + 8));
    for (int64_t slot : {10, 11, 12}) cache.release(slot);
    EXPECT_EQ(cache.free_blocks(), 64);
  }
  // Prefill of the whole prompt in one chunk, then one sequence finishes while another starts
  // in recycled blocks: stale K/V in reused blocks must not leak into the newcomer.
  {
    KvCache cache = KvCache::for_model(model->config(), 26, 4, torch::kFloat);
    auto a = run_interleaved(*model, cache, {{seqs[0], 0, 100}});
    EXPECT_LE(rel_error(a[0], full[0]), 1e-5);
    cache.release(0);
    auto b = run_interleaved(*model, cache, {{seqs[2], 1, 5}});
    EXPECT_LE(rel_error(b[0], full[2]), 1e-5);
  }
}

TEST_F(DecoderModelTest, Bf16CachedDecodingTracksBf16FullForward) {
  auto model = DecoderModel::load(tinystories(), DType::BF16);
  const auto seqs = random_prompts(2048, {40, 17}, 5);
  KvCache cache = KvCache::for_model(model->config(), 32, 8, torch::kBFloat16);
  const auto got = run_interleaved(*model, cache, {{seqs[0], 0, 7}, {seqs[1], 1, 1}});
  for (size_t s = 0; s < seqs.size(); ++s) {
    Errors e;
    e.add(got[s], full_logits(*model, seqs[s]));
    std::cout << "[bf16 cache vs full " << s << "] " << e.str() << " (mean/spread " << e.mean_abs_over_spread
              << ")" << std::endl;
    EXPECT_GE(e.top1(), 0.95) << e.str();
    EXPECT_LE(e.mean_abs_over_spread, 0.01) << e.str();
    EXPECT_LE(e.max_rel, 0.05) << e.str();
  }
}

// ---------------------------------------------------------------- other families (random weights)

// Writes config.json and random F32 weights for it (unit-scale activations, so logits are O(1)).
ModelConfig write_random_model(const fs::path& dir, const json& config, uint64_t seed) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  const ModelConfig cfg = ModelConfig::from_directory(dir);
  torch::manual_seed(seed);
  std::vector<torch::Tensor> keep;
  std::vector<TensorData> data;
  for (const TensorSpec& spec : cfg.expected_tensors()) {
    torch::Tensor t;
    const auto& n = spec.name;
    if (n.ends_with("norm.weight")) {
      t = 1 + 0.2 * torch::randn(spec.shape);
    } else if (n.ends_with(".bias")) {
      t = 0.2 * torch::randn(spec.shape);
    } else if (n == "model.embed_tokens.weight") {
      t = torch::randn(spec.shape);
    } else {
      t = torch::randn(spec.shape) / std::sqrt(static_cast<double>(spec.shape[1]));
    }
    keep.push_back(t.contiguous());
    data.push_back({n,
                    DType::F32,
                    spec.shape,
                    {reinterpret_cast<const std::byte*>(keep.back().data_ptr()), keep.back().nbytes()}});
  }
  write_safetensors(dir / "model.safetensors", data);
  return cfg;
}

json qwen2_config() {
  return {{"architectures", {"Qwen2ForCausalLM"}},
          {"model_type", "qwen2"},
          {"vocab_size", 300},
          {"hidden_size", 96},
          {"intermediate_size", 160},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 6},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 256},
          {"rope_theta", 1000000.0},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", true},
          {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}},
          {"hidden_act", "silu"}};
}

json qwen3_config() {
  // head_dim 32 != hidden / heads (16), untied head, llama3 RoPE scaling spanning all three bands.
  return {{"architectures", {"Qwen3ForCausalLM"}},
          {"model_type", "qwen3"},
          {"vocab_size", 300},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 32},
          {"max_position_embeddings", 256},
          {"rope_theta", 10000.0},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"},
          {"rope_scaling",
           {{"rope_type", "llama3"},
            {"factor", 8.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 64}}}};
}

void check_random_family(const json& config, const std::string& what) {
  ScratchDir scratch;
  const fs::path dir = scratch.path() / "model";
  const ModelConfig cfg = write_random_model(dir, config, 42);
  const auto seqs = random_prompts(cfg.vocab_size, {1, 23, 80}, 3);
  const json ref = run_reference(
      {{"model_dir", dir.string()}, {"batch", batch_json(seqs)}, {"dtype", "fp32"}}, scratch.path());
  auto model = DecoderModel::load(dir, DType::F32);
  Errors full, padded, cached, packed_eager, packed_blockwise, padded_blockwise;
  auto [ids, lens] = pad_batch(seqs);
  const torch::Tensor batched = model->forward_full(ids, lens);
  KvCache cache = KvCache::for_model(cfg, 64, 8, torch::kFloat);
  const auto stepped = run_interleaved(*model, cache, {{seqs[0], 0, 1}, {seqs[1], 1, 1}, {seqs[2], 2, 7}});
  // The trainer's forwards: the prompts packed end to end in one row (eager attention with a
  // block-diagonal mask, and the blockwise kernel with blocks of 16 tokens, so the 80-token
  // prompt spans several query and key blocks and a window of 8 starts inside them), and the
  // padded batch through the blockwise kernel.
  const TrainingTokens packed = pack_tokens(seqs);
  const auto packed_logits = [&](TrainingAttention a) {
    return model->head_logits(model->final_hidden(packed, TrainingForward{a, false, 16}));
  };
  const torch::Tensor by_eager = packed_logits(TrainingAttention::EAGER);
  const torch::Tensor by_blocks = packed_logits(TrainingAttention::BLOCKWISE);
  const torch::Tensor padded_blocks = model->head_logits(model->final_hidden(
      padded_tokens(ids, lens), TrainingForward{TrainingAttention::BLOCKWISE, false, 16}));
  int64_t at = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const torch::Tensor r = reference_logits(ref, b);
    const auto n = static_cast<int64_t>(seqs[b].size());
    full.add(full_logits(*model, seqs[b]), r);
    padded.add(batched[static_cast<int64_t>(b)].narrow(0, 0, n), r);
    cached.add(stepped[b], r);
    packed_eager.add(by_eager.narrow(0, at, n), r);
    packed_blockwise.add(by_blocks.narrow(0, at, n), r);
    padded_blockwise.add(padded_blocks[static_cast<int64_t>(b)].narrow(0, 0, n), r);
    at += n;
  }
  std::cout << "[" << what << " full  ] " << full.str() << "\n[" << what << " padded] " << padded.str()
            << "\n[" << what << " cached] " << cached.str() << "\n[" << what << " packed eager] "
            << packed_eager.str() << "\n[" << what << " packed blockwise] " << packed_blockwise.str() << "\n["
            << what << " padded blockwise] " << padded_blockwise.str() << std::endl;
  for (const Errors* e : {&full, &padded, &cached, &packed_eager, &packed_blockwise, &padded_blockwise}) {
    EXPECT_LE(e->max_rel, 1e-4) << what << ": " << e->str();
    EXPECT_EQ(e->top1_agree, e->positions) << what << ": " << e->str();
  }
}

TEST_F(DecoderModelTest, RandomQwen2WithQkvBiasMatchesReference) {
  check_random_family(qwen2_config(), "qwen2");
}

TEST_F(DecoderModelTest, RandomQwen3WithQkNormMatchesReference) {
  check_random_family(qwen3_config(), "qwen3");
}

json mistral_config() {
  return {{"architectures", {"MistralForCausalLM"}},
          {"model_type", "mistral"},
          {"vocab_size", 300},
          {"hidden_size", 64},
          {"intermediate_size", 96},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 1},
          {"max_position_embeddings", 256},
          {"rope_theta", 10000.0},
          {"rms_norm_eps", 1e-5},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"}};
}

// Sliding windows per layer, as transformers applies them, against the reference (which reads
// the same config keys independently): full forward, padded batch and the paged serving step.
// The prompts (23 and 80 tokens) run well past the window of 8, so a layer windowed that should
// not be (or the reverse) moves the logits by O(1) against the 1e-4 bound.
TEST_F(DecoderModelTest, Qwen2SlidingWindowFlagWithNoWindowedLayerMatchesReference) {
  json config = qwen2_config();  // 2 layers; max_window_layers = layers: transformers windows none
  config["use_sliding_window"] = true;
  config["sliding_window"] = 8;
  config["max_window_layers"] = 2;
  const ModelConfig cfg = ModelConfig::from_json(config.dump());
  EXPECT_FALSE(cfg.any_layer_windowed());
  check_random_family(config, "qwen2 max_window_layers=2");
}

TEST_F(DecoderModelTest, Qwen2SlidingWindowFromMaxWindowLayersMatchesReference) {
  json config = qwen2_config();  // layer 1 windowed, layer 0 full
  config["use_sliding_window"] = true;
  config["sliding_window"] = 8;
  config["max_window_layers"] = 1;
  const ModelConfig cfg = ModelConfig::from_json(config.dump());
  EXPECT_FALSE(cfg.layer_window(0).has_value());
  EXPECT_EQ(cfg.layer_window(1), 8);
  check_random_family(config, "qwen2 max_window_layers=1");
}

TEST_F(DecoderModelTest, Qwen3SlidingWindowFromLayerTypesMatchesReference) {
  json config = qwen3_config();  // layer_types wins over max_window_layers
  config["use_sliding_window"] = true;
  config["sliding_window"] = 8;
  config["max_window_layers"] = 2;
  config["layer_types"] = {"sliding_attention", "full_attention"};
  const ModelConfig cfg = ModelConfig::from_json(config.dump());
  EXPECT_EQ(cfg.layer_window(0), 8);
  EXPECT_FALSE(cfg.layer_window(1).has_value());
  check_random_family(config, "qwen3 layer_types");
}

TEST_F(DecoderModelTest, MistralSlidingWindowOnEveryLayerMatchesReference) {
  json config = mistral_config();
  config["sliding_window"] = 8;
  check_random_family(config, "mistral window 8");
}

// The RoPE tables against the reference's, which computes them in fp32 step for step as
// transformers does, at positions up to 32767 (a computation in double, rounded once, differs
// there by ~1e-4 to 1e-3: the angle's fp32 rounding grows with the position).
TEST_F(DecoderModelTest, RopeTablesMatchTransformersAtLongPositions) {
  ScratchDir scratch;
  const std::vector<int64_t> rows = {0, 1, 77, 4095, 16384, 32767};
  for (auto [name, base] :
       {std::pair<const char*, json>{"qwen2-linear", qwen2_config()}, {"qwen3-llama3", qwen3_config()}}) {
    json config = base;
    config["max_position_embeddings"] = 32768;
    write_random_model(scratch.path() / name, config, 5);
    auto model = DecoderModel::load(scratch.path() / name, DType::F32);
    const json ref =
        run_reference({{"rope_tables", config}, {"positions", 32768}, {"rows", rows}}, scratch.path());
    double worst_cos = 0, worst_sin = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const torch::Tensor want_cos = torch::tensor(ref.at("cos").at(r).get<std::vector<float>>());
      const torch::Tensor want_sin = torch::tensor(ref.at("sin").at(r).get<std::vector<float>>());
      worst_cos = std::max(worst_cos, (model->rope_cos()[rows[r]] - want_cos).abs().max().item<double>());
      worst_sin = std::max(worst_sin, (model->rope_sin()[rows[r]] - want_sin).abs().max().item<double>());
    }
    std::cout << "[" << name << "] max |cos - ref| " << worst_cos << ", max |sin - ref| " << worst_sin
              << std::endl;
    EXPECT_LE(worst_cos, 1e-5) << name;
    EXPECT_LE(worst_sin, 1e-5) << name;
  }
}

// Mistral's sliding window (the reference has none): in a one-layer model, the logits at
// position i depend only on the last `window` tokens, and RoPE is relative, so they equal the
// last logits of a forward over exactly those tokens.
TEST_F(DecoderModelTest, SlidingWindowSeesOnlyTheWindow) {
  ScratchDir scratch;
  json config = {{"architectures", {"MistralForCausalLM"}},
                 {"model_type", "mistral"},
                 {"vocab_size", 128},
                 {"hidden_size", 64},
                 {"intermediate_size", 96},
                 {"num_hidden_layers", 1},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 1},
                 {"max_position_embeddings", 128},
                 {"rope_theta", 10000.0},
                 {"rms_norm_eps", 1e-5},
                 {"tie_word_embeddings", false},
                 {"sliding_window", 6},
                 {"hidden_act", "silu"}};
  const ModelConfig cfg = write_random_model(scratch.path() / "m", config, 7);
  ASSERT_EQ(cfg.sliding_window, 6);
  auto model = DecoderModel::load(scratch.path() / "m", DType::F32);
  const auto seq = random_prompts(128, {30}, 11)[0];
  const torch::Tensor full = full_logits(*model, seq);
  for (int64_t i = 6; i < 30; i += 5) {
    const std::vector<int32_t> window(seq.begin() + (i - 5), seq.begin() + i + 1);
    EXPECT_LE(rel_error(full[i], full_logits(*model, window)[5]), 1e-5) << "position " << i;
  }
  // Not vacuous: the same weights without the window see further back.
  config.erase("sliding_window");
  write_random_model(scratch.path() / "nowindow", config, 7);
  auto unwindowed = DecoderModel::load(scratch.path() / "nowindow", DType::F32);
  EXPECT_GT(rel_error(full_logits(*unwindowed, seq)[20], full[20]), 1e-3);
  KvCache cache = KvCache::for_model(cfg, 16, 4, torch::kFloat);
  const auto got = run_interleaved(*model, cache, {{seq, 0, 4}});
  EXPECT_LE(rel_error(got[0], full), 1e-5);
}

// ---------------------------------------------------------------- training-facing behaviour

TEST_F(DecoderModelTest, ParametersAreNamedOwnedAndTied) {
  auto model = DecoderModel::load(tinystories(), DType::F32);
  const auto& params = model->parameters();
  const ModelConfig& cfg = model->config();
  ASSERT_EQ(params.size(), cfg.expected_tensors().size());
  int64_t count = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, cfg.expected_tensors()[i].name);
    EXPECT_EQ(params[i].second.scalar_type(), torch::kFloat);
    count += params[i].second.numel();
  }
  EXPECT_EQ(count, cfg.parameter_count());
  EXPECT_THROW(model->parameter("lm_head.weight"), SwarmError);  // tied: the head is the embedding
  // Owned: writable (a zero-copy tensor over the read-only mapping would crash here).
  torch::NoGradGuard no_grad;
  model->parameters()[1].second.mul_(1.0f);
}

TEST_F(DecoderModelTest, WeightsCanBeUpdatedInPlaceOrReplaced) {
  auto model = DecoderModel::load(tinystories(), DType::F32);
  const std::vector<int32_t> seq = {1, 200, 300, 400};
  const torch::Tensor before = full_logits(*model, seq);
  {
    torch::NoGradGuard no_grad;  // weight sync: copy new values into the existing tensor
    for (auto& [name, t] : model->parameters()) {
      if (name == "model.layers.1.mlp.down_proj.weight") t.copy_(t * 0.5f);
    }
  }
  const torch::Tensor halved = full_logits(*model, seq);
  EXPECT_GT((halved - before).abs().max().item<float>(), 1e-3f);
  for (auto& [name, t] : model->parameters()) {
    if (name == "model.layers.1.mlp.down_proj.weight") t = t * 2;  // replaced by a new tensor
  }
  EXPECT_LE(rel_error(full_logits(*model, seq), before), 1e-6);
}

// The serving path computes q/k/v (and gate/up) with one GEMM over weights stacked at load, the
// parameters() entries being views into them. It must follow a weight sync (in-place copy into
// the entry) and a replaced entry (a new tensor: the stacked copy is stale, so it falls back),
// for prefill chunks (GEMM) and single-token decode (small-row kernel) alike.
TEST_F(DecoderModelTest, ServingFollowsUpdatesOfMergedProjections) {
  std::shared_ptr<DecoderModel> model;
  const std::vector<int32_t> seq = {1, 200, 300, 400, 500, 17, 33, 90};
  auto serving_logits = [&] {  // prefill of 5 in one step, then 3 single-token steps
    KvCache cache = KvCache::for_model(model->config(), 8, 4, torch::kFloat);
    std::vector<torch::Tensor> rows;
    cache.ensure_capacity(0, static_cast<int64_t>(seq.size()));
    rows.push_back(model->forward_step({{0, {seq.begin(), seq.begin() + 5}, 0}}, cache, true));
    for (int64_t pos = 5; pos < static_cast<int64_t>(seq.size()); ++pos)
      rows.push_back(model->forward_step({{0, {seq[static_cast<size_t>(pos)]}, pos}}, cache));
    return torch::cat(rows, 0);
  };
  for (const char* which :
       {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"}) {
    model = DecoderModel::load(tinystories(), DType::F32);  // merged afresh
    const torch::Tensor original = full_logits(*model, seq);
    ASSERT_LE(rel_error(serving_logits(), original), 1e-5);
    const std::string name = std::string("model.layers.0.") + which + ".weight";
    torch::Tensor* entry = nullptr;
    for (auto& [n, t] : model->parameters())
      if (n == name) entry = &t;
    ASSERT_NE(entry, nullptr) << name;
    {
      torch::NoGradGuard no_grad;
      entry->copy_(*entry * 0.5f);  // in place, as the trainer's weight sync writes
    }
    const torch::Tensor synced = full_logits(*model, seq);
    EXPECT_GT((synced - original).abs().max().item<float>(), 1e-4f) << name;
    EXPECT_LE(rel_error(serving_logits(), synced), 1e-5) << name << " after an in-place update";
    *entry = *entry * 2;  // a new tensor with the original values
    EXPECT_LE(rel_error(full_logits(*model, seq), original), 1e-5) << name;
    EXPECT_LE(rel_error(serving_logits(), original), 1e-5) << name << " after a replacement";
  }
}

TEST_F(DecoderModelTest, ForwardFullIsDifferentiableAndIgnoresPadding) {
  auto model = DecoderModel::load(tinystories(), DType::F32);
  for (auto& [name, t] : model->parameters()) t.requires_grad_(true);
  const auto seqs = random_prompts(2048, {20, 5, 1}, 8);
  auto [ids, lens] = pad_batch(seqs, 0);
  const torch::Tensor logits = model->forward_full(ids, lens);
  // Next-token loss over the real positions only.
  torch::Tensor loss = torch::zeros({}, torch::kFloat);
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t n = static_cast<int64_t>(seqs[b].size());
    if (n < 2) continue;
    const torch::Tensor lp = at::log_softmax(logits[static_cast<int64_t>(b)].narrow(0, 0, n - 1), -1);
    loss = loss - lp.gather(1, ids[static_cast<int64_t>(b)].narrow(0, 1, n - 1).unsqueeze(1)).sum();
  }
  loss.backward();
  for (const auto& [name, t] : model->parameters()) {
    ASSERT_TRUE(t.grad().defined()) << name;
    EXPECT_TRUE(t.grad().isfinite().all().item<bool>()) << name;
  }
  EXPECT_GT(model->parameter("model.layers.0.self_attn.k_proj.weight").grad().abs().sum().item<float>(),
            0.0f);

  // Different padding ids change nothing at the real positions.
  torch::NoGradGuard no_grad;
  auto [ids2, lens2] = pad_batch(seqs, 1999);
  const torch::Tensor again = model->forward_full(ids2, lens2);
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t n = static_cast<int64_t>(seqs[b].size());
    EXPECT_LE((again[static_cast<int64_t>(b)].narrow(0, 0, n) -
               logits[static_cast<int64_t>(b)].narrow(0, 0, n).detach())
                  .abs()
                  .max()
                  .item<float>(),
              1e-6f);
  }
}

// ---------------------------------------------------------------- errors

TEST_F(DecoderModelTest, RejectsBadInputs) {
  auto model = DecoderModel::load(tinystories(), DType::F32);
  KvCache cache = KvCache::for_model(model->config(), 4, 16, torch::kFloat);
  // No capacity reserved: a scheduler bug, not a crash.
  EXPECT_THROW(model->forward_step({{0, {1, 2, 3}, 0}}, cache), SwarmError);
  ASSERT_TRUE(cache.ensure_capacity(0, 8));
  EXPECT_THROW(model->forward_step({{0, {4096}, 0}}, cache), SwarmError);            // token out of range
  EXPECT_THROW(model->forward_step({{0, {}, 0}}, cache), SwarmError);                // nothing to do
  EXPECT_THROW(model->forward_step({{0, {1}, 0}, {0, {2}, 1}}, cache), SwarmError);  // slot twice
  EXPECT_THROW(model->forward_step({{0, {1}, 600}}, cache), SwarmError);             // beyond context
  KvCache bf16_cache = KvCache::for_model(model->config(), 4, 16, torch::kBFloat16);
  ASSERT_TRUE(bf16_cache.ensure_capacity(0, 4));
  EXPECT_THROW(model->forward_step({{0, {1}, 0}}, bf16_cache), SwarmError);  // dtype mismatch
  EXPECT_THROW(model->forward_full(torch::zeros({1, 600}, torch::kLong), torch::full({1}, 600, torch::kLong)),
               SwarmError);
  EXPECT_THROW(DecoderModel::load(tinystories(), DType::I32), SwarmError);
}

TEST_F(DecoderModelTest, RejectsDynamicRopeAndMissingTensors) {
  ScratchDir scratch;
  json config = qwen2_config();
  config["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  write_random_model(scratch.path() / "dyn", config, 1);
  try {
    DecoderModel::load(scratch.path() / "dyn");
    FAIL() << "dynamic rope scaling should be refused";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("not supported yet"), std::string::npos) << e.what();
  }
  // A checkpoint missing a tensor names it.
  write_random_model(scratch.path() / "ok", qwen2_config(), 1);
  auto state = std::map<std::string, torch::Tensor>{};
  const ModelConfig cfg = ModelConfig::from_directory(scratch.path() / "ok");
  for (const auto& spec : cfg.expected_tensors()) state[spec.name] = torch::zeros(spec.shape);
  state.erase("model.layers.1.self_attn.k_proj.bias");
  try {
    DecoderModel::from_state_dict(cfg, state);
    FAIL() << "missing tensor should be refused";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.self_attn.k_proj.bias"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace swarm
