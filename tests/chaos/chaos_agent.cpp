// chaos_agent: the agents of the chaos tests (tests/chaos/). `--workers` threads share one
// SwarmClient; each runs task after task (num_repeat episodes per task id, ids unique to this
// process) until the engine reaches `--until-step` or `--deadline` passes: claim (the SDK retries
// through weight syncs and server restarts), one chat call, end. A task whose episode fails
// (the server died under it, the episode was reclaimed) is run again until it ends, so its group
// completes. Every episode the server acknowledged is appended to `--acked` as
// "<episode_uuid> <task_id>" the moment the answer arrives: the test compares this list with what
// the server trained and holds.
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "swarm/swarm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chaos_agent: agents that keep going through server crashes (tests/chaos)"};
  std::string url, acked_path, tag;
  int workers = 32, num_repeat = 4, until_step = 3;
  double deadline_s = 300, discard_timeout = 30;
  int max_tokens = 8, think_ms = 0;
  app.add_option("--url", url, "Swarm server URL")->required();
  app.add_option("--acked", acked_path, "Append acknowledged episodes here")->required();
  app.add_option("--workers", workers, "Agent threads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--num-repeat", num_repeat, "Episodes per task id")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--until-step", until_step, "Stop once the engine's global_step reaches this")
      ->capture_default_str();
  app.add_option("--deadline", deadline_s, "Give up after this many seconds (exit 1)")->capture_default_str();
  app.add_option("--discard-timeout", discard_timeout, "discard_episode_timeout of each claim (s)")
      ->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "Completion limit of each call")->capture_default_str();
  app.add_option("--think-ms", think_ms, "Pause before ending each episode (an agent's own work)")
      ->capture_default_str();
  app.add_option("--tag", tag, "Prefix of this process's task ids (default: the pid)");
  CLI11_PARSE(app, argc, argv);
  if (tag.empty()) tag = "p" + std::to_string(::getpid());

  FILE* acked = std::fopen(acked_path.c_str(), "a");
  if (acked == nullptr) {
    std::perror(acked_path.c_str());
    return 2;
  }
  std::mutex acked_mu;

  swarm::SwarmClientOptions options;
  options.backoff_initial = std::chrono::milliseconds(100);
  options.backoff_max = std::chrono::milliseconds(1000);
  options.request_timeout = std::chrono::seconds(30);
  options.log_level = swarm::ClientLogLevel::ERROR;
  swarm::SwarmClient client(url, options);

  const auto deadline = Clock::now() + std::chrono::duration<double>(deadline_s);
  std::atomic<bool> done{false};
  std::atomic<int64_t> next_slot{0}, ended{0}, failures{0};

  // Watches the engine's step (tolerating a server that is down) and says when to stop.
  std::thread watcher([&] {
    while (!done && Clock::now() < deadline) {
      try {
        if (client.get_engine_status().global_step >= until_step) done = true;
      } catch (const std::exception&) {}
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    done = true;
  });

  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&] {
      while (!done) {
        const int64_t slot = next_slot++;
        swarm::Task task;
        task.task_id = tag + "-task-" + std::to_string(slot / num_repeat);
        task.main_query = "Count to " + std::to_string(slot % 7 + 1);
        for (bool ended_ok = false; !ended_ok && !done;) {
          std::string episode;
          try {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
            if (left.count() <= 0) break;
            swarm::OpenAIEndpoint ep = client.begin_episode(discard_timeout, "train", left);
            episode = ep.episode_uuid;
            swarm::OpenAIClient llm(ep, std::chrono::seconds(30));
            swarm::ChatParams params;
            params.max_tokens = max_tokens;
            const auto reply = llm.chat({{"user", task.main_query}}, params);
            if (think_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(think_ms));
            swarm::WorkflowOutput out;
            // Rewards that differ within a group (so groups are not dummies): reply length.
            out.reward = static_cast<double>(reply.content.size() % 5) / 4.0;
            if (client.end_episode(task, episode, out)) {
              std::lock_guard lk(acked_mu);
              std::fprintf(acked, "%s %s\n", episode.c_str(), task.task_id.c_str());
              std::fflush(acked);
              ++ended;
              ended_ok = true;
            }
          } catch (const std::exception& e) {
            ++failures;
            if (!episode.empty()) {
              try {
                client.abort_episode(episode);
              } catch (const std::exception&) {}
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }
      }
    });
  for (auto& t : threads) t.join();
  done = true;
  watcher.join();
  std::fclose(acked);
  int64_t step = -1;
  try {
    step = client.get_engine_status().global_step;
  } catch (const std::exception&) {}
  std::printf("chaos_agent %s: %lld episode(s) acknowledged, %lld failed attempt(s), engine at step %lld\n",
              tag.c_str(), static_cast<long long>(ended.load()), static_cast<long long>(failures.load()),
              static_cast<long long>(step));
  return step >= until_step ? 0 : 1;
}
