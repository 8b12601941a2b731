// multi_model_agent: one logical rollout over two swarm servers, each training its own model.
//
// Server A serves a "planner", server B a "solver". A rollout claims an episode on each,
// asks the planner for a plan, passes the plan into the solver's prompt, scores the
// solver's answer once, and ends BOTH episodes with that reward. If anything fails before
// the commit (a claim, a model call, a server going away, --fail-every), BOTH episodes are
// aborted and the rollout is retried: one model never trains on a rollout the other lost.
//
//   swarm-server start --port 10086 &   # planner
//   swarm-server start --port 10087 &   # solver
//   multi_model_agent --url-a http://127.0.0.1:10086 --url-b http://127.0.0.1:10087 --steps 3
//
// See docs/multi_model.md.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
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

// 1.0 if the answer contains the word; otherwise the share of the word's letters found in
// it (each answer character used at most once), scaled below a real hit. In [0, 1].
double word_reward(const std::string& word, const std::string& answer) {
  const std::string w = lower(word), r = lower(answer);
  if (w.empty()) return 0.0;
  if (r.find(w) != std::string::npos) return 1.0;
  int available[256] = {};
  for (unsigned char c : r) ++available[c];
  int hits = 0;
  for (unsigned char c : w)
    if (available[c] > 0) --available[c], ++hits;
  return 0.9 * hits / static_cast<double>(w.size());
}

// Thrown by --fail-every after both episodes were claimed and both models called.
struct InjectedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A was ended but B could not be: the one outcome the protocol cannot undo (there is no
// two-phase commit). Not retried: the task already has an episode on A.
struct HalfCommitted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Settings {
  std::string model_a, model_b;
  double discard_timeout_s = 600;
  std::chrono::milliseconds claim_timeout{60000};
  std::chrono::milliseconds request_timeout{60000};  // one HTTP request (command or model call)
  int fail_every = 0;
  int max_tokens = 48;
};

struct Tally {
  std::atomic<int> attempts{0};        // rollouts that claimed both episodes
  std::atomic<int> committed{0};       // ended on both servers
  std::atomic<int> aborted{0};         // rollouts aborted (on both servers, or on A when B's claim failed)
  std::atomic<int> half_committed{0};  // ended on A, B lost
};

// Everything a rollout needs. SwarmClient is thread-safe; the rest is read-only.
struct Context {
  Context(swarm::SwarmClient& client_a, swarm::SwarmClient& client_b, Settings s)
      : a(client_a), b(client_b), settings(std::move(s)) {}
  swarm::SwarmClient& a;
  swarm::SwarmClient& b;
  const Settings settings;
  Tally tally;
};

void abort_quietly(swarm::SwarmClient& client, const std::string& episode_uuid, const char* side) {
  try {
    client.abort_episode(episode_uuid);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multi_model_agent: warning: abort of %s on server %s failed: %s\n",
                 episode_uuid.c_str(), side, e.what());
  }
}

std::string word_of(const swarm::Task& task) {
  return nlohmann::json::parse(task.metadata_json).value("word", std::string());
}

// One logical rollout. Returns the reward once both episodes are ended; otherwise throws
// after aborting every episode it claimed (HalfCommitted is the exception: see above).
double rollout(Context& ctx, const swarm::Task& task) {
  const Settings& s = ctx.settings;
  // Always A, then B: a rollout may hold A while waiting for B, never the reverse, so two
  // rollouts can never wait on each other across the servers.
  const swarm::OpenAIEndpoint ep_a = ctx.a.begin_episode(s.discard_timeout_s, "train", s.claim_timeout);
  std::optional<swarm::OpenAIEndpoint> ep_b;
  bool a_open = true;  // false once A was aborted by its own end_episode
  swarm::WorkflowOutput out;
  try {
    ep_b = ctx.b.begin_episode(s.discard_timeout_s, "train", s.claim_timeout);
    const int attempt = ++ctx.tally.attempts;
    const std::string word = word_of(task);

    swarm::OpenAIClient planner(ep_a, s.request_timeout);
    swarm::OpenAIClient solver(*ep_b, s.request_timeout);
    swarm::ChatParams pa, pb;
    pa.model = s.model_a;
    pb.model = s.model_b;
    pa.max_tokens = pb.max_tokens = s.max_tokens;
    const auto plan = planner.chat(
        {{"system", "You are the planner. Write a one-line plan for the solver."}, {"user", task.main_query}},
        pa);
    const auto answer =
        solver.chat({{"system", "You are the solver. Follow the planner's plan."},
                     {"user", "Repeat after me: " + word + "\nPlanner's hint: " + plan.content}},
                    pb);
    out.reward = word_reward(word, answer.content);
    out.is_success = *out.reward >= 1.0;
    out.log_metrics["plan_chars"] = static_cast<double>(plan.content.size());
    out.log_metrics["answer_chars"] = static_cast<double>(answer.content.size());

    if (s.fail_every > 0 && attempt % s.fail_every == 0)
      throw InjectedFailure("--fail-every " + std::to_string(s.fail_every) +
                            ": injected failure in attempt " + std::to_string(attempt) +
                            " after claiming both episodes");
    // Commit only if both episodes are still alive: one the server reclaimed (idle
    // timeout, engine stop) or a server gone means neither may train on this rollout.
    if (!ctx.a.can_continue_episode(ep_a.episode_uuid))
      throw std::runtime_error("the episode on A can no longer continue");
    if (!ctx.b.can_continue_episode(ep_b->episode_uuid))
      throw std::runtime_error("the episode on B can no longer continue");
    // A first: it was claimed first, so it is the one nearer its client-side lifetime.
    if (!ctx.a.end_episode(task, ep_a.episode_uuid, out)) {
      a_open = false;
      throw std::runtime_error("episode on A outlived its lifetime (the SDK sent an abort)");
    }
  } catch (...) {
    if (a_open) abort_quietly(ctx.a, ep_a.episode_uuid, "A");
    if (ep_b) abort_quietly(ctx.b, ep_b->episode_uuid, "B");
    ++ctx.tally.aborted;
    throw;
  }
  std::string failure;
  try {
    if (ctx.b.end_episode(task, ep_b->episode_uuid, out)) {
      ++ctx.tally.committed;
      return *out.reward;
    }
    failure = "episode on B outlived its lifetime (the SDK sent an abort)";
  } catch (const std::exception& e) {
    abort_quietly(ctx.b, ep_b->episode_uuid, "B");
    failure = e.what();
  }
  ++ctx.tally.half_committed;
  throw HalfCommitted("ended on A but not on B: " + failure);
}

struct StepResult {
  int committed = 0;
  int failed = 0;
  double reward_sum = 0;
};

// Runs every task once (retrying an aborted rollout up to `max_retries` more times) on
// `workers` threads. The first task out of attempts stops the others from starting new ones.
StepResult run_tasks(Context& ctx, const std::vector<swarm::Task>& tasks, int workers, int max_retries) {
  StepResult result;
  std::mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<bool> give_up{false};
  auto worker = [&] {
    for (size_t i; !give_up && (i = next++) < tasks.size();) {
      for (int attempt = 0;; ++attempt) {
        try {
          const double r = rollout(ctx, tasks[i]);
          std::lock_guard lock(mu);
          ++result.committed;
          result.reward_sum += r;
          break;
        } catch (const HalfCommitted& e) {
          std::fprintf(stderr, "multi_model_agent: error: rollout %zu/%zu (task %s): %s\n", i + 1,
                       tasks.size(), tasks[i].task_id.c_str(), e.what());
        } catch (const std::exception& e) {
          const bool retry = attempt < max_retries && !give_up;
          std::fprintf(
              stderr,
              "multi_model_agent: rollout %zu/%zu (task %s, attempt %d) failed, its episodes aborted: "
              "%s%s\n",
              i + 1, tasks.size(), tasks[i].task_id.c_str(), attempt + 1, e.what(),
              retry ? "; retrying" : "");
          if (retry) continue;
        }
        std::lock_guard lock(mu);
        ++result.failed;
        give_up = true;
        break;
      }
    }
  };
  std::vector<std::thread> threads;
  const int n = std::min<int>(workers, static_cast<int>(tasks.size()));
  for (int w = 0; w < n; ++w) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  return result;
}

void configure(swarm::SwarmClient& client, const swarm::Job& job, bool no_configure, bool force_restart,
               const char* side) {
  if (no_configure) {
    const auto st = client.get_engine_status();
    if (st.engine_status == "ENGINE.OFFLINE")
      throw swarm::ClientError(std::string("server ") + side + " (" + client.server_url() +
                               ") is OFFLINE and --no-configure was given");
  } else {
    client.auto_sync_train_config_and_start_engine(job, force_restart);
  }
  const auto st = client.get_engine_status();
  std::printf("multi_model_agent: server %s %s: %s%s, engine %s, global_step=%lld\n", side,
              client.server_url().c_str(), no_configure ? "attached" : "model ",
              no_configure ? "" : job.model.c_str(), st.engine_status.c_str(),
              static_cast<long long>(st.global_step));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"multi_model_agent: one rollout, two swarm servers (planner + solver), one reward for both"};
  std::string url_a = "http://127.0.0.1:10086", url_b = "http://127.0.0.1:10087";
  Settings settings;
  settings.model_a = "mock-planner";
  settings.model_b = "mock-solver";
  int steps = 3, workers = 4, batch_size = 2, num_repeat = 2, max_retries = 3;
  bool force_restart = false, no_configure = false;
  double claim_timeout_s = 60, request_timeout_s = 60, step_timeout_s = 600;
  app.add_option("--url-a", url_a, "Swarm server of model A (the planner)")->capture_default_str();
  app.add_option("--url-b", url_b, "Swarm server of model B (the solver)")->capture_default_str();
  app.add_option("--model-a", settings.model_a, "Model server A trains")->capture_default_str();
  app.add_option("--model-b", settings.model_b, "Model server B trains")->capture_default_str();
  app.add_option("--steps", steps, "Policy steps to drive (on both servers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", workers, "Rollouts in flight at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "Tasks per policy step (both servers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num-repeat", num_repeat, "Rollouts per task (GRPO group size, both servers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-retries", max_retries, "Extra attempts of an aborted rollout")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--fail-every", settings.fail_every,
                 "Testing: make every K-th rollout fail after claiming both episodes (0 = never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--claim-timeout", claim_timeout_s, "Seconds to wait for one claim")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--request-timeout", request_timeout_s,
                 "Seconds one request may take (a model call, a command) before the server counts as lost")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--discard-timeout", settings.discard_timeout_s, "discard_episode_timeout of each claim")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--step-timeout", step_timeout_s, "Seconds to wait for one policy step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--force-restart", force_restart,
               "Stop and reconfigure both engines even if they are running");
  app.add_flag("--no-configure", no_configure,
               "Never sync a config or start an engine: attach to running ones");
  CLI11_PARSE(app, argc, argv);
  if (force_restart && no_configure) {
    std::fprintf(stderr, "multi_model_agent: error: --force-restart and --no-configure exclude each other\n");
    return 2;
  }
  settings.claim_timeout = std::chrono::milliseconds(static_cast<int64_t>(claim_timeout_s * 1000));
  settings.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(request_timeout_s * 1000));

  swarm::SwarmClientOptions options;
  options.backoff_max = std::chrono::seconds(1);
  options.request_timeout = settings.request_timeout;
  std::optional<swarm::SwarmClient> client_a, client_b;
  std::optional<Context> ctx;
  auto summary = [&] {
    if (!ctx) return;
    std::printf("multi_model_agent: %d rollouts ended on both servers, %d aborted, %d half-committed\n",
                ctx->tally.committed.load(), ctx->tally.aborted.load(), ctx->tally.half_committed.load());
    std::fflush(stdout);
  };
  try {
    client_a.emplace(url_a, options);
    client_b.emplace(url_b, options);
    ctx.emplace(*client_a, *client_b, settings);

    auto make_job = [&](const std::string& model, const char* experiment) {
      swarm::Job job;
      job.project_name = "multi_model";
      job.experiment_name = experiment;
      job.model = model;
      job.batch_size = batch_size;
      job.num_repeat = num_repeat;
      job.max_response_length = 64;
      return job;
    };
    configure(*client_a, make_job(settings.model_a, "planner"), no_configure, force_restart, "A");
    configure(*client_b, make_job(settings.model_b, "solver"), no_configure, force_restart, "B");

    for (int step = 1; step <= steps; ++step) {
      const auto t0 = Clock::now();
      const int64_t a_before = client_a->get_engine_status().global_step;
      const int64_t b_before = client_b->get_engine_status().global_step;

      // The same task ids on both servers: each server groups its episodes by task, and
      // the two groups of a task are made of the same rollouts.
      std::mt19937 rng(static_cast<uint32_t>(a_before * 7919 + b_before * 31 + step));
      std::vector<swarm::Task> tasks;
      for (int i = 0; i < batch_size; ++i) {
        const std::string& word = kWords[rng() % kWords.size()];
        swarm::Task task;
        task.task_id =
            "mm-" + std::to_string(a_before) + "-" + std::to_string(b_before) + "-" + std::to_string(i);
        task.main_query = "Plan how to make the solver say the word \"" + word + "\".";
        task.env_type = "planner-solver";
        task.metadata_json = nlohmann::json{{"word", word}}.dump();
        for (int r = 0; r < num_repeat; ++r) tasks.push_back(task);
      }

      const int aborted_before = ctx->tally.aborted;
      const StepResult result = run_tasks(*ctx, tasks, workers, max_retries);
      if (result.failed > 0) {
        std::fprintf(stderr, "multi_model_agent: error: step %d: %d of %zu rollouts failed (see above)\n",
                     step, result.failed, tasks.size());
        summary();
        return 1;
      }

      // Both batches are complete; both servers now train and sync weights.
      const auto wait_until = Clock::now() + std::chrono::duration<double>(step_timeout_s);
      swarm::EngineStatus sa, sb;
      for (;;) {
        sa = client_a->get_engine_status();
        sb = client_b->get_engine_status();
        if (sa.global_step > a_before && sb.global_step > b_before) break;
        for (const auto* st : {&sa, &sb})
          if (st->engine_status == "ENGINE.OFFLINE")
            throw swarm::ClientError(std::string("server ") + (st == &sa ? "A" : "B") +
                                     " went offline: " + st->engine_status_detail);
        if (Clock::now() > wait_until)
          throw swarm::TimeoutError("global_step stayed at A=" + std::to_string(sa.global_step) +
                                    " B=" + std::to_string(sb.global_step) + " for " +
                                    std::to_string(step_timeout_s) + " s");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      std::printf(
          "step %d/%d  global_step a=%lld b=%lld  rollouts=%d  aborted=%d  reward_mean=%.2f  elapsed=%.1fs\n",
          step, steps, static_cast<long long>(sa.global_step), static_cast<long long>(sb.global_step),
          result.committed, ctx->tally.aborted - aborted_before, result.reward_sum / result.committed,
          std::chrono::duration<double>(Clock::now() - t0).count());
      std::fflush(stdout);
    }
    summary();
    return 0;
  } catch (const swarm::TransportError& e) {
    std::fprintf(stderr, "multi_model_agent: error: a swarm server cannot be reached: %s\n", e.what());
  } catch (const swarm::Error& e) {
    std::fprintf(stderr, "multi_model_agent: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multi_model_agent: unexpected error: %s\n", e.what());
  }
  summary();
  return 1;
}
