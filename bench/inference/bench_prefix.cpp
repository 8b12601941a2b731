// bench_prefix: the serving engine's prefix cache (job key prefix_caching), each case run with
// the cache on and off in the same process, SmolLM2-135M shape (random weights), fp32 and bf16:
//
//   group     a GRPO group of 16 on one 1,024-token prompt, max_tokens 32, landing together:
//             time to the group's last answer. Target: >= 4x faster with the cache.
//   turns     a 10-turn agent conversation: a 400-token first prompt (system prompt and tool
//             definitions), each turn's answer (50 tokens) and 100 tokens of tool output
//             appended to the next prompt, token for token (exact_history_tokens). Time to
//             first token of each turn. Target: the 10th turn's <= 1.5x the 1st turn's.
//   distinct  16 requests of 512 distinct tokens each, max_tokens 32, nothing shared: total
//             time. Target: the cache costs <= 3% (best of --repeats alternating runs).
//
// The engine is the real ServingEngine (continuous batching, the paged KV cache, the CPU
// kernels), in process, no HTTP. Prints tables; never a timed assertion.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/torch_bench.hpp"
#include "inference/serving_engine.hpp"
#include "text/tokenizer.hpp"

namespace {

using namespace swarm::bench;
using swarm::GenerationRequest;
using swarm::GenerationResult;
using swarm::ServingEngine;
using swarm::TokenId;

template <typename... Args>
void progress(const char* fmt, Args... args) {
  progress_line("bench_prefix", fmt, args...);
}

// Waits for one generation; notes when its first token (text or end) arrived.
class Timed : public swarm::GenerationObserver {
 public:
  explicit Timed(Clock::time_point submitted) : submitted_(submitted) {}
  void on_text(int64_t, const std::string&) override { mark_first(); }
  void on_complete(GenerationResult r) override {
    mark_first();
    std::lock_guard lk(mu_);
    result = std::move(r);
    done_ = Clock::now();
    ended_ = true;
    cv_.notify_all();
  }
  void on_error(swarm::ErrorKind, const std::string& message) override {
    std::lock_guard lk(mu_);
    error = message;
    done_ = Clock::now();
    ended_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return ended_; });
    if (!error.empty()) throw std::runtime_error("generation failed: " + error);
  }
  double ttft_seconds() const { return std::chrono::duration<double>(first_ - submitted_).count(); }
  Clock::time_point done() const { return done_; }
  GenerationResult result;
  std::string error;

 private:
  void mark_first() {
    std::lock_guard lk(mu_);
    if (!has_first_) first_ = Clock::now(), has_first_ = true;
  }
  Clock::time_point submitted_, first_, done_;
  bool has_first_ = false, ended_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
};

std::vector<TokenId> random_ids(int64_t n, std::mt19937& rng, int64_t vocab) {
  std::vector<TokenId> ids;
  for (int64_t i = 0; i < n; ++i)
    ids.push_back(static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(vocab - 1)));
  return ids;
}

GenerationRequest request(std::vector<TokenId> prompt, int64_t max_tokens, uint64_t seed) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 1.0;
  r.params.seed = seed;
  r.params.max_tokens = max_tokens;
  return r;
}

struct Engines {
  std::shared_ptr<swarm::DecoderModel> model;
  std::shared_ptr<const swarm::Tokenizer> tokenizer;
  std::unique_ptr<ServingEngine> make(bool prefix_caching, int64_t kv_tokens) const {
    swarm::ServingConfig c;
    c.kv_cache_tokens = kv_tokens;
    c.prefix_caching = prefix_caching;  // no eos ids: every answer runs to max_tokens
    return std::make_unique<ServingEngine>(model, tokenizer, c);
  }
};

// Submits all while generation is paused (they land in one scheduler step); seconds to the last
// answer, from the resume.
double run_batch(ServingEngine& e, const std::vector<GenerationRequest>& reqs) {
  e.pause_generation(false);
  std::vector<std::shared_ptr<Timed>> obs;
  const auto t0 = Clock::now();
  for (const auto& r : reqs) {
    obs.push_back(std::make_shared<Timed>(t0));
    e.submit(r, obs.back());
  }
  const auto start = Clock::now();
  e.resume_generation();
  Clock::time_point last = start;
  for (auto& o : obs) {
    o->wait();
    last = std::max(last, o->done());
  }
  return std::chrono::duration<double>(last - start).count();
}

struct TurnsResult {
  std::vector<double> ttft;  // per turn, seconds
  int64_t hit_tokens = 0, query_tokens = 0;
};

TurnsResult run_turns(ServingEngine& e, int64_t vocab, int turns, int64_t first_prompt, int64_t answer,
                      int64_t tool) {
  std::mt19937 rng(7);
  std::vector<TokenId> prompt = random_ids(first_prompt, rng, vocab);
  TurnsResult out;
  for (int t = 0; t < turns; ++t) {
    auto o = std::make_shared<Timed>(Clock::now());
    e.submit(request(prompt, answer, 100 + static_cast<uint64_t>(t)), o);
    o->wait();
    out.ttft.push_back(o->ttft_seconds());
    const auto& ids = o->result.choices.at(0).ids;
    prompt.insert(prompt.end(), ids.begin(), ids.end());
    const std::vector<TokenId> output = random_ids(tool, rng, vocab);
    prompt.insert(prompt.end(), output.begin(), output.end());
  }
  e.run_exclusive([] {});
  const swarm::ServingStats s = e.stats();
  out.hit_tokens = s.prefix_cache_hit_tokens;
  out.query_tokens = s.prefix_cache_queries_tokens;
  return out;
}

struct Row {
  std::string dtype, what, off, on, ratio, target, verdict;
};

void print_rows(const std::vector<Row>& rows) {
  std::printf(
      "\n| dtype | case | cache off | cache on | ratio | target | |\n|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", r.dtype.c_str(), r.what.c_str(), r.off.c_str(),
                r.on.c_str(), r.ratio.c_str(), r.target.c_str(), r.verdict.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  swarm::bound_openmp_spin_wait(argv);
  CommonOptions common{SWARM_DEFAULT_FIXTURES_DIR, SWARM_BENCH_MODEL_CACHE, ""};
  int repeats = 3;
  CLI::App app{"bench_prefix: the serving engine with and without its prefix cache"};
  common.add_to(app, "Smaller cases (a smoke run)", "libtorch intra-op threads");
  app.add_option("--repeats", repeats, "Alternating runs of the distinct-prompts case (best of)")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  CLI11_PARSE(app, argc, argv);
  try {
    const auto bench_start = Clock::now();
    swarm::set_compute_threads(common.threads);
    print_run_header(SWARM_SOURCE_DIR, common.quick, "");
    const fs::path dir = common.smollm2_random();
    const int64_t group_prompt = common.quick ? 256 : 1024, group = 16, group_new = 32;
    const int turns = common.quick ? 4 : 10;
    const int64_t first_prompt = 400, answer = 50, tool = 100;
    const int64_t distinct_prompt = common.quick ? 128 : 512;
    std::printf(
        "model smollm2-135m (random weights); group %lld x %lld-token prompt, %lld new; %d turns from "
        "%lld tokens (+%lld answer, +%lld tool); %lld distinct x %lld tokens, best of %d\n",
        static_cast<long long>(group), static_cast<long long>(group_prompt),
        static_cast<long long>(group_new), turns, static_cast<long long>(first_prompt),
        static_cast<long long>(answer), static_cast<long long>(tool), static_cast<long long>(group),
        static_cast<long long>(distinct_prompt), repeats);

    std::vector<Row> rows;
    std::vector<std::pair<std::string, TurnsResult>> turn_tables;
    for (const auto& [name, dtype] : common.dtype_list()) {
      apply_thread_plan(common.threads, dtype);
      Engines engines{swarm::DecoderModel::load(dir, dtype), swarm::Tokenizer::from_directory(dir.string())};
      const int64_t vocab = engines.model->config().vocab_size;
      const int64_t kv_tokens = group * (group_prompt + group_new) + 256;

      // group
      std::mt19937 rng(1);
      const std::vector<TokenId> prompt = random_ids(group_prompt, rng, vocab);
      std::vector<GenerationRequest> reqs;
      for (int64_t i = 0; i < group; ++i)
        reqs.push_back(request(prompt, group_new, 10 + static_cast<uint64_t>(i)));
      double t_off = 0, t_on = 0;
      {
        progress("%s: group, cache off", name.c_str());
        auto e = engines.make(false, kv_tokens);
        run_batch(*e, {request(random_ids(64, rng, vocab), 4, 1)});  // warm-up
        t_off = run_batch(*e, reqs);
      }
      {
        progress("%s: group, cache on", name.c_str());
        auto e = engines.make(true, kv_tokens);
        run_batch(*e, {request(random_ids(64, rng, vocab), 4, 1)});
        t_on = run_batch(*e, reqs);
      }
      const double group_ratio = t_off / t_on;
      rows.push_back({name, "group of 16: last answer", fmt_number("%.2f s", t_off),
                      fmt_number("%.2f s", t_on), fmt_number("%.2fx", group_ratio), ">= 4x faster",
                      group_ratio >= 4.0 ? "met" : "missed"});

      // turns
      progress("%s: %d turns, cache off", name.c_str(), turns);
      TurnsResult off, on;
      {
        auto e = engines.make(false, kv_tokens);
        off = run_turns(*e, vocab, turns, first_prompt, answer, tool);
      }
      progress("%s: %d turns, cache on", name.c_str(), turns);
      {
        auto e = engines.make(true, kv_tokens);
        on = run_turns(*e, vocab, turns, first_prompt, answer, tool);
      }
      const double last_over_first_on = on.ttft.back() / on.ttft.front();
      const double last_over_first_off = off.ttft.back() / off.ttft.front();
      rows.push_back({name, "turn " + std::to_string(turns) + " TTFT / turn 1",
                      fmt_number("%.2fx", last_over_first_off), fmt_number("%.2fx", last_over_first_on),
                      fmt_number("%.2fx", off.ttft.back() / on.ttft.back()), "<= 1.5x (cache on)",
                      last_over_first_on <= 1.5 ? "met" : "missed"});
      turn_tables.emplace_back(name + " cache off", off);
      turn_tables.emplace_back(name + " cache on", on);

      // distinct, alternating off/on, best of `repeats`
      double best_off = 1e30, best_on = 1e30;
      for (int r = 0; r < repeats; ++r) {
        for (bool cache : {false, true}) {
          progress("%s: distinct prompts, cache %s, run %d", name.c_str(), cache ? "on" : "off", r + 1);
          std::mt19937 drng(1000 + static_cast<uint32_t>(r));
          std::vector<GenerationRequest> distinct;
          for (int64_t i = 0; i < group; ++i)
            distinct.push_back(
                request(random_ids(distinct_prompt, drng, vocab), group_new, static_cast<uint64_t>(i)));
          auto e = engines.make(cache, kv_tokens);
          run_batch(*e, {request(random_ids(64, drng, vocab), 4, 1)});
          const double t = run_batch(*e, distinct);
          (cache ? best_on : best_off) = std::min(cache ? best_on : best_off, t);
        }
      }
      const double cost = best_on / best_off - 1.0;
      rows.push_back({name, "16 distinct prompts: total", fmt_number("%.2f s", best_off),
                      fmt_number("%.2f s", best_on), fmt_number("%+.1f%%", 100.0 * cost), "<= +3%",
                      cost <= 0.03 ? "met" : "missed"});
    }

    print_rows(rows);
    std::printf("\nTTFT per turn (ms):\n| run |");
    for (int t = 1; t <= turns; ++t) std::printf(" %d |", t);
    std::printf(" prefix hits |\n|---|");
    for (int t = 0; t <= turns; ++t) std::printf("---|");
    std::printf("\n");
    for (const auto& [label, tr] : turn_tables) {
      std::printf("| %s |", label.c_str());
      for (double s : tr.ttft) std::printf(" %.0f |", s * 1000.0);
      std::printf(" %s |\n", tr.query_tokens > 0
                                 ? fmt_number("%.1f%%", 100.0 * static_cast<double>(tr.hit_tokens) /
                                                            static_cast<double>(tr.query_tokens))
                                       .c_str()
                                 : "-");
    }
    std::printf("\ntotal %.1f s\n", seconds_since(bench_start));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_prefix: %s\n", e.what());
    return 1;
  }
  return 0;
}
