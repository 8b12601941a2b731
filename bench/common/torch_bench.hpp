// Helpers shared by the libtorch benchmarks (bench_inference, bench_trainer): the options they
// both take, describing the machine and the run, the engine's thread plan per dtype, how busy
// the cores were, a matmul-peak probe, running the python3-torch reference as a child process
// (bench/common/reference_common.py is its Python half), the cached SmolLM2-shaped random
// model, and a per-op profile. Header-only; not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
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
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "inference/decoder_model_torch.hpp"
#include "kernels/cpu/paged_attention_torch.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"
#include "model/model_config.hpp"
#include "model/model_tools.hpp"
#include "model/safetensors.hpp"

extern char** environ;

#include "common/machine_info.hpp"
#include "common/openmp_wait.hpp"

namespace swarm::bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// One progress line on stderr, "[bench] ...", flushed at once (tables go to stdout).
template <typename... Args>
void progress_line(const char* bench, const char* fmt, Args... args) {
  std::fprintf(stderr, "[%s] ", bench);
  std::fprintf(stderr, fmt, args...);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

/// `v` printed with the printf format `f` (one number), as a string for a table cell.
inline std::string fmt_number(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// `batch` sequences of `length` keys each, sequence s in the cache blocks [s * blocks_per_seq,
/// (s + 1) * blocks_per_seq): the block tables of the attention benchmarks.
inline swarm::PagedContext consecutive_blocks_context(int64_t batch, int64_t blocks_per_seq, int64_t length) {
  swarm::PagedContext context;
  context.table_offset.push_back(0);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t j = 0; j < blocks_per_seq; ++j) context.block_ids.push_back(s * blocks_per_seq + j);
    context.table_offset.push_back(static_cast<int64_t>(context.block_ids.size()));
    context.lengths.push_back(length);
  }
  return context;
}

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ------------------------------------------------------------------ machine and process

/// libtorch's fp32 GEMMs go to the system BLAS; on Debian that is OpenBLAS with its own
/// pthread pool, sized independently of at::set_num_threads. Looked up at run time.
struct OpenBlas {
  int (*get_threads)() = nullptr;
  void (*set_threads)(int) = nullptr;
  char* (*get_config)() = nullptr;
  char* (*get_corename)() = nullptr;

  static OpenBlas find() {
    OpenBlas o;
    o.get_threads = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    o.set_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    o.get_config = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
    o.get_corename = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
    return o;
  }
  std::string describe() const {
    if (!get_threads) return "not loaded (fp32 GEMM elsewhere)";
    std::string s = get_config ? get_config() : "OpenBLAS";
    if (get_corename) s += ", kernels " + std::string(get_corename());
    return s + ", " + std::to_string(get_threads()) + " threads";
  }
};

/// CPU time of this process (and its reaped children) against the whole machine's, so the
/// tables can say how busy other processes kept the cores during a measurement.
struct CpuSample {
  Clock::time_point wall;
  double machine_busy_s = 0;  // all CPUs, from /proc/stat
  double ours_s = 0;          // self + children, from getrusage
};

inline CpuSample cpu_sample() {
  CpuSample s;
  s.wall = Clock::now();
  std::ifstream in("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  s.machine_busy_s = static_cast<double>(user + nice + system + irq + softirq) / tick;
  auto tv = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  rusage self{}, kids{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &kids);
  s.ours_s = tv(self.ru_utime) + tv(self.ru_stime) + tv(kids.ru_utime) + tv(kids.ru_stime);
  return s;
}

/// Cores kept busy between two samples: {ours, everybody else's}.
inline std::pair<double, double> cores_busy(const CpuSample& a, const CpuSample& b) {
  const double wall = std::chrono::duration<double>(b.wall - a.wall).count();
  if (wall <= 0) return {0, 0};
  const double ours = (b.ours_s - a.ours_s) / wall;
  const double all = (b.machine_busy_s - a.machine_busy_s) / wall;
  return {ours, std::max(0.0, all - ours)};
}

// ------------------------------------------------------------------ probes

/// Best GB/s of `reps` copies of a `bytes` buffer (at::Tensor::copy_, the intra-op threads),
/// read + write bytes counted; every run's figure is appended to `runs`.
inline double copy_bandwidth(int64_t bytes, int reps, std::vector<double>& runs) {
  at::Tensor src = at::empty({bytes / 4}, at::kFloat).fill_(1.0f);
  at::Tensor dst = at::empty_like(src).fill_(0.0f);  // touch every page before timing
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    dst.copy_(src);
    const double gbs = 2.0 * static_cast<double>(bytes) / seconds_since(t0) / 1e9;
    runs.push_back(gbs);
    best = std::max(best, gbs);
  }
  return best;
}

/// Best FLOP/s of at::matmul on n x n matrices of `type` (bf16 without AVX512_BF16: of
/// widening_linear, see below): at least `min_reps` timed reps and at least `min_seconds` of them
/// (the first reps on this VM are often slow).
inline double matmul_peak(c10::ScalarType type, int64_t n, int min_reps, double min_seconds) {
  at::Tensor a = at::randn({n, n}).to(type);
  at::Tensor b = at::randn({n, n}).to(type);
  // bf16 without AVX512_BF16: widening_linear, the GEMM the engine uses there (a · bᵀ, the same
  // FLOPs; the packed bf16 GEMM from AVX2 on), not libtorch's own bf16 matmul, which it never
  // calls there.
  // fp32 under the engine's thread plan: the GEMM split over libtorch's threads (split_linear).
  const bool widened = type == at::kBFloat16 && swarm::bf16_matmul_widens();
  const bool split = swarm::splits(a);
  auto mm = [&] {
    if (widened) return swarm::widening_linear(a, b, at::Tensor());
    return split ? swarm::split_linear(a, b, at::Tensor()) : at::matmul(a, b);
  };
  at::Tensor c = mm();  // warm-up (primitive creation, page faults)
  double best = 1e30, total = 0;
  for (int r = 0; r < min_reps || total < min_seconds; ++r) {
    auto t0 = Clock::now();
    c = mm();
    const double t = seconds_since(t0);
    best = std::min(best, t);
    total += t;
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

// ------------------------------------------------------------------ child processes

/// Runs `argv` with stdout captured (stderr passes through); returns {exit status, stdout}.
inline std::pair<int, std::string> run_capture(std::vector<std::string> argv) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

/// The last non-empty line of a child's stdout (where the references print their JSON).
inline std::string last_line(const std::string& out) {
  const auto end = out.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const auto begin = out.rfind('\n', end);
  return out.substr(begin == std::string::npos ? 0 : begin + 1,
                    end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

// ------------------------------------------------------------------ options and the run

/// The options every libtorch benchmark takes. The paths' defaults come from the benchmark's
/// CMake definitions (SWARM_DEFAULT_FIXTURES_DIR, SWARM_BENCH_MODEL_CACHE,
/// SWARM_BENCH_PYTHON_SCRIPT), passed to the constructor.
struct CommonOptions {
  bool quick = false;
  int threads = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::string dtypes = "fp32,bf16";
  bool skip_python = false;
  std::string fixtures;     // holds models/ (tests/fixtures)
  std::string model_cache;  // random-weight models, written once
  std::string python = "/usr/bin/python3";
  std::string python_script;

  CommonOptions(std::string fixtures_dir, std::string model_cache_dir, std::string script)
      : fixtures(std::move(fixtures_dir)),
        model_cache(std::move(model_cache_dir)),
        python_script(std::move(script)) {}

  /// Adds --quick, --threads, --dtypes, --skip-python, --fixtures, --model-cache, --python.
  void add_to(CLI::App& app, const std::string& quick_help, const std::string& threads_help) {
    app.add_flag("--quick", quick, quick_help);
    app.add_option("--threads", threads, threads_help)->capture_default_str();
    app.add_option("--dtypes", dtypes, "Comma list: fp32, bf16")->capture_default_str();
    app.add_flag("--skip-python", skip_python, "Do not run the python3-torch reference");
    app.add_option("--fixtures", fixtures, "The fixtures directory with models/ (tests/fixtures)")
        ->capture_default_str();
    app.add_option("--model-cache", model_cache, "Where random-weight models are written once")
        ->capture_default_str();
    app.add_option("--python", python, "Python with torch")->capture_default_str();
  }

  /// --dtypes as {name, dtype}; throws std::invalid_argument on an unknown name.
  std::vector<std::pair<std::string, swarm::DType>> dtype_list() const {
    std::vector<std::pair<std::string, swarm::DType>> out;
    for (const std::string& d : split_list(dtypes)) {
      if (d == "fp32")
        out.emplace_back(d, swarm::DType::F32);
      else if (d == "bf16")
        out.emplace_back(d, swarm::DType::BF16);
      else
        throw std::invalid_argument("unknown dtype '" + d + "' (fp32, bf16)");
    }
    return out;
  }

  /// The SmolLM2-135M-shaped model with random fp32 weights (seed 0), written once.
  fs::path smollm2_random() const;
};

/// The first lines of every report: the machine, libtorch and its thread pools, the commit.
inline void print_run_header(const fs::path& source_dir, bool quick, const std::string& blas) {
  std::printf("machine: %s, %ld online CPUs; %s; loadavg %s\n", cpu_model().c_str(),
              sysconf(_SC_NPROCESSORS_ONLN), utc_now().c_str(), load_average().c_str());
  std::printf(
      "torch %s (libtorch C++), intra-op threads %d, inter-op threads %d (OpenMP wait: %s); OpenBLAS: %s\n",
      TORCH_VERSION, at::get_num_threads(), at::get_num_interop_threads(), swarm::openmp_wait_setting(),
      blas.c_str());
  const char* dnnl = std::getenv("DNNL_MAX_CPU_ISA");
  const char* aten = std::getenv("ATEN_CPU_CAPABILITY");
  std::printf("CPU level %s: bf16 matmuls %s%s%s%s%s; ATen kernels %s, oneDNN %s\n", cpu_level().c_str(),
              swarm::bf16_matmul_path().c_str(), dnnl ? "; DNNL_MAX_CPU_ISA=" : "", dnnl ? dnnl : "",
              aten ? "; ATEN_CPU_CAPABILITY=" : "", aten ? aten : "", swarm::aten_cpu_capability().c_str(),
              swarm::onednn_cpu_isa().c_str());
  std::printf("commit %s; %s run\n", git_commit(source_dir).c_str(), quick ? "quick" : "full");
  std::fflush(stdout);
}

/// The threads of a plain PyTorch child (the Python references): it cannot split its GEMMs over
/// its OpenMP pool as the engine does, so it gets PyTorch's best plan on `cores` (measured before
/// the engine's GEMMs split): fp32 gives OpenBLAS's pool the cores and libtorch one thread (its
/// time is in OpenBLAS), bf16 the reverse (oneDNN runs on libtorch's pool).
struct PythonThreads {
  int torch = 1;
  int openblas = 1;
};
inline PythonThreads python_thread_plan(int cores, swarm::DType dtype) {
  return dtype == swarm::DType::F32 ? PythonThreads{1, cores} : PythonThreads{cores, 1};
}

/// The engine's thread plan for `dtype` on `cores` (swarm::configure_compute_threads), and
/// OPENBLAS_NUM_THREADS for a Python child started afterwards (python_thread_plan).
inline swarm::ThreadPlan apply_thread_plan(int cores, swarm::DType dtype) {
  const swarm::ThreadPlan plan = swarm::configure_compute_threads(cores, dtype);
  if (plan.openblas_threads > 0)
    setenv("OPENBLAS_NUM_THREADS", std::to_string(python_thread_plan(cores, dtype).openblas).c_str(), 1);
  return plan;
}

// ------------------------------------------------------------------ python reference

/// What a python3-torch reference printed: the JSON object on the last line of its stdout.
struct PythonResult {
  bool ok = false;
  std::string error;
  nlohmann::json out;
  std::pair<double, double> cores;  // cores busy while it ran: {it, everybody else}
  /// A top-level number of the result, 0 when the run failed or the key is missing.
  double get(const char* key) const { return ok && out.contains(key) ? out.at(key).get<double>() : 0.0; }
};

/// Runs `python script SPEC_FILE`, the spec written to a temporary file (not an argument: a
/// large spec would exceed the kernel's per-argument limit) and removed afterwards. Never
/// throws: a failure is in `error`.
inline PythonResult run_python_reference(const std::string& python, const fs::path& script,
                                         const nlohmann::json& spec) {
  const fs::path spec_path =
      fs::temp_directory_path() / ("swarm_bench_spec_" + std::to_string(getpid()) + ".json");
  PythonResult r;
  try {
    std::ofstream(spec_path) << spec.dump();
    const CpuSample cpu0 = cpu_sample();
    auto [status, out] = run_capture({python, script.string(), spec_path.string()});
    r.cores = cores_busy(cpu0, cpu_sample());
    if (status != 0) {
      r.error = python + " exited with status " + std::to_string(status);
    } else {
      r.out = nlohmann::json::parse(last_line(out));
      r.ok = true;
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  std::error_code ec;
  fs::remove(spec_path, ec);
  return r;
}

// ------------------------------------------------------------------ models

/// A model config with deterministic random fp32 weights (seed 0), created once in
/// `cache_dir`/`name` and reused while it still validates.
inline fs::path prepare_random_model(const fs::path& config_dir, const fs::path& cache_dir,
                                     const std::string& name) {
  const fs::path out = cache_dir / name;
  std::error_code ec;
  if (fs::exists(out / "config.json", ec)) {
    try {
      swarm::SafetensorsModel::open(out).validate_against(swarm::ModelConfig::from_directory(out));
      return out;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[bench] cached %s is unusable (%s): recreating\n", out.c_str(), e.what());
      fs::remove_all(out);
    }
  }
  std::fprintf(stderr, "[bench] writing random weights for %s into %s (once)\n", config_dir.c_str(),
               out.c_str());
  fs::create_directories(cache_dir);
  swarm::InitModelOptions opts;
  opts.from = config_dir;
  opts.out = out;
  opts.seed = 0;
  opts.dtype = swarm::DType::F32;
  swarm::init_random_model(opts);
  return out;
}

inline fs::path CommonOptions::smollm2_random() const {
  return prepare_random_model(fs::path(fixtures) / "models/smollm2-135m-instruct-noweights", model_cache,
                              "smollm2-135m-random-f32-seed0");
}

// ------------------------------------------------------------------ op profile

struct OpCost {
  std::string name;
  double self_us = 0;  // per `per` (e.g. per step)
  int64_t calls = 0;   // per `per`
};

/// Self CPU time per op on this thread (intra-op workers are not seen; CPU autograd runs the
/// backward on the calling thread, so it is included) while `fn` runs, divided by `per`, the
/// top `top` by time.
inline std::vector<OpCost> profile_ops(const std::function<void()>& fn, double per, size_t top) {
  using namespace torch::autograd::profiler;
  std::map<std::string, OpCost> by_name;
  {
    TLSLegacyProfilerGuard guard(
        torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU),
        [&](const thread_event_lists& lists) {
          for (const auto& list : lists) {
            struct Open {
              const LegacyEvent* push;
              double child_us;
            };
            std::vector<Open> stack;
            for (const LegacyEvent& e : list) {
              if (e.kind() == EventKind::PushRange) {
                stack.push_back({&e, 0.0});
              } else if (e.kind() == EventKind::PopRange && !stack.empty()) {
                Open open = stack.back();
                stack.pop_back();
                const double total = open.push->cpuElapsedUs(e);
                OpCost& c = by_name[open.push->name()];
                c.name = open.push->name();
                c.self_us += total - open.child_us;
                c.calls += 1;
                if (!stack.empty()) stack.back().child_us += total;
              }
            }
          }
        });
    fn();
  }
  std::vector<OpCost> ops;
  for (auto& [name, c] : by_name) {
    c.self_us /= per;
    c.calls = static_cast<int64_t>(std::lround(static_cast<double>(c.calls) / per));
    ops.push_back(c);
  }
  std::sort(ops.begin(), ops.end(), [](const OpCost& a, const OpCost& b) { return a.self_us > b.self_us; });
  if (ops.size() > top) ops.resize(top);
  return ops;
}

}  // namespace swarm::bench
