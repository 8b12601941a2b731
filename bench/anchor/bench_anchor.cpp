// bench_anchor: llama.cpp as the standing anchor of the CPU engine. The
// SmolLM2-135M-shaped model with random weights (the one bench_inference uses) is written as
// GGUF by our own writer (gguf_writer.hpp) in F32, F16 and BF16 and loaded in llama.cpp
// (node-llama-cpp's prebuilt linux-x64 CPU libraries, dlopen'ed); then, in the same run:
//
//  * greedy ids: a fixed 32-token prompt continued by 16 tokens (argmax), ours against
//    llama.cpp's, for swarm fp32 vs F32 and swarm bf16 vs F16 and BF16;
//  * prefill tokens/s: one 512-token prompt and 8 x 128-token prompts, in calls of at most 512
//    tokens on both sides, each prompt's first token picked greedily;
//  * decode tokens/s at batch 1, 8, 32, 64: each sequence has a 128-token prompt cached, then
//    each step is one batched call (forward_step / llama_decode) plus a greedy pick per
//    sequence; best of 3 passes over the same positions.
//
// Prints the tables with the machine and the commit, the ratios, and the targets
// (reported, never asserted): swarm >= 1.0x llama.cpp everywhere, >= 1.5x at batch >= 8, and
// swarm bf16 never below swarm fp32. Progress goes to stderr.
//
//   bench_anchor [--quick] [--threads N] [--llama-lib-dir DIR] [--llama-cpu auto|best|VARIANT] [--skip-llama]
//   bench_anchor --kernels [--kernel-rows N] [--quick] ...   kernel by kernel against ggml's ops (ggml_kernels.hpp)
//
// With SWARM_CPU_LEVEL=avx2 (and DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2) an AVX-512
// machine runs as an AVX2 one on both sides: llama.cpp then loads ggml's haswell backend.
//
// Built without llama.cpp (no bench/anchor/node_modules at configure time), it still writes
// the GGUF files and times our engine, and says how to get llama.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>  // torch_bench.hpp's run header uses at::get_num_threads
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "anchor/gguf_writer.hpp"
#include "common/engine_runs.hpp"
#include "common/torch_bench.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/kv_cache_torch.hpp"
#include "model/model_config.hpp"
#if SWARM_ANCHOR_WITH_LLAMA
#include "anchor/ggml_kernels.hpp"
#include "anchor/llama_runner.hpp"
#endif

namespace {

namespace fs = std::filesystem;
using namespace swarm::bench;

constexpr int64_t kBlockSize = 16;     // our KV cache block, tokens
constexpr int64_t kChunk = 512;        // prefill tokens per call, both sides
constexpr int64_t kIdsPrompt = 32;     // greedy check: prompt tokens
constexpr int64_t kIdsNewTokens = 16;  // greedy check: generated tokens

template <typename... Args>
void progress(const char* fmt, Args... args) {
  progress_line("bench_anchor", fmt, args...);
}

// ------------------------------------------------------------------ workload

struct Case {
  std::string name;  // column label
  bool prefill = false;
  int64_t batch = 1;
  int64_t tokens = 0;  // prefill: tokens per prompt
  EngineDecodeSpec decode;
};

struct Workload {
  std::vector<Case> cases;
  int64_t prefill_reps = 2;
  int64_t prompt_tokens = 128;  // cached before decode starts
};

Workload make_workload(bool quick) {
  Workload w;
  w.prefill_reps = quick ? 1 : 2;
  w.prompt_tokens = quick ? 32 : 128;
  if (quick) {
    w.cases.push_back({"pre 1x128", true, 1, 128, {}});
    w.cases.push_back({"pre 2x64", true, 2, 64, {}});
  } else {
    w.cases.push_back({"pre 1x512", true, 1, 512, {}});
    w.cases.push_back({"pre 8x128", true, 8, 128, {}});
  }
  for (int64_t b : {1, 8, 32, 64}) {
    EngineDecodeSpec d;
    d.batch = b;
    d.warmup = quick ? 1 : 2;
    d.steps = quick ? (b == 1 ? 4 : 2) : (b == 1 ? 48 : b == 8 ? 24 : 12);
    d.reps = quick ? 1 : 3;
    w.cases.push_back({"dec b" + std::to_string(b), false, b, 0, d});
  }
  return w;
}

/// The prompts of prefill case `index`: the same on both sides.
std::vector<std::vector<int32_t>> case_prompts(const Case& c, size_t index, int64_t vocab) {
  std::mt19937 gen(static_cast<uint32_t>(1000 + index));
  return random_token_prompts(c.batch, c.tokens, vocab, gen);
}

std::vector<int32_t> ids_prompt(int64_t vocab) {
  std::mt19937 gen(7);
  return random_token_prompts(1, kIdsPrompt, vocab, gen)[0];
}

double tokens_of(const Case& c) {
  return static_cast<double>(c.batch) * static_cast<double>(c.prefill ? c.tokens : c.decode.steps);
}

/// One side's run of one dtype: greedy ids and tokens/s per case.
struct SideResult {
  std::string label;  // "swarm fp32", "llama F16", ...
  bool ran = false;
  std::string error;
  std::vector<int32_t> ids;
  std::vector<double> tok_s;  // per case, 0 when missing
  double load_s = 0;
  std::pair<double, double> cores;  // ours / others while it ran
};

// ------------------------------------------------------------------ our engine

SideResult run_swarm(const fs::path& dir, const std::string& name, swarm::DType dtype, const Workload& w,
                     int threads) {
  SideResult r;
  r.label = "swarm " + name;
  const swarm::ThreadPlan plan = apply_thread_plan(threads, dtype);
  progress("%s: thread plan: libtorch %d, OpenBLAS %d", r.label.c_str(), plan.torch_threads,
           plan.openblas_threads);
  const CpuSample cpu0 = cpu_sample();
  auto t0 = Clock::now();
  std::shared_ptr<swarm::DecoderModel> model = swarm::DecoderModel::load(dir, dtype);
  r.load_s = seconds_since(t0);
  const swarm::ModelConfig& config = model->config();
  auto blocks = [](int64_t tokens) { return (tokens + kBlockSize - 1) / kBlockSize; };
  int64_t need = blocks(kIdsPrompt + kIdsNewTokens);
  for (const Case& c : w.cases)
    need = std::max(
        need, c.batch * blocks(c.prefill ? c.tokens : w.prompt_tokens + c.decode.warmup + c.decode.steps));
  swarm::KvCache cache = swarm::KvCache::for_model(config, need, kBlockSize, model->scalar_type());

  r.ids = engine_greedy_ids(*model, cache, ids_prompt(config.vocab_size), kIdsNewTokens);
  fill_cache_pattern(cache, config, model->scalar_type());
  std::mt19937 gen(1234);
  engine_prefill(*model, cache, random_token_prompts(1, 64, config.vocab_size, gen), 0, kChunk);  // warm-up
  cache.release(0);
  engine_decode(*model, cache, EngineDecodeSpec{1, 0, 4, 1}, 64, gen);
  for (size_t i = 0; i < w.cases.size(); ++i) {
    const Case& c = w.cases[i];
    double seconds = 1e30;
    if (c.prefill) {
      const auto prompts = case_prompts(c, i, config.vocab_size);
      for (int64_t rep = 0; rep < w.prefill_reps; ++rep) {
        auto t = Clock::now();
        engine_prefill(*model, cache, prompts, 0, kChunk);
        seconds = std::min(seconds, seconds_since(t));
        for (int64_t s = 0; s < c.batch; ++s) cache.release(s);
      }
    } else {
      seconds = engine_decode(*model, cache, c.decode, w.prompt_tokens, gen).seconds;
    }
    r.tok_s.push_back(tokens_of(c) / seconds);
    progress("  %s %s: %.1f tok/s", r.label.c_str(), c.name.c_str(), r.tok_s.back());
  }
  r.cores = cores_busy(cpu0, cpu_sample());
  r.ran = true;
  return r;
}

// ------------------------------------------------------------------ llama.cpp

#if SWARM_ANCHOR_WITH_LLAMA
SideResult run_llama(const LlamaLibrary& lib, const fs::path& gguf, GgufTensorType type, const Workload& w,
                     int threads) {
  SideResult r;
  r.label = std::string("llama ") + gguf_type_name(type);
  const CpuSample cpu0 = cpu_sample();
  auto t0 = Clock::now();
  LlamaModel model(lib, gguf, type, threads);
  r.load_s = seconds_since(t0);
  const int64_t vocab = model.vocab_size();
  r.ids = model.greedy_ids(ids_prompt(vocab), kIdsNewTokens);
  std::mt19937 gen(1234);
  model.prefill_seconds(random_token_prompts(1, 64, vocab, gen), kChunk, 1);  // warm-up
  for (size_t i = 0; i < w.cases.size(); ++i) {
    const Case& c = w.cases[i];
    const double seconds = c.prefill
                               ? model.prefill_seconds(case_prompts(c, i, vocab), kChunk, w.prefill_reps)
                               : model.decode(c.decode, w.prompt_tokens, gen).seconds;
    r.tok_s.push_back(tokens_of(c) / seconds);
    progress("  %s %s: %.1f tok/s", r.label.c_str(), c.name.c_str(), r.tok_s.back());
  }
  r.cores = cores_busy(cpu0, cpu_sample());
  r.ran = true;
  return r;
}
#endif

// ------------------------------------------------------------------ report

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

void print_header_row(const Workload& w, const char* first) {
  std::printf("%-22s", first);
  for (const Case& c : w.cases) std::printf(" %11s", c.name.c_str());
  std::printf("\n");
}

void print_tok_s(const SideResult& s, const Workload& w) {
  std::printf("%-22s", s.label.c_str());
  for (size_t i = 0; i < w.cases.size(); ++i)
    std::printf(" %11s", s.ran && i < s.tok_s.size() ? fmt("%.1f", s.tok_s[i]).c_str() : "-");
  if (s.ran)
    std::printf("   load %.1f s, cores %.2f/%.2f", s.load_s, s.cores.first, s.cores.second);
  else if (!s.error.empty())
    std::printf("   FAILED: %s", s.error.c_str());
  std::printf("\n");
}

struct Pair {
  const SideResult* swarm;
  const SideResult* llama;
};

void print_report(const Workload& w, const std::vector<SideResult>& swarm_runs,
                  const std::vector<SideResult>& llama_runs, const std::vector<Pair>& pairs) {
  std::printf("\n== Greedy ids: a fixed %lld-token prompt continued by %lld tokens (argmax)\n",
              static_cast<long long>(kIdsPrompt), static_cast<long long>(kIdsNewTokens));
  for (const Pair& p : pairs) {
    if (!p.swarm->ran || !p.llama->ran) {
      std::printf("%-12s vs %-10s -\n", p.swarm->label.c_str(), p.llama->label.c_str());
      continue;
    }
    size_t differ = 0;
    while (differ < p.swarm->ids.size() && differ < p.llama->ids.size() &&
           p.swarm->ids[differ] == p.llama->ids[differ])
      ++differ;
    if (p.swarm->ids == p.llama->ids) {
      std::printf("%-12s vs %-10s EQUAL   %s\n", p.swarm->label.c_str(), p.llama->label.c_str(),
                  ids_str(p.swarm->ids).c_str());
    } else {
      std::printf("%-12s vs %-10s DIFFER from token %zu\n  %-10s %s\n  %-10s %s\n", p.swarm->label.c_str(),
                  p.llama->label.c_str(), differ, "swarm:", ids_str(p.swarm->ids).c_str(),
                  "llama.cpp:", ids_str(p.llama->ids).c_str());
    }
  }

  std::printf(
      "\n== tokens/s (prefill in calls of <= %lld tokens; decode = one batched call + a greedy pick per "
      "sequence, "
      "%lld-token prompts cached)\n",
      static_cast<long long>(kChunk), static_cast<long long>(w.prompt_tokens));
  print_header_row(w, "engine");
  for (const SideResult& s : swarm_runs) print_tok_s(s, w);
  for (const SideResult& s : llama_runs) print_tok_s(s, w);

  std::printf(
      "\n== swarm / llama.cpp (targets, reported not asserted: >= 1.00x everywhere, >= 1.50x at batch >= "
      "8)\n");
  print_header_row(w, "pair");
  for (const Pair& p : pairs) {
    std::printf("%-22s", (p.swarm->label.substr(6) + " / " + p.llama->label.substr(6)).c_str());
    for (size_t i = 0; i < w.cases.size(); ++i) {
      if (!p.swarm->ran || !p.llama->ran) {
        std::printf(" %11s", "-");
        continue;
      }
      const double ratio = p.swarm->tok_s[i] / p.llama->tok_s[i];
      const double target = w.cases[i].batch >= 8 ? 1.5 : 1.0;
      std::printf(" %11s", (fmt("%.2fx", ratio) + (ratio >= target ? " ok" : " MISS")).c_str());
    }
    std::printf("\n");
  }

  const SideResult* fp32 = nullptr;
  const SideResult* bf16 = nullptr;
  for (const SideResult& s : swarm_runs) {
    if (s.label == "swarm fp32" && s.ran) fp32 = &s;
    if (s.label == "swarm bf16" && s.ran) bf16 = &s;
  }
  if (fp32 && bf16) {
    std::printf("\n== swarm bf16 / swarm fp32 (target: >= 1.00x, bf16 never below fp32)\n");
    print_header_row(w, "");
    std::printf("%-22s", "bf16 / fp32");
    for (size_t i = 0; i < w.cases.size(); ++i) {
      const double ratio = bf16->tok_s[i] / fp32->tok_s[i];
      std::printf(" %11s", (fmt("%.2fx", ratio) + (ratio >= 1.0 ? " ok" : " MISS")).c_str());
    }
    std::printf("\n");
  }
}

struct Options {
  CommonOptions common{SWARM_DEFAULT_FIXTURES_DIR, SWARM_BENCH_MODEL_CACHE, ""};
  int threads = 2;
  std::string llama_lib_dir = SWARM_ANCHOR_LLAMA_LIB_DIR;
  std::string llama_cpu = "auto";  // ggml CPU backend variant; see llama_cpu_variant
  bool skip_llama = false;
  bool kernels = false;                 // only the kernel-by-kernel comparison with ggml
  int64_t kernel_rows = 0;              // --kernels: rows of the elementwise kernels (0: the default)
  std::vector<std::string> write_gguf;  // MODEL_DIR OUT TYPE: only convert one model
};

#if SWARM_ANCHOR_WITH_LLAMA
// The --kernels table: per row each side's best microseconds per call and swarm's speed
// relative to ggml's (ggml's time / ours: above 1 ours is faster). bf16 against the faster of
// ggml's F16 and BF16 where ggml has them (projection weights, attention's K/V), else against
// its F32 (ggml computes activations in fp32).
void print_kernel_comparison(const std::vector<KernelComparison>& rows, int threads) {
  std::printf(
      "\n== Kernels against ggml's ops: the same shapes, %d threads, the CPU backend above; best time per "
      "call, "
      "each side's inputs reused; x = ggml's time / ours (above 1: ours faster)\n",
      threads);
  std::printf("%-24s %-28s %-26s %10s %10s %7s %10s %10s %10s %7s\n", "kernel", "shape", "ggml ops",
              "fp32 us", "ggml F32", "x", "bf16 us", "ggml F16", "ggml BF16", "x");
  auto num = [](double v, const char* format) {
    if (!(v > 0)) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof buf, format, v);
    return std::string(buf);
  };
  auto us = [&](double v) { return num(v, "%.1f"); };
  for (const KernelComparison& r : rows) {
    const double fp32_x = r.swarm_fp32_us > 0 && r.ggml_f32_us > 0 ? r.ggml_f32_us / r.swarm_fp32_us : 0;
    double ggml_16 = r.ggml_f32_us;
    if (r.ggml_f16_us > 0 || r.ggml_bf16_us > 0) {
      ggml_16 = std::numeric_limits<double>::infinity();
      if (r.ggml_f16_us > 0) ggml_16 = std::min(ggml_16, r.ggml_f16_us);
      if (r.ggml_bf16_us > 0) ggml_16 = std::min(ggml_16, r.ggml_bf16_us);
    }
    const double bf16_x = r.swarm_bf16_us > 0 && ggml_16 > 0 ? ggml_16 / r.swarm_bf16_us : 0;
    std::printf("%-24s %-28s %-26s %10s %10s %7s %10s %10s %10s %7s\n", r.kernel.c_str(), r.shape.c_str(),
                r.ggml_ops.c_str(), us(r.swarm_fp32_us).c_str(), us(r.ggml_f32_us).c_str(),
                num(fp32_x, "%.2f").c_str(), us(r.swarm_bf16_us).c_str(), us(r.ggml_f16_us).c_str(),
                us(r.ggml_bf16_us).c_str(), num(bf16_x, "%.2f").c_str());
  }
  for (const KernelComparison& r : rows)
    if (!r.note.empty()) std::printf("  %s (%s): %s\n", r.kernel.c_str(), r.shape.c_str(), r.note.c_str());
  std::printf(
      "  bf16 x: against the faster of ggml's F16 and BF16 (weights of the projections, K/V of attention), "
      "else "
      "against its F32 (its activations are fp32)\n");
}
#endif

// The ggml CPU backend to load for --llama-cpu: "auto" follows SWARM_CPU_LEVEL where it lowers
// our kernels (avx2: haswell = AVX2, FMA, F16C, BMI2, as an AVX2-only CPU would pick; avx512:
// skylakex = AVX-512 without its bf16 and VNNI; base: x64), so a machine behaving as a lower
// level does so on both sides; else "" (ggml scores the variants and loads the best). "best"
// forces that; any other name is a variant (libggml-cpu-NAME.so).
std::string llama_cpu_variant(const std::string& option) {
  if (option == "best") return "";
  if (option != "auto") return option;
  const char* level = std::getenv("SWARM_CPU_LEVEL");
  const std::string want = level == nullptr ? "" : level;
  if (want == "avx2") return "haswell";
  if (want == "avx512") return "skylakex";
  if (want == "base") return "x64";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  swarm::bound_openmp_spin_wait(argv);  // first: it may re-execute this program
  Options opt;
  CLI::App app{"bench_anchor: swarm's CPU engine against llama.cpp on the same GGUF-converted weights"};
  app.add_flag("--quick", opt.common.quick,
               "Small prompts and step counts (smoke run, about a minute or two)");
  app.add_option("--threads", opt.threads, "Threads on both sides (llama.cpp n_threads; our engine's plan)")
      ->capture_default_str();
  app.add_option("--llama-lib-dir", opt.llama_lib_dir, "Directory with libllama*.so and the libggml backends")
      ->capture_default_str();
  app.add_option(
         "--llama-cpu", opt.llama_cpu,
         "ggml CPU backend: auto (follow SWARM_CPU_LEVEL, else the best for this CPU), best, or a variant "
         "name (haswell, skylakex, zen4, ... as libggml-cpu-NAME.so)")
      ->capture_default_str();
  app.add_flag("--skip-llama", opt.skip_llama, "Only write the GGUF files and time our engine");
  app.add_flag(
      "--kernels", opt.kernels,
      "Only compare our CPU kernels with the ggml ops llama.cpp runs for the same work (same shapes, "
      "threads and CPU backend)");
  app.add_option(
         "--kernel-rows", opt.kernel_rows,
         "--kernels: rows of the elementwise kernels (default 16384, from memory; e.g. 512 to stay in cache)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--fixtures", opt.common.fixtures, "The fixtures directory with models/ (tests/fixtures)")
      ->capture_default_str();
  app.add_option("--model-cache", opt.common.model_cache,
                 "Where the random-weight model and GGUF files are written")
      ->capture_default_str();
  app.add_option(
         "--write-gguf", opt.write_gguf,
         "Only convert: MODEL_DIR OUT F32|F16|BF16 writes one llama-architecture model as GGUF and exits "
         "(tests/unit/anchor checks the file with an independent reader)")
      ->expected(3);
  CLI11_PARSE(app, argc, argv);

  if (!opt.write_gguf.empty()) {
    const std::string& type = opt.write_gguf[2];
    const GgufTensorType kTypes[] = {GgufTensorType::F32, GgufTensorType::F16, GgufTensorType::BF16};
    const auto t = std::find_if(std::begin(kTypes), std::end(kTypes),
                                [&](GgufTensorType k) { return type == gguf_type_name(k); });
    if (t == std::end(kTypes)) {
      std::fprintf(stderr, "bench_anchor: --write-gguf: unknown type '%s' (F32, F16, BF16)\n", type.c_str());
      return 2;
    }
    try {
      const GgufWriteResult r = write_llama_gguf(opt.write_gguf[0], opt.write_gguf[1], *t);
      std::printf("%s: %llu bytes, %lld tensors, %lld metadata keys\n", opt.write_gguf[1].c_str(),
                  static_cast<unsigned long long>(r.bytes), static_cast<long long>(r.tensors),
                  static_cast<long long>(r.metadata));
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_anchor: %s\n", e.what());
      return 1;
    }
  }

  try {
    const auto bench_start = Clock::now();
    swarm::set_compute_threads(opt.threads);
    print_run_header(SWARM_SOURCE_DIR, opt.common.quick, OpenBlas::find().describe());
    std::printf("threads: %d on both sides\n", opt.threads);

#if SWARM_ANCHOR_WITH_LLAMA
    const LlamaLibrary* lib = nullptr;
    if (!opt.skip_llama) {
      const std::string variant = llama_cpu_variant(opt.llama_cpu);
      lib = &LlamaLibrary::open(opt.llama_lib_dir, variant);
      std::printf("llama.cpp: %s (%s); CPU backend %s; %s\n", SWARM_ANCHOR_LLAMA_VERSION, lib->path().c_str(),
                  variant.empty() ? "the best for this CPU" : ("libggml-cpu-" + variant + ".so").c_str(),
                  lib->system_info().c_str());
    }
#else
    if (!opt.skip_llama)
      std::printf(
          "llama.cpp: not built in (no headers at configure time): npm ci --prefix bench/anchor "
          "--omit=optional "
          "--ignore-scripts, then re-run cmake\n");
#endif
    std::fflush(stdout);

    if (opt.kernels) {
#if SWARM_ANCHOR_WITH_LLAMA
      if (lib == nullptr)
        throw std::runtime_error("--kernels needs llama.cpp's ggml (not with --skip-llama)");
      print_kernel_comparison(compare_kernels(*lib, opt.threads, opt.common.quick, opt.kernel_rows),
                              opt.threads);
      std::printf("\ntotal %.1f s\n", seconds_since(bench_start));
      return 0;
#else
      throw std::runtime_error("--kernels needs llama.cpp's ggml: built without its headers");
#endif
    }

    const fs::path model_dir = opt.common.smollm2_random();
    const Workload w = make_workload(opt.common.quick);

    // ---- GGUF files, written by our writer from the same safetensors
    std::map<GgufTensorType, fs::path> gguf;
    for (GgufTensorType t : {GgufTensorType::F32, GgufTensorType::F16, GgufTensorType::BF16}) {
      const fs::path out = fs::path(opt.common.model_cache) /
                           (model_dir.filename().string() + "." + gguf_type_name(t) + ".gguf");
      auto t0 = Clock::now();
      const GgufWriteResult written = write_llama_gguf(model_dir, out, t);
      progress("wrote %s: %.1f MiB, %lld tensors, %lld keys, %.1f s", out.c_str(),
               static_cast<double>(written.bytes) / (1024.0 * 1024.0),
               static_cast<long long>(written.tensors), static_cast<long long>(written.metadata),
               seconds_since(t0));
      gguf[t] = out;
    }

    // ---- our engine, then llama.cpp, in the same run
    std::vector<SideResult> swarm_runs;
    for (const auto& [name, dtype] : {std::pair<std::string, swarm::DType>{"fp32", swarm::DType::F32},
                                      std::pair<std::string, swarm::DType>{"bf16", swarm::DType::BF16}}) {
      progress("swarm %s", name.c_str());
      swarm_runs.push_back(run_swarm(model_dir, name, dtype, w, opt.threads));
    }
    std::vector<SideResult> llama_runs;
    for (GgufTensorType t : {GgufTensorType::F32, GgufTensorType::F16, GgufTensorType::BF16}) {
      SideResult r;
      r.label = std::string("llama ") + gguf_type_name(t);
#if SWARM_ANCHOR_WITH_LLAMA
      if (lib) {
        progress("%s", r.label.c_str());
        try {
          r = run_llama(*lib, gguf[t], t, w, opt.threads);
        } catch (const std::exception& e) {
          r.error = e.what();
          progress("%s failed: %s", r.label.c_str(), e.what());
        }
      }
#endif
      llama_runs.push_back(r);
    }

    const std::vector<Pair> pairs = {
        {&swarm_runs[0], &llama_runs[0]}, {&swarm_runs[1], &llama_runs[1]}, {&swarm_runs[1], &llama_runs[2]}};
    print_report(w, swarm_runs, llama_runs, pairs);
    std::printf("\ntotal %.1f s\n", seconds_since(bench_start));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_anchor: %s\n", e.what());
    return 1;
  }
  return 0;
}
