// harness_agent: trains a model on what a real agent harness does with it — Claude Code (the
// Anthropic Messages API) or Codex (the OpenAI Responses API) — on a small file task.
//
// Each episode runs the harness once, in a fresh temporary directory, on "create answer.txt
// holding the sum of A and B": Claude Code in print mode (`claude -p --bare --tools Bash`)
// with ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY set to the claimed episode, or `codex exec` with a
// provider whose wire_api is "responses" pointing at it. The harness calls the model as many
// times as it likes (tool calls: it runs Bash / exec_command itself); the server records every
// call with its exact tokens, and the episode trains as one sample. The reward comes from the
// directory afterwards: 1 when answer.txt holds the right number, --file-reward when it exists
// but is wrong, else 0.
//
//   swarm-server start --engine mock &
//   harness_agent --url http://127.0.0.1:10086 --model mock --scripted --temperature 0 --steps 2
//
// --scripted appends the right shell command as a tool call to each prompt in the mock engine's
// convention (the mock answers with the last user or tool message), so the whole loop — harness,
// tool run, reward from the directory — runs without a model. A tiny random model will not learn
// this task; a real one (Qwen3-8B class, a GPU box) can: see docs/harnesses.md.
//
// The harnesses come from tests/harness (scripts/setup.sh installs them); --harness-bin points
// elsewhere.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/swarm.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Settings {
  std::string url = "http://127.0.0.1:10086";
  std::string model;
  std::string harness = "claude";  // claude | codex
  std::string harness_bin;         // default: tests/harness/node_modules/.bin/<harness>
  int steps = 3;
  int batch_size = 2;
  int num_repeat = 2;
  int workers = 2;
  int max_tokens = 512;
  int max_prompt_length = 60000;
  double temperature = 1.0;
  double learning_rate = 1e-5;
  double file_reward = 0.1;
  double episode_timeout_s = 300;
  uint64_t seed = 1;
  bool scripted = false;
  bool force_restart = false;
  bool keep_dirs = false;
  double step_timeout_s = 1200;
};

// Runs argv in `cwd` with `env` added to this process's environment, stdin /dev/null, stdout and
// stderr into `log`; kills it after `timeout_s`. Returns the exit status (-1: killed / failed).
int run_process(const std::vector<std::string>& argv,
                const std::vector<std::pair<std::string, std::string>>& env, const fs::path& cwd,
                const fs::path& log, double timeout_s) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool overridden = false;
    for (const auto& [k, v] : env) overridden |= kv.rfind(k + "=", 0) == 0;
    if (!overridden) envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

struct Problem {
  long long a = 0, b = 0;
};

struct EpisodeResult {
  double reward = 0;
  bool file = false, correct = false;
  int exit_code = 0;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

EpisodeResult run_episode(const Settings& s, const Problem& p, const swarm::OpenAIEndpoint& ep) {
  const fs::path dir = fs::temp_directory_path() / ("harness-agent-" + ep.episode_uuid);
  fs::create_directories(dir);
  const long long sum = p.a + p.b;
  std::string prompt = "Create a file named answer.txt in the current directory holding only the sum of " +
                       std::to_string(p.a) + " and " + std::to_string(p.b) + ", then say done.";
  const std::string command = "echo " + std::to_string(sum) + " > answer.txt";
  std::string base = ep.base_url;  // http://host:port/v1 -> what ANTHROPIC_BASE_URL takes
  if (base.size() >= 3 && base.compare(base.size() - 3, 3, "/v1") == 0) base.resize(base.size() - 3);
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env = {{"HOME", dir.string()}};
  if (s.harness == "claude") {
    if (s.scripted)
      prompt += "<tool_call>" + json{{"name", "Bash"}, {"arguments", {{"command", command}}}}.dump() +
                "</tool_call>";
    argv = {s.harness_bin,
            "-p",
            prompt,
            "--bare",
            "--tools",
            "Bash",
            "--allowedTools",
            "Bash",
            "--system-prompt",
            "You are a careful assistant working in a shell.",
            "--model",
            "swarm",
            "--output-format",
            "json"};
    env.insert(env.end(), {{"ANTHROPIC_BASE_URL", base},
                           {"ANTHROPIC_API_KEY", ep.api_key},
                           {"DISABLE_TELEMETRY", "1"},
                           {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"},
                           {"DISABLE_AUTOUPDATER", "1"}});
  } else {
    if (s.scripted)
      prompt += "<tool_call>" + json{{"name", "exec_command"}, {"arguments", {{"cmd", command}}}}.dump() +
                "</tool_call>";
    const fs::path home = dir / ".codex-home";
    fs::create_directories(home);
    std::ofstream(home / "config.toml")
        << "model = \"swarm\"\nmodel_provider = \"swarm\"\napproval_policy = \"never\"\n"
           "sandbox_mode = \"danger-full-access\"\ncheck_for_update_on_startup = false\n"
           "web_search = \"disabled\"\n\n[analytics]\nenabled = false\n\n[feedback]\n"
           "enabled = false\n\n[otel]\nexporter = \"none\"\n\n[model_providers.swarm]\n"
           "name = \"swarm\"\nbase_url = \""
        << ep.base_url
        << "\"\nwire_api = \"responses\"\nenv_key = \"SWARM_API_KEY\"\n"
           "request_max_retries = 1\nstream_max_retries = 1\n";
    argv = {s.harness_bin, "exec", "--skip-git-repo-check", "--strict-config", "--disable",
            "plugins",     prompt};
    env.insert(env.end(), {{"CODEX_HOME", home.string()}, {"SWARM_API_KEY", ep.api_key}});
  }
  EpisodeResult r;
  r.exit_code = run_process(argv, env, dir, dir / "harness.log", s.episode_timeout_s);
  const fs::path answer = dir / "answer.txt";
  r.file = fs::exists(answer);
  if (r.file) {
    std::string text = read_file(answer);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    r.correct = text == std::to_string(sum);
  }
  r.reward = r.correct ? 1.0 : r.file ? s.file_reward : 0.0;
  if (!s.keep_dirs) fs::remove_all(dir);
  return r;
}

int run(const Settings& s) {
  if (!fs::exists(s.harness_bin))
    throw std::runtime_error("no " + s.harness + " at " + s.harness_bin +
                             " (run scripts/setup.sh, or pass --harness-bin)");
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
  job.max_prompt_length = s.max_prompt_length;  // a harness's system prompt and tools: Codex ~10k tokens
  job.max_response_length = s.max_tokens;
  std::printf("harness_agent: %s, model %s, harness %s (%s), %d steps of %d tasks x %d episodes%s\n",
              s.url.c_str(), s.model.c_str(), s.harness.c_str(), s.harness_bin.c_str(), s.steps, s.batch_size,
              s.num_repeat, s.scripted ? ", scripted tool calls (mock engine)" : "");
  client.auto_sync_train_config_and_start_engine(job, s.force_restart);
  std::fflush(stdout);

  std::mt19937_64 rng(s.seed);
  std::uniform_int_distribution<long long> num(100, 999);
  for (int step = 1; step <= s.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t step_before = client.get_engine_status().global_step;
    std::vector<swarm::Task> batch;
    std::vector<Problem> problems;
    for (int i = 0; i < s.batch_size; ++i) {
      Problem p{num(rng), num(rng)};
      problems.push_back(p);
      swarm::Task task;
      task.task_id = "sum-" + std::to_string(step_before) + "-" + std::to_string(i);
      task.main_query = std::to_string(p.a) + " + " + std::to_string(p.b);
      for (int k = 0; k < s.num_repeat; ++k) batch.push_back(task);
    }
    std::atomic<int> files{0}, correct{0}, harness_failures{0};
    auto workflow = [&](const swarm::Task& task, const swarm::OpenAIEndpoint& ep) {
      const size_t i = static_cast<size_t>(std::stoul(task.task_id.substr(task.task_id.rfind('-') + 1)));
      const EpisodeResult r = run_episode(s, problems[i], ep);
      files += r.file;
      correct += r.correct;
      harness_failures += r.exit_code != 0;
      swarm::WorkflowOutput out;
      out.reward = r.reward;
      out.is_success = r.correct;
      out.log_metrics["answer_file"] = r.file ? 1.0 : 0.0;
      out.log_metrics["correct"] = r.correct ? 1.0 : 0.0;
      out.log_metrics["harness_failed"] = r.exit_code != 0 ? 1.0 : 0.0;
      return out;
    };
    const swarm::RunSummary summary = client.run_episodes_until_all_complete(batch, workflow, s.workers);
    if (summary.failed > 0) {
      std::fprintf(stderr, "harness_agent: error: %zu of %zu episodes of step %d failed after retries\n",
                   summary.failed, batch.size(), step);
      return 1;
    }
    double reward = 0;
    for (const auto& r : summary.rewards) reward += r.value_or(0.0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(s.step_timeout_s);
    swarm::EngineStatus status;
    while ((status = client.get_engine_status()).global_step <= step_before) {
      if (status.engine_status == "ENGINE.OFFLINE" || std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "harness_agent: error: no policy step (engine %s %s)\n",
                     status.engine_status.c_str(), status.engine_status_detail.c_str());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double n = static_cast<double>(batch.size());
    std::printf(
        "step %d/%d  global_step=%lld  reward=%.3f  answer_file=%.2f  correct=%.2f  harness_failed=%.2f  "
        "%.1fs\n",
        step, s.steps, static_cast<long long>(status.global_step), reward / n, files / n, correct / n,
        harness_failures / n, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
  return 0;
}

// The harness installed by scripts/setup.sh in the checkout this binary runs from: beside the
// build directory holding it (<checkout>/build/harness_agent), else under the working
// directory. The first that exists; the first place when none does (the error names it).
std::string default_harness_bin(const std::string& harness) {
  const fs::path rel = fs::path("tests/harness/node_modules/.bin") / harness;
  std::vector<fs::path> places;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) places.push_back(exe.parent_path().parent_path() / rel);
  places.push_back(fs::current_path(ec) / rel);
  for (const fs::path& p : places)
    if (fs::exists(p, ec)) return p.string();
  return places.front().string();
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "harness_agent: trains a model on what Claude Code or Codex does with it on a small file task"};
  app.add_option("--url", s.url, "Swarm server URL")->capture_default_str();
  app.add_option("--model", s.model, "Model directory the server loads (any name on the mock engine)")
      ->required();
  app.add_option("--harness", s.harness, "claude (Anthropic Messages API) or codex (Responses API)")
      ->capture_default_str()
      ->check(CLI::IsMember({"claude", "codex"}));
  app.add_option(
      "--harness-bin", s.harness_bin,
      "The harness executable (default: tests/harness/node_modules/.bin/<harness> of the checkout: beside "
      "the build directory holding harness_agent, else under the working directory)");
  app.add_option("--steps", s.steps, "Policy steps to drive")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", s.batch_size, "Tasks per policy step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num-repeat", s.num_repeat, "Episodes per task (GRPO group size)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", s.workers, "Parallel episodes (harness processes)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-tokens", s.max_tokens, "Completion limit per model call")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-prompt-length", s.max_prompt_length,
                 "Prompt limit in tokens (the harness's system prompt and tools)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--temperature", s.temperature, "Sampling temperature")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0));
  app.add_option("--learning-rate", s.learning_rate, "AdamW learning rate")->capture_default_str();
  app.add_option("--file-reward", s.file_reward, "Reward when answer.txt exists but is wrong")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--episode-timeout", s.episode_timeout_s, "Seconds one harness run may take")
      ->capture_default_str();
  app.add_option("--seed", s.seed, "Seed of the problems")->capture_default_str();
  app.add_flag("--scripted", s.scripted,
               "Script the shell command into each prompt (the mock engine echoes it)");
  app.add_flag("--keep-dirs", s.keep_dirs,
               "Keep each episode's directory (harness.log, answer.txt) under the temp dir");
  app.add_flag("--force-restart", s.force_restart, "Stop and reconfigure the engine even if it is running");
  app.add_option("--step-timeout", s.step_timeout_s, "Seconds to wait for one policy step")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (s.harness_bin.empty()) s.harness_bin = default_harness_bin(s.harness);
  try {
    return run(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "harness_agent: error: %s\n", e.what());
    return 1;
  }
}
