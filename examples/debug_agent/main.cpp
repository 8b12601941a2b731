// debug_agent: checks connectivity to a swarm server without touching the training batch.
//
// Every episode it claims goes through the real path (claim, OpenAI endpoint, optionally a
// chat call) and is then ALWAYS aborted, never ended: in ROLLING the slot goes back to the
// pool, in ROLLING_POST the record is deleted. Safe to run next to a training run.
//
//   debug_agent --url http://127.0.0.1:10086 --episodes 4 --no-configure
//
// By default it brings an OFFLINE server up with a small job (like echo_agent; a running
// engine is left as it is). With --no-configure it only attaches to a running engine.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "swarm/swarm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The few pool figures that show whether a batch changed.
struct PoolFigures {
  int64_t global_step = 0;
  int64_t finished_episodes = 0;
  int64_t ended = 0;
  int64_t aborted = 0;
  int64_t running = 0;
};

PoolFigures pool_figures(swarm::SwarmClient& client) {
  const nlohmann::json info = client.get_pool_information();
  auto get = [](const nlohmann::json& j, const char* a, const char* b) -> int64_t {
    if (!j.contains(a) || !j[a].is_object()) return 0;
    const auto& o = j[a];
    return o.contains(b) && o[b].is_number() ? o[b].get<int64_t>() : 0;
  };
  PoolFigures f;
  f.global_step = info.value("global_step", int64_t{0});
  f.finished_episodes = get(info, "progress", "finished_episodes");
  f.ended = get(info, "counters", "ended");
  f.aborted = get(info, "counters", "aborted");
  f.running = get(info, "slots", "running");
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"debug_agent: claims episodes, optionally calls the model, and always aborts (never trains)"};
  std::string url = "http://127.0.0.1:10086";
  int episodes = 4, workers = 1, batch_size = 4, num_repeat = 4, max_tokens = 16;
  std::string model = "mock-echo";
  std::string prompt = "Hello from debug_agent: reply with one word.";
  bool force_restart = false, no_configure = false, no_llm = false;
  double claim_timeout_s = 60, discard_timeout_s = 60;
  app.add_option("--url", url, "Swarm server URL")->capture_default_str();
  app.add_option("--episodes", episodes, "Episodes to claim (each is aborted)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", workers, "Episodes in flight at once (keep it low next to a training run)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--model", model, "Model of the job synced when the engine is OFFLINE")
      ->capture_default_str();
  app.add_option("--batch-size", batch_size, "batch_size of that job")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num-repeat", num_repeat, "num_repeat of that job")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--force-restart", force_restart, "Stop and reconfigure the engine even if it is running");
  app.add_flag("--no-configure", no_configure,
               "Never sync a config or start the engine: attach to a running one");
  app.add_flag("--no-llm", no_llm, "Claim and abort only, without a model call");
  app.add_option("--prompt", prompt, "User message of the model call")->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "max_tokens of the model call")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--claim-timeout", claim_timeout_s, "Seconds to wait for one claim")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--discard-timeout", discard_timeout_s,
                 "discard_episode_timeout of each claim (short, so a crashed debug run frees its slots fast)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (force_restart && no_configure) {
    std::fprintf(stderr, "debug_agent: error: --force-restart and --no-configure exclude each other\n");
    return 2;
  }

  try {
    swarm::SwarmClient client(url);
    std::printf("debug_agent: connecting to %s (client %s)\n", url.c_str(), client.client_uuid().c_str());
    if (!client.health()) {
      std::fprintf(stderr, "debug_agent: error: %s/health does not answer \"ok\"\n", url.c_str());
      return 1;
    }
    swarm::EngineStatus status = client.get_engine_status();
    std::printf("debug_agent: engine %s, global_step=%lld\n", status.engine_status.c_str(),
                static_cast<long long>(status.global_step));
    if (no_configure) {
      if (status.engine_status == "ENGINE.OFFLINE") {
        std::fprintf(
            stderr,
            "debug_agent: error: the engine is OFFLINE and --no-configure was given (start a training "
            "run first, or drop --no-configure)%s%s\n",
            status.engine_status_detail.empty() ? "" : ": ", status.engine_status_detail.c_str());
        return 1;
      }
    } else {
      swarm::Job job;
      job.project_name = "debug";
      job.experiment_name = "debug-agent";
      job.model = model;
      job.batch_size = batch_size;
      job.num_repeat = num_repeat;
      job.max_response_length = 64;
      client.auto_sync_train_config_and_start_engine(job, force_restart);
      status = client.get_engine_status();
      std::printf("debug_agent: engine %s, global_step=%lld\n", status.engine_status.c_str(),
                  static_cast<long long>(status.global_step));
    }

    const PoolFigures before = pool_figures(client);
    const auto t_start = Clock::now();
    std::atomic<int> next{0}, claimed{0}, aborted{0}, llm_calls{0}, errors{0};
    std::atomic<bool> listed_models{false};
    std::mutex out_mu;  // one line at a time
    auto say = [&](const std::string& line) {
      std::lock_guard lock(out_mu);
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    };

    auto worker = [&] {
      for (int i; (i = next++) < episodes;) {
        const std::string tag = "episode " + std::to_string(i + 1) + "/" + std::to_string(episodes);
        const auto t0 = Clock::now();
        swarm::OpenAIEndpoint ep;
        try {
          ep = client.begin_episode(discard_timeout_s, "train",
                                    std::chrono::milliseconds(static_cast<int64_t>(claim_timeout_s * 1000)));
        } catch (const std::exception& e) {
          ++errors;
          say(tag + ": claim failed: " + e.what());
          continue;
        }
        ++claimed;
        std::string what = tag + ": claimed " + ep.episode_uuid + " (" + ep.base_url + ")";
        // Whatever happens below, the episode is aborted: it must never reach a batch.
        try {
          if (!no_llm) {
            swarm::OpenAIClient llm(ep, std::chrono::seconds(60));
            if (!listed_models.exchange(true)) {
              std::string ids;
              for (const auto& id : llm.models()) ids += (ids.empty() ? "" : ", ") + id;
              say("debug_agent: /v1/models: [" + ids + "]");
            }
            swarm::ChatParams params;
            params.model = model;
            params.max_tokens = max_tokens;
            const auto reply = llm.chat({{"user", prompt}}, params);
            ++llm_calls;
            char buf[160];
            std::snprintf(buf, sizeof buf, ", chat: %d prompt + %d completion tokens, finish=%s, %.2fs",
                          reply.usage.prompt_tokens, reply.usage.completion_tokens,
                          reply.finish_reason.c_str(), seconds_since(t0));
            what += buf;
          }
        } catch (const std::exception& e) {
          ++errors;
          what += std::string(", model call failed: ") + e.what();
        }
        try {
          client.abort_episode(ep.episode_uuid);
          ++aborted;
          what += ", aborted";
        } catch (const std::exception& e) {
          ++errors;
          what += std::string(", abort failed: ") + e.what();
        }
        say(what);
      }
    };
    std::vector<std::thread> threads;
    for (int w = 0; w < std::min(workers, episodes); ++w) threads.emplace_back(worker);
    for (auto& t : threads) t.join();

    const PoolFigures after = pool_figures(client);
    std::printf(
        "debug_agent: %d claimed, %d aborted, %d model calls, %d errors in %.2fs\n"
        "debug_agent: server: global_step %lld -> %lld, batch finished_episodes %lld -> %lld, "
        "ended %lld -> %lld, aborted %lld -> %lld, running %lld\n",
        claimed.load(), aborted.load(), llm_calls.load(), errors.load(), seconds_since(t_start),
        static_cast<long long>(before.global_step), static_cast<long long>(after.global_step),
        static_cast<long long>(before.finished_episodes), static_cast<long long>(after.finished_episodes),
        static_cast<long long>(before.ended), static_cast<long long>(after.ended),
        static_cast<long long>(before.aborted), static_cast<long long>(after.aborted),
        static_cast<long long>(after.running));
    return errors == 0 && aborted == episodes ? 0 : 1;
  } catch (const swarm::TransportError& e) {
    std::fprintf(stderr, "debug_agent: error: cannot reach the swarm server at %s: %s\n", url.c_str(),
                 e.what());
  } catch (const swarm::Error& e) {
    std::fprintf(stderr, "debug_agent: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "debug_agent: unexpected error: %s\n", e.what());
  }
  return 1;
}
