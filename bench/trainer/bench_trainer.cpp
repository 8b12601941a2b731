// bench_trainer: GRPO trainer throughput on CPU. For each compute dtype (fp32, bf16), on a
// SmolLM2-135M-shaped model with random weights and a fixed synthetic GRPO batch (seeded: by
// default 8 sequences x 256 tokens, a 128-token prompt + 128 trained response tokens, 2 task
// groups of 4 with different rewards, micro-batches of at most 2048 padded tokens):
//
//  * one training step = PolicyTrainer::accumulate_gradients over every micro-batch (forward +
//    backward, the on-policy path: old log-probs = current ones, detached) + optimizer_step
//    (clip + AdamW on the fp32 master). 1 untimed warm-up step, then --steps timed ones.
//    tokens/s counts every sequence token (prompt + response) processed;
//  * optimizer_step and sync_to_serving (the weight copy into the serving model) on their own;
//  * MFU: model FLOPs (6 x parameters + 12 x layers x hidden x seq_len per token) per second
//    over a matmul peak measured in the same run, in that dtype, with that dtype's thread plan
//    (bf16 without AVX512_BF16: the widened fp32 GEMM the trainer runs there).
//
// In the same run: a python3-torch eager reference (python_reference.py, a child process: the
// same weights, batch, micro-batches, loss, threads; torch.optim.AdamW). Prints tables; progress
// goes to stderr. Never a timed assertion. Results and the exact command are recorded in
// docs/benchmarks.md.
//
//   bench_trainer [--quick] [--threads N] [--dtypes fp32,bf16] [--steps K] [--seqs N]
//                 [--seq-len T] [--prompt-len P] [--micro-batch-tokens M] [--skip-python]
//                 [--profile]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/torch_bench.hpp"
#include "inference/decoder_model_torch.hpp"
#include "model/model_config.hpp"
#include "rollout_pool/types.hpp"
#include "trainer/grpo_batch.hpp"
#include "trainer/policy_trainer_torch.hpp"

namespace {

namespace fs = std::filesystem;
namespace sb = swarm::bench;
using json = nlohmann::json;
using sb::Clock;
using sb::seconds_since;

constexpr double kMiB = 1024.0 * 1024.0;

template <typename... Args>
void progress(const char* fmt, Args... args) {
  sb::progress_line("bench_trainer", fmt, args...);
}

constexpr auto& fmt = sb::fmt_number;

// ------------------------------------------------------------------ workload

struct Workload {
  int64_t seqs = 8;
  int64_t seq_len = 256;
  int64_t prompt_len = 128;  // loss mask 0; the rest of the sequence is the trained response
  int64_t groups = 2;        // task groups (consecutive sequences), each with varying rewards
  int64_t micro_batch_tokens = 2048;
  int64_t warmup = 1;
  int64_t steps = 2;
  uint64_t seed = 1234;
};

/// The synthetic GRPO batch: one episode with one sample per sequence, random token ids, a
/// prompt/response loss mask, random rewards in [0, 1) (so no group has zero variance) and
/// made-up rollout log-probs (only the mismatch metric reads them).
swarm::TrainBatch make_batch(const Workload& w, int64_t vocab) {
  std::mt19937_64 rng(w.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  swarm::TrainBatch batch;
  batch.num_tasks = w.groups;
  for (int64_t s = 0; s < w.seqs; ++s) {
    const int64_t group = s * w.groups / w.seqs;
    swarm::FinishedEpisode ep;
    ep.episode_uuid = "episode-" + std::to_string(s);
    ep.client_uuid = "bench";
    ep.task_id = "task-" + std::to_string(group);
    ep.reward = unit(rng);
    ep.finish_seq = s;
    swarm::Sample sample;
    sample.task_id = ep.task_id;
    sample.episode_uuid = ep.episode_uuid;
    sample.reward = ep.reward;
    sample.num_calls = 1;
    for (int64_t t = 0; t < w.seq_len; ++t) {
      const bool trained = t >= w.prompt_len;
      sample.token_ids.push_back(token(rng));
      sample.loss_mask.push_back(trained ? 1 : 0);
      sample.rollout_logprobs.push_back(trained ? static_cast<float>(-3.0 * unit(rng)) : 0.0f);
      sample.policy_versions.push_back(trained ? 0 : -1);
    }
    ep.samples.push_back(std::move(sample));
    batch.episodes.push_back(std::move(ep));
  }
  return batch;
}

/// The update's plan, exactly as PolicyTrainer::train makes it for one mini-batch on one rank.
struct Plan {
  swarm::PreparedBatch prepared;
  std::vector<std::vector<size_t>> micro;
  double norm = 0;     // token-mean: the trained tokens of the mini-batch
  int64_t tokens = 0;  // every sequence token
  int64_t padded_tokens = 0;
};

Plan make_plan(const swarm::TrainBatch& batch, const swarm::TrainerOptions& opts) {
  Plan p;
  p.prepared = swarm::prepare_batch(batch, opts.advantage_estimator);
  if (p.prepared.sequences.empty()) throw std::runtime_error("the synthetic batch has no trainable sequence");
  const auto minis = swarm::split_mini_batches(p.prepared, 0);
  p.micro = swarm::plan_micro_batches(p.prepared, swarm::shard_for_rank(p.prepared, minis.at(0), 0, 1),
                                      opts.micro_batch_max_tokens);
  for (const auto& s : p.prepared.sequences) {
    p.norm += static_cast<double>(s.trained_tokens);
    p.tokens += s.length;
  }
  for (const auto& m : p.micro) {
    int64_t longest = 0;
    for (size_t i : m) longest = std::max(longest, p.prepared.sequences[i].length);
    p.padded_tokens += longest * static_cast<int64_t>(m.size());
  }
  return p;
}

// ------------------------------------------------------------------ C++ trainer

/// Kernel time and minor page faults of this process (all threads): first-touch faults on
/// freshly mmap'ed buffers are where large temporaries cost on this VM (PTI is on).
struct Usage {
  double sys_s = 0;
  double minflt = 0;
  static Usage now() {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return {static_cast<double>(r.ru_stime.tv_sec) + static_cast<double>(r.ru_stime.tv_usec) * 1e-6,
            static_cast<double>(r.ru_minflt)};
  }
  Usage operator-(const Usage& o) const { return {sys_s - o.sys_s, minflt - o.minflt}; }
  static Usage mean(const std::vector<Usage>& v) {
    Usage m;
    for (const Usage& u : v) m.sys_s += u.sys_s, m.minflt += u.minflt;
    if (!v.empty()) m.sys_s /= static_cast<double>(v.size()), m.minflt /= static_cast<double>(v.size());
    return m;
  }
};

struct EngineResult {
  double load_s = 0;
  double init_s = 0;  // PolicyTrainer construction (flat buffers, master copy)
  int64_t params = 0;
  std::vector<double> step_s;                      // timed steps: gradients + optimizer
  std::vector<double> grad_s;                      // of which accumulate_gradients over all micro-batches
  std::vector<double> optimizer_s;                 // of which optimizer_step
  std::vector<double> sync_s;                      // sync_to_serving reps (after the steps)
  std::vector<Usage> grad_usage, optimizer_usage;  // per timed step
  double forward_only_s = 0;                       // token_logprobs over the micro-batches (--profile only)
  double first_grad_norm = 0;                      // of the warm-up step, from the checkpoint's weights
  double loss = 0;                                 // of the last step
  int64_t rss_peak_kib = 0;
  std::pair<double, double> cores;       // ours / others during the steps
  std::vector<sb::OpCost> profile;       // one step's accumulate_gradients, per step
  std::vector<sb::OpCost> profile_opt;   // optimizer_step + sync_to_serving
  swarm::FlatParameters::Memory memory;  // the trainer's buffers after the steps
  int64_t serving_bytes = 0;             // the serving copy (0: one weight copy)
  int64_t activations_peak = -1;         // the last step's activations_peak_bytes
  int64_t weight_bytes_per_param = 4;    // the compute dtype's size

  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
  static double min(const std::vector<double>& v) {
    return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
  }
};

EngineResult run_engine(const fs::path& dir, swarm::DType dtype, const swarm::TrainerOptions& opts,
                        const swarm::TrainBatch& batch, const Workload& w, bool profile) {
  EngineResult r;
  malloc_trim(0);
  sb::reset_peak_rss();
  auto t0 = Clock::now();
  std::shared_ptr<swarm::DecoderModel> serving = swarm::DecoderModel::load(dir, dtype);
  std::unique_ptr<swarm::PolicyTrainer> trainer;
  {
    // As the engine does: bf16 training starts from the fp32 checkpoint as its master weights.
    std::shared_ptr<swarm::DecoderModel> master;
    if (dtype != swarm::DType::F32) master = swarm::DecoderModel::load(dir, swarm::DType::F32);
    r.load_s = seconds_since(t0);
    t0 = Clock::now();
    trainer = std::make_unique<swarm::PolicyTrainer>(serving, opts, nullptr,
                                                     master ? &master->parameters() : nullptr);
    r.init_s = seconds_since(t0);
  }
  r.params = trainer->parameter_count();
  const Plan plan = make_plan(batch, opts);

  auto step = [&](EngineResult* out) {
    const Usage u0 = Usage::now();
    const auto s0 = Clock::now();
    trainer->zero_gradients();
    swarm::LossSums sums;
    for (const auto& micro : plan.micro)
      sums.add(trainer->accumulate_gradients(plan.prepared, micro, {}, plan.norm));
    const auto s1 = Clock::now();
    const Usage u1 = Usage::now();
    const double norm = trainer->optimizer_step(opts.learning_rate);
    const auto s2 = Clock::now();
    const Usage u2 = Usage::now();
    if (out) {
      out->grad_s.push_back(std::chrono::duration<double>(s1 - s0).count());
      out->optimizer_s.push_back(std::chrono::duration<double>(s2 - s1).count());
      out->step_s.push_back(std::chrono::duration<double>(s2 - s0).count());
      out->grad_usage.push_back(u1 - u0);
      out->optimizer_usage.push_back(u2 - u1);
      out->loss = sums.loss;
    }
    return norm;
  };

  for (int64_t i = 0; i < w.warmup; ++i) {
    const double norm = step(nullptr);
    if (i == 0) r.first_grad_norm = norm;
  }
  const sb::CpuSample cpu0 = sb::cpu_sample();
  for (int64_t i = 0; i < w.steps; ++i) {
    step(&r);
    progress("  C++ step %lld: %.2f s (%.1f tok/s; gradients %.2f s, optimizer %.3f s)",
             static_cast<long long>(i + 1), r.step_s.back(),
             static_cast<double>(plan.tokens) / r.step_s.back(), r.grad_s.back(), r.optimizer_s.back());
  }
  r.cores = sb::cores_busy(cpu0, sb::cpu_sample());
  const swarm::PolicyTrainer::ExclusiveRunner inline_runner;  // no serving engine: runs inline
  trainer->sync_to_serving(inline_runner);                    // warm-up
  for (int i = 0; i < 5; ++i) r.sync_s.push_back(trainer->sync_to_serving(inline_runner));
  r.rss_peak_kib = sb::proc_status_kib("VmHWM");
  r.memory = trainer->memory();
  r.activations_peak = trainer->activations_peak_bytes();
  r.weight_bytes_per_param = r.params > 0 ? r.memory.weights / r.params : 0;
  if (!trainer->shares_serving_weights())
    for (const auto& [name, p] : trainer->serving_model()->parameters())
      r.serving_bytes += p.numel() * static_cast<int64_t>(p.element_size());

  if (profile) {
    auto f0 = Clock::now();
    for (const auto& micro : plan.micro) trainer->token_logprobs(plan.prepared, micro);
    r.forward_only_s = seconds_since(f0);
    r.profile = sb::profile_ops(
        [&] {
          trainer->zero_gradients();
          for (const auto& micro : plan.micro)
            trainer->accumulate_gradients(plan.prepared, micro, {}, plan.norm);
        },
        1.0, 22);
    r.profile_opt = sb::profile_ops(
        [&] {
          trainer->optimizer_step(opts.learning_rate);
          trainer->sync_to_serving(inline_runner);
        },
        1.0, 10);
  }
  return r;
}

// ------------------------------------------------------------------ python reference

using sb::PythonResult;

PythonResult run_python(const std::string& python, const fs::path& script, const fs::path& dir,
                        const std::string& dtype, int threads, const Plan& plan,
                        const swarm::TrainerOptions& opts, const Workload& w) {
  json spec = {{"model_dir", dir.string()},
               {"dtype", dtype},
               {"threads", threads},
               {"warmup", w.warmup},
               {"steps", w.steps},
               {"norm", plan.norm},
               {"clip_low", opts.clip_ratio_low},
               {"clip_high", opts.clip_ratio_high},
               {"foreach", false},
               {"adamw",
                {{"lr", opts.learning_rate},
                 {"weight_decay", opts.weight_decay},
                 {"beta1", opts.adam_beta1},
                 {"beta2", opts.adam_beta2},
                 {"eps", opts.adam_eps},
                 {"grad_clip", opts.grad_clip}}}};
  spec["sequences"] = json::array();
  for (const auto& s : plan.prepared.sequences) {
    std::vector<int> mask(s.sample->loss_mask.begin(), s.sample->loss_mask.end());
    spec["sequences"].push_back({{"ids", s.sample->token_ids}, {"mask", mask}, {"advantage", s.advantage}});
  }
  spec["micro_batches"] = plan.micro;
  return sb::run_python_reference(python, script, spec);
}

// ------------------------------------------------------------------ report

struct CaseResult {
  std::string dtype;
  c10::ScalarType scalar = at::kFloat;
  swarm::ThreadPlan threads;
  double peak = 0;  // matmul FLOP/s in this dtype with this thread plan
  std::string load_before, load_after;
  EngineResult engine;
  PythonResult python;
  bool ran_python = false;
};

struct ModelShape {
  int64_t layers = 0, hidden = 0;
};

/// Training FLOPs per token: 6 x parameters (forward 2, backward 4) + attention
/// 12 x layers x hidden x seq_len (QK^T and PV, forward + backward; PaLM's MFU convention,
/// which counts the full square, not the causal half).
double train_flops_per_token(int64_t params, const ModelShape& s, int64_t seq_len) {
  return 6.0 * static_cast<double>(params) +
         12.0 * static_cast<double>(s.layers) * static_cast<double>(s.hidden) * static_cast<double>(seq_len);
}

std::string verdict(bool known, double value, double target, const char* unit) {
  if (!known) return "-";
  return std::string(value >= target ? "PASS " : "MISS ") + fmt(unit, value);
}

void print_report(const std::vector<CaseResult>& cases, const Plan& plan, const Workload& w,
                  const ModelShape& shape) {
  const double tokens = static_cast<double>(plan.tokens);
  std::printf(
      "\n== Workload: %lld sequences x %lld tokens (prompt %lld, trained response %lld), %lld task groups, "
      "%zu micro-batch(es) of <= %lld padded tokens (%lld padded in all); %lld tokens/step, %.0f trained; "
      "1 warm-up + %lld timed steps\n",
      static_cast<long long>(w.seqs), static_cast<long long>(w.seq_len), static_cast<long long>(w.prompt_len),
      static_cast<long long>(w.seq_len - w.prompt_len), static_cast<long long>(w.groups), plan.micro.size(),
      static_cast<long long>(w.micro_batch_tokens), static_cast<long long>(plan.padded_tokens),
      static_cast<long long>(plan.tokens), plan.norm, static_cast<long long>(w.steps));

  std::printf(
      "\n== Trainer step (C++ PolicyTrainer vs python3-torch eager; tokens/s = all sequence tokens)\n");
  std::printf("%-5s %11s %13s %7s %9s %13s %16s\n", "dtype", "C++ tok/s", "Python tok/s", "ratio", "MFU C++",
              "optimizer ms", "weight sync ms");
  for (const CaseResult& c : cases) {
    const EngineResult& e = c.engine;
    const double cpp = tokens / EngineResult::mean(e.step_s);
    const double py = c.python.get("step_s") > 0 ? tokens / c.python.get("step_s") : 0;
    const double flops = train_flops_per_token(e.params, shape, w.seq_len) * tokens;
    const double mfu = flops / EngineResult::mean(e.step_s) / c.peak;
    std::printf("%-5s %11.1f %13s %7s %8.1f%% %13.1f %16.1f\n", c.dtype.c_str(), cpp,
                py > 0 ? fmt("%.1f", py).c_str() : "-", py > 0 ? fmt("%.2fx", cpp / py).c_str() : "-",
                100.0 * mfu, EngineResult::mean(e.optimizer_s) * 1e3, EngineResult::mean(e.sync_s) * 1e3);
  }

  std::printf("\n== Details (means over the timed steps; min in brackets)\n");
  std::printf("%-5s %-22s %-20s %-19s %-15s %-13s %-21s %-10s %-10s %-12s\n", "dtype", "C++ s/step",
              "C++ gradients s", "Py fwd / bwd / opt s", "sync ms (min)", "peak GFLOP/s",
              "achieved GFLOP/s C/Py", "MFU Py", "cores us/oth", "RSS peak MiB C/Py");
  for (const CaseResult& c : cases) {
    const EngineResult& e = c.engine;
    const double flops = train_flops_per_token(e.params, shape, w.seq_len) * tokens;
    const double py_s = c.python.get("step_s");
    std::printf(
        "%-5s %-22s %-20s %-19s %-15s %-13.1f %-21s %-10s %-12s %-12s\n", c.dtype.c_str(),
        (fmt("%.2f", EngineResult::mean(e.step_s)) + " (" + fmt("%.2f", EngineResult::min(e.step_s)) + ")")
            .c_str(),
        fmt("%.2f", EngineResult::mean(e.grad_s)).c_str(),
        py_s > 0 ? (fmt("%.2f", c.python.get("forward_s")) + " / " + fmt("%.2f", c.python.get("backward_s")) +
                    " / " + fmt("%.2f", c.python.get("optimizer_s")))
                       .c_str()
                 : "-",
        (fmt("%.1f", EngineResult::mean(e.sync_s) * 1e3) + " (" +
         fmt("%.1f", EngineResult::min(e.sync_s) * 1e3) + ")")
            .c_str(),
        c.peak / 1e9,
        (fmt("%.1f", flops / EngineResult::mean(e.step_s) / 1e9) + " / " +
         (py_s > 0 ? fmt("%.1f", flops / py_s / 1e9) : std::string("-")))
            .c_str(),
        py_s > 0 ? fmt("%.1f%%", 100.0 * flops / py_s / c.peak).c_str() : "-",
        (fmt("%.2f", e.cores.first) + "/" + fmt("%.2f", e.cores.second)).c_str(),
        (fmt("%.0f", static_cast<double>(e.rss_peak_kib) / 1024) + " / " +
         (c.python.ok ? fmt("%.0f", c.python.get("peak_rss_kib") / 1024) : std::string("-")))
            .c_str());
  }
  std::printf("\n%-5s %-24s %-26s %-22s %-12s %-10s %-22s\n", "dtype", "thread plan torch/BLAS",
              "loadavg before -> after", "grad norm step 1 C/Py", "loss C/Py", "Py cores",
              "load / trainer init s");
  for (const CaseResult& c : cases) {
    std::printf("%-5s %-24s %-26s %-22s %-12s %-10s %-22s\n", c.dtype.c_str(),
                (std::to_string(c.threads.torch_threads) + " / " + std::to_string(c.threads.openblas_threads))
                    .c_str(),
                (c.load_before + " -> " + c.load_after).c_str(),
                (fmt("%.5g", c.engine.first_grad_norm) + " / " +
                 (c.python.ok ? fmt("%.5g", c.python.get("first_grad_norm")) : std::string("-")))
                    .c_str(),
                (fmt("%.4f", c.engine.loss) + "/" +
                 (c.python.ok ? fmt("%.4f", c.python.get("loss")) : std::string("-")))
                    .c_str(),
                c.ran_python
                    ? (fmt("%.2f", c.python.cores.first) + "/" + fmt("%.2f", c.python.cores.second)).c_str()
                    : "-",
                (fmt("%.1f", c.engine.load_s) + " / " + fmt("%.2f", c.engine.init_s)).c_str());
    if (c.ran_python && !c.python.ok)
      std::printf("      python reference FAILED: %s\n", c.python.error.c_str());
  }

  std::printf(
      "\n== Kernel time and minor page faults per step (getrusage, all threads): first touches of freshly "
      "mmap'ed temporaries\n");
  std::printf("%-5s %-28s %-28s %-28s\n", "dtype", "C++ gradients sys s / kflt", "C++ optimizer sys s / kflt",
              "Python step sys s / kflt");
  for (const CaseResult& c : cases) {
    const Usage g = Usage::mean(c.engine.grad_usage), o = Usage::mean(c.engine.optimizer_usage);
    std::printf(
        "%-5s %-28s %-28s %-28s\n", c.dtype.c_str(),
        (fmt("%.2f", g.sys_s) + " / " + fmt("%.0f", g.minflt / 1e3)).c_str(),
        (fmt("%.2f", o.sys_s) + " / " + fmt("%.0f", o.minflt / 1e3)).c_str(),
        c.python.ok
            ? (fmt("%.2f", c.python.get("sys_s")) + " / " + fmt("%.0f", c.python.get("minflt") / 1e3)).c_str()
            : "-");
  }

  // What the rank holds (one rank, synchronous training: one weight copy), against the per-rank
  // formula of docs/concepts.md "Sharding": weights P x the compute dtype, gradients 4P (all of
  // them on one rank), fp32 master 4P (none where the fp32 weights are the master), moments 8P,
  // no serving copy.
  std::printf("\n== Memory per rank (MiB; N = 1; target from the formula in brackets)\n");
  std::printf("%-5s %-18s %-18s %-18s %-18s %-18s %-16s %-8s\n", "dtype", "weights", "serving copy",
              "gradients", "master", "moments", "activations peak", "formula");
  for (const CaseResult& c : cases) {
    const EngineResult& e = c.engine;
    const double P = static_cast<double>(e.params), mib = 1 << 20;
    const double want_w = P * static_cast<double>(e.weight_bytes_per_param), want_g = 4 * P,
                 want_m = e.weight_bytes_per_param == 4 ? 0.0 : 4 * P, want_o = 8 * P;
    const auto cell = [&](int64_t got, double want) {
      return fmt("%.1f", static_cast<double>(got) / mib) + fmt(" [%.1f]", want / mib);
    };
    // Padding of the flat buffers: under one element per bucket and rank.
    const auto near = [](int64_t got, double want) {
      return std::abs(static_cast<double>(got) - want) <= 64.0;
    };
    const bool met = near(e.memory.weights, want_w) && near(e.serving_bytes, 0) &&
                     near(e.memory.gradients, want_g) && near(e.memory.master, want_m) &&
                     near(e.memory.optimizer, want_o);
    std::printf(
        "%-5s %-18s %-18s %-18s %-18s %-18s %-16s %-8s\n", c.dtype.c_str(),
        cell(e.memory.weights, want_w).c_str(), cell(e.serving_bytes, 0).c_str(),
        cell(e.memory.gradients, want_g).c_str(), cell(e.memory.master, want_m).c_str(),
        cell(e.memory.optimizer, want_o).c_str(),
        e.activations_peak >= 0 ? fmt("%.1f", static_cast<double>(e.activations_peak) / mib).c_str() : "n/a",
        met ? "met" : "MISSED");
  }

  std::printf("\n== Targets (reported, not asserted)\n");
  std::printf("%-5s %-22s %-22s %-22s\n", "dtype", ">= 1.0x Python", "bf16 MFU >= 40%",
              "weight sync <= 50 ms");
  for (const CaseResult& c : cases) {
    const EngineResult& e = c.engine;
    const double cpp = tokens / EngineResult::mean(e.step_s);
    const double py = c.python.get("step_s") > 0 ? tokens / c.python.get("step_s") : 0;
    const double mfu =
        train_flops_per_token(e.params, shape, w.seq_len) * tokens / EngineResult::mean(e.step_s) / c.peak;
    const double sync_ms = EngineResult::mean(e.sync_s) * 1e3;
    std::printf("%-5s %-22s %-22s %-22s\n", c.dtype.c_str(),
                verdict(py > 0, py > 0 ? cpp / py : 0, 1.0, "(%.2fx)").c_str(),
                c.scalar == at::kBFloat16 ? verdict(true, 100.0 * mfu, 40.0, "(%.1f%%)").c_str() : "n/a",
                (sync_ms <= 50.0 ? "PASS " + fmt("(%.1f ms)", sync_ms) : "MISS " + fmt("(%.1f ms)", sync_ms))
                    .c_str());
  }

  for (const CaseResult& c : cases) {
    if (c.engine.profile.empty()) continue;
    std::printf(
        "\n== Profile, %s: forward only (token_logprobs, no grad) %.2f s vs forward+backward %.2f s per "
        "step\n",
        c.dtype.c_str(), c.engine.forward_only_s, EngineResult::mean(c.engine.grad_s));
    for (const auto& [title, ops] :
         {std::pair{"accumulate_gradients over the micro-batches", &c.engine.profile},
          std::pair{"optimizer_step + sync_to_serving", &c.engine.profile_opt}}) {
      std::printf("  %s: self CPU ms on the calling thread (legacy profiler overhead included)\n", title);
      double total = 0;
      for (const auto& op : *ops) total += op.self_us;
      for (const auto& op : *ops)
        std::printf("    %-40s %10.1f ms %6lld calls\n", op.name.c_str(), op.self_us / 1e3,
                    static_cast<long long>(op.calls));
      std::printf("    %-40s %10.1f ms\n", "(top ops total)", total / 1e3);
    }
  }
}

struct Options {
  sb::CommonOptions common{SWARM_DEFAULT_FIXTURES_DIR, SWARM_BENCH_MODEL_CACHE, SWARM_BENCH_PYTHON_SCRIPT};
  bool profile = false;
  int64_t steps = 0;  // 0 = the default of the run size
  int64_t seqs = 0, seq_len = 0, prompt_len = -1, micro_batch_tokens = 2048;
};

}  // namespace

int main(int argc, char** argv) {
  swarm::bound_openmp_spin_wait(argv);  // first: it may re-execute this program
  Options opt;
  const sb::CommonOptions& common = opt.common;
  CLI::App app{
      "bench_trainer: GRPO trainer step tokens/s, MFU, optimizer and weight-sync time vs python3-torch"};
  opt.common.add_to(app, "Smaller batch (2 x 128 tokens) and 1 timed step (smoke run)",
                    "Cores for the engine's thread plan (C++ and Python)");
  app.add_option("--steps", opt.steps, "Timed steps after 1 warm-up (default 2, quick 1)");
  app.add_option("--seqs", opt.seqs, "Sequences in the batch (default 8, quick 2)");
  app.add_option("--seq-len", opt.seq_len, "Tokens per sequence (default 256, quick 128)");
  app.add_option("--prompt-len", opt.prompt_len, "Prompt tokens (loss mask 0) per sequence (default: half)");
  app.add_option("--micro-batch-tokens", opt.micro_batch_tokens,
                 "micro_batch_max_tokens (padded rows x longest row)")
      ->capture_default_str();
  app.add_flag(
      "--profile", opt.profile,
      "Also time a forward-only pass and print per-op self time of one step's gradients and optimizer");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto bench_start = Clock::now();
    Workload w;
    w.seqs = opt.seqs > 0 ? opt.seqs : (common.quick ? 2 : 8);
    w.seq_len = opt.seq_len > 0 ? opt.seq_len : (common.quick ? 128 : 256);
    w.prompt_len = opt.prompt_len >= 0 ? opt.prompt_len : w.seq_len / 2;
    w.steps = opt.steps > 0 ? opt.steps : (common.quick ? 1 : 2);
    w.micro_batch_tokens = opt.micro_batch_tokens;
    w.groups = std::min<int64_t>(2, w.seqs / 2);
    if (w.groups < 1 || w.prompt_len >= w.seq_len - 1)
      throw std::invalid_argument("need --seqs >= 2 and --prompt-len < --seq-len - 1");

    swarm::set_compute_threads(common.threads);
    sb::print_run_header(SWARM_SOURCE_DIR, common.quick, sb::OpenBlas::find().describe());

    const fs::path dir = common.smollm2_random();
    const swarm::ModelConfig config = swarm::ModelConfig::from_directory(dir);
    const ModelShape shape{config.num_hidden_layers, config.hidden_size};
    std::printf("model: smollm2-135m shape, random weights (%s)\n", dir.c_str());

    swarm::TrainerOptions topts;         // the defaults, with the token budget of the run
    topts.share_serving_weights = true;  // as the engine trains synchronously: one weight copy
    topts.micro_batch_max_tokens = w.micro_batch_tokens;
    const swarm::TrainBatch batch = make_batch(w, config.vocab_size);
    const Plan plan = make_plan(batch, topts);

    std::vector<CaseResult> cases;
    for (const auto& [name, dtype] : common.dtype_list()) {
      CaseResult c;
      c.dtype = name;
      c.scalar = swarm::compute_scalar_type(dtype);
      // The engine's thread plan for this dtype; the Python child gets PyTorch's best (python_thread_plan).
      c.threads = sb::apply_thread_plan(common.threads, dtype);
      progress("%s: thread plan libtorch %d, OpenBLAS %d", name.c_str(), c.threads.torch_threads,
               c.threads.openblas_threads);
      c.peak = sb::matmul_peak(c.scalar, 2048, common.quick ? 2 : 4, common.quick ? 0.3 : 1.0);
      progress("%s: matmul peak %.1f GFLOP/s (2048^3)", name.c_str(), c.peak / 1e9);
      c.load_before = sb::load_average();
      progress("%s: C++ trainer (loadavg %s)", name.c_str(), c.load_before.c_str());
      c.engine = run_engine(dir, dtype, topts, batch, w, opt.profile);
      if (!common.skip_python) {
        progress("%s: python reference", name.c_str());
        c.python = run_python(common.python, common.python_script, dir, name,
                              sb::python_thread_plan(common.threads, dtype).torch, plan, topts, w);
        c.ran_python = true;
        if (!c.python.ok) progress("python reference failed: %s", c.python.error.c_str());
      }
      c.load_after = sb::load_average();
      cases.push_back(std::move(c));
    }

    print_report(cases, plan, w, shape);
    std::printf("\ntotal %.1f s\n", seconds_since(bench_start));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}
