// echo_agent: the smallest complete swarm agent, using only the public SDK.
//
// It configures and boots the server (idempotently), then drives `--steps` policy steps:
// each step submits batch_size tasks × num_repeat episodes of "Repeat after me: <word>",
// scores each reply by how well it echoes the word, and waits until the server's
// global_step advances.
//
//   swarm-server start &   # mock engine
//   echo_agent --url http://127.0.0.1:10086 --steps 3

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "swarm/swarm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string> kWords = {
    "apple",  "river",  "mountain", "lantern", "violet",  "harbor", "pepper",  "glacier",
    "meadow", "copper", "falcon",   "orchid",  "thunder", "pebble", "saffron", "willow",
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// 1.0 if the reply contains the word; otherwise the share of the word's letters found in
// the reply (each reply character used at most once). Deterministic, in [0, 1].
double echo_reward(const std::string& word, const std::string& reply) {
  const std::string w = lower(word), r = lower(reply);
  if (w.empty()) return 0.0;
  if (r.find(w) != std::string::npos) return 1.0;
  int available[256] = {};
  for (unsigned char c : r) ++available[c];
  int hits = 0;
  for (unsigned char c : w)
    if (available[c] > 0) --available[c], ++hits;
  return 0.9 * hits / static_cast<double>(w.size());  // below a real echo
}

std::string word_of(const swarm::Task& task) {
  const std::string prefix = "Repeat after me: ";
  return task.main_query.substr(prefix.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"echo_agent: a minimal swarm agent that trains a model to repeat a word"};
  std::string url = "http://127.0.0.1:10086";
  int workers = 8, steps = 3, batch_size = 4, num_repeat = 4;
  std::string model = "mock-echo";
  bool force_restart = false;
  double step_timeout_s = 600;
  app.add_option("--url", url, "Swarm server URL")->capture_default_str();
  app.add_option("--workers", workers, "Parallel episodes on this client")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "Policy steps (weight-sync cycles) to drive")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "Tasks per policy step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num-repeat", num_repeat, "Episodes per task (GRPO group size)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--model", model, "Model the server trains (any name with the mock engine)")
      ->capture_default_str();
  int64_t engine_threads = 0;
  app.add_option("--engine-threads", engine_threads,
                 "Compute threads per rank of the torch engine (job key engine_threads; 0: the cores split "
                 "between the ranks of a machine)")
      ->capture_default_str();
  int64_t seed = -1;
  app.add_option(
         "--seed", seed,
         "Seed every request: the n-th episode this client runs samples with seed + n (with --workers 1 "
         "a run repeats exactly; -1: unseeded)")
      ->capture_default_str();
  app.add_flag("--force-restart", force_restart, "Stop and reconfigure the engine even if it is running");
  app.add_option("--step-timeout", step_timeout_s, "Seconds to wait for one policy step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    swarm::SwarmClientOptions options;
    // Give up on a claim after a while instead of waiting forever for a server that is gone.
    // (a quarter of the step budget, as each task gets 1 + 3 attempts).
    options.run_claim_deadline = std::chrono::milliseconds(static_cast<int64_t>(step_timeout_s * 1000 / 4));
    swarm::SwarmClient client(url, options);

    swarm::Job job;
    job.algorithm = "grpo";
    job.project_name = "echo";
    job.experiment_name = "echo-agent";
    job.model = model;
    job.batch_size = batch_size;
    job.num_repeat = num_repeat;
    job.max_response_length = 64;
    job.engine_threads = engine_threads;

    std::printf("echo_agent: connecting to %s (client %s)\n", url.c_str(), client.client_uuid().c_str());
    client.auto_sync_train_config_and_start_engine(job, force_restart);
    swarm::EngineStatus status = client.get_engine_status();
    std::printf("echo_agent: engine %s, global_step=%lld\n", status.engine_status.c_str(),
                static_cast<long long>(status.global_step));

    auto episodes_run = std::make_shared<std::atomic<uint64_t>>(0);
    auto workflow = [seed, episodes_run](const swarm::Task& task, const swarm::OpenAIEndpoint& ep) {
      swarm::OpenAIClient llm(ep, std::chrono::seconds(60));
      swarm::ChatParams params;
      params.max_tokens = 32;
      const uint64_t n = episodes_run->fetch_add(1);
      if (seed >= 0) params.seed = static_cast<uint64_t>(seed) + n;
      const auto reply = llm.chat({{"user", task.main_query}}, params);
      swarm::WorkflowOutput out;
      out.reward = echo_reward(word_of(task), reply.content);
      out.is_success = *out.reward >= 1.0;
      out.log_metrics["reply_chars"] = static_cast<double>(reply.content.size());
      return out;
    };

    for (int step = 1; step <= steps; ++step) {
      const auto t0 = Clock::now();
      const int64_t step_before = client.get_engine_status().global_step;

      std::mt19937 rng(static_cast<uint32_t>(step_before * 7919 + step));
      std::vector<swarm::Task> tasks;
      for (int i = 0; i < batch_size; ++i) {
        swarm::Task task;
        task.task_id = "task-" + std::to_string(step_before) + "-" + std::to_string(i);
        task.main_query = "Repeat after me: " + kWords[rng() % kWords.size()];
        task.env_type = "echo";
        for (int r = 0; r < num_repeat; ++r) tasks.push_back(task);
      }

      const auto summary = client.run_episodes_until_all_complete(tasks, workflow, workers);
      if (summary.completed == 0) {
        std::fprintf(stderr, "echo_agent: error: no episode of step %d completed (%zu failed)\n", step,
                     summary.failed);
        return 1;
      }
      if (summary.failed > 0)
        std::fprintf(stderr, "echo_agent: warning: %zu of %zu episodes failed in step %d\n", summary.failed,
                     tasks.size(), step);

      double sum = 0;
      int n = 0;
      for (const auto& r : summary.rewards)
        if (r) sum += *r, ++n;

      // The batch is complete; the server now trains and syncs weights.
      const auto wait_until = Clock::now() + std::chrono::duration<double>(step_timeout_s);
      for (;;) {
        status = client.get_engine_status();
        if (status.global_step > step_before) break;
        if (Clock::now() > wait_until) {
          std::fprintf(stderr, "echo_agent: error: global_step stayed at %lld for %.0f s (engine %s%s%s)\n",
                       static_cast<long long>(status.global_step), step_timeout_s,
                       status.engine_status.c_str(), status.engine_status_detail.empty() ? "" : ": ",
                       status.engine_status_detail.c_str());
          return 1;
        }
        if (status.engine_status == "ENGINE.OFFLINE") {
          std::fprintf(stderr, "echo_agent: error: the engine went offline%s%s\n",
                       status.engine_status_detail.empty() ? "" : ": ", status.engine_status_detail.c_str());
          return 1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("step %d/%d  global_step=%lld  episodes=%zu  reward_mean=%.2f  elapsed=%.1fs\n", step,
                  steps, static_cast<long long>(status.global_step), summary.completed, n ? sum / n : 0.0,
                  elapsed);
      std::fflush(stdout);
    }
    return 0;
  } catch (const swarm::TransportError& e) {
    std::fprintf(stderr, "echo_agent: error: cannot reach the swarm server at %s: %s\n", url.c_str(),
                 e.what());
  } catch (const swarm::Error& e) {
    std::fprintf(stderr, "echo_agent: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "echo_agent: unexpected error: %s\n", e.what());
  }
  return 1;
}
