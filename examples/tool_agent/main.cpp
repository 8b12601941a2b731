// tool_agent: a multi-turn agent that uses a calculator tool, trained on arithmetic it needs the
// tool for (public SDK only).
//
// Each task is a multi-digit sum, difference or product ("What is 4821 * 37?"). An episode is a
// conversation: the model may call `calculator({"expression": "..."})`; the agent evaluates the
// expression and sends the result back as a `tool` message; the first answer without a tool
// call ends the conversation (or --max-turns does). The verifier's reward: 1 when the last
// integer of the final answer is the right result, else --call-reward when the model made at
// least one well-formed calculator call (valid JSON arguments whose expression evaluates),
// else 0. Each conversation trains as one sample (the server splices the exact ids of every
// turn), with the loss on the model's turns only.
//
// Per step it prints the reward mean, the share of episodes with a well-formed call, the share
// of correct answers, tool calls and turns per episode.
//
//   swarm-server start --engine mock &
//   tool_agent --url http://127.0.0.1:10086 --model mock --scripted --temperature 0 --max-tokens 256 --steps 2
//
// --scripted appends the right tool call to each question in the mock engine's scripting
// convention (the mock answers with the last user or tool message), so the whole loop runs
// without a model (greedy: when sampling, the mock replaces letters, tool names included). On the torch engine, use a model whose chat template renders tools
// (Qwen2.5 / Qwen3 style, e.g. tests/data/tiny-qwen3 + tests/fixtures/tokenizers/qwen3).

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/swarm.hpp"

namespace {

using json = nlohmann::json;

struct Settings {
  std::string url = "http://127.0.0.1:10086";
  std::string model;
  int steps = 5;
  int batch_size = 4;
  int num_repeat = 4;
  int workers = 8;
  int digits = 3;
  int max_turns = 3;
  int max_tokens = 64;
  double temperature = 1.0;
  double learning_rate = 1e-3;
  double call_reward = 0.2;
  uint64_t seed = 1;
  bool scripted = false;
  bool force_restart = false;
  double step_timeout_s = 600;
};

// ------------------------------------------------------------------ the tool

// Integer arithmetic: + - * / and parentheses, with overflow and division checks.
class Calculator {
 public:
  static std::optional<long long> eval(const std::string& text, std::string* error) {
    Calculator c{text};
    try {
      long long v = c.sum();
      c.skip();
      if (c.pos_ != text.size()) throw std::runtime_error("unexpected '" + text.substr(c.pos_, 1) + "'");
      return v;
    } catch (const std::exception& e) {
      if (error) *error = e.what();
      return std::nullopt;
    }
  }

 private:
  explicit Calculator(const std::string& t) : text_(t) {}
  void skip() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  static void check(bool overflow) {
    if (overflow) throw std::runtime_error("overflow");
  }
  long long sum() {
    long long v = product();
    for (;;) {
      if (eat('+'))
        check(__builtin_add_overflow(v, product(), &v));
      else if (eat('-'))
        check(__builtin_sub_overflow(v, product(), &v));
      else
        return v;
    }
  }
  long long product() {
    long long v = unary();
    for (;;) {
      if (eat('*')) {
        check(__builtin_mul_overflow(v, unary(), &v));
      } else if (eat('/')) {
        const long long d = unary();
        if (d == 0) throw std::runtime_error("division by zero");
        v /= d;
      } else {
        return v;
      }
    }
  }
  long long unary() {
    if (eat('-')) {
      long long r = 0;
      check(__builtin_sub_overflow(0LL, unary(), &r));
      return r;
    }
    if (eat('(')) {
      if (++depth_ > 32) throw std::runtime_error("too deeply nested");
      long long v = sum();
      --depth_;
      if (!eat(')')) throw std::runtime_error("missing ')'");
      return v;
    }
    skip();
    const size_t begin = pos_;
    long long v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9')
      check(__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text_[pos_++] - '0', &v));
    if (pos_ == begin)
      throw std::runtime_error(pos_ < text_.size() ? "unexpected '" + text_.substr(pos_, 1) + "'"
                                                   : "expression ends early");
    return v;
  }
  const std::string& text_;
  size_t pos_ = 0;
  int depth_ = 0;
};

const json kTools =
    json::array({{{"type", "function"},
                  {"function",
                   {{"name", "calculator"},
                    {"description", "Evaluate an integer arithmetic expression (+ - * / and parentheses)."},
                    {"parameters",
                     {{"type", "object"},
                      {"properties", {{"expression", {{"type", "string"}}}}},
                      {"required", {"expression"}}}}}}}});

// ------------------------------------------------------------------ tasks and the verifier

struct Problem {
  std::string expression;  // "4821 * 37"
  long long answer = 0;
};

// The task id encodes the problem ("arith-4821*37"), so the workflow regenerates it.
Problem make_problem(std::mt19937_64& rng, int digits) {
  long long lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  std::uniform_int_distribution<long long> num(lo, lo * 10 - 1), small(2, 99);
  const char ops[] = {'+', '-', '*'};
  const char op = ops[rng() % 3];
  const long long a = num(rng), b = op == '*' ? small(rng) : num(rng);
  Problem p;
  p.expression = std::to_string(a) + " " + op + " " + std::to_string(b);
  p.answer = op == '+' ? a + b : op == '-' ? a - b : a * b;
  return p;
}

std::optional<long long> last_integer(const std::string& text) {
  std::optional<long long> last;
  for (size_t i = 0; i < text.size();) {
    if (text[i] >= '0' && text[i] <= '9') {
      size_t j = i;
      while (j < text.size() && ((text[j] >= '0' && text[j] <= '9') || text[j] == ',')) ++j;
      std::string digits;
      for (size_t k = i; k < j; ++k)
        if (text[k] != ',') digits += text[k];
      if (digits.size() <= 18) {
        long long v = std::stoll(digits);
        last = i > 0 && text[i - 1] == '-' ? -v : v;
      }
      i = j;
    } else {
      ++i;
    }
  }
  return last;
}

struct EpisodeResult {
  double reward = 0;
  bool well_formed_call = false;
  bool correct = false;
  int tool_calls = 0;
  int turns = 0;
};

EpisodeResult run_episode(const Settings& s, const Problem& p, const swarm::OpenAIEndpoint& ep,
                          uint64_t seed) {
  swarm::OpenAIClient llm(ep, std::chrono::seconds(120));
  swarm::ChatParams params;
  params.tools = kTools;
  params.max_tokens = s.max_tokens;
  params.temperature = s.temperature;
  params.seed = seed;
  std::string question = "What is " + p.expression + "? Use the calculator tool, then give the number.";
  if (s.scripted)  // the mock engine answers with this text, i.e. calls the tool
    question += "<tool_call>" +
                json{{"name", "calculator"}, {"arguments", {{"expression", p.expression}}}}.dump() +
                "</tool_call>";
  json messages = json::array({{{"role", "user"}, {"content", question}}});
  EpisodeResult r;
  std::string final_text;
  for (r.turns = 1; r.turns <= s.max_turns; ++r.turns) {
    const swarm::ChatResult reply = llm.chat(messages, params);
    if (reply.tool_calls.empty()) {
      final_text = reply.content;
      break;
    }
    messages.push_back(reply.assistant_message());
    for (const auto& call : reply.tool_calls) {
      ++r.tool_calls;
      std::string result;
      const json args = json::parse(call.arguments, nullptr, false);
      if (call.name != "calculator") {
        result = "error: unknown tool '" + call.name + "'";
      } else if (!args.is_object() || !args.contains("expression") || !args["expression"].is_string()) {
        result = "error: arguments must be {\"expression\": string}";
      } else {
        std::string error;
        if (auto v = Calculator::eval(args["expression"].get<std::string>(), &error)) {
          result = std::to_string(*v);
          r.well_formed_call = true;
        } else {
          result = "error: " + error;
        }
      }
      messages.push_back(swarm::ChatResult::tool_message(call, result));
    }
  }
  r.turns = std::min(r.turns, s.max_turns);
  r.correct = last_integer(final_text) == p.answer;
  r.reward = r.correct ? 1.0 : r.well_formed_call ? s.call_reward : 0.0;
  return r;
}

// ------------------------------------------------------------------ the training loop

int run(const Settings& s) {
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
  job.max_prompt_length = 1024 + 64 * s.max_turns;  // tools in the system prompt, tool results
  job.max_response_length = s.max_tokens;
  std::printf(
      "tool_agent: %s, model %s, %d steps of %d tasks x %d episodes, %d-digit arithmetic, up to %d turns%s\n",
      s.url.c_str(), s.model.c_str(), s.steps, s.batch_size, s.num_repeat, s.digits, s.max_turns,
      s.scripted ? ", scripted tool calls (mock engine)" : "");
  client.auto_sync_train_config_and_start_engine(job, s.force_restart);
  std::fflush(stdout);

  std::mt19937_64 rng(s.seed);
  for (int step = 1; step <= s.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t step_before = client.get_engine_status().global_step;
    std::vector<swarm::Task> batch;
    std::vector<Problem> problems;
    for (int i = 0; i < s.batch_size; ++i) {
      const Problem p = make_problem(rng, s.digits);
      swarm::Task task;
      task.task_id = "arith-" + std::to_string(step_before) + "-" + std::to_string(i);
      task.main_query = p.expression;
      for (int k = 0; k < s.num_repeat; ++k) {
        batch.push_back(task);
        problems.push_back(p);
      }
    }
    std::atomic<int> calls{0}, well_formed{0}, correct{0}, turns{0}, index{0};
    auto workflow = [&](const swarm::Task& task, const swarm::OpenAIEndpoint& ep) {
      const size_t i = static_cast<size_t>(std::stoul(task.task_id.substr(task.task_id.rfind('-') + 1)));
      const Problem& p = problems[i * static_cast<size_t>(s.num_repeat)];
      const EpisodeResult r = run_episode(s, p, ep, s.seed * 1000003 + static_cast<uint64_t>(index++));
      calls += r.tool_calls;
      well_formed += r.well_formed_call;
      correct += r.correct;
      turns += r.turns;
      swarm::WorkflowOutput out;
      out.reward = r.reward;
      out.is_success = r.correct;
      out.log_metrics["well_formed_call"] = r.well_formed_call ? 1.0 : 0.0;
      out.log_metrics["correct"] = r.correct ? 1.0 : 0.0;
      out.log_metrics["tool_calls"] = r.tool_calls;
      return out;
    };
    const swarm::RunSummary summary = client.run_episodes_until_all_complete(batch, workflow, s.workers);
    if (summary.failed > 0) {
      std::fprintf(stderr, "tool_agent: error: %zu of %zu episodes of step %d failed after retries\n",
                   summary.failed, batch.size(), step);
      return 1;
    }
    double reward = 0;
    for (const auto& r : summary.rewards) reward += r.value_or(0.0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(s.step_timeout_s);
    swarm::EngineStatus status;
    while ((status = client.get_engine_status()).global_step <= step_before) {
      if (status.engine_status == "ENGINE.OFFLINE" || std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "tool_agent: error: no policy step (engine %s %s)\n",
                     status.engine_status.c_str(), status.engine_status_detail.c_str());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double n = static_cast<double>(batch.size());
    std::printf(
        "step %d/%d  global_step=%lld  reward=%.3f  well_formed_call=%.2f  correct=%.2f  "
        "calls/episode=%.2f  turns/episode=%.2f  %.1fs\n",
        step, s.steps, static_cast<long long>(status.global_step), reward / n, well_formed / n, correct / n,
        calls / n, turns / n, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"tool_agent: trains a model to use a calculator tool over several turns"};
  app.add_option("--url", s.url, "Swarm server URL")->capture_default_str();
  app.add_option("--model", s.model, "Model directory the server loads (any name on the mock engine)")
      ->required();
  app.add_option("--steps", s.steps, "Policy steps to drive")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", s.batch_size, "Tasks per policy step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num-repeat", s.num_repeat, "Episodes per task (GRPO group size)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", s.workers, "Parallel episodes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--digits", s.digits, "Digits of the operands")
      ->capture_default_str()
      ->check(CLI::Range(1, 9));
  app.add_option("--max-turns", s.max_turns, "LLM calls per episode at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  app.add_option("--max-tokens", s.max_tokens, "Completion limit per turn")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--temperature", s.temperature, "Sampling temperature")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0));
  app.add_option("--learning-rate", s.learning_rate, "AdamW learning rate")->capture_default_str();
  app.add_option("--call-reward", s.call_reward,
                 "Reward of a wrong answer after a well-formed calculator call")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", s.seed, "Seed of the problems and of the sampling")->capture_default_str();
  app.add_flag("--scripted", s.scripted,
               "Script the tool call into each question (the mock engine echoes it)");
  app.add_flag("--force-restart", s.force_restart, "Stop and reconfigure the engine even if it is running");
  app.add_option("--step-timeout", s.step_timeout_s, "Seconds to wait for one policy step")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tool_agent: error: %s\n", e.what());
    return 1;
  }
}
