// train_agent: trains a model on procedurally generated, verifiable tasks (examples/tasks/),
// using only the public SDK.
//
// It configures and boots the server (idempotently), then drives `--steps` policy steps. Each
// step draws `--batch-size` tasks from the task mix (ids like "sort-d2-s12345", which
// regenerate the task), runs `--num-repeat` episodes of each (one GRPO group per task id) on
// `--workers` threads — claim, one chat call, verify, end (an error aborts the episode) —
// waits for the server's policy update and prints one line: the reward mean (overall and per
// family), the exact-answer rate, episodes, generated tokens per second and the step time.
//
//   swarm-model init --preset tiny-char --out /tmp/tiny-char --dtype f32
//   swarm-server start --engine torch --port 10086 &
//   train_agent --url http://127.0.0.1:10086 --model /tmp/tiny-char --tasks sort,reverse --steps 60

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/swarm.hpp"
#include "tasks/tasks.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace tasks = swarm::tasks;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Settings {
  std::string url = "http://127.0.0.1:10086";
  std::string model;
  std::string task_mix = "sort,reverse";
  std::string job_file;
  int workers = 32;
  int steps = 20;
  int batch_size = 8;
  int num_repeat = 8;
  int difficulty = 1;
  uint64_t seed = 1;
  bool force_restart = false;
  bool random_sampling = false;
  // sampling and rewards
  double temperature = 1.0;
  int max_tokens = 0;  // 0 = per task: the family's longest answer + max_token_slack
  int max_token_slack = 2;
  std::string partial = "position";
  double partial_weight = 0.5;
  // optimisation (Job fields)
  double learning_rate = 1e-3;
  std::string lr_schedule = "constant";
  int lr_warmup_steps = 0;
  double weight_decay = 0.0;
  double grad_clip = 1.0;
  std::string advantage_estimator = "grpo";
  std::string algorithm = "grpo";  // ppo: a critic and GAE (advantage_estimator gae)
  double gamma = 1.0, lam = 1.0, critic_learning_rate = 1e-3;
  int critic_warmup = 0;
  bool token_credit = false;  // send the position credit per token (workflow_output.token_rewards)
  std::string loss_agg_mode = "token-mean";
  int ppo_epochs = 1;
  int ppo_mini_batch_size = 0;
  std::string dtype = "fp32";
  int engine_threads = 0;
  // asynchronous training and agent timing
  int max_staleness = 0;
  std::string off_policy_correction = "auto";
  bool stream = false;       // workers claim continuously instead of one batch per step
  double think_ms = 0;       // median of a long-tailed pause before each episode ends
  double target_reward = 0;  // streaming: stop once the last 10 steps' mean reward reaches it
  std::string project_name = "tasks";
  std::string experiment_name = "train-agent";
  // output
  std::string metrics_out;
  int show_samples = 0;
  double step_timeout_s = 600;
};

// Per-step figures, from the rewards the episodes reported.
struct StepStats {
  std::map<std::string, std::pair<double, int>> by_family;  // reward sum, episodes
  double reward_sum = 0;
  int episodes = 0;
  int exact = 0;
  void add(const std::string& family, double r) {
    reward_sum += r;
    ++episodes;
    exact += r >= 1.0;
    auto& [sum, n] = by_family[family];
    sum += r;
    ++n;
  }
  double mean() const { return episodes ? reward_sum / episodes : 0.0; }
  double exact_rate() const { return episodes ? static_cast<double>(exact) / episodes : 0.0; }
  double family_mean(const std::string& f) const {
    auto it = by_family.find(f);
    return it == by_family.end() || it->second.second == 0 ? 0.0 : it->second.first / it->second.second;
  }
};

struct Sample {
  std::string prompt, answer, reply;
  double reward;
};

// Shared by the worker threads of one step; guarded by mu.
struct StepScratch {
  std::mutex mu;
  std::vector<Sample> samples;
  std::atomic<int64_t> completion_tokens{0};
  // Attempts started per task id: the n-th attempt of a task samples with seed (task, n), so a
  // group's replies do not depend on which worker ran which episode.
  std::map<std::string, int> attempts;
};

swarm::Job make_job(const Settings& s, const std::vector<const CLI::Option*>& given,
                    int max_response_tokens) {
  // The file is a layer under the flags (it need not name the model --model gives): it is
  // validated once merged, below.
  swarm::Job job = s.job_file.empty() ? swarm::Job() : swarm::Job::load_layer(s.job_file);
  // With --job FILE, only the flags given on the command line override the file.
  const auto use = [&](const char* flag) {
    if (s.job_file.empty()) return true;
    return std::any_of(given.begin(), given.end(), [&](const CLI::Option* o) { return o->check_name(flag); });
  };
  if (use("--model") || job.model.empty()) job.model = s.model;
  if (use("--algorithm")) job.algorithm = s.algorithm;
  if (job.algorithm == "ppo") {
    job.advantage_estimator = "gae";
    if (use("--gamma")) job.gamma = s.gamma;
    if (use("--lam")) job.lam = s.lam;
    if (use("--critic-learning-rate")) job.critic_learning_rate = s.critic_learning_rate;
    if (use("--critic-warmup")) job.critic_warmup = s.critic_warmup;
  }
  if (use("--batch-size")) job.batch_size = s.batch_size;
  if (use("--num-repeat")) job.num_repeat = s.num_repeat;
  if (use("--project")) job.project_name = s.project_name;
  if (use("--experiment")) job.experiment_name = s.experiment_name;
  if (use("--temperature")) job.temperature = s.temperature;
  if (use("--learning-rate")) job.learning_rate = s.learning_rate;
  if (use("--lr-schedule")) job.lr_schedule = s.lr_schedule;
  if (use("--lr-warmup-steps")) job.lr_warmup_steps = s.lr_warmup_steps;
  if (use("--weight-decay")) job.weight_decay = s.weight_decay;
  if (use("--grad-clip")) job.grad_clip = s.grad_clip;
  if (use("--advantage") && job.algorithm != "ppo") job.advantage_estimator = s.advantage_estimator;
  if (use("--loss-agg")) job.loss_agg_mode = s.loss_agg_mode;
  if (use("--ppo-epochs")) job.ppo_epochs = s.ppo_epochs;
  if (use("--ppo-mini-batch-size")) job.ppo_mini_batch_size = s.ppo_mini_batch_size;
  if (use("--dtype")) job.dtype = s.dtype;
  if (use("--engine-threads")) job.engine_threads = s.engine_threads;
  if (use("--max-staleness")) job.max_staleness = s.max_staleness;
  if (use("--off-policy-correction")) job.off_policy_correction = s.off_policy_correction;
  if (use("--seed")) job.seed = static_cast<int64_t>(s.seed);
  if (s.job_file.empty()) {
    job.max_prompt_length = 64;  // the prompts are a few characters
    job.max_response_length = std::max(32, max_response_tokens);
  } else {
    job.max_response_length = std::max<int64_t>(job.max_response_length, max_response_tokens);
  }
  // The cosine schedule decays to 0 at the last step of this run.
  if (job.lr_schedule == "cosine" && job.total_training_steps == 0) job.total_training_steps = s.steps;
  job.validate();
  return job;
}

// --token-credit: position credit earned token by token. Each completion token earns
// partial_weight / max(len(reply), len(answer)) for every character it wrote that matches the
// answer at the same position; an exact reply's last token gets what is left up to 1. The
// tokens' rewards add up to the position-credit score, which becomes the episode's reward.
std::vector<double> token_credit(const swarm::ChatResult& reply, const std::string& answer,
                                 double partial_weight, double* total) {
  std::vector<double> out;
  const nlohmann::json* content = nullptr;
  if (reply.raw.contains("choices") && !reply.raw["choices"].empty()) {
    const auto& lp = reply.raw["choices"][0]["logprobs"];
    if (lp.is_object() && lp.contains("content") && lp["content"].is_array()) content = &lp["content"];
  }
  if (content == nullptr) throw std::runtime_error("--token-credit: the reply has no logprobs.content");
  const std::string& text = reply.content;
  const double scale =
      partial_weight / static_cast<double>(std::max<size_t>(1, std::max(text.size(), answer.size())));
  size_t pos = 0;
  double sum = 0;
  for (const auto& tok : *content) {
    const std::string t = tok.value("token", "");
    double r = 0;
    for (size_t j = 0; j < t.size(); ++j, ++pos)
      if (pos < text.size() && pos < answer.size() && text[pos] == answer[pos] && t[j] == text[pos])
        r += scale;
    out.push_back(r);
    sum += r;
  }
  if (text == answer && !out.empty()) out.back() += 1.0 - sum, sum = 1.0;
  *total = sum;
  return out;
}

// One episode: the chat call, its verdict (and per-token credit), the optional think time.
swarm::WorkflowOutput play_episode(const Settings& s, const tasks::RewardOptions& reward_options,
                                   const tasks::TaskInstance& inst, int attempt, int max_tokens,
                                   const swarm::OpenAIEndpoint& ep, StepScratch& scratch) {
  swarm::OpenAIClient llm(ep, std::chrono::seconds(120));
  swarm::ChatParams params;
  params.max_tokens = max_tokens;
  params.temperature = s.temperature;
  params.logprobs = s.token_credit;  // the completion's tokens, to credit each one
  if (!s.random_sampling) params.seed = tasks::mix_seed(s.seed, inst.seed, static_cast<uint64_t>(attempt));
  const swarm::ChatResult reply = llm.chat({{"user", inst.prompt}}, params);
  swarm::WorkflowOutput out;
  out.reward = tasks::score(inst, reply.content, reward_options);
  if (s.token_credit) out.token_rewards = {token_credit(reply, inst.answer, s.partial_weight, &*out.reward)};
  out.is_success = tasks::is_exact(inst, reply.content);
  out.log_metrics["exact"] = *out.is_success ? 1.0 : 0.0;
  out.log_metrics["reply_chars"] = static_cast<double>(reply.content.size());
  scratch.completion_tokens += reply.usage.completion_tokens;
  if (s.show_samples > 0) {
    std::lock_guard lk(scratch.mu);
    if (static_cast<int>(scratch.samples.size()) < s.show_samples)
      scratch.samples.push_back({inst.prompt, inst.answer, reply.content, *out.reward});
  }
  if (s.think_ms > 0) {
    // An agent's own work before it reports (tools, checks): long-tailed, median think_ms
    // (lognormal, sigma 1: mean 1.65x, one in a hundred over 10x the median).
    std::mt19937_64 rng(tasks::mix_seed(s.seed ^ 0x7468696e6bull, inst.seed, static_cast<uint64_t>(attempt)));
    std::lognormal_distribution<double> pause(std::log(s.think_ms), 1.0);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(pause(rng)));
  }
  return out;
}

std::string family_summary(const StepStats& st, const std::vector<std::string>& families) {
  std::string out;
  char buf[64];
  for (const auto& f : families) {
    std::snprintf(buf, sizeof buf, "%s%s=%.3f", out.empty() ? "" : " ", f.c_str(), st.family_mean(f));
    out += buf;
  }
  return out;
}

// Mean over steps [begin, end) of a per-step figure.
template <class F>
double window_mean(const std::vector<StepStats>& steps, size_t begin, size_t end, F figure) {
  if (begin >= end) return 0.0;
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += figure(steps[i]);
  return sum / static_cast<double>(end - begin);
}

swarm::Task make_task(const tasks::TaskInstance& inst) {
  swarm::Task task;
  task.task_id = inst.id;
  task.main_query = inst.prompt;
  task.env_type = inst.family;
  task.metadata_json = nlohmann::json{{"answer", inst.answer}, {"difficulty", inst.difficulty}}.dump();
  return task;
}

// Prints one line per policy step (and appends it to --metrics-out), then the run's summary.
class Reporter {
 public:
  Reporter(const Settings& s, std::vector<std::string> families) : s_(s), families_(std::move(families)) {
    if (!s.metrics_out.empty()) {
      metrics_.open(s.metrics_out, std::ios::app);
      if (!metrics_) throw swarm::ConfigError("cannot open --metrics-out " + s.metrics_out);
    }
  }

  void step(int64_t global_step, const StepStats& st, StepScratch& scratch, double rollout_s,
            double elapsed) {
    history_.push_back(st);
    const int step = static_cast<int>(history_.size());
    const double tokens_per_s =
        rollout_s > 0 ? static_cast<double>(scratch.completion_tokens) / rollout_s : 0.0;
    std::printf(
        "step %d/%d  global_step=%lld  reward=%.3f (%s)  exact=%.2f  episodes=%d  tok/s=%.0f  "
        "rollout=%.1fs  step=%.1fs  total=%.0fs\n",
        step, s_.steps, static_cast<long long>(global_step), st.mean(), family_summary(st, families_).c_str(),
        st.exact_rate(), st.episodes, tokens_per_s, rollout_s, elapsed, seconds_since(t0_));
    for (const auto& smp : scratch.samples)
      std::printf("    %-16s -> %-12s (answer %s, reward %.2f)\n", smp.prompt.c_str(),
                  nlohmann::json(smp.reply).dump().c_str(), smp.answer.c_str(), smp.reward);
    std::fflush(stdout);
    if (!metrics_.is_open()) return;
    nlohmann::json line = {{"step", step},
                           {"global_step", global_step},
                           {"reward_mean", st.mean()},
                           {"exact_rate", st.exact_rate()},
                           {"episodes", st.episodes},
                           {"completion_tokens", scratch.completion_tokens.load()},
                           {"tokens_per_second", tokens_per_s},
                           {"rollout_seconds", rollout_s},
                           {"step_seconds", elapsed},
                           {"elapsed_seconds", seconds_since(t0_)}};
    for (const auto& f : families_) line["reward_by_family"][f] = st.family_mean(f);
    metrics_ << line.dump() << "\n";
    metrics_.flush();
  }

  // Mean reward of the last `n` steps (all of them when fewer).
  double recent_reward(size_t n) const {
    const size_t k = std::min(n, history_.size());
    return window_mean(history_, history_.size() - k, history_.size(),
                       [](const StepStats& st) { return st.mean(); });
  }
  size_t steps() const { return history_.size(); }

  // The first and last tenth-or-10 steps.
  void summary() const {
    const size_t n = history_.size();
    const size_t w = std::max<size_t>(1, std::min<size_t>(10, n / 2));
    const auto reward = [](const StepStats& st) { return st.mean(); };
    const auto exact = [](const StepStats& st) { return st.exact_rate(); };
    const double total_s = seconds_since(t0_);
    std::printf(
        "summary: %zu steps in %.0fs (%.2f s/step); reward first %zu steps %.3f -> last %zu steps %.3f; "
        "exact %.2f -> %.2f\n",
        n, total_s, n ? total_s / static_cast<double>(n) : 0.0, w, window_mean(history_, 0, w, reward), w,
        window_mean(history_, n - w, n, reward), window_mean(history_, 0, w, exact),
        window_mean(history_, n - w, n, exact));
    for (const auto& f : families_) {
      const auto fam = [&](const StepStats& st) { return st.family_mean(f); };
      std::printf("summary: %-8s reward %.3f -> %.3f\n", f.c_str(), window_mean(history_, 0, w, fam),
                  window_mean(history_, n - w, n, fam));
    }
  }

 private:
  const Settings& s_;
  std::vector<std::string> families_;
  std::ofstream metrics_;
  std::vector<StepStats> history_;
  const Clock::time_point t0_ = Clock::now();
};

// --stream (always with --max-staleness >= 1): `--workers` agents claim episodes continuously
// instead of one batch per step, so they keep generating while the server trains (the server
// holds their claims when the staleness bound says so). Tasks come as groups of num_repeat
// episodes of one task id, in order; a step's line covers the episodes that ended between two
// policy updates. Ends after `--steps` updates, or once the last 10 steps' mean reward reaches
// --target-reward.
int drive_streaming(const Settings& s, const tasks::TaskMix& mix, const tasks::RewardOptions& reward_options,
                    const std::function<int(const std::string&)>& max_tokens_for, swarm::SwarmClient& client,
                    Reporter& report) {
  const int64_t start_step = client.get_engine_status().global_step;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> next_episode{0};
  std::atomic<int> failures{0};
  std::mutex mu;  // guards window and scratch
  StepStats window;
  auto scratch = std::make_unique<StepScratch>();
  auto window_t0 = Clock::now();

  auto worker = [&] {
    while (!stop) {
      const int64_t n = next_episode++;
      const int64_t group = n / s.num_repeat;
      const int attempt = static_cast<int>(n % s.num_repeat);
      const uint64_t task_seed =
          tasks::mix_seed(s.seed, 0x5354524541ull, static_cast<uint64_t>(group)) & 0xFFFFFFFFull;
      const tasks::TaskInstance inst = mix.sample(s.difficulty, task_seed);
      const swarm::Task task = make_task(inst);
      std::optional<swarm::OpenAIEndpoint> ep;
      while (!stop && !ep) {
        try {
          ep = client.begin_episode(600, "train", std::chrono::milliseconds(1000));
        } catch (const swarm::TimeoutError&) {}
      }
      if (!ep) break;
      try {
        StepScratch* sc;
        {
          std::lock_guard lk(mu);
          sc = scratch.get();
        }
        swarm::WorkflowOutput out =
            play_episode(s, reward_options, inst, attempt, max_tokens_for(inst.family), *ep, *sc);
        if (stop) {
          client.abort_episode(ep->episode_uuid);
          break;
        }
        if (client.end_episode(task, ep->episode_uuid, out)) {
          std::lock_guard lk(mu);
          window.add(inst.family, *out.reward);
        }
      } catch (const std::exception& e) {
        if (++failures <= 5) std::fprintf(stderr, "train_agent: episode failed (aborted): %s\n", e.what());
        try {
          client.abort_episode(ep->episode_uuid);
        } catch (const std::exception&) {}
      }
    }
  };
  std::vector<std::thread> workers;
  for (int i = 0; i < s.workers; ++i) workers.emplace_back(worker);

  int rc = 0;
  int64_t seen = start_step;
  std::vector<std::unique_ptr<StepScratch>> retired;  // the workers may still hold one
  auto last_progress = Clock::now();
  while (report.steps() < static_cast<size_t>(s.steps)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const swarm::EngineStatus status = client.get_engine_status();
    if (status.engine_status == "ENGINE.OFFLINE") {
      std::fprintf(stderr, "train_agent: error: the engine went offline%s%s\n",
                   status.engine_status_detail.empty() ? "" : ": ", status.engine_status_detail.c_str());
      rc = 1;
      break;
    }
    if (status.global_step == seen) {
      if (seconds_since(last_progress) > s.step_timeout_s) {
        std::fprintf(stderr, "train_agent: error: global_step stayed at %lld for %.0f s (engine %s)\n",
                     static_cast<long long>(seen), s.step_timeout_s, status.engine_status.c_str());
        rc = 1;
        break;
      }
      continue;
    }
    seen = status.global_step;
    last_progress = Clock::now();
    StepStats st;
    std::unique_ptr<StepScratch> done;
    {
      std::lock_guard lk(mu);
      st = std::exchange(window, StepStats{});
      done = std::exchange(scratch, std::make_unique<StepScratch>());
    }
    const double elapsed = seconds_since(window_t0);
    window_t0 = Clock::now();
    // A worker may still add its tokens to the old scratch: it lives until the workers end.
    report.step(status.global_step, st, *done, elapsed, elapsed);
    retired.push_back(std::move(done));
    if (s.target_reward > 0 && report.steps() >= 10 && report.recent_reward(10) >= s.target_reward) {
      std::printf(
          "train_agent: the last 10 steps' mean reward %.3f reached --target-reward %.3f after %zu steps\n",
          report.recent_reward(10), s.target_reward, report.steps());
      break;
    }
  }
  stop = true;
  for (auto& t : workers) t.join();
  report.summary();
  return rc;
}

int run(Settings s, const std::vector<const CLI::Option*>& given) {
  const tasks::TaskMix mix = tasks::TaskMix::parse(s.task_mix);
  const std::vector<std::string> families = mix.families();
  const tasks::RewardOptions reward_options{tasks::parse_partial_credit(s.partial), s.partial_weight};
  const auto max_tokens_for = [&](const std::string& family) {
    return s.max_tokens > 0 ? s.max_tokens
                            : tasks::family(family).max_answer_chars(s.difficulty) + s.max_token_slack;
  };
  int max_response_tokens = 0;
  for (const auto& f : families) max_response_tokens = std::max(max_response_tokens, max_tokens_for(f));

  swarm::SwarmClientOptions options;
  options.run_claim_deadline = std::chrono::milliseconds(static_cast<int64_t>(s.step_timeout_s * 1000 / 4));
  options.max_connections = static_cast<size_t>(s.workers) + 4;
  if (s.stream || s.max_staleness > 0) {
    // Streaming agents ask again soon when a claim is held (staleness bound, a weight sync).
    options.backoff_initial = std::chrono::milliseconds(20);
    options.backoff_max = std::chrono::milliseconds(250);
  }
  swarm::SwarmClient client(s.url, options);

  const swarm::Job job = make_job(s, given, max_response_tokens);
  s.batch_size = static_cast<int>(job.batch_size);  // the job file's, unless a flag overrode it
  s.num_repeat = static_cast<int>(job.num_repeat);
  std::printf(
      "train_agent: %s, model %s, tasks %s, difficulty %d, %d steps of %d tasks x %d episodes, %d workers\n",
      s.url.c_str(), job.model.c_str(), mix.to_string().c_str(), s.difficulty, s.steps, s.batch_size,
      s.num_repeat, s.workers);
  std::printf(
      "train_agent: lr %g (%s, warmup %lld), temperature %g, max_tokens %s, reward 1 exact else %g x %s\n",
      job.learning_rate, job.lr_schedule.c_str(), static_cast<long long>(job.lr_warmup_steps),
      job.temperature,
      s.max_tokens > 0 ? std::to_string(s.max_tokens).c_str()
                       : ("auto (longest answer + " + std::to_string(s.max_token_slack) + ")").c_str(),
      reward_options.partial_weight, tasks::partial_credit_name(reward_options.partial));
  client.auto_sync_train_config_and_start_engine(job, s.force_restart);
  swarm::EngineStatus status = client.get_engine_status();
  std::printf("train_agent: engine %s, global_step=%lld\n", status.engine_status.c_str(),
              static_cast<long long>(status.global_step));
  std::fflush(stdout);

  Reporter report(s, families);
  if (s.stream || s.max_staleness > 0)
    return drive_streaming(s, mix, reward_options, max_tokens_for, client, report);

  for (int step = 1; step <= s.steps; ++step) {
    const auto t0 = Clock::now();
    const int64_t step_before = client.get_engine_status().global_step;

    // One group of num_repeat episodes per task id. The seed comes from (--seed, global step,
    // index): a rerun from the same step sees the same tasks.
    std::vector<swarm::Task> batch;
    for (int i = 0; i < s.batch_size; ++i) {
      const uint64_t task_seed =
          tasks::mix_seed(s.seed, static_cast<uint64_t>(step_before), static_cast<uint64_t>(i)) &
          0xFFFFFFFFull;
      batch.insert(batch.end(), static_cast<size_t>(s.num_repeat),
                   make_task(mix.sample(s.difficulty, task_seed)));
    }

    StepScratch scratch;
    auto workflow = [&](const swarm::Task& task, const swarm::OpenAIEndpoint& ep) {
      const tasks::TaskInstance inst = tasks::task_from_id(task.task_id);  // the id says it all
      int attempt = 0;
      {
        std::lock_guard lk(scratch.mu);
        attempt = scratch.attempts[task.task_id]++;
      }
      return play_episode(s, reward_options, inst, attempt, max_tokens_for(inst.family), ep, scratch);
    };
    const swarm::RunSummary summary = client.run_episodes_until_all_complete(batch, workflow, s.workers);
    const double rollout_s = seconds_since(t0);
    if (summary.failed > 0) {
      std::fprintf(stderr, "train_agent: error: %zu of %zu episodes of step %d failed after retries\n",
                   summary.failed, batch.size(), step);
      return 1;
    }

    StepStats st;
    for (size_t i = 0; i < batch.size(); ++i)
      if (summary.rewards[i]) st.add(batch[i].env_type, *summary.rewards[i]);

    // The batch is complete; the server now trains and syncs weights.
    const auto wait_until = Clock::now() + std::chrono::duration<double>(s.step_timeout_s);
    for (;;) {
      status = client.get_engine_status();
      if (status.global_step > step_before) break;
      if (status.engine_status == "ENGINE.OFFLINE") {
        std::fprintf(stderr, "train_agent: error: the engine went offline%s%s\n",
                     status.engine_status_detail.empty() ? "" : ": ", status.engine_status_detail.c_str());
        return 1;
      }
      if (Clock::now() > wait_until) {
        std::fprintf(stderr, "train_agent: error: global_step stayed at %lld for %.0f s (engine %s)\n",
                     static_cast<long long>(status.global_step), s.step_timeout_s,
                     status.engine_status.c_str());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    report.step(status.global_step, st, scratch, rollout_s, seconds_since(t0));
  }
  report.summary();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "train_agent: trains a model on generated, verifiable tasks (sort, reverse, count, base, add)"};
  Settings s;
  app.add_option("--url", s.url, "Swarm server URL")->capture_default_str();
  app.add_option("--model", s.model,
                 "Hugging Face model directory the server trains (e.g. swarm-model init "
                 "--preset tiny-char); required unless the --job file names one");
  std::string families_help = "Task mix: 'sort,reverse', 'sort:2,add:1' or 'all'. Families:";
  for (const auto* f : tasks::all_families())
    families_help += "\n  " + std::string(f->name()) + ": " + std::string(f->description());
  app.add_option("--tasks", s.task_mix, families_help)->capture_default_str();
  app.add_option("--job", s.job_file,
                 "Base job YAML (any Job key); flags given on the command line override it")
      ->check(CLI::ExistingFile);
  app.add_option("--workers", s.workers, "Parallel episodes on this client")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", s.steps, "Policy steps to drive")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", s.batch_size, "Tasks per policy step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num-repeat", s.num_repeat, "Episodes per task (GRPO group size)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1024));
  app.add_option("--difficulty", s.difficulty, "Task difficulty (every family)")
      ->capture_default_str()
      ->check(CLI::Range(tasks::kMinDifficulty, tasks::kMaxDifficulty));
  app.add_option("--seed", s.seed, "Seed of the task stream, of the sampling and of the job")
      ->capture_default_str();
  app.add_flag("--force-restart", s.force_restart, "Stop and reconfigure the engine even if it is running");
  app.add_flag(
      "--random-sampling", s.random_sampling,
      "Let the server seed each completion at random (default: seeds derived from --seed and the task, "
      "so a run samples the same replies given the same weights)");
  app.add_option("--temperature", s.temperature, "Sampling temperature")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-tokens", s.max_tokens,
                 "Completion limit; 0 = the family's longest answer + --max-token-slack")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-token-slack", s.max_token_slack,
                 "With --max-tokens 0: tokens allowed beyond the family's longest answer (0: a reply can be "
                 "no longer "
                 "than that, so a model that never ends its turn is cut at the answer's length)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option(
         "--partial-credit", s.partial,
         "Reward of a reply that is not exact: none, position, prefix or shaped (examples/tasks/tasks.hpp)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "position", "prefix", "shaped"}));
  app.add_option("--partial-weight", s.partial_weight, "Partial credit scale (an exact answer gets 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--learning-rate", s.learning_rate, "AdamW learning rate")->capture_default_str();
  app.add_option("--lr-schedule", s.lr_schedule, "constant or cosine (decays to 0 at --steps)")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--lr-warmup-steps", s.lr_warmup_steps, "Linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", s.weight_decay, "AdamW weight decay")->capture_default_str();
  app.add_option("--grad-clip", s.grad_clip, "Gradient norm clip; 0 disables")->capture_default_str();
  app.add_option("--algorithm", s.algorithm, "grpo, or ppo (a critic and GAE: advantage_estimator gae)")
      ->capture_default_str();
  app.add_option("--gamma", s.gamma, "PPO: GAE discount")->capture_default_str();
  app.add_option("--lam", s.lam, "PPO: GAE lambda")->capture_default_str();
  app.add_option("--critic-learning-rate", s.critic_learning_rate, "PPO: the critic's learning rate")
      ->capture_default_str();
  app.add_option("--critic-warmup", s.critic_warmup, "PPO: steps that train only the critic")
      ->capture_default_str();
  app.add_flag(
      "--token-credit", s.token_credit,
      "Send the position credit per completion token (workflow_output.token_rewards): PPO's GAE credits "
      "each character where it was written; the episode's reward is their sum");
  app.add_option("--advantage", s.advantage_estimator, "grpo, grpo_no_std or reinforce_baseline")
      ->capture_default_str()
      ->check(CLI::IsMember({"grpo", "grpo_no_std", "reinforce_baseline"}));
  app.add_option("--loss-agg", s.loss_agg_mode, "token-mean or seq-mean-token-mean")
      ->capture_default_str()
      ->check(CLI::IsMember({"token-mean", "seq-mean-token-mean"}));
  app.add_option("--ppo-epochs", s.ppo_epochs, "Passes over each batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--ppo-mini-batch-size", s.ppo_mini_batch_size,
                 "Tasks per optimizer step (batch-size / this = optimizer steps per policy step); 0 = the "
                 "whole batch")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dtype", s.dtype, "Compute precision")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--engine-threads", s.engine_threads, "Server compute threads; 0 = every CPU")
      ->capture_default_str();
  app.add_option("--project", s.project_name, "Job project_name")->capture_default_str();
  app.add_option("--experiment", s.experiment_name, "Job experiment_name")->capture_default_str();
  app.add_option("--metrics-out", s.metrics_out, "Append one JSON line per step to this file");
  app.add_option("--show-samples", s.show_samples, "Print this many replies of each step")
      ->capture_default_str();
  app.add_option(
         "--max-staleness", s.max_staleness,
         "Asynchronous training (Job max_staleness): 0 = synchronous; N >= 1 trains while the agents go on "
         "generating, nothing older than N versions (implies --stream)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--off-policy-correction", s.off_policy_correction, "auto, none, tis or decoupled")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "tis", "decoupled"}));
  app.add_flag(
      "--stream", s.stream,
      "Workers claim episodes continuously (groups of --num-repeat, in order) instead of one batch per step");
  app.add_option("--think-ms", s.think_ms,
                 "Each episode pauses before it ends: long-tailed (lognormal, sigma 1), this median in ms")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--target-reward", s.target_reward,
                 "With --stream: stop once the last 10 steps' mean reward reaches this (0 = run --steps)")
      ->capture_default_str();
  app.add_option("--step-timeout", s.step_timeout_s, "Seconds to wait for one policy step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::vector<const CLI::Option*> given;
  for (const CLI::Option* o : app.get_options())
    if (o->count() > 0) given.push_back(o);
  try {
    return run(s, given);
  } catch (const swarm::TransportError& e) {
    std::fprintf(stderr, "train_agent: error: cannot reach the swarm server at %s: %s\n", s.url.c_str(),
                 e.what());
  } catch (const swarm::Error& e) {
    std::fprintf(stderr, "train_agent: error: %s\n", e.what());
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "train_agent: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_agent: unexpected error: %s\n", e.what());
  }
  return 1;
}
