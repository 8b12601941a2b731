// bench_ttft: time to first token of swarm-server on the torch engine, one chat client
// against 64 concurrent chat clients (target: "with 64 concurrent chat clients the
// server's p99 time-to-first-token stays within 2x of a single client's").
//
// swarm-server runs as a child process (--engine torch). Every client claims an episode and
// sends streaming chat completions back to back through the SDK's OpenAIClient; TTFT is the
// time from sending the request to the first streamed content delta. Below it, the engine's
// own figures from GET /metrics: how long requests waited for admission, the engine's time to
// first token (so the rest is the HTTP path) and the steps. --max-tokens-spread draws each
// request's max_tokens around --max-tokens, so the clients do not stay in lockstep. Prints
// tables; never a timed assertion.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/child_process.hpp"
#include "overwatch/snapshot.hpp"
#include "swarm/swarm.hpp"

namespace {

using namespace swarm::bench;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Latencies {
  std::mutex mu;
  std::vector<double> ttft_ms;
  std::vector<double> steady_ms;  // without each client's first request (the arrival burst)
  int64_t completion_tokens = 0;
  int64_t errors = 0;
  std::string first_error;
};

// The engine's own latency figures (`swarm_inference{field="..."}` in GET /metrics), over its
// window of the most recent requests.
std::map<std::string, double> inference_metrics(const std::string& url) {
  swarm::HttpClient http(url, std::chrono::seconds(10));
  std::map<std::string, double> out;
  for (const auto& sample : swarm::overwatch::parse_prometheus(http.request("GET", "/metrics").body)) {
    const auto field = sample.labels.find("field");
    if (sample.name == "swarm_inference" && field != sample.labels.end()) out[field->second] = sample.value;
  }
  return out;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  return v[i];
}

// A user message of about `words` words (SmolLM2's tokenizer: ~1.3 tokens per word).
std::string prompt_text(int client, int request, int words) {
  static const char* kWords[] = {"agent",   "reward", "policy", "token", "server", "batch",
                                 "episode", "model",  "learn",  "step",  "train",  "sample",
                                 "group",   "value",  "update", "weight"};
  std::string s = "Client " + std::to_string(client) + " request " + std::to_string(request) + ":";
  for (int i = 0; i < words; ++i) s += std::string(" ") + kWords[(client * 7 + request * 3 + i) % 16];
  return s + ". Summarise.";
}

// `clients` threads, each with its own episode, sending streaming chats until `until`
// (at least `min_requests` each).
// Each request asks for max_tokens drawn uniformly from [max_tokens - spread, max_tokens +
// spread] (a seeded generator per client), so answers of different lengths keep the clients
// from moving in lockstep; spread 0 gives every request the same max_tokens.
// With `group` > 1, clients c and c' with c / group == c' / group send the same prompts (a GRPO
// group's episodes of one task), so the prefix cache can share them.
void run_clients(const std::string& url, int clients, Clock::time_point until, int min_requests,
                 int prompt_words, int max_tokens, int spread, int group, Latencies& out) {
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      try {
        swarm::SwarmClient client(url);
        swarm::OpenAIEndpoint ep = client.begin_episode(3600, "train", std::chrono::seconds(120));
        swarm::OpenAIClient llm(ep, std::chrono::seconds(600));
        swarm::ChatParams params;
        params.max_tokens = max_tokens;
        params.temperature = 1.0;
        params.extra = {{"stream_options", {{"include_usage", true}}}};
        std::mt19937 rng(static_cast<uint32_t>(1000 + c));
        std::uniform_int_distribution<int> length(std::max(1, max_tokens - spread), max_tokens + spread);
        for (int r = 0; Clock::now() < until || r < min_requests; ++r) {
          params.max_tokens = length(rng);
          const nlohmann::json messages = nlohmann::json::array(
              {{{"role", "user"}, {"content", prompt_text(c / group, r, prompt_words)}}});
          const auto t0 = Clock::now();
          std::optional<Clock::time_point> first;
          swarm::ChatResult res = llm.chat_stream(
              messages,
              [&](std::string_view d) {
                if (!first && !d.empty()) first = Clock::now();
              },
              params);
          const auto t1 = first.value_or(Clock::now());
          std::lock_guard lk(out.mu);
          const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
          out.ttft_ms.push_back(ms);
          if (r > 0) out.steady_ms.push_back(ms);
          out.completion_tokens += res.usage.completion_tokens;
        }
        client.abort_episode(ep.episode_uuid);
      } catch (const std::exception& e) {
        std::lock_guard lk(out.mu);
        if (out.errors++ == 0) out.first_error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_ttft: time to first token, 1 vs 64 concurrent chat clients (torch engine)"};
  std::string server_bin = SWARM_SERVER_BIN, model;
  std::string dtype = "bf16";
  int clients = 64, seconds = 20, prompt_words = 48, max_tokens = 32, max_tokens_spread = 0,
      single_requests = 30, group = 1;
  int64_t max_step_tokens = 512, engine_threads = 0;
  app.add_option("--server-bin", server_bin, "swarm-server binary")->capture_default_str();
  app.add_option("--model", model, "Hugging Face model directory with a chat template")->required();
  app.add_option("--dtype", dtype, "fp32 or bf16")->capture_default_str();
  app.add_option("--clients", clients, "Concurrent clients in the loaded phase")->capture_default_str();
  app.add_option("--seconds", seconds, "Duration of the loaded phase")->capture_default_str();
  app.add_option("--single-requests", single_requests, "Requests in the single-client phase")
      ->capture_default_str();
  app.add_option("--prompt-words", prompt_words, "Words in each user message")->capture_default_str();
  app.add_option("--max-tokens", max_tokens,
                 "max_tokens of each completion (the mean with --max-tokens-spread)")
      ->capture_default_str();
  app.add_option("--max-tokens-spread", max_tokens_spread,
                 "Draw each request's max_tokens uniformly from max-tokens +- this (0: all the same)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--group", group,
                 "Clients in groups of this many send the same prompts (GRPO-shaped load; 1: all distinct)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-step-tokens", max_step_tokens, "The engine's max_step_tokens")->capture_default_str();
  app.add_option("--engine-threads", engine_threads,
                 "The job's engine_threads (0: the server's default, all cores)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    const uint16_t port = pick_free_port();
    const std::string url = "http://127.0.0.1:" + std::to_string(port);
    ChildProcess server("swarm-server",
                        {server_bin, "start", "--host", "127.0.0.1", "--port", std::to_string(port),
                         "--engine", "torch", "--log-level", "warn", "--io-threads", "2"});
    wait_until_answering(url, server, std::chrono::seconds(30));

    swarm::Job job;
    job.model = fs::absolute(model).string();
    job.batch_size = 100000;  // no policy step during the measurement
    job.num_repeat = 1;
    job.max_parallel_episodes = clients + 8;
    job.max_prompt_length = 1024;
    job.max_response_length = max_tokens + max_tokens_spread;
    job.dtype = dtype;
    job.max_batch_sequences = std::max(64, clients);
    job.max_step_tokens = max_step_tokens;
    job.engine_threads = engine_threads;
    swarm::SwarmClient admin(url);
    std::fprintf(stderr, "bench_ttft: booting %s (%s)...\n", model.c_str(), dtype.c_str());
    admin.auto_sync_train_config_and_start_engine(job);

    // Warm-up: a few requests so one-time allocations are out of the way.
    Latencies warm;
    run_clients(url, 1, Clock::now(), 4, prompt_words, max_tokens, max_tokens_spread, 1, warm);

    std::fprintf(stderr, "bench_ttft: 1 client, %d requests...\n", single_requests);
    Latencies one;
    const auto one_before = inference_metrics(url);
    auto t0 = Clock::now();
    run_clients(url, 1, Clock::now(), single_requests, prompt_words, max_tokens, max_tokens_spread, 1, one);
    const double one_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto one_engine = inference_metrics(url);

    std::fprintf(stderr, "bench_ttft: %d clients for %d s...\n", clients, seconds);
    Latencies many;
    const auto many_before = inference_metrics(url);
    t0 = Clock::now();
    run_clients(url, clients, Clock::now() + std::chrono::seconds(seconds), 1, prompt_words, max_tokens,
                max_tokens_spread, group, many);
    const double many_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto many_engine = inference_metrics(url);

    std::printf(
        "\nmodel %s  dtype %s  prompt ~%d words  max_tokens %d +- %d  max_step_tokens %lld  groups of %d\n",
        model.c_str(), dtype.c_str(), prompt_words, max_tokens, max_tokens_spread,
        static_cast<long long>(max_step_tokens), group);
    std::printf("%8s %9s %12s %12s %12s %18s %14s %7s\n", "clients", "requests", "TTFT p50 ms", "TTFT p99 ms",
                "TTFT max ms", "p99 w/o 1st req ms", "gen tokens/s", "errors");
    for (auto* row : {&one, &many}) {
      const int n = row == &one ? 1 : clients;
      const double secs = row == &one ? one_s : many_s;
      std::printf("%8d %9zu %12.1f %12.1f %12.1f %18.1f %14.1f %7lld\n", n, row->ttft_ms.size(),
                  percentile(row->ttft_ms, 50), percentile(row->ttft_ms, 99), percentile(row->ttft_ms, 100),
                  percentile(row->steady_ms, 99), static_cast<double>(row->completion_tokens) / secs,
                  static_cast<long long>(row->errors));
      if (row->errors) std::printf("    first error: %s\n", row->first_error.c_str());
    }
    // Where a request's time goes inside the engine: its window of the last 256 requests (and
    // steps) when the phase ended, and the mean step from the step counters over the phase.
    std::printf(
        "\nengine side (percentiles over its window of the last 256 requests / steps at the end of the "
        "phase):\n");
    std::printf("%8s %22s %22s %22s %10s %14s\n", "clients", "queue wait p50/p99 ms",
                "engine TTFT p50/p99 ms", "step p50/p99 ms", "steps", "mean step ms");
    for (const auto& [before, after] :
         {std::pair{&one_before, &one_engine}, std::pair{&many_before, &many_engine}}) {
      const auto f = [&](const char* k) { return after->count(k) ? after->at(k) : 0.0; };
      const auto delta = [&](const char* k) { return f(k) - (before->count(k) ? before->at(k) : 0.0); };
      const double steps = delta("steps_total");
      std::printf("%8d %10.1f /%10.1f %10.1f /%10.1f %10.1f /%10.1f %10.0f %14.2f\n",
                  after == &one_engine ? 1 : clients, 1e3 * f("queue_wait_p50_seconds"),
                  1e3 * f("queue_wait_p99_seconds"), 1e3 * f("ttft_p50_seconds"), 1e3 * f("ttft_p99_seconds"),
                  1e3 * f("step_p50_seconds"), 1e3 * f("step_p99_seconds"), steps,
                  steps > 0 ? 1e3 * delta("busy_seconds_total") / steps : 0.0);
    }
    // The prefix cache over each phase: prompt tokens found cached / looked up.
    for (const auto& [before, after] :
         {std::pair{&one_before, &one_engine}, std::pair{&many_before, &many_engine}}) {
      const auto delta = [&](const char* k) {
        return (after->count(k) ? after->at(k) : 0.0) - (before->count(k) ? before->at(k) : 0.0);
      };
      const double asked = delta("prefix_cache_queries_tokens_total");
      std::printf("prefix cache, %d client(s): %.1f%% of %.0f prompt tokens found cached\n",
                  after == &one_engine ? 1 : clients,
                  asked > 0 ? 100.0 * delta("prefix_cache_hit_tokens_total") / asked : 0.0, asked);
    }
    const double ratio = percentile(many.ttft_ms, 99) / std::max(1e-9, percentile(one.ttft_ms, 99));
    const double steady = percentile(many.steady_ms, 99) / std::max(1e-9, percentile(one.ttft_ms, 99));
    std::printf(
        "p99 TTFT ratio (%d clients / 1 client): %.2f (without the arrival burst: %.2f)   target <= 2.0: "
        "%s\n",
        clients, ratio, steady, ratio <= 2.0 ? "PASS" : "MISS");
    server.stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ttft: %s\n", e.what());
    return 1;
  }
  return 0;
}
