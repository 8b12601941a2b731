// bench_inference: the libtorch inference engine on CPU. For each model
// (SmolLM2-135M shape with random weights, TinyStories-656K) and compute dtype (fp32, bf16):
//
//  * prefill tokens/s: one 512-token prompt, and a batch of 8 x 128-token prompts, packed into
//    forward_step calls of at most 512 tokens (chunked prefill, as the serving engine does),
//    each finished prompt's first token sampled;
//  * decode tokens/s at batch 1, 8, 32, 64: every sequence starts with a 128-token prompt
//    (--context N: N tokens; over 1024, batch 1 and 8 only) in the paged KV cache (random
//    K/V: prefill is measured on its own), then each step is one forward_step over the batch
//    + greedy sample_tokens; the timed steps are run 3 times over
//    the same positions and the best pass counts (a batch-1 pass of a small model lasts a few
//    milliseconds, where one preemption on this shared host shows);
//  * memory: weight bytes, KV pool bytes, RSS after load and the VmHWM peak of the case.
//
// In the same run: a python3-torch eager reference (python_reference.py, a child process, the
// same weights, workload and thread count), a copy-bandwidth probe (roofline of batch-1 decode)
// and a matmul-peak probe (compute roofline of batched decode). Prints tables; progress goes to
// stderr. Never a timed assertion. Results and the exact command are recorded in
// docs/benchmarks.md.
//
//   bench_inference [--quick] [--threads N] [--models smollm2,tinystories] [--dtypes fp32,bf16]
//                   [--skip-python] [--profile-ops] [--openblas-threads N] [--context N]
//
// The SmolLM2 weights are written once (swarm::init_random_model, fp32, seed 0) into
// <build>/bench-models/ and reused; TinyStories comes from tests/fixtures/models/.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/version.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/engine_runs.hpp"
#include "common/torch_bench.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/kv_cache_torch.hpp"
#include "inference/sampler_torch.hpp"
#include "model/model_config.hpp"
#include "model/model_tools.hpp"
#include "model/safetensors.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace swarm::bench;  // machine probes, matmul peak, Python child, model cache, op profile

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int64_t kBlockSize = 16;  // KV cache block, tokens

template <typename... Args>
void progress(const char* fmt, Args... args) {
  progress_line("bench_inference", fmt, args...);
}

// ------------------------------------------------------------------ probes

struct Probes {
  double copy_gbs = 0;  // best, read + write bytes counted
  std::vector<double> copy_runs;
  int64_t copy_bytes = 0;
  int64_t gemm_n = 0;
  double peak_f32 = 0, peak_bf16 = 0;  // FLOP/s with the bench's thread count
  // With one libtorch intra-op thread. OpenBLAS (fp32 GEMM) keeps its own pool, so the fp32
  // figure still uses every core (measured here: 198 GFLOP/s against 122 with N threads).
  double peak_f32_1t = 0, peak_bf16_1t = 0;

  /// The compute ceiling of `t`: the better of the two probes (the engine could always run on
  /// one thread, so a 1-thread figure above the N-thread one means the N-thread probe is low).
  double peak(c10::ScalarType t) const {
    return t == at::kBFloat16 ? std::max(peak_bf16, peak_bf16_1t) : std::max(peak_f32, peak_f32_1t);
  }
};

Probes run_probes(int threads, bool quick) {
  Probes p;
  p.copy_bytes = (quick ? 256 : 512) * 1024 * 1024LL;
  p.copy_gbs = copy_bandwidth(p.copy_bytes, quick ? 3 : 8, p.copy_runs);
  progress("copy bandwidth %.1f GB/s (read+write, %d threads)", p.copy_gbs, threads);
  p.gemm_n = 2048;
  const int reps = quick ? 2 : 4;
  const double seconds = quick ? 0.3 : 1.0;
  p.peak_f32 = matmul_peak(at::kFloat, p.gemm_n, reps, seconds);
  p.peak_bf16 = matmul_peak(at::kBFloat16, p.gemm_n, reps, seconds);
  at::set_num_threads(1);
  p.peak_f32_1t = matmul_peak(at::kFloat, p.gemm_n, reps, seconds);
  p.peak_bf16_1t = matmul_peak(at::kBFloat16, p.gemm_n, reps, seconds);
  swarm::set_compute_threads(threads);
  progress("matmul peak fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s (1 libtorch thread: %.1f / %.1f)",
           p.peak_f32 / 1e9, p.peak_bf16 / 1e9, p.peak_f32_1t / 1e9, p.peak_bf16_1t / 1e9);
  return p;
}

// ------------------------------------------------------------------ workload

struct PrefillSpec {
  std::string name;
  int64_t batch = 1;   // prompts
  int64_t tokens = 0;  // tokens per prompt
};

// batch, warmup (untimed steps), steps (timed), reps (passes over the same positions; the best
// counts): the case bench_anchor times too (bench/common/engine_runs.hpp).
using DecodeSpec = EngineDecodeSpec;

/// The same workload runs in C++ and in Python.
struct Workload {
  std::vector<PrefillSpec> prefill;
  int64_t prefill_reps = 2;     // best of
  int64_t chunk_tokens = 512;   // prefill tokens per forward_step (C++ only)
  int64_t prompt_tokens = 128;  // already in the cache when decode starts
  std::vector<DecodeSpec> decode;

  /// KV blocks the largest phase needs (a prefill or a decode batch, including the warm-up).
  int64_t blocks_needed() const {
    auto blocks = [](int64_t tokens) { return (tokens + kBlockSize - 1) / kBlockSize; };
    int64_t need = blocks(64 + 8);  // warm-up
    for (const auto& p : prefill) need = std::max(need, p.batch * blocks(p.tokens));
    for (const auto& d : decode) need = std::max(need, d.batch * blocks(prompt_tokens + d.warmup + d.steps));
    return need;
  }
};

Workload make_workload(bool quick, int64_t max_positions, int64_t context) {
  Workload w;
  w.prompt_tokens = context;
  // The quick run shrinks the prefill prompts too: a 512-token prompt of the 135M model takes
  // seconds per rep on a 2-core machine.
  if (quick) {
    w.prefill = {{"1x128", 1, 128}, {"4x32", 4, 32}};
  } else {
    w.prefill = {{"1x512", 1, std::min<int64_t>(512, max_positions)}, {"8x128", 8, 128}};
  }
  w.prefill_reps = quick ? 1 : 2;
  for (int64_t b : {1, 8, 32, 64}) {
    if (context > 1024 && b > 8) continue;  // long contexts: the KV pool for batch 32/64 would be GBs
    DecodeSpec d;
    d.batch = b;
    d.warmup = quick ? 1 : 2;
    // Smaller batches are cheap per step: more steps for a steadier figure.
    d.steps = quick ? (b == 1 ? 4 : 2) : (b == 1 ? 48 : b == 8 ? 24 : 12);
    d.reps = quick ? 1 : 3;
    w.decode.push_back(d);
  }
  const int64_t longest = context + w.decode.front().warmup + w.decode.front().steps;
  if (longest > max_positions)
    throw std::invalid_argument("--context " + std::to_string(context) + " plus the decode steps (" +
                                std::to_string(longest) + " positions) exceeds the model's " +
                                std::to_string(max_positions) + " (use --models smollm2)");
  return w;
}

// ------------------------------------------------------------------ model arithmetic

/// Sizes the rooflines need, from the loaded parameters.
struct ModelShape {
  int64_t weight_bytes = 0;   // every parameter once (tied head = embedding)
  int64_t linear_params = 0;  // matrices a token multiplies with: projections, MLP, LM head
  int64_t head_params = 0;    // the LM head alone
  int64_t kv_bytes_per_token = 0;
  int64_t layers = 0, heads = 0, head_dim = 0;
  int64_t element_size = 4;
};

ModelShape model_shape(const swarm::DecoderModel& model) {
  const swarm::ModelConfig& c = model.config();
  ModelShape s;
  s.layers = c.num_hidden_layers;
  s.heads = c.num_attention_heads;
  s.head_dim = c.head_dim;
  s.element_size = model.scalar_type() == at::kBFloat16 ? 2 : 4;
  for (const auto& [name, t] : model.parameters()) {
    s.weight_bytes += t.numel() * static_cast<int64_t>(t.element_size());
    const bool embedding = name == "model.embed_tokens.weight";
    if (t.dim() == 2 && (!embedding || c.tie_word_embeddings)) s.linear_params += t.numel();
    if (name == "lm_head.weight" || (embedding && c.tie_word_embeddings)) s.head_params = t.numel();
  }
  s.kv_bytes_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * s.element_size;
  return s;
}

/// FLOPs of one decode step of `batch` sequences at context length `ctx`: every linear weight
/// once per token (2 FLOP per multiply-add), plus attention (q.k and p.v over ctx keys).
double decode_flops(const ModelShape& s, int64_t batch, double ctx) {
  const double attention = 4.0 * static_cast<double>(s.layers * s.heads * s.head_dim) * ctx;
  return static_cast<double>(batch) * (2.0 * static_cast<double>(s.linear_params) + attention);
}

/// Bytes one decode step must read at least: every weight once, plus each sequence's K and V.
double decode_bytes(const ModelShape& s, int64_t batch, double ctx) {
  return static_cast<double>(s.weight_bytes) +
         static_cast<double>(batch) * ctx * static_cast<double>(s.kv_bytes_per_token);
}

/// FLOPs of prefilling `batch` prompts of `tokens`: the LM head runs on each prompt's last token
/// only; causal attention over tokens*(tokens+1)/2 pairs.
double prefill_flops(const ModelShape& s, int64_t batch, int64_t tokens) {
  const double body =
      2.0 * static_cast<double>(s.linear_params - s.head_params) * static_cast<double>(tokens);
  const double head = 2.0 * static_cast<double>(s.head_params);
  const double pairs = static_cast<double>(tokens) * static_cast<double>(tokens + 1) / 2.0;
  const double attention = 4.0 * static_cast<double>(s.layers * s.heads * s.head_dim) * pairs;
  return static_cast<double>(batch) * (body + head + attention);
}

// ------------------------------------------------------------------ engine runs

struct PrefillResult {
  PrefillSpec spec;
  double seconds = 0;  // best of the reps
  int64_t steps = 0;   // forward_step calls per rep
};

struct DecodeResult {
  DecodeSpec spec;
  double seconds = 0;    // the timed steps, forward + sample
  double forward_s = 0;  // of which forward_step
  double sample_s = 0;   // of which sample_tokens
  double ctx = 0;        // mean context length over the timed steps
};

struct EngineResult {
  double load_s = 0;
  ModelShape shape;
  int64_t kv_pool_bytes = 0;
  int64_t kv_blocks = 0;
  int64_t rss_start_kib = 0, rss_loaded_kib = 0, rss_end_kib = 0, peak_kib = 0;
  bool peak_reset = false;
  std::vector<PrefillResult> prefill;
  std::vector<DecodeResult> decode;
  std::pair<double, double> cores;                     // ours / others during the case
  std::map<std::string, std::vector<OpCost>> profile;  // what was profiled -> top ops
};

/// `spec.batch` sequences, each with `prompt` tokens already cached, decoded greedily.
DecodeResult decode(const swarm::DecoderModel& model, swarm::KvCache& cache, const DecodeSpec& spec,
                    int64_t prompt, std::mt19937& gen) {
  const EngineDecodeResult e = engine_decode(model, cache, spec, prompt, gen);
  DecodeResult r;
  r.spec = spec;
  r.seconds = e.seconds;
  r.forward_s = e.forward_s;
  r.sample_s = e.sample_s;
  r.ctx = static_cast<double>(prompt + spec.warmup) + static_cast<double>(spec.steps + 1) / 2.0;
  return r;
}

EngineResult run_engine(const fs::path& dir, swarm::DType dtype, const Workload& w, bool profile) {
  EngineResult r;
  malloc_trim(0);  // hand the previous case's freed heap back, so RSS start means this case
  r.peak_reset = reset_peak_rss();
  r.rss_start_kib = proc_status_kib("VmRSS");
  const CpuSample cpu0 = cpu_sample();

  auto t0 = Clock::now();
  std::shared_ptr<swarm::DecoderModel> model = swarm::DecoderModel::load(dir, dtype);
  r.load_s = seconds_since(t0);
  r.rss_loaded_kib = proc_status_kib("VmRSS");
  r.shape = model_shape(*model);
  const swarm::ModelConfig& config = model->config();

  r.kv_blocks = w.blocks_needed();
  swarm::KvCache cache = swarm::KvCache::for_model(config, r.kv_blocks, kBlockSize, model->scalar_type());
  r.kv_pool_bytes = cache.bytes();
  fill_cache_pattern(cache, config, model->scalar_type());  // the "prompt already in the cache" of decode

  std::mt19937 gen(1234);
  const int64_t vocab = config.vocab_size;
  // Warm-up: a short prefill and a few decode steps (allocator, oneDNN primitives).
  engine_prefill(*model, cache, random_token_prompts(1, 64, vocab, gen), 0, w.chunk_tokens);
  cache.release(0);
  decode(*model, cache, DecodeSpec{1, 0, 4}, 64, gen);

  for (const PrefillSpec& p : w.prefill) {
    PrefillResult pr;
    pr.spec = p;
    pr.seconds = 1e30;
    for (int64_t rep = 0; rep < w.prefill_reps; ++rep) {
      auto prompts = random_token_prompts(p.batch, p.tokens, vocab, gen);
      auto t = Clock::now();
      pr.steps = engine_prefill(*model, cache, prompts, 0, w.chunk_tokens);
      pr.seconds = std::min(pr.seconds, seconds_since(t));
      for (int64_t s = 0; s < p.batch; ++s) cache.release(s);
    }
    progress("  C++ prefill %s: %.1f tok/s (%lld forward_step calls)", p.name.c_str(),
             static_cast<double>(p.batch * p.tokens) / pr.seconds, static_cast<long long>(pr.steps));
    r.prefill.push_back(pr);
  }
  for (const DecodeSpec& d : w.decode) {
    DecodeResult dr = decode(*model, cache, d, w.prompt_tokens, gen);
    progress("  C++ decode batch %lld: %.1f tok/s (%.2f ms/step, sample %.2f ms)",
             static_cast<long long>(d.batch), static_cast<double>(d.batch * d.steps) / dr.seconds,
             dr.seconds / static_cast<double>(d.steps) * 1e3,
             dr.sample_s / static_cast<double>(d.steps) * 1e3);
    r.decode.push_back(dr);
  }
  r.peak_kib = proc_status_kib("VmHWM");
  r.rss_end_kib = proc_status_kib("VmRSS");
  r.cores = cores_busy(cpu0, cpu_sample());
  if (profile) {
    constexpr size_t kTop = 14;
    for (int64_t b : {int64_t{1}, int64_t{32}, int64_t{64}}) {
      if (std::none_of(w.decode.begin(), w.decode.end(), [&](const DecodeSpec& s) { return s.batch == b; }))
        continue;
      const DecodeSpec d{b, 0, 4};
      r.profile["decode b" + std::to_string(b) + ", per step"] = profile_ops(
          [&] { decode(*model, cache, d, w.prompt_tokens, gen); }, static_cast<double>(d.steps), kTop);
    }
    const PrefillSpec& p = w.prefill.front();
    r.profile["prefill " + p.name + ", per prompt"] = profile_ops(
        [&] {
          engine_prefill(*model, cache, random_token_prompts(p.batch, p.tokens, vocab, gen), 0,
                         w.chunk_tokens);
          for (int64_t s = 0; s < p.batch; ++s) cache.release(s);
        },
        static_cast<double>(p.batch), kTop);
  }
  return r;
}

// ------------------------------------------------------------------ python reference

/// The reference's tokens/s of the prefill case `name` (0 when it failed or lacks it).
double python_prefill_tok_s(const PythonResult& py, const std::string& name) {
  if (!py.ok) return 0;
  for (const auto& p : py.out.at("prefill")) {
    if (p.at("name") == name) return p.at("tok_s").get<double>();
  }
  return 0;
}

/// The reference's tokens/s of decode at `batch` (0 when it failed or lacks it).
double python_decode_tok_s(const PythonResult& py, int64_t batch) {
  if (!py.ok) return 0;
  for (const auto& d : py.out.at("decode")) {
    if (d.at("batch").get<int64_t>() == batch) return d.at("tok_s").get<double>();
  }
  return 0;
}

PythonResult run_python(const std::string& python, const fs::path& script, const fs::path& dir,
                        const char* dtype, int threads, const Workload& w) {
  json spec = {{"model_dir", dir.string()}, {"dtype", dtype}, {"threads", threads}, {"seed", 0}};
  spec["prefill"] = json::array();
  for (const auto& p : w.prefill)
    spec["prefill"].push_back(
        {{"name", p.name}, {"batch", p.batch}, {"tokens", p.tokens}, {"reps", w.prefill_reps}});
  spec["decode"] = json::array();
  for (const auto& d : w.decode)
    spec["decode"].push_back({{"batch", d.batch},
                              {"prompt", w.prompt_tokens},
                              {"warmup", d.warmup},
                              {"steps", d.steps},
                              {"reps", d.reps}});
  return run_python_reference(python, script, spec);
}

// ------------------------------------------------------------------ models

struct ModelEntry {
  std::string key;    // --models name
  std::string label;  // table label
  fs::path dir;       // loadable directory
};

// ------------------------------------------------------------------ report

struct CaseResult {
  ModelEntry model;
  std::string dtype;  // "fp32" / "bf16"
  c10::ScalarType scalar = at::kFloat;
  EngineResult engine;
  PythonResult python;
  bool ran_python = false;
};

const PrefillResult* find_prefill(const EngineResult& e, const std::string& name) {
  for (const auto& p : e.prefill) {
    if (p.spec.name == name) return &p;
  }
  return nullptr;
}

const DecodeResult* find_decode(const EngineResult& e, int64_t batch) {
  for (const auto& d : e.decode) {
    if (d.spec.batch == batch) return &d;
  }
  return nullptr;
}

double tok_s(const DecodeResult& d) { return static_cast<double>(d.spec.batch * d.spec.steps) / d.seconds; }
double tok_s(const PrefillResult& p) { return static_cast<double>(p.spec.batch * p.spec.tokens) / p.seconds; }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string ratio_str(double a, double b) { return b > 0 && a > 0 ? fmt("%.2fx", a / b) : "-"; }

void print_throughput(const std::vector<CaseResult>& cases, const Workload& w, bool python) {
  std::printf("%-22s %-5s", "model", "dtype");
  for (const auto& p : w.prefill) std::printf(" %12s", ("pre " + p.name).c_str());
  for (const auto& d : w.decode) std::printf(" %10s", ("dec b" + std::to_string(d.batch)).c_str());
  std::printf("   cores us/oth\n");
  for (const CaseResult& c : cases) {
    if (python && !c.ran_python) continue;
    std::printf("%-22s %-5s", c.model.label.c_str(), c.dtype.c_str());
    for (const auto& p : w.prefill) {
      double v = python ? python_prefill_tok_s(c.python, p.name)
                        : (find_prefill(c.engine, p.name) ? tok_s(*find_prefill(c.engine, p.name)) : 0);
      std::printf(" %12s", v > 0 ? fmt("%.1f", v).c_str() : "-");
    }
    for (const auto& d : w.decode) {
      double v = python ? python_decode_tok_s(c.python, d.batch)
                        : (find_decode(c.engine, d.batch) ? tok_s(*find_decode(c.engine, d.batch)) : 0);
      std::printf(" %10s", v > 0 ? fmt("%.1f", v).c_str() : "-");
    }
    auto cores = python ? c.python.cores : c.engine.cores;
    std::printf("   %.2f/%.2f", cores.first, cores.second);
    if (python && !c.python.ok) std::printf("   FAILED: %s", c.python.error.c_str());
    std::printf("\n");
  }
}

void print_report(const std::vector<CaseResult>& cases, const Workload& w, const Probes& probes) {
  std::printf(
      "\n== C++ engine: tokens/s (DecoderModel::forward_step over a paged KV cache, block %lld; "
      "prefill in <= %lld-token forward_step calls; decode = forward_step + greedy sample_tokens)\n",
      static_cast<long long>(kBlockSize), static_cast<long long>(w.chunk_tokens));
  print_throughput(cases, w, false);

  std::printf("\n== C++ decode: ms per step (forward_step / sample_tokens), mean context\n");
  std::printf("%-22s %-5s", "model", "dtype");
  for (const auto& d : w.decode)
    std::printf(" %19s", ("b" + std::to_string(d.batch) + " fwd/sample").c_str());
  std::printf("  prefill calls\n");
  for (const CaseResult& c : cases) {
    std::printf("%-22s %-5s", c.model.label.c_str(), c.dtype.c_str());
    for (const auto& dr : c.engine.decode) {
      const double n = static_cast<double>(dr.spec.steps);
      std::printf(" %19s",
                  (fmt("%.2f", dr.forward_s / n * 1e3) + " / " + fmt("%.2f", dr.sample_s / n * 1e3)).c_str());
    }
    std::printf("  ");
    for (const auto& p : c.engine.prefill)
      std::printf(" %s:%lld", p.spec.name.c_str(), static_cast<long long>(p.steps));
    std::printf("\n");
  }
  std::printf("(mean context of the timed decode steps: %.1f tokens at batch 1)\n",
              cases.empty() || cases[0].engine.decode.empty() ? 0.0 : cases[0].engine.decode[0].ctx);

  bool any_python = std::any_of(cases.begin(), cases.end(), [](const CaseResult& c) { return c.ran_python; });
  if (any_python) {
    std::printf("\n== Python reference (python3-torch eager, same weights / workload / threads): tokens/s\n");
    print_throughput(cases, w, true);
    std::printf("\n== C++ / Python\n");
    std::printf("%-22s %-5s", "model", "dtype");
    for (const auto& p : w.prefill) std::printf(" %12s", ("pre " + p.name).c_str());
    for (const auto& d : w.decode) std::printf(" %10s", ("dec b" + std::to_string(d.batch)).c_str());
    std::printf("\n");
    for (const CaseResult& c : cases) {
      if (!c.ran_python) continue;
      std::printf("%-22s %-5s", c.model.label.c_str(), c.dtype.c_str());
      for (const auto& p : w.prefill) {
        const PrefillResult* e = find_prefill(c.engine, p.name);
        std::printf(" %12s", ratio_str(e ? tok_s(*e) : 0, python_prefill_tok_s(c.python, p.name)).c_str());
      }
      for (const auto& d : w.decode) {
        const DecodeResult* e = find_decode(c.engine, d.batch);
        std::printf(" %10s", ratio_str(e ? tok_s(*e) : 0, python_decode_tok_s(c.python, d.batch)).c_str());
      }
      std::printf("\n");
    }
  }

  std::printf(
      "\n== Memory (MiB). RSS peak = VmHWM of the case (reset at its start%s); KV pool sized for the "
      "largest phase (decode b%lld: %lld prompt + steps tokens per sequence)\n",
      cases.empty() || cases[0].engine.peak_reset ? "" : " FAILED: peak is process-wide",
      static_cast<long long>(w.decode.back().batch),
      static_cast<long long>(w.prompt_tokens + w.decode.back().warmup + w.decode.back().steps));
  std::printf("%-22s %-5s %9s %12s %9s %10s %10s %9s %9s %11s %9s\n", "model", "dtype", "weights",
              "KV MiB/1k tok", "KV pool", "RSS start", "RSS loaded", "RSS peak", "RSS end", "py loaded",
              "py peak");
  for (const CaseResult& c : cases) {
    const EngineResult& e = c.engine;
    std::printf("%-22s %-5s %9.1f %12.1f %9.1f %10.1f %10.1f %9.1f %9.1f", c.model.label.c_str(),
                c.dtype.c_str(), static_cast<double>(e.shape.weight_bytes) / kMiB,
                static_cast<double>(e.shape.kv_bytes_per_token) * 1000 / kMiB,
                static_cast<double>(e.kv_pool_bytes) / kMiB, static_cast<double>(e.rss_start_kib) / 1024,
                static_cast<double>(e.rss_loaded_kib) / 1024, static_cast<double>(e.peak_kib) / 1024,
                static_cast<double>(e.rss_end_kib) / 1024);
    if (c.ran_python && c.python.ok) {
      std::printf(" %11.1f %9.1f", c.python.out.at("rss_after_load_kib").get<double>() / 1024,
                  c.python.out.at("peak_rss_kib").get<double>() / 1024);
    } else {
      std::printf(" %11s %9s", "-", "-");
    }
    std::printf("\n");
  }

  std::printf(
      "\n== Roofline, batch-1 decode vs memory bandwidth (%.1f GB/s copy probe): bytes/step = weights + "
      "K/V read at the mean context\n",
      probes.copy_gbs);
  std::printf("%-22s %-5s %13s %15s %13s %10s\n", "model", "dtype", "MiB/step", "roofline tok/s", "achieved",
              "% roof");
  for (const CaseResult& c : cases) {
    const DecodeResult* d = find_decode(c.engine, 1);
    if (!d) continue;
    const double bytes = decode_bytes(c.engine.shape, 1, d->ctx);
    const double roof = probes.copy_gbs * 1e9 / bytes;
    std::printf("%-22s %-5s %13.2f %15.1f %13.1f %9.1f%%\n", c.model.label.c_str(), c.dtype.c_str(),
                bytes / kMiB, roof, tok_s(*d), 100.0 * tok_s(*d) / roof);
  }

  std::printf(
      "\n== Roofline, decode vs compute (matmul %lld^3 with the bench's threads: fp32 %.1f, bf16%s %.1f "
      "GFLOP/s; "
      "1 libtorch thread, OpenBLAS keeping its pool: %.1f / %.1f; peak = the better of the two). FLOP/step = "
      "2 x linear params (incl. LM head) x "
      "batch + attention. attainable = batch / max(bytes/BW, FLOP/peak)\n",
      static_cast<long long>(probes.gemm_n), probes.peak_f32 / 1e9,
      swarm::bf16_matmul_widens() ? " (the engine's bf16 GEMM without AVX512_BF16)" : "",
      probes.peak_bf16 / 1e9, probes.peak_f32_1t / 1e9, probes.peak_bf16_1t / 1e9);
  std::printf("%-22s %-5s %6s %11s %13s %9s %12s %13s %10s\n", "model", "dtype", "batch", "GFLOP/step",
              "GFLOP/s", "% peak", "compute tok/s", "attainable", "% attain");
  for (const CaseResult& c : cases) {
    const double peak = probes.peak(c.scalar);
    for (const DecodeResult& d : c.engine.decode) {
      const int64_t b = d.spec.batch;
      const double flops = decode_flops(c.engine.shape, b, d.ctx);
      const double achieved = flops * static_cast<double>(d.spec.steps) / d.seconds;
      const double compute_roof = peak * static_cast<double>(b) / flops;
      const double step_floor =
          std::max(decode_bytes(c.engine.shape, b, d.ctx) / (probes.copy_gbs * 1e9), flops / peak);
      const double attainable = static_cast<double>(b) / step_floor;
      std::printf("%-22s %-5s %6lld %11.3f %13.2f %8.1f%% %12.1f %13.1f %9.1f%%\n", c.model.label.c_str(),
                  c.dtype.c_str(), static_cast<long long>(b), flops / 1e9, achieved / 1e9,
                  100.0 * achieved / peak, compute_roof, attainable, 100.0 * tok_s(d) / attainable);
    }
    for (const PrefillResult& p : c.engine.prefill) {
      const double flops = prefill_flops(c.engine.shape, p.spec.batch, p.spec.tokens);
      std::printf("%-22s %-5s %6s %11.3f %13.2f %8.1f%%   (prefill)\n", c.model.label.c_str(),
                  c.dtype.c_str(), p.spec.name.c_str(), flops / 1e9, flops / p.seconds / 1e9,
                  100.0 * flops / p.seconds / peak);
    }
  }

  std::printf("\n== Targets (reported, not asserted)\n");
  std::printf("%-22s %-5s %-28s %-28s %-28s %-28s\n", "model", "dtype", "b1 >= 50% BW roofline",
              "b1 >= 2x Python", "b32 >= 40% compute peak", "b32 >= 1.2x Python");
  auto verdict = [](bool known, double value, double target, const char* unit) {
    if (!known) return std::string("-");
    return std::string(value >= target ? "PASS " : "MISS ") + fmt(unit, value);
  };
  for (const CaseResult& c : cases) {
    const DecodeResult* d1 = find_decode(c.engine, 1);
    const DecodeResult* d32 = find_decode(c.engine, 32);
    std::string a = "-", b = "-", cc = "-", dd = "-";
    if (d1) {
      const double roof = probes.copy_gbs * 1e9 / decode_bytes(c.engine.shape, 1, d1->ctx);
      a = verdict(true, 100.0 * tok_s(*d1) / roof, 50.0, "(%.1f%%)");
      const double py = python_decode_tok_s(c.python, 1);
      b = verdict(py > 0, py > 0 ? tok_s(*d1) / py : 0, 2.0, "(%.2fx)");
    }
    if (d32) {
      const double flops = decode_flops(c.engine.shape, 32, d32->ctx);
      const double achieved = flops * static_cast<double>(d32->spec.steps) / d32->seconds;
      cc = verdict(true, 100.0 * achieved / probes.peak(c.scalar), 40.0, "(%.1f%%)");
      const double py = python_decode_tok_s(c.python, 32);
      dd = verdict(py > 0, py > 0 ? tok_s(*d32) / py : 0, 1.2, "(%.2fx)");
    }
    std::printf("%-22s %-5s %-28s %-28s %-28s %-28s\n", c.model.label.c_str(), c.dtype.c_str(), a.c_str(),
                b.c_str(), cc.c_str(), dd.c_str());
  }

  for (const CaseResult& c : cases) {
    for (const auto& [what, ops] : c.engine.profile) {
      std::printf(
          "\n== Op profile: %s %s, %s: self CPU us (calling thread; legacy profiler overhead included)\n",
          c.model.label.c_str(), c.dtype.c_str(), what.c_str());
      double total = 0;
      for (const auto& op : ops) total += op.self_us;
      for (const auto& op : ops)
        std::printf("  %-34s %10.1f us %6lld calls\n", op.name.c_str(), op.self_us,
                    static_cast<long long>(op.calls));
      std::printf("  %-34s %10.1f us\n", "(top ops total)", total);
    }
  }
}

struct Options {
  CommonOptions common{SWARM_DEFAULT_FIXTURES_DIR, SWARM_BENCH_MODEL_CACHE, SWARM_BENCH_PYTHON_SCRIPT};
  std::string models = "smollm2,tinystories";
  bool profile_ops = false;
  int openblas_threads = 0;    // 0 = leave as loaded
  bool fixed_threads = false;  // true: --threads / --openblas-threads for every case, no engine plan
  int64_t context = 128;       // tokens in the cache when decode starts
};

}  // namespace

int main(int argc, char** argv) {
  swarm::bound_openmp_spin_wait(argv);  // first: it may re-execute this program
  Options opt;
  const CommonOptions& common = opt.common;
  CLI::App app{"bench_inference: libtorch engine prefill/decode tokens/s vs python3-torch and rooflines"};
  opt.common.add_to(app, "Small step counts (smoke run, about a minute)",
                    "libtorch intra-op threads (C++ and Python)");
  app.add_option("--models", opt.models, "Comma list: smollm2, tinystories")->capture_default_str();
  app.add_flag("--profile-ops", opt.profile_ops,
               "Also print per-op self time of decode steps (batch 1, 32, 64) and of one prefill");
  app.add_flag("--fixed-threads", opt.fixed_threads,
               "Use --threads / --openblas-threads as given for every case instead of the engine's per-dtype "
               "thread plan (swarm::configure_compute_threads with --threads cores)");
  app.add_option("--openblas-threads", opt.openblas_threads,
                 "Set OpenBLAS's pool (fp32 GEMM) to N threads in both processes; 0 = leave the default")
      ->capture_default_str();
  app.add_option("--context", opt.context,
                 "Tokens already in the KV cache when decode starts (long contexts: batch 1 and 8 only)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  CLI11_PARSE(app, argc, argv);

  try {
    const auto bench_start = Clock::now();
    // Phases run in order; a new phase (e.g. the server's TTFT) is one more function called here.
    // ---- 1. set-up and machine description
    swarm::set_compute_threads(common.threads);
    OpenBlas blas = OpenBlas::find();
    if (opt.openblas_threads > 0) {
      if (blas.set_threads) blas.set_threads(opt.openblas_threads);
      setenv("OPENBLAS_NUM_THREADS", std::to_string(opt.openblas_threads).c_str(), 1);  // the Python child
    }
    print_run_header(SWARM_SOURCE_DIR, common.quick, blas.describe());

    // ---- 2. machine ceilings
    progress("probes: copy bandwidth and matmul peak");
    const Probes probes = run_probes(common.threads, common.quick);

    // ---- 3. models x dtypes: the engine, then the Python reference on the same case
    std::vector<ModelEntry> models;
    for (const std::string& key : split_list(opt.models)) {
      if (key == "smollm2") {
        models.push_back({key, "smollm2-135m (random)", common.smollm2_random()});
      } else if (key == "tinystories") {
        models.push_back({key, "tinystories-656k", fs::path(common.fixtures) / "models/tinystories-656k"});
      } else {
        throw std::invalid_argument("unknown model '" + key + "' (smollm2, tinystories)");
      }
    }
    const std::vector<std::pair<std::string, swarm::DType>> dtypes = common.dtype_list();

    std::vector<CaseResult> cases;
    Workload report_workload;
    for (const ModelEntry& m : models) {
      const Workload w = make_workload(
          common.quick, swarm::ModelConfig::from_directory(m.dir).max_position_embeddings, opt.context);
      report_workload = w;
      for (const auto& [name, dtype] : dtypes) {
        CaseResult c;
        c.model = m;
        c.dtype = name;
        c.scalar = swarm::compute_scalar_type(dtype);
        // The engine's thread plan for this dtype; the Python child gets PyTorch's best (python_thread_plan).
        int py_threads = common.threads;
        if (!opt.fixed_threads) {
          const swarm::ThreadPlan plan = apply_thread_plan(common.threads, dtype);
          py_threads = python_thread_plan(common.threads, dtype).torch;
          progress("%s %s: thread plan: libtorch %d, OpenBLAS %d", m.label.c_str(), name.c_str(),
                   plan.torch_threads, plan.openblas_threads);
        }
        progress("%s %s: C++ engine", m.label.c_str(), name.c_str());
        c.engine = run_engine(m.dir, dtype, w, opt.profile_ops);
        if (!common.skip_python) {
          progress("%s %s: python reference", m.label.c_str(), name.c_str());
          c.python = run_python(common.python, common.python_script, m.dir, name.c_str(), py_threads, w);
          c.ran_python = true;
          if (!c.python.ok) progress("python reference failed: %s", c.python.error.c_str());
        }
        cases.push_back(std::move(c));
      }
    }

    // ---- 4. report
    std::printf("\nprobes: copy %.1f GB/s best of", probes.copy_gbs);
    for (double g : probes.copy_runs) std::printf(" %.1f", g);
    std::printf(" (%lld MiB buffer, read+write counted)\n", static_cast<long long>(probes.copy_bytes >> 20));
    print_report(cases, report_workload, probes);
    std::printf("\ntotal %.1f s\n", seconds_since(bench_start));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_inference: %s\n", e.what());
    return 1;
  }
  return 0;
}
