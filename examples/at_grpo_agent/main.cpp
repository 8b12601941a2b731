// at_grpo_agent: two roles sharing one policy, trained with AT-GRPO (PettingLLMs).
//
// Each episode is one conversation on a generated task (examples/tasks: "sort 5092"):
//   1. the **proposer** answers the task;
//   2. the **checker**, shown the proposal, says whether it is right ("yes" / "no": its first
//      letter, y or n, is the verdict).
// Every call names its agent (`"swarm": {"agent": ...}` in the request), and the episode ends
// with one reward per call (`turn_rewards`): the proposer's is the verifier's score of its
// answer, the checker's is 1 when its verdict matches the truth (exact answer <=> "yes"), else
// 0. The job trains with `group_by: task_agent_turn`: the proposers of a task are compared with
// each other on their scores, the checkers with each other on their verdicts, although both
// calls are one sample of the conversation (each call's advantage lands on its own tokens).
// The episode's outcome reward is the proposer's score.
//
//   swarm-server start --engine mock &
//   at_grpo_agent --url http://127.0.0.1:10086 --model mock --steps 2
//
// On the mock engine the proposer echoes the task and the checker the question, with letters
// replaced at temperature > 0, so rewards vary but nothing is learned: a smoke run. On the torch
// engine use any model (a tiny-char model trains; docs/concepts.md describes the grouping).

#include <CLI/CLI.hpp>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/swarm.hpp"
#include "tasks/tasks.hpp"

namespace {

using json = nlohmann::json;

struct Settings {
  std::string url = "http://127.0.0.1:10086";
  std::string model;
  std::string tasks = "sort,reverse";
  int difficulty = 2;
  int steps = 3;
  int batch_size = 4;
  int num_repeat = 4;
  int workers = 8;
  int max_tokens = 16;
  double temperature = 1.0;
  double learning_rate = 5e-4;
  std::string group_by = "task_agent_turn";  // task: GRPO on the episode's reward (the contrast)
  uint64_t seed = 1;
  bool force_restart = false;
  double step_timeout_s = 600;
};

struct EpisodeResult {
  double proposer = 0, checker = 0;
  bool exact = false;
};

// The verdict is the reply's first letter, any case: y (yes) or n (no) — "yes", "y", "No" and
// "n" all count, so a model learning from scratch can find a verdict one character long;
// anything else is no verdict.
int verdict(const std::string& reply) {
  const std::string r = swarm::tasks::normalize_reply(reply);
  if (r.empty()) return -1;
  const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(r[0])));
  return c == 'y' ? 1 : c == 'n' ? 0 : -1;
}

EpisodeResult run_episode(const Settings& s, const swarm::tasks::TaskInstance& task,
                          const swarm::OpenAIEndpoint& ep) {
  swarm::OpenAIClient llm(ep, std::chrono::seconds(120));
  swarm::ChatParams params;
  params.max_tokens = s.max_tokens;
  params.temperature = s.temperature;
  json messages = json::array({{{"role", "user"}, {"content", task.prompt}}});
  params.extra = {{"swarm", {{"agent", "proposer"}}}};
  const swarm::ChatResult proposal = llm.chat(messages, params);
  EpisodeResult r;
  r.proposer = swarm::tasks::score(task, proposal.content);
  r.exact = swarm::tasks::is_exact(task, proposal.content);
  messages.push_back(proposal.assistant_message());
  messages.push_back({{"role", "user"}, {"content", "right? yes or no"}});
  params.extra = {{"swarm", {{"agent", "checker"}}}};
  params.max_tokens = 4;
  const swarm::ChatResult check = llm.chat(messages, params);
  const int v = verdict(check.content);
  r.checker = v >= 0 && (v == 1) == r.exact ? 1.0 : 0.0;
  return r;
}

int run(const Settings& s) {
  const swarm::tasks::TaskMix mix = swarm::tasks::TaskMix::parse(s.tasks);
  swarm::SwarmClientOptions options;
  options.max_connections = static_cast<size_t>(s.workers) + 4;
  options.run_claim_deadline = std::chrono::milliseconds(static_cast<int64_t>(s.step_timeout_s * 1000 / 4));
  swarm::SwarmClient client(s.url, options);
  swarm::Job job;
  job.model = s.model;
  job.batch_size = s.batch_size;
  job.num_repeat = s.num_repeat;
  job.temperature = s.temperature;
  job.learning_rate = s.learning_rate;
  job.seed = static_cast<int64_t>(s.seed);
  job.group_by = s.group_by;
  job.max_prompt_length = 256;
  job.max_response_length = s.max_tokens;
  std::printf(
      "at_grpo_agent: %s, model %s, %d steps of %d tasks x %d episodes (%s, difficulty %d), "
      "roles proposer + checker, group_by %s\n",
      s.url.c_str(), s.model.c_str(), s.steps, s.batch_size, s.num_repeat, mix.to_string().c_str(),
      s.difficulty, s.group_by.c_str());
  client.auto_sync_train_config_and_start_engine(job, s.force_restart);
  std::fflush(stdout);

  for (int step = 1; step <= s.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t step_before = client.get_engine_status().global_step;
    std::vector<swarm::Task> batch;
    for (int i = 0; i < s.batch_size; ++i) {
      const auto task = mix.sample(
          s.difficulty,
          swarm::tasks::mix_seed(s.seed, static_cast<uint64_t>(step_before), static_cast<uint64_t>(i)));
      swarm::Task t;
      t.task_id = task.id;
      t.main_query = task.prompt;
      for (int k = 0; k < s.num_repeat; ++k) batch.push_back(t);
    }
    std::mutex mu;
    double proposer = 0, checker = 0;
    int exact = 0;
    auto workflow = [&](const swarm::Task& t, const swarm::OpenAIEndpoint& ep) {
      const auto task = swarm::tasks::task_from_id(t.task_id);
      const EpisodeResult r = run_episode(s, task, ep);
      {
        std::lock_guard lk(mu);
        proposer += r.proposer;
        checker += r.checker;
        exact += r.exact;
      }
      swarm::WorkflowOutput out;
      out.reward = r.proposer;
      out.is_success = r.exact;
      out.turn_rewards = {r.proposer, r.checker};  // one per call, in call order
      out.log_metrics["checker_right"] = r.checker;
      return out;
    };
    const swarm::RunSummary summary = client.run_episodes_until_all_complete(batch, workflow, s.workers);
    if (summary.failed > 0) {
      std::fprintf(stderr, "at_grpo_agent: error: %zu of %zu episodes of step %d failed after retries\n",
                   summary.failed, batch.size(), step);
      return 1;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(s.step_timeout_s);
    swarm::EngineStatus status;
    while ((status = client.get_engine_status()).global_step <= step_before) {
      if (status.engine_status == "ENGINE.OFFLINE" || std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "at_grpo_agent: error: no policy step (engine %s %s)\n",
                     status.engine_status.c_str(), status.engine_status_detail.c_str());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double n = static_cast<double>(batch.size());
    std::printf("step %d/%d  global_step=%lld  proposer_reward=%.3f  exact=%.2f  checker_right=%.2f  %.1fs\n",
                step, s.steps, static_cast<long long>(status.global_step), proposer / n, exact / n,
                checker / n, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"at_grpo_agent: a proposer and a checker sharing one policy, trained with AT-GRPO"};
  app.add_option("--url", s.url, "Swarm server URL")->capture_default_str();
  app.add_option("--model", s.model, "Model directory the server loads (any name on the mock engine)")
      ->required();
  app.add_option("--tasks", s.tasks,
                 "Task mix (examples/tasks: sort, reverse, count, base, add; weights as sort:2)")
      ->capture_default_str();
  app.add_option("--difficulty", s.difficulty, "Task difficulty")
      ->capture_default_str()
      ->check(CLI::Range(1, 8));
  app.add_option("--steps", s.steps, "Policy steps to drive")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", s.batch_size, "Tasks per policy step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num-repeat", s.num_repeat, "Episodes per task (group size per agent and turn)")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  app.add_option("--workers", s.workers, "Parallel episodes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-tokens", s.max_tokens, "The proposer's completion limit")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--temperature", s.temperature, "Sampling temperature")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0));
  app.add_option("--learning-rate", s.learning_rate, "AdamW learning rate")->capture_default_str();
  app.add_option("--seed", s.seed, "Seed of the tasks")->capture_default_str();
  app.add_option("--group-by", s.group_by,
                 "task_agent_turn (AT-GRPO: each role compared on its own turn reward) or task (GRPO on the "
                 "episode's reward, the proposer's score, for both calls: the contrast)")
      ->capture_default_str()
      ->check(CLI::IsMember({"task_agent_turn", "task"}));
  app.add_flag("--force-restart", s.force_restart, "Stop and reconfigure the engine even if it is running");
  app.add_option("--step-timeout", s.step_timeout_s, "Seconds to wait for one policy step")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "at_grpo_agent: error: %s\n", e.what());
    return 1;
  }
}
