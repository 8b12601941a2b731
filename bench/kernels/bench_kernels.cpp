// bench_kernels: every CPU kernel family of the engine and the trainer on its own, at the
// SmolLM2-135M shapes, in fp32 and bf16, against the bound this machine sets for it (target:
// "each kernel family has an AVX2 path within noise of the best a 2-core CPU allows"):
//
// Each row's bound is the slower of its bytes at the copy rate and its FLOPs at the peak:
//  * memory-bound kernels (small_linear at 1 and 8 rows, the fused gate/up + SiLU, the LM head,
//    paged decode attention, the norms, SiLU·mul, RoPE into the cache, the softmax statistics of
//    the logits): bytes moved per call over the copy probe (at::Tensor::copy_ of 512 MiB, read +
//    write counted, the same threads). Their operands are several times the last-level cache
//    (distinct weights per call, as 30 layers are), so every byte comes from memory;
//  * compute-bound GEMMs (model_linear at 32, 128 and 512 rows, the projections of batched
//    decode and prefill; the trainer's forward runs the same call; and small_linear at the row
//    counts serving gives it instead, e.g. the AVX2 widening tiles at 32): FLOP/s over the peak
//    matmul of the dtype (at::matmul 2048^3 fp32; bf16: widening_linear without AVX512_BF16, oneDNN's
//    bf16 GEMM with it, as bench_inference measures it).
//
// Each case runs with the engine's thread plan for its dtype (configure_compute_threads), best of
// several timed passes. The header names the CPU level; SWARM_CPU_LEVEL=avx2 (with
// DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2) reproduces an AVX2 machine on an AVX-512 one.
// Prints one table; progress goes to stderr. Never a timed assertion; figures are recorded in
// docs/benchmarks.md.
//
//   bench_kernels [--quick] [--threads N] [--dtypes fp32,bf16] [--only NAME]

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/torch_bench.hpp"
#include "kernels/cpu/paged_attention_torch.hpp"
#include "kernels/cpu/serving_ops_torch.hpp"
#include "kernels/cpu/small_linear_torch.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"

namespace {

namespace sb = swarm::bench;
using sb::Clock;
using sb::seconds_since;

template <typename... Args>
void progress(const char* fmt, Args... args) {
  sb::progress_line("bench_kernels", fmt, args...);
}

// SmolLM2-135M.
constexpr int64_t kHidden = 576, kInter = 1536, kHeads = 9, kKvHeads = 3, kHeadDim = 64, kVocab = 49152,
                  kLayers = 30;

struct Row {
  std::string kernel, shape, dtype;
  double seconds = 0;  // best per call
  double bytes = 0;    // moved per call: weights or K/V read, inputs read, results written
  double flops = 0;    // per call (multiply-adds counted as 2; 0 for the elementwise ops)
  double copy_bps = 0, peak = 0;
  // The best this machine allows: the slower of moving the bytes at the copy probe's rate and
  // doing the arithmetic at the matmul peak.
  double bound_seconds() const { return std::max(bytes / copy_bps, flops / peak); }
  bool memory_bound() const { return bytes / copy_bps >= flops / peak; }
};

// Best seconds per call of `fn` over `passes` passes of `calls` calls (call i gets i).
double best_per_call(const std::function<void(int)>& fn, int calls, int passes) {
  fn(0);  // warm-up: first touches, primitive creation
  double best = 1e30;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) fn(i);
    best = std::min(best, seconds_since(t0) / calls);
  }
  return best;
}

at::Tensor randn(std::initializer_list<int64_t> sizes, at::ScalarType dtype, double scale = 1.0) {
  return (at::randn(sizes) * scale).to(dtype).contiguous();
}

struct Bench {
  bool quick = false;
  std::string only;     // run only the kernels whose name contains this
  double copy_bps = 0;  // bytes/s, read + write counted
  std::vector<Row> rows;

  int passes() const { return quick ? 3 : 7; }

  double peak = 0;             // FLOP/s of the dtype being run
  double peak_of[2] = {0, 0};  // fp32, bf16 (0: not run)

  void run(const std::string& kernel, const std::string& shape, const std::string& dtype, double bytes,
           double flops, int calls, const std::function<void(int)>& fn) {
    if (kernel.find(only) == std::string::npos) return;
    progress("%s %s %s", kernel.c_str(), shape.c_str(), dtype.c_str());
    rows.push_back({kernel, shape, dtype, best_per_call(fn, calls, passes()), bytes, flops, copy_bps, peak});
  }
};

void run_dtype(Bench& b, const std::string& name, swarm::DType dtype, int threads) {
  c10::InferenceMode guard;
  const at::ScalarType st = dtype == swarm::DType::BF16 ? at::kBFloat16 : at::kFloat;
  const double es = st == at::kBFloat16 ? 2.0 : 4.0;
  const swarm::ThreadPlan plan = sb::apply_thread_plan(threads, dtype);
  progress("%s: thread plan libtorch %d, OpenBLAS %d, small_linear %d", name.c_str(), plan.torch_threads,
           plan.openblas_threads, swarm::small_linear_threads());
  b.peak = sb::matmul_peak(st, 2048, b.quick ? 2 : 4, b.quick ? 0.3 : 1.0);
  progress("%s: matmul peak %.1f GFLOP/s", name.c_str(), b.peak / 1e9);
  b.peak_of[st == at::kBFloat16 ? 1 : 0] = b.peak;
  at::manual_seed(0);

  // One layer's MLP weights per layer of the model, so each call reads weights from memory.
  const int64_t layers = b.quick ? 8 : kLayers;
  std::vector<at::Tensor> gate_up, down;
  for (int64_t l = 0; l < layers; ++l) {
    gate_up.push_back(randn({2 * kInter, kHidden}, st, 0.05));
    down.push_back(randn({kHidden, kInter}, st, 0.05));
  }
  const int calls = static_cast<int>(layers);
  for (int64_t m : {int64_t{1}, int64_t{8}}) {
    const at::Tensor x = randn({m, kHidden}, st), xd = randn({m, kInter}, st);
    const std::string rows_s = std::to_string(m) + (m == 1 ? " row" : " rows");
    const double w_up = static_cast<double>(2 * kInter * kHidden) * es,
                 w_down = static_cast<double>(kHidden * kInter) * es;
    const double f_up = 2.0 * m * 2 * kInter * kHidden, f_down = 2.0 * m * kHidden * kInter;
    b.run("small_linear", rows_s + " x [3072, 576]", name,
          w_up + static_cast<double>(m) * (kHidden + 2 * kInter) * es, f_up, calls,
          [&](int i) { swarm::small_linear(x, gate_up[static_cast<size_t>(i)], c10::nullopt); });
    b.run("small_linear", rows_s + " x [576, 1536]", name,
          w_down + static_cast<double>(m) * (kInter + kHidden) * es, f_down, calls,
          [&](int i) { swarm::small_linear(xd, down[static_cast<size_t>(i)], c10::nullopt); });
    b.run("small_linear_silu_mul", rows_s + " x [3072, 576]", name,
          w_up + static_cast<double>(m) * (kHidden + kInter) * es, f_up, calls,
          [&](int i) { swarm::small_linear_silu_mul(x, gate_up[static_cast<size_t>(i)], c10::nullopt); });
  }
  {  // the LM head, fp32 logits out
    const at::Tensor head = randn({kVocab, kHidden}, st, 0.05), x = randn({1, kHidden}, st);
    b.run("small_linear (LM head, fp32 out)", "1 row x [49152, 576]", name,
          static_cast<double>(kVocab * kHidden) * es + kVocab * 4.0, 2.0 * kVocab * kHidden, 3,
          [&](int) { swarm::small_linear(x, head, c10::nullopt, /*float_out=*/true); });
  }
  gate_up.clear();
  down.clear();

  // GEMMs of batched decode and prefill: the weights stay in cache, the arithmetic bounds them.
  {
    const at::Tensor w_up = randn({2 * kInter, kHidden}, st, 0.05),
                     w_down = randn({kHidden, kInter}, st, 0.05);
    for (int64_t m : {int64_t{32}, int64_t{128}, int64_t{512}}) {
      const at::Tensor x = randn({m, kHidden}, st), xd = randn({m, kInter}, st);
      const int reps = m >= 512 ? 3 : 10;
      b.run(
          "model_linear", std::to_string(m) + " rows x [3072, 576]", name,
          (static_cast<double>(2 * kInter * kHidden) + static_cast<double>(m) * (kHidden + 2 * kInter)) * es,
          2.0 * m * 2 * kInter * kHidden, reps, [&](int) { swarm::model_linear(x, w_up); });
      b.run("model_linear", std::to_string(m) + " rows x [576, 1536]", name,
            (static_cast<double>(kHidden * kInter) + static_cast<double>(m) * (kHidden + kInter)) * es,
            2.0 * m * kHidden * kInter, reps, [&](int) { swarm::model_linear(xd, w_down); });
      if (m > 8 && m <= swarm::small_linear_max_rows(st)) {  // what serving takes at this many rows
        b.run("small_linear", std::to_string(m) + " rows x [3072, 576]", name,
              (static_cast<double>(2 * kInter * kHidden) + static_cast<double>(m) * (kHidden + 2 * kInter)) *
                  es,
              2.0 * m * 2 * kInter * kHidden, reps, [&](int) { swarm::small_linear(x, w_up, c10::nullopt); });
        b.run("small_linear", std::to_string(m) + " rows x [576, 1536]", name,
              (static_cast<double>(kHidden * kInter) + static_cast<double>(m) * (kHidden + kInter)) * es,
              2.0 * m * kHidden * kInter, reps, [&](int) { swarm::small_linear(xd, w_down, c10::nullopt); });
      }
    }
  }

  // Paged decode attention: batch B at a context of T keys, every key and value read once.
  for (int64_t batch : {int64_t{1}, int64_t{32}}) {
    const int64_t ctx = batch == 1 ? 4096 : 1024, block = 16, blocks_per_seq = ctx / block;
    // Several caches (one per layer, as in the model) when one would stay in cache.
    const int64_t caches = batch == 1 ? 8 : 2;
    std::vector<at::Tensor> ks, vs;
    for (int64_t c = 0; c < caches; ++c) {
      ks.push_back(randn({batch * blocks_per_seq, block, kKvHeads, kHeadDim}, st));
      vs.push_back(randn({batch * blocks_per_seq, block, kKvHeads, kHeadDim}, st));
    }
    const swarm::PagedContext context = swarm::bench::consecutive_blocks_context(batch, blocks_per_seq, ctx);
    const at::Tensor q = randn({batch, kHeads, kHeadDim}, st);
    const double bytes = 2.0 * static_cast<double>(batch * ctx * kKvHeads * kHeadDim) * es;
    const double flops = 4.0 * static_cast<double>(batch * ctx * kHeads * kHeadDim);  // q.k and p.v
    b.run("paged_decode_attention", "batch " + std::to_string(batch) + ", " + std::to_string(ctx) + " keys",
          name, bytes, flops, static_cast<int>(caches), [&](int i) {
            swarm::paged_decode_attention(q, ks[static_cast<size_t>(i)], vs[static_cast<size_t>(i)], context,
                                          std::numeric_limits<int64_t>::max(), 0.125);
          });
  }

  // Elementwise serving ops over a prefill-sized block of rows, from memory.
  {
    const int64_t n = b.quick ? 8192 : 16384;
    const at::Tensor x = randn({n, kHidden}, st), w = randn({kHidden}, st), out = at::empty_like(x);
    at::Tensor resid = randn({n, kHidden}, st);
    const double row_bytes = static_cast<double>(n * kHidden) * es;
    b.run("rms_norm_rows", std::to_string(n) + " x 576", name, 2 * row_bytes, 0, 5,
          [&](int) { swarm::rms_norm_rows(x, w, 1e-5, out); });
    b.run("add_rms_norm_rows", std::to_string(n) + " x 576", name, 4 * row_bytes, 0, 5,
          [&](int) { swarm::add_rms_norm_rows(resid, x, w, 1e-5, out); });
    const at::Tensor gu = randn({n, 2 * kInter}, st, 0.5), act = at::empty({n, kInter}, gu.options());
    b.run("silu_mul", std::to_string(n) + " x 2 x 1536", name, 3.0 * static_cast<double>(n * kInter) * es, 0,
          5, [&](int) { swarm::silu_mul(gu, act); });
    const int64_t width = (kHeads + 2 * kKvHeads) * kHeadDim;
    const at::Tensor qkv = randn({n, width}, st);
    const at::Tensor angles =
        at::arange(n, at::kFloat).unsqueeze(1) * at::linspace(0.001, 1.0, kHeadDim).unsqueeze(0);
    const at::Tensor cos = angles.cos().to(st), sin = angles.sin().to(st);
    const at::Tensor pos = at::arange(n, at::kLong), rows = at::randperm(n, at::kLong);
    const at::Tensor kc = at::zeros({n, kKvHeads * kHeadDim}, qkv.options()), vc = at::zeros_like(kc);
    const at::Tensor qout = at::empty({n, kHeads, kHeadDim}, qkv.options());
    // read qkv and the step's cos/sin rows, write q, k and v
    const double rope_bytes =
        (2.0 * static_cast<double>(n * width) + 2.0 * static_cast<double>(n * kHeadDim)) * es;
    b.run("rope_qkv_into_cache", std::to_string(n) + " x (9 + 2 x 3) x 64", name, rope_bytes, 0, 5, [&](int) {
      swarm::rope_qkv_into_cache(qkv, kHeads, kKvHeads, kHeadDim, cos, sin, pos, rows, kc, vc, qout);
    });
  }
  if (st == at::kFloat) {  // the logits are fp32 in both dtypes: once
    const int64_t batch = 64;
    const at::Tensor logits = at::randn({batch, kVocab});
    const std::vector<float> temps(static_cast<size_t>(batch), 0.7f);
    b.run("softmax_row_stats", "64 x 49152 fp32 logits", "fp32", static_cast<double>(batch * kVocab) * 4.0, 0,
          5, [&](int) { swarm::softmax_row_stats(logits, temps); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  swarm::bound_openmp_spin_wait(argv);  // first: it may re-execute this program
  CLI::App app{"bench_kernels: each CPU kernel family against this machine's copy bandwidth and matmul peak"};
  bool quick = false;
  int threads = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::string dtypes = "fp32,bf16";
  app.add_flag("--quick", quick, "Fewer layers' weights, fewer passes (smoke run, under a minute)");
  app.add_option("--threads", threads, "Cores for the engine's thread plan")->capture_default_str();
  app.add_option("--dtypes", dtypes, "Comma list: fp32, bf16")->capture_default_str();
  std::string only;
  app.add_option("--only", only, "Only the kernels whose name contains this (e.g. paged_decode_attention)");
  CLI11_PARSE(app, argc, argv);
  sb::CommonOptions parse_dtypes("", "", "");
  parse_dtypes.dtypes = dtypes;
  std::vector<std::pair<std::string, swarm::DType>> list;
  try {
    list = parse_dtypes.dtype_list();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 2;
  }

  const auto t_start = Clock::now();
  swarm::set_compute_threads(threads);
  sb::print_run_header(SWARM_SOURCE_DIR, quick, sb::OpenBlas::find().describe());
  Bench b;
  b.quick = quick;
  b.only = only;
  std::vector<double> runs;
  b.copy_bps = sb::copy_bandwidth(512LL * 1024 * 1024, quick ? 3 : 8, runs) * 1e9;
  progress("copy bandwidth %.1f GB/s (read+write, %d threads)", b.copy_bps / 1e9, threads);
  for (const auto& [name, dtype] : list) run_dtype(b, name, dtype, threads);

  std::printf("copy probe: %.1f GB/s best of", b.copy_bps / 1e9);
  for (double g : runs) std::printf(" %.1f", g);
  std::printf(" (512 MiB, read + write counted, %d threads)\n", threads);
  std::printf(
      "\n== Kernels at SmolLM2-135M shapes, best time per call. bound = the slower of moving the call's "
      "bytes (weights "
      "or K/V read, inputs read, results written) at the copy probe's rate and doing its FLOPs at the "
      "dtype's matmul "
      "peak (2048^3, the same thread plan); limit = which of the two; %% of bound = bound time / time "
      "(elementwise "
      "ops: bytes only)\n");
  std::printf("%-34s %-28s %-5s %10s %8s %9s %10s %6s %8s\n", "kernel", "shape", "dtype", "us/call", "GB/s",
              "GFLOP/s", "bound us", "limit", "% bound");
  for (const Row& r : b.rows) {
    std::printf("%-34s %-28s %-5s %10.1f %8.1f %9.1f %10.1f %6s %7.1f%%\n", r.kernel.c_str(), r.shape.c_str(),
                r.dtype.c_str(), r.seconds * 1e6, r.bytes / r.seconds / 1e9, r.flops / r.seconds / 1e9,
                r.bound_seconds() * 1e6, r.memory_bound() ? "memory" : "FLOPs",
                100.0 * r.bound_seconds() / r.seconds);
  }
  std::printf(
      "matmul peak 2048^3: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s%s\n", b.peak_of[0] / 1e9, b.peak_of[1] / 1e9,
      swarm::bf16_matmul_widens() ? " (the engine's bf16 GEMM without AVX512_BF16: widening_linear)" : "");
  std::printf("\ntotal %.1f s\n", seconds_since(t_start));
  return 0;
}
