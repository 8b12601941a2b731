// bench_server: swarm-server (mock engine) over loopback, full episodes (claim + one chat
// call + end) with 1, 16 and 64 concurrent clients, against a bare Boost.Beast server that
// answers a fixed body (the transport ceiling). Both servers run as child processes, so
// their CPU time and resident memory come from /proc/<pid>. Prints a table; results and the
// exact command are recorded in docs/benchmarks.md. Never a timed assertion.
#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <latch>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bare_beast.hpp"
#include "common/child_process.hpp"
#include "common/machine_info.hpp"
#include "http/http_client.hpp"
#include "swarm/errors.hpp"

extern char** environ;

namespace {

using namespace swarm::bench;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kTrainConfig =
    "algorithm: grpo\nmodel: mock\nbatch_size: 64\nnum_repeat: 4\nmax_parallel_episodes: 512\n";
constexpr int kRequestsPerEpisode = 3;  // claim + chat + end
constexpr size_t kMaxErrorKinds = 32;
constexpr uint64_t kMaxErrorsPerClient = 1000;

// ------------------------------------------------------------------ /proc readings

/// Busy CPU seconds of the whole machine (every process), from /proc/stat.
double machine_busy_seconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;  // "cpu": the sum over all cores
  double v[8] = {};
  for (double& x : v) in >> x;
  const double busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];  // user nice system irq softirq steal
  return busy / static_cast<double>(sysconf(_SC_CLK_TCK));
}

/// RssAnon of a process (heap and other private memory), in KiB.
long proc_rss_anon_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("RssAnon:", 0) == 0) return std::stol(line.substr(8));
  return -1;
}

double self_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// ------------------------------------------------------------------ engine control

json get_json(swarm::HttpClient& http, const std::string& path) {
  auto r = http.request("GET", path);
  if (r.status != 200)
    throw std::runtime_error("GET " + path + " -> HTTP " + std::to_string(r.status) + ": " + r.body);
  return json::parse(r.body);
}

void post_ok(swarm::HttpClient& http, const std::string& path, const std::string& body) {
  auto r = http.request("POST", path, body);
  if (r.status != 200)
    throw std::runtime_error("POST " + path + " -> HTTP " + std::to_string(r.status) + ": " + r.body);
}

// The run's files (metrics, checkpoints, the episode store) go here; removed at the end.
std::string g_experiment_dir;

// `durable`: the job's durable_episodes (the episode store commits each end_episode before it
// answers). Stops a running engine first.
void start_engine(swarm::HttpClient& http, bool durable = true, bool fsync = true) {
  if (get_json(http, "/get_engine_status").value("engine_status", "") != "ENGINE.OFFLINE") {
    post_ok(http, "/stop_engine", "{}");
    const auto until = Clock::now() + 30s;
    while (get_json(http, "/get_engine_status").value("engine_status", "") != "ENGINE.OFFLINE") {
      if (Clock::now() > until) throw std::runtime_error("engine did not stop within 30 s");
      std::this_thread::sleep_for(20ms);
    }
  }
  const std::string yaml = std::string(kTrainConfig) + "durable_episodes: " + (durable ? "true" : "false") +
                           "\ndurable_fsync: " + (fsync ? "true" : "false") +
                           "\nexperiment_dir: " + g_experiment_dir + "\n";
  post_ok(http, "/sync_train_config", json{{"yaml_as_string", yaml}}.dump());
  post_ok(http, "/start_engine", "{}");
  const auto until = Clock::now() + 30s;
  while (Clock::now() < until) {
    if (get_json(http, "/get_engine_status").value("engine_status", "") == "ENGINE.ROLLING") return;
    std::this_thread::sleep_for(20ms);
  }
  throw std::runtime_error("engine did not reach ENGINE.ROLLING within 30 s");
}

int64_t global_step(swarm::HttpClient& http) {
  return get_json(http, "/get_engine_status").value("global_step", int64_t{-1});
}

// ------------------------------------------------------------------ per-client statistics

/// What one client thread saw. Owned by that thread until it is joined.
struct ClientStats {
  uint64_t episodes = 0;  // swarm: full episodes; bare: requests
  uint64_t retries = 0;   // claim answered success:false
  uint64_t errors = 0;
  std::vector<int64_t> claim_ns, chat_ns, end_ns;  // bare: claim_ns holds every request
  std::map<std::string, uint64_t> error_kinds;

  void reserve(size_t n) {
    claim_ns.reserve(n);
    chat_ns.reserve(n);
    end_ns.reserve(n);
  }

  void note_error(const std::string& what, const swarm::HttpClientResponse* r) {
    ++errors;
    std::string key = what;
    if (r) key += " HTTP " + std::to_string(r->status) + ": " + r->body.substr(0, 160);
    if (error_kinds.size() >= kMaxErrorKinds && !error_kinds.count(key)) key = "(other errors)";
    ++error_kinds[key];
  }

  void merge(ClientStats&& o) {
    episodes += o.episodes;
    retries += o.retries;
    errors += o.errors;
    claim_ns.insert(claim_ns.end(), o.claim_ns.begin(), o.claim_ns.end());
    chat_ns.insert(chat_ns.end(), o.chat_ns.begin(), o.chat_ns.end());
    end_ns.insert(end_ns.end(), o.end_ns.begin(), o.end_ns.end());
    for (auto& [k, v] : o.error_kinds) error_kinds[k] += v;
  }
};

struct Percentiles {
  double p50_ms = 0, p99_ms = 0;
  size_t n = 0;
};

Percentiles percentiles(std::vector<int64_t> v) {
  Percentiles p;
  p.n = v.size();
  if (v.empty()) return p;
  auto at = [&](double q) {
    size_t k = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return static_cast<double>(v[k]) / 1e6;
  };
  p.p50_ms = at(0.50);
  p.p99_ms = at(0.99);
  return p;
}

int64_t elapsed_ns(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// ------------------------------------------------------------------ workloads

/// State shared by the client threads of one phase.
struct Shared {
  std::atomic<uint64_t> task_seq{0};   // every 4 consecutive end_episode calls share a task_id
  std::atomic<uint64_t> completed{0};  // full episodes finished in this phase
  std::atomic<int> threads_done{0};
  std::atomic<bool> abort{false};  // the server died: stop at once
};

using KeepGoing = std::function<bool()>;

/// One swarm client on its own keep-alive connection. Not thread-safe (one per thread).
class EpisodeClient {
 public:
  EpisodeClient(const std::string& url, std::string client_uuid, Shared& shared, ClientStats& st,
                bool record_latency)
      : http_(url, 30s),
        client_uuid_(std::move(client_uuid)),
        shared_(shared),
        st_(st),
        record_(record_latency) {
    claim_body_ =
        R"({"client_uuid":")" + client_uuid_ + R"(","episode_type":"train","discard_episode_timeout":60})";
  }

  /// Opens the connection before the clock starts.
  void warm_up() {
    try {
      http_.request("GET", "/health");
    } catch (const swarm::TransportError& e) {
      st_.note_error(std::string("warm-up transport: ") + e.what(), nullptr);
    }
  }

  /// Full episodes back to back until keep_going() says stop.
  void run(const KeepGoing& keep_going) {
    while (keep_going() && st_.errors < kMaxErrorsPerClient) {
      try {
        if (!claim(keep_going)) continue;  // stopped while retrying, or an error
        if (chat() && end()) {
          ++st_.episodes;
          shared_.completed.fetch_add(1, std::memory_order_relaxed);
        }
      } catch (const swarm::TransportError& e) {
        st_.note_error(std::string("transport: ") + e.what(), nullptr);
        std::this_thread::sleep_for(10ms);
      } catch (const std::exception& e) {
        st_.note_error(std::string("exception: ") + e.what(), nullptr);
        std::this_thread::sleep_for(10ms);
      }
    }
  }

 private:
  // success:false (engine in ROLLING_POST / WEIGHT_SYNCING, or no free slot) is a retry,
  // not an error. Only the successful call's latency is recorded.
  bool claim(const KeepGoing& keep_going) {
    while (keep_going()) {
      const auto t0 = Clock::now();
      auto r = http_.request("POST", "/claim_episode", claim_body_);
      const auto t1 = Clock::now();
      if (r.status != 200) {
        st_.note_error("claim", &r);
        std::this_thread::sleep_for(1ms);
        return false;
      }
      json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) {
        st_.note_error("claim: unparsable body", &r);
        return false;
      }
      if (j.value("success", false)) {
        episode_uuid_ = j.value("episode_uuid", "");
        auth_ = {{"Authorization", "Bearer " + j.value("openai_api_key", "")}};
        if (record_) st_.claim_ns.push_back(elapsed_ns(t0, t1));
        return true;
      }
      ++st_.retries;
      std::this_thread::sleep_for(200us);
    }
    return false;
  }

  bool chat() {
    const std::string body = R"({"model":"mock","messages":[{"role":"user","content":"hello world )" +
                             std::to_string(prompt_seq_++) + R"("}],"max_tokens":16})";
    const auto t0 = Clock::now();
    auto r = http_.request("POST", "/v1/chat/completions", body, auth_);
    const auto t1 = Clock::now();
    if (r.status != 200 || r.body.find("\"choices\"") == std::string::npos) {
      st_.note_error("chat", &r);
      abort();
      return false;
    }
    if (record_) st_.chat_ns.push_back(elapsed_ns(t0, t1));
    return true;
  }

  // Every 4 consecutive end calls (over all clients) share a task_id, so GRPO groups
  // complete; rewards differ inside a group so no group is "dummy".
  bool end() {
    const uint64_t k = shared_.task_seq.fetch_add(1, std::memory_order_relaxed);
    char reward[32];
    std::snprintf(reward, sizeof(reward), "%.4f", static_cast<double>(k % 4) / 3.0);
    const std::string body = R"({"client_uuid":")" + client_uuid_ + R"(","episode_uuid":")" + episode_uuid_ +
                             R"(","task_id":"task-)" + std::to_string(k / 4) +
                             R"(","workflow_output":{"reward":)" + reward + "}}";
    const auto t0 = Clock::now();
    auto r = http_.request("POST", "/end_episode", body);
    const auto t1 = Clock::now();
    if (r.status != 200) {
      st_.note_error("end", &r);
      abort();
      return false;
    }
    if (r.body.find("\"accepted\":false") != std::string::npos) st_.note_error("end not accepted", &r);
    if (record_) st_.end_ns.push_back(elapsed_ns(t0, t1));
    return true;
  }

  // Frees the slot of an episode that failed, so ROLLING_POST never waits for it.
  void abort() {
    http_.request("POST", "/abort_episode",
                  R"({"client_uuid":")" + client_uuid_ + R"(","episode_uuid":")" + episode_uuid_ + R"("})");
  }

  swarm::HttpClient http_;
  std::string client_uuid_;
  Shared& shared_;
  ClientStats& st_;
  bool record_;
  std::string claim_body_;
  std::string episode_uuid_;
  std::vector<std::pair<std::string, std::string>> auth_;
  uint64_t prompt_seq_ = 0;
};

void episode_client(const std::string& url, const std::string& client_uuid, Shared& shared, ClientStats& st,
                    bool record_latency, std::latch& ready, std::latch& go, const KeepGoing& keep_going) {
  EpisodeClient client(url, client_uuid, shared, st, record_latency);
  client.warm_up();
  ready.count_down();
  go.wait();
  client.run(keep_going);
  shared.threads_done.fetch_add(1);
}

/// One bare-Beast client: `POST /x` with a small body back to back.
void bare_client(const std::string& url, Shared& shared, ClientStats& st, std::latch& ready, std::latch& go,
                 const KeepGoing& keep_going) {
  swarm::HttpClient http(url, 30s);
  const std::string body = R"({"x":1})";
  try {
    http.request("POST", "/x", body);
  } catch (const swarm::TransportError& e) {
    st.note_error(std::string("warm-up transport: ") + e.what(), nullptr);
  }
  ready.count_down();
  go.wait();
  while (keep_going() && st.errors < kMaxErrorsPerClient) {
    try {
      const auto t0 = Clock::now();
      auto r = http.request("POST", "/x", body);
      const auto t1 = Clock::now();
      if (r.status != 200) {
        st.note_error("bare", &r);
        continue;
      }
      st.claim_ns.push_back(elapsed_ns(t0, t1));
      ++st.episodes;
    } catch (const swarm::TransportError& e) {
      st.note_error(std::string("transport: ") + e.what(), nullptr);
      std::this_thread::sleep_for(10ms);
    }
  }
  shared.threads_done.fetch_add(1);
}

enum class Target { SWARM, BARE };

struct PointResult {
  int clients = 0;
  double wall_s = 0;
  double server_cpu_s = 0;
  double client_cpu_s = 0;
  double machine_busy_s = 0;  // every process on the machine
  int64_t steps = 0;
  ClientStats stats;
  /// Cores kept busy by processes other than the server under test and this benchmark.
  double other_cores() const {
    return std::max(0.0, (machine_busy_s - server_cpu_s - client_cpu_s) / wall_s);
  }
  double rate() const { return wall_s > 0 ? static_cast<double>(stats.episodes) / wall_s : 0.0; }
};

PointResult run_point(Target target, const std::string& url, ChildProcess& server, swarm::HttpClient* control,
                      int clients, double seconds) {
  Shared shared;
  std::vector<ClientStats> stats(static_cast<size_t>(clients));
  const size_t expect = static_cast<size_t>(seconds * 12000.0 / clients) + 1024;
  for (auto& s : stats) s.reserve(expect);
  std::latch ready(clients), go(1);
  Clock::time_point deadline;  // written before go.count_down(), read after go.wait()
  KeepGoing keep_going = [&deadline] { return Clock::now() < deadline; };

  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    auto& st = stats[static_cast<size_t>(i)];
    if (target == Target::SWARM) {
      std::string uuid = "bench-c" + std::to_string(clients) + "-" + std::to_string(i);
      threads.emplace_back([&, uuid] { episode_client(url, uuid, shared, st, true, ready, go, keep_going); });
    } else {
      threads.emplace_back([&] { bare_client(url, shared, st, ready, go, keep_going); });
    }
  }
  ready.wait();
  PointResult res;
  res.clients = clients;
  const int64_t step0 = control ? global_step(*control) : 0;
  const double cpu0 = proc_cpu_seconds(server.pid());
  const double self0 = self_cpu_seconds();
  const double busy0 = machine_busy_seconds();
  const auto t0 = Clock::now();
  deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  go.count_down();
  for (auto& t : threads) t.join();
  const auto t1 = Clock::now();
  res.server_cpu_s = proc_cpu_seconds(server.pid()) - cpu0;
  res.client_cpu_s = self_cpu_seconds() - self0;
  res.machine_busy_s = machine_busy_seconds() - busy0;
  res.wall_s = std::chrono::duration<double>(t1 - t0).count();
  res.steps = control ? global_step(*control) - step0 : 0;
  for (auto& s : stats) res.stats.merge(std::move(s));
  if (auto how = server.exited()) throw std::runtime_error(server.name() + " " + *how + " during the run");
  return res;
}

struct MemorySample {
  uint64_t episodes;
  long rss_kib;
  long anon_kib;
  double elapsed_s;
};

MemorySample sample_memory(pid_t pid, uint64_t episodes, double elapsed_s) {
  return {episodes, proc_rss_kib(pid), proc_rss_anon_kib(pid), elapsed_s};
}

struct MemoryResult {
  std::vector<MemorySample> samples;  // samples[0] is the baseline before the phase
  ClientStats stats;
  double wall_s = 0;
  double server_cpu_s = 0;
  double client_cpu_s = 0;
  double machine_busy_s = 0;
  int64_t steps = 0;
};

MemoryResult run_memory_phase(const std::string& url, ChildProcess& server, swarm::HttpClient& control,
                              int clients, uint64_t target_episodes, uint64_t sample_every) {
  Shared shared;
  std::vector<ClientStats> stats(static_cast<size_t>(clients));
  std::latch ready(clients), go(1);
  KeepGoing keep_going = [&shared, target_episodes] {
    return shared.completed.load(std::memory_order_relaxed) < target_episodes && !shared.abort.load();
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    auto& st = stats[static_cast<size_t>(i)];
    std::string uuid = "bench-mem-" + std::to_string(i);
    threads.emplace_back([&, uuid] { episode_client(url, uuid, shared, st, false, ready, go, keep_going); });
  }
  ready.wait();
  MemoryResult res;
  const int64_t step0 = global_step(control);
  const double cpu0 = proc_cpu_seconds(server.pid());
  const double self0 = self_cpu_seconds();
  const double busy0 = machine_busy_seconds();
  const auto t0 = Clock::now();
  res.samples.push_back(sample_memory(server.pid(), 0, 0.0));
  go.count_down();
  uint64_t next = sample_every;
  auto last_alive_check = t0;
  while (shared.threads_done.load() < clients) {
    std::this_thread::sleep_for(5ms);
    const uint64_t done = shared.completed.load(std::memory_order_relaxed);
    if (done >= next && next <= target_episodes) {
      res.samples.push_back(
          sample_memory(server.pid(), done, std::chrono::duration<double>(Clock::now() - t0).count()));
      while (next <= done) next += sample_every;
    }
    if (Clock::now() - last_alive_check > 1s) {
      last_alive_check = Clock::now();
      if (auto how = server.exited()) {
        shared.abort = true;
        for (auto& t : threads) t.join();
        throw std::runtime_error(server.name() + " " + *how + " during the memory phase");
      }
    }
  }
  for (auto& t : threads) t.join();
  const auto t1 = Clock::now();
  res.wall_s = std::chrono::duration<double>(t1 - t0).count();
  res.server_cpu_s = proc_cpu_seconds(server.pid()) - cpu0;
  res.client_cpu_s = self_cpu_seconds() - self0;
  res.machine_busy_s = machine_busy_seconds() - busy0;
  if (res.samples.back().episodes < shared.completed.load())
    res.samples.push_back(sample_memory(server.pid(), shared.completed.load(), res.wall_s));
  res.steps = global_step(control) - step0;
  for (auto& s : stats) res.stats.merge(std::move(s));
  return res;
}

// ------------------------------------------------------------------ output

void print_errors(const char* what, const ClientStats& st) {
  if (st.errors == 0) return;
  std::printf("  !! %s: %llu error(s):\n", what, static_cast<unsigned long long>(st.errors));
  for (const auto& [k, v] : st.error_kinds)
    std::printf("     %8llu x %s\n", static_cast<unsigned long long>(v), k.c_str());
}

std::string pair_ms(const Percentiles& p) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f / %.3f", p.p50_ms, p.p99_ms);
  return buf;
}

double mib(long kib) { return static_cast<double>(kib) / 1024.0; }

// ------------------------------------------------------------------ bare-Beast child mode

int run_bare_child(int port, int io_threads) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the benchmark
  // Block the stop signals before any thread starts; the main thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  swarm::bench::BareBeastServer server("127.0.0.1", static_cast<uint16_t>(port), io_threads);
  server.start();
  int sig = 0;
  sigwait(&signals, &sig);
  server.stop();
  return 0;
}

std::string default_server_bin() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "swarm-server";
  return (self.parent_path() / ".." / ".." / "swarm-server").lexically_normal().string();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_server: swarm-server (mock engine) full-episode throughput vs a bare Beast server"};
  std::string server_bin = default_server_bin();
  std::vector<int> clients_list{1, 16, 64};
  double seconds = 5.0;
  uint64_t memory_episodes = 1'000'000, memory_sample_every = 100'000;
  int memory_clients = 64;
  int io_threads = 2;
  int repeats = 3;
  bool quick = false, skip_memory = false;
  std::vector<int> persistence_clients{64};
  int bare_port = -1;
  app.add_option("--server-bin", server_bin, "swarm-server binary")->capture_default_str();
  app.add_option("--clients", clients_list, "Concurrent clients per point")->capture_default_str();
  app.add_option("--seconds", seconds, "Measured seconds per point")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--memory-episodes", memory_episodes, "Full episodes in the memory phase")
      ->capture_default_str();
  app.add_option("--memory-sample-every", memory_sample_every, "Sample the server RSS every N episodes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--memory-clients", memory_clients, "Concurrent clients in the memory phase")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--io-threads", io_threads, "I/O threads of both servers")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--repeats", repeats,
                 "Runs of every point, swarm and bare interleaved; the table shows the best")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_flag("--quick", quick,
               "Smoke run: 1 s points, 1 run each, 50k memory episodes sampled every 10k (unless given)");
  app.add_flag("--skip-memory", skip_memory, "Skip the memory phase");
  app.add_option("--persistence-clients", persistence_clients,
                 "Client counts of the persistence phase (durable_episodes off vs on); empty = skip it")
      ->capture_default_str();
  app.add_option("--bare-beast-port", bare_port, "Internal: act as the bare Beast server on this port")
      ->group("");
  CLI11_PARSE(app, argc, argv);

  if (bare_port >= 0) return run_bare_child(bare_port, io_threads);
  if (quick) {  // smaller defaults; flags given explicitly still win
    if (app.count("--seconds") == 0) seconds = 1.0;
    if (app.count("--repeats") == 0) repeats = 1;
    if (app.count("--memory-episodes") == 0) memory_episodes = 50'000;
    if (app.count("--memory-sample-every") == 0) memory_sample_every = 10'000;
  }
  for (int c : clients_list)
    if (c < 1) {
      std::cerr << "bench_server: --clients must be >= 1\n";
      return 2;
    }
  if (!std::filesystem::exists(server_bin)) {
    std::cerr << "bench_server: no swarm-server at " << server_bin << " (build it, or pass --server-bin)\n";
    return 2;
  }
  std::error_code ec;
  const std::string self_exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  g_experiment_dir =
      (std::filesystem::temp_directory_path() / ("bench_server-" + std::to_string(::getpid()))).string();
  struct RemoveDir {
    ~RemoveDir() {
      std::error_code e;
      std::filesystem::remove_all(g_experiment_dir, e);
    }
  } remove_dir;

  try {
    const uint16_t swarm_port = pick_free_port();
    ChildProcess swarm_server("swarm-server", {server_bin, "start", "--host", "127.0.0.1", "--port",
                                               std::to_string(swarm_port), "--engine", "mock", "--log-level",
                                               "warn", "--io-threads", std::to_string(io_threads)});
    const std::string swarm_url = "http://127.0.0.1:" + std::to_string(swarm_port);
    wait_until_answering(swarm_url, swarm_server, 15s);

    const uint16_t bare_listen_port = pick_free_port();
    ChildProcess bare_server("bare Beast server",
                             {self_exe, "--bare-beast-port", std::to_string(bare_listen_port), "--io-threads",
                              std::to_string(io_threads)});
    const std::string bare_url = "http://127.0.0.1:" + std::to_string(bare_listen_port);
    wait_until_answering(bare_url, bare_server, 15s);

    swarm::HttpClient control(swarm_url, 30s);
    start_engine(control);

    std::printf("bench_server: commit %s; %s; %s\n", git_commit(SWARM_SOURCE_DIR).c_str(),
                cpu_model().c_str(), utc_now().c_str());
    std::printf(
        "bench_server: swarm-server (mock engine, %d I/O threads, pid %d) vs bare Beast (%d I/O threads, pid "
        "%d)\n",
        io_threads, swarm_server.pid(), io_threads, bare_server.pid());
    std::printf("loopback; %u hardware threads SHARED by the server under test and this load generator\n",
                std::thread::hardware_concurrency());
    {
      std::ifstream la("/proc/loadavg");
      std::string l1, l5, l15;
      la >> l1 >> l5 >> l15;
      std::printf("load average at start: %s %s %s (other processes compete for the same cores)\n",
                  l1.c_str(), l5.c_str(), l15.c_str());
    }
    std::printf("config: %s", kTrainConfig);
    std::printf(
        "full episode = POST /claim_episode + POST /v1/chat/completions + POST /end_episode\n"
        "%.1f s per point; %d run(s) of every point, swarm and bare interleaved; tables show the best "
        "run\n\n",
        seconds, repeats);
    std::fflush(stdout);

    const size_t n_points = clients_list.size();
    std::vector<std::vector<PointResult>> swarm_runs(n_points), bare_runs(n_points);
    for (int r = 0; r < repeats; ++r)
      for (size_t i = 0; i < n_points; ++i) {
        swarm_runs[i].push_back(
            run_point(Target::SWARM, swarm_url, swarm_server, &control, clients_list[i], seconds));
        bare_runs[i].push_back(
            run_point(Target::BARE, bare_url, bare_server, nullptr, clients_list[i], seconds));
      }
    // The machine is shared with other work: the best run of each point is the least disturbed.
    auto best = [](const std::vector<PointResult>& runs) {
      return *std::max_element(runs.begin(), runs.end(), [](const PointResult& a, const PointResult& b) {
        return a.rate() < b.rate();
      });
    };
    std::vector<PointResult> swarm_points, bare_points;
    for (size_t i = 0; i < n_points; ++i) {
      swarm_points.push_back(best(swarm_runs[i]));
      bare_points.push_back(best(bare_runs[i]));
    }

    std::printf("%7s %11s %19s %19s %19s %13s %13s %8s %6s %5s %13s\n", "clients", "episodes/s",
                "claim p50/p99 ms", "chat p50/p99 ms", "end p50/p99 ms", "srv CPU/ep us", "gen CPU/ep us",
                "retries", "errors", "steps", "cores us/oth");
    for (const auto& p : swarm_points) {
      const double eps = static_cast<double>(std::max<uint64_t>(1, p.stats.episodes));
      std::printf("%7d %11.0f %19s %19s %19s %13.1f %13.1f %8llu %6llu %5lld %6.2f/%-6.2f\n", p.clients,
                  p.rate(), pair_ms(percentiles(p.stats.claim_ns)).c_str(),
                  pair_ms(percentiles(p.stats.chat_ns)).c_str(), pair_ms(percentiles(p.stats.end_ns)).c_str(),
                  p.server_cpu_s / eps * 1e6, p.client_cpu_s / eps * 1e6,
                  static_cast<unsigned long long>(p.stats.retries),
                  static_cast<unsigned long long>(p.stats.errors), static_cast<long long>(p.steps),
                  (p.server_cpu_s + p.client_cpu_s) / p.wall_s, p.other_cores());
    }
    std::printf("\n%7s %11s %19s %13s %13s %6s %13s %21s %12s\n", "clients", "bare req/s", "req p50/p99 ms",
                "srv CPU/rq us", "gen CPU/rq us", "errors", "cores us/oth", "ratio 3rq/ep [range]",
                "ratio ep/rq");
    for (size_t i = 0; i < n_points; ++i) {
      const auto& b = bare_points[i];
      const double reqs = static_cast<double>(std::max<uint64_t>(1, b.stats.episodes));
      // Ratios pair each swarm run with the bare run right after it (same machine
      // conditions); the median over the pairs is the figure, [min-max] its spread.
      std::vector<double> ratios;
      for (size_t r = 0; r < swarm_runs[i].size(); ++r)
        if (bare_runs[i][r].rate() > 0) ratios.push_back(swarm_runs[i][r].rate() / bare_runs[i][r].rate());
      std::sort(ratios.begin(), ratios.end());
      const size_t n = ratios.size();
      const double median = n == 0 ? 0.0 : n % 2 ? ratios[n / 2] : (ratios[n / 2 - 1] + ratios[n / 2]) / 2;
      char range[64];
      std::snprintf(range, sizeof(range), "%.3f [%.2f-%.2f]", median * kRequestsPerEpisode,
                    ratios.empty() ? 0.0 : ratios.front() * kRequestsPerEpisode,
                    ratios.empty() ? 0.0 : ratios.back() * kRequestsPerEpisode);
      std::printf("%7d %11.0f %19s %13.1f %13.1f %6llu %6.2f/%-6.2f %21s %12.3f\n", b.clients, b.rate(),
                  pair_ms(percentiles(b.stats.claim_ns)).c_str(), b.server_cpu_s / reqs * 1e6,
                  b.client_cpu_s / reqs * 1e6, static_cast<unsigned long long>(b.stats.errors),
                  (b.server_cpu_s + b.client_cpu_s) / b.wall_s, b.other_cores(), range, median);
    }
    std::printf(
        "srv CPU = server process utime+stime per episode (per request for bare); gen CPU = this load "
        "generator's\n"
        "cores us/oth = cores kept busy by (server + load generator) / by every other process on the "
        "machine\n"
        "ratio 3rq/ep = (swarm episodes/s x 3 requests per episode) / bare req/s, same client count; each "
        "swarm\n"
        "               run is paired with the bare run right after it: median over the pairs [min-max]\n"
        "ratio ep/rq  = swarm episodes/s / bare req/s (a whole episode against one bare request), median\n");
    std::printf("every run, in order (episodes/s | bare req/s):\n");
    for (size_t i = 0; i < n_points; ++i) {
      std::printf("  clients=%-3d swarm", clients_list[i]);
      for (const auto& p : swarm_runs[i]) std::printf(" %6.0f", p.rate());
      std::printf("   bare");
      for (const auto& p : bare_runs[i]) std::printf(" %6.0f", p.rate());
      std::printf("   others' cores (swarm runs)");
      for (const auto& p : swarm_runs[i]) std::printf(" %.2f", p.other_cores());
      std::printf("\n");
    }
    for (size_t i = 0; i < n_points; ++i)
      for (size_t r = 0; r < swarm_runs[i].size(); ++r) {
        const std::string tag =
            "clients=" + std::to_string(clients_list[i]) + " run " + std::to_string(r + 1);
        print_errors(("swarm, " + tag).c_str(), swarm_runs[i][r].stats);
        print_errors(("bare, " + tag).c_str(), bare_runs[i][r].stats);
      }
    std::fflush(stdout);

    if (!skip_memory && memory_episodes > 0) {
      std::printf("\nmemory phase: %d clients until %llu full episodes, server RSS every %llu episodes\n",
                  memory_clients, static_cast<unsigned long long>(memory_episodes),
                  static_cast<unsigned long long>(memory_sample_every));
      std::fflush(stdout);
      MemoryResult m = run_memory_phase(swarm_url, swarm_server, control, memory_clients, memory_episodes,
                                        memory_sample_every);
      std::printf("%10s %10s %10s %11s %12s %13s %11s\n", "episodes", "elapsed s", "RSS MiB", "delta KiB",
                  "RssAnon MiB", "delta KiB", "episodes/s");
      const MemorySample& first = m.samples.size() > 1 ? m.samples[1] : m.samples[0];
      for (size_t i = 0; i < m.samples.size(); ++i) {
        const auto& s = m.samples[i];
        std::string rate = "-";  // over the interval since the previous sample, if long enough
        if (i > 0 && s.elapsed_s > m.samples[i - 1].elapsed_s + 0.5)
          rate =
              std::to_string(static_cast<long>(static_cast<double>(s.episodes - m.samples[i - 1].episodes) /
                                               (s.elapsed_s - m.samples[i - 1].elapsed_s)));
        std::printf("%10llu %10.1f %10.1f %+11ld %12.1f %+13ld %11s%s\n",
                    static_cast<unsigned long long>(s.episodes), s.elapsed_s, mib(s.rss_kib),
                    s.rss_kib - first.rss_kib, mib(s.anon_kib), s.anon_kib - first.anon_kib, rate.c_str(),
                    i == 0 ? "  (baseline, before the phase)" : "");
      }
      const auto& last = m.samples.back();
      const double eps = static_cast<double>(std::max<uint64_t>(1, m.stats.episodes));
      std::printf(
          "RSS after %llu episodes: %.1f MiB (first sample %.1f MiB at %llu episodes, delta %+ld KiB; "
          "baseline before the phase %.1f MiB)\n",
          static_cast<unsigned long long>(last.episodes), mib(last.rss_kib), mib(first.rss_kib),
          static_cast<unsigned long long>(first.episodes), last.rss_kib - first.rss_kib,
          mib(m.samples[0].rss_kib));
      std::printf(
          "memory phase: %.0f episodes/s over %.1f s, server CPU/episode %.1f us, %llu retries, %lld steps, "
          "cores busy ours/others %.2f/%.2f\n",
          static_cast<double>(m.stats.episodes) / m.wall_s, m.wall_s, m.server_cpu_s / eps * 1e6,
          static_cast<unsigned long long>(m.stats.retries), static_cast<long long>(m.steps),
          (m.server_cpu_s + m.client_cpu_s) / m.wall_s,
          std::max(0.0, (m.machine_busy_s - m.server_cpu_s - m.client_cpu_s) / m.wall_s));
      print_errors("memory phase", m.stats);
    }

    if (!persistence_clients.empty()) {
      // The cost of durability: the same load with the episode store off, on (fsync every
      // commit: survives a power cut) and on without fsync (survives a crash of the server),
      // alternating, in the same server process; the best run of each is shown.
      std::printf(
          "\npersistence phase: durable_episodes off / on / on with durable_fsync: false (the episode "
          "store: SQLite WAL), %d run(s) of %.1f s each, alternating\n",
          repeats, seconds);
      std::printf("%7s %9s %9s %9s %7s %7s %17s %17s %17s %13s %10s %8s\n", "clients", "off ep/s", "on ep/s",
                  "nofs ep/s", "on/off", "nofs/of", "end p50/p99 off", "end p50/p99 on", "end p50/p99 nofs",
                  "srv us/ep o/on", "commits/ep", "target");
      std::fflush(stdout);
      auto best = [](const std::vector<PointResult>& runs) {
        return *std::max_element(runs.begin(), runs.end(), [](const PointResult& a, const PointResult& b) {
          return a.rate() < b.rate();
        });
      };
      for (int c : persistence_clients) {
        std::vector<PointResult> off, on, nofsync;
        double commits_per_episode = 0.0;
        for (int r = 0; r < repeats; ++r) {
          start_engine(control, false);
          off.push_back(run_point(Target::SWARM, swarm_url, swarm_server, &control, c, seconds));
          start_engine(control, true, true);
          const auto before = get_json(control, "/get_current_batch_rollout_pool_information");
          on.push_back(run_point(Target::SWARM, swarm_url, swarm_server, &control, c, seconds));
          const auto after = get_json(control, "/get_current_batch_rollout_pool_information");
          const double recorded =
              after["episode_store"].value("recorded", 0.0) - before["episode_store"].value("recorded", 0.0);
          const double commits =
              after["episode_store"].value("commits", 0.0) - before["episode_store"].value("commits", 0.0);
          if (recorded > 0) commits_per_episode = commits / recorded;
          start_engine(control, true, false);
          nofsync.push_back(run_point(Target::SWARM, swarm_url, swarm_server, &control, c, seconds));
        }
        const PointResult a = best(off), b = best(on), n = best(nofsync);
        const double ratio = a.rate() > 0 ? b.rate() / a.rate() : 0.0;
        const double ratio_n = a.rate() > 0 ? n.rate() / a.rate() : 0.0;
        auto us_per_ep = [](const PointResult& p) {
          return p.server_cpu_s / static_cast<double>(std::max<uint64_t>(1, p.stats.episodes)) * 1e6;
        };
        char cpu[32];
        std::snprintf(cpu, sizeof cpu, "%.0f/%.0f", us_per_ep(a), us_per_ep(b));
        std::printf("%7d %9.0f %9.0f %9.0f %7.3f %7.3f %17s %17s %17s %13s %10.3f %8s\n", c, a.rate(),
                    b.rate(), n.rate(), ratio, ratio_n, pair_ms(percentiles(a.stats.end_ns)).c_str(),
                    pair_ms(percentiles(b.stats.end_ns)).c_str(),
                    pair_ms(percentiles(n.stats.end_ns)).c_str(), cpu, commits_per_episode,
                    c == 64 ? (ratio >= 0.8 ? "met" : "MISSED") : "-");
        std::printf("        every run (ep/s): off");
        for (const auto& p : off) std::printf(" %.0f", p.rate());
        std::printf("   on");
        for (const auto& p : on) std::printf(" %.0f", p.rate());
        std::printf("   no fsync");
        for (const auto& p : nofsync) std::printf(" %.0f", p.rate());
        std::printf("\n");
        for (size_t r = 0; r < on.size(); ++r)
          print_errors(("persistence on, run " + std::to_string(r + 1)).c_str(), on[r].stats);
      }
      std::printf(
          "target: episodes/s with the store on (fsync) >= 0.8 x off at 64 clients; commits/ep "
          "< 1 = group commit (concurrent end_episode calls share one fsync)\n");
      std::fflush(stdout);
    }

    const json st = get_json(control, "/get_engine_status");
    std::printf("\nengine at the end: %s, global_step=%lld, policy_version=%lld\n",
                st.value("engine_status", "?").c_str(),
                static_cast<long long>(st.value("global_step", int64_t{-1})),
                static_cast<long long>(st.value("policy_version", int64_t{-1})));
    const std::string swarm_end = swarm_server.stop();
    const std::string bare_end = bare_server.stop();
    std::printf("swarm-server %s; bare Beast server %s\n", swarm_end.c_str(), bare_end.c_str());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "bench_server: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
