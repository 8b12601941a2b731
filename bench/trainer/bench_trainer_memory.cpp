// bench_trainer_memory: what a GRPO training step holds, and what packing, blockwise attention
// and activation checkpointing cost and save (docs/concepts.md "Memory"). Each case runs in a
// child process of its own (this binary again, --case JSON), under an address-space limit
// (--limit-gib), so a case that does not fit fails with its allocation error instead of taking
// the machine down, and peaks do not carry over between cases. Per case: one PolicyTrainer over a
// random-weight model and a synthetic GRPO batch (two task groups, rewards varied, each sequence
// half prompt, half trained response), --steps train() calls; reported: the step's
// activations_peak_bytes (tensor memory above what the step started with), the process's peak
// RSS, the update's seconds (the fastest step) and tokens/s, padding_fraction, the trainer's
// buffers by category.
//
// Tables (stdout; progress on stderr; never a timed assertion):
//  1. one sequence of --lengths tokens (default 1024,2048,4096) on the SmolLM2-135M shape, fp32:
//     today's path (padded rows, eager attention, no checkpointing), blockwise attention over a
//     packed row, and blockwise with checkpointing; target: checkpointed blockwise <= 1/4 of
//     today's activation peak at 4,096 tokens;
//  2. checkpointing's cost: 8 x 512-token sequences, fp32 and bf16, off and on; target: <= 1.35x;
//  3. packing: 64 sequences of 20-200 tokens (uniform), micro-batches of 2,048 tokens, packed vs
//     padded rows; target: tokens/s >= 1.3x unpacked;
//  4. --qwen05b: a Qwen2.5-0.5B-shaped random model, one 4,096-token sample: today's path, then
//     blockwise with checkpointing (and --long-tokens, default 16384, on the SmolLM2 shape with
//     checkpointing).
//
//   bench_trainer_memory [--quick] [--threads N] [--limit-gib G] [--lengths 1024,2048,4096]
//                        [--steps K] [--qwen05b] [--long-tokens T] [--skip-table 1,2,...]
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/torch_bench.hpp"
#include "inference/decoder_model_torch.hpp"
#include "model/model_tools.hpp"
#include "rollout_pool/types.hpp"
#include "trainer/allocation_tracker_torch.hpp"
#include "trainer/grpo_batch.hpp"
#include "trainer/policy_trainer_torch.hpp"

namespace {

namespace fs = std::filesystem;
namespace sb = swarm::bench;
using json = nlohmann::json;

constexpr double kMiB = 1024.0 * 1024.0;

template <typename... Args>
void progress(const char* fmt, Args... args) {
  sb::progress_line("bench_trainer_memory", fmt, args...);
}

constexpr auto& fmt = sb::fmt_number;

// ------------------------------------------------------------------ one case (child process)

swarm::TrainBatch make_batch(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  swarm::TrainBatch batch;
  const int64_t groups = lengths.size() > 1 ? 2 : 1;
  batch.num_tasks = groups;
  for (size_t s = 0; s < lengths.size(); ++s) {
    swarm::FinishedEpisode ep;
    ep.episode_uuid = "episode-" + std::to_string(s);
    ep.client_uuid = "bench";
    ep.task_id =
        "task-" + std::to_string(static_cast<int64_t>(s) * groups / static_cast<int64_t>(lengths.size()));
    ep.reward = unit(rng);
    ep.finish_seq = static_cast<int64_t>(s);
    swarm::Sample sample;
    sample.task_id = ep.task_id;
    sample.episode_uuid = ep.episode_uuid;
    sample.reward = ep.reward;
    sample.num_calls = 1;
    for (int64_t t = 0; t < lengths[s]; ++t) {
      const bool trained = t >= lengths[s] / 2;
      sample.token_ids.push_back(token(rng));
      sample.loss_mask.push_back(trained ? 1 : 0);
      sample.rollout_logprobs.push_back(trained ? static_cast<float>(-3.0 * unit(rng)) : 0.0f);
      sample.policy_versions.push_back(trained ? 0 : -1);
    }
    ep.samples.push_back(std::move(sample));
    batch.episodes.push_back(std::move(ep));
  }
  return batch;
}

swarm::TrainerOptions case_options(const json& c) {
  swarm::TrainerOptions o;
  o.learning_rate = 1e-5;
  o.micro_batch_max_tokens = c.value("micro_batch_max_tokens", int64_t{8192});
  o.sequence_packing = c.at("packing").get<bool>();
  o.forward.attention = swarm::parse_training_attention(c.at("attention").get<std::string>());
  o.forward.checkpoint_layers = c.at("checkpoint").get<bool>();
  return o;
}

int run_case(const json& c) {
  json out = {{"ok", false}};
  try {
    const double limit_gib = c.value("limit_gib", 0.0);
    if (limit_gib > 0) {
      const auto bytes = static_cast<rlim_t>(limit_gib * 1024 * kMiB);
      rlimit lim{bytes, bytes};
      setrlimit(RLIMIT_AS, &lim);
    }
    const swarm::DType dtype =
        c.at("dtype").get<std::string>() == "bf16" ? swarm::DType::BF16 : swarm::DType::F32;
    sb::apply_thread_plan(c.at("threads").get<int>(), dtype);
    auto model = swarm::DecoderModel::load(c.at("model").get<std::string>(), dtype);
    std::shared_ptr<swarm::DecoderModel> master;
    if (dtype != swarm::DType::F32)
      master = swarm::DecoderModel::load(c.at("model").get<std::string>(), swarm::DType::F32);
    swarm::TrainerOptions o = case_options(c);
    swarm::PolicyTrainer trainer(model, o, nullptr, master ? &master->parameters() : nullptr);
    master.reset();
    const auto lengths = c.at("lengths").get<std::vector<int64_t>>();
    swarm::TrainBatch batch = make_batch(lengths, model->config().vocab_size, 7);
    const int steps = c.value("steps", 1);
    double best = 0, tokens_per_s = 0, padding = 0, act_peak = -1, loss = 0;
    for (int i = 0; i < steps; ++i) {
      std::map<std::string, double> m;
      if (lengths.size() == 1) {
        // One sequence: accumulate + optimizer by hand (a lone group has no GRPO advantage).
        swarm::PreparedBatch p;
        swarm::TrainSequence seq;
        seq.sample = &batch.episodes[0].samples[0];
        seq.length = static_cast<int64_t>(seq.sample->token_ids.size());
        seq.trained_tokens = seq.length - seq.length / 2;
        seq.advantage = 1.0;
        p.sequences.push_back(seq);
        const auto t0 = sb::Clock::now();
        swarm::mark_allocation_peak(torch::kCPU);
        const int64_t held = swarm::allocation_stats(torch::kCPU).current;
        trainer.zero_gradients();
        const swarm::LossSums s =
            trainer.accumulate_gradients(p, {0}, {}, static_cast<double>(seq.trained_tokens));
        trainer.optimizer_step(o.learning_rate);
        m["update_seconds"] = sb::seconds_since(t0);
        m["activations_peak_bytes"] = static_cast<double>(swarm::allocation_stats(torch::kCPU).peak - held);
        m["trainer_tokens_per_second"] = static_cast<double>(seq.length) / m["update_seconds"];
        m["padding_fraction"] = 1.0 - s.sequence_tokens / s.slots;
        m["loss"] = s.loss;
      } else {
        m = trainer.train(batch, i + 1, nullptr);
      }
      const double sec = m.at("update_seconds");
      if (i == 0 || sec < best) best = sec, tokens_per_s = m.at("trainer_tokens_per_second");
      padding = m.at("padding_fraction");
      act_peak =
          std::max(act_peak, m.count("activations_peak_bytes") ? m.at("activations_peak_bytes") : -1.0);
      loss = m.count("loss") ? m.at("loss") : 0.0;
      progress("    step %d: %.2f s, activations peak %.1f MiB", i + 1, sec, act_peak / kMiB);
    }
    const swarm::FlatParameters::Memory mem = trainer.memory();
    int64_t serving = 0;
    for (const auto& [name, p] : model->parameters())
      serving += p.numel() * static_cast<int64_t>(p.element_size());
    out = {{"ok", true},
           {"update_s", best},
           {"tokens_per_s", tokens_per_s},
           {"padding_fraction", padding},
           {"activations_peak_bytes", act_peak},
           {"loss", loss},
           {"rss_peak_bytes", sb::proc_status_kib("VmHWM") * 1024},
           {"weights", mem.weights},
           {"serving_weights", serving},
           {"gradients", mem.gradients},
           {"optimizer", mem.optimizer},
           {"master", mem.master},
           {"params", trainer.parameter_count()}};
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    out = {{"ok", false}, {"error", what}, {"rss_peak_bytes", sb::proc_status_kib("VmHWM") * 1024}};
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ------------------------------------------------------------------ the parent

struct Runner {
  std::string self;
  int threads = 2;
  double limit_gib = 20;

  json run(json c) const {
    c["threads"] = threads;
    c["limit_gib"] = limit_gib;
    progress("  case %s", c.dump().substr(0, 200).c_str());
    const auto t0 = sb::Clock::now();
    auto [status, text] = sb::run_capture({self, "--case", c.dump()});
    json r;
    try {
      r = json::parse(sb::last_line(text));
    } catch (const std::exception&) {
      r = {{"ok", false}, {"error", "the case process exited with status " + std::to_string(status)}};
    }
    r["wall_s"] = sb::seconds_since(t0);
    progress("    -> %s", r.dump().substr(0, 300).c_str());
    return r;
  }
};

std::string mib_or(const json& r, const char* key) {
  if (!r.value("ok", false)) return "—";
  const double v = r.value(key, -1.0);
  return v < 0 ? "n/a" : fmt("%.0f", v / kMiB);
}

std::string outcome(const json& r) {
  if (r.value("ok", false)) return "ok";
  std::string e = r.value("error", std::string("failed"));
  const auto nl = e.find('\n');
  if (nl != std::string::npos) e = e.substr(0, nl);
  return "FAILED: " + e.substr(0, 90);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "bench_trainer_memory: activation memory and the cost of packing, blockwise attention and "
      "checkpointing"};
  std::string case_json;
  std::string lengths_arg = "1024,2048,4096";
  std::string skip;
  int steps = 2;
  bool qwen05b = false;
  int64_t long_tokens = 16384;
  sb::CommonOptions common(SWARM_DEFAULT_FIXTURES_DIR, SWARM_BENCH_MODEL_CACHE, "");
  Runner runner;
  app.add_option("--case", case_json, "(internal) run one case and print its JSON");
  common.add_to(app, "Shorter: lengths 512,1024; one step per case", "CPU threads");
  app.add_option("--limit-gib", runner.limit_gib, "Address-space limit of each case process")
      ->capture_default_str();
  app.add_option("--lengths", lengths_arg, "Table 1's sequence lengths")->capture_default_str();
  app.add_option("--steps", steps, "train() calls per timed case (the fastest counts)")
      ->capture_default_str();
  app.add_flag("--qwen05b", qwen05b, "Table 4: the Qwen2.5-0.5B shape at 4,096 tokens (minutes)");
  app.add_option("--long-tokens", long_tokens, "Table 4's long SmolLM2-shape sequence (0 = skip)")
      ->capture_default_str();
  app.add_option("--skip-table", skip, "Comma list of tables (1-4) to leave out");
  CLI11_PARSE(app, argc, argv);
  if (!case_json.empty()) return run_case(json::parse(case_json));

  runner.self = fs::read_symlink("/proc/self/exe").string();
  runner.threads = common.threads;
  if (common.quick) lengths_arg = "512,1024", steps = 1;
  const auto skipped = [&](const std::string& t) {
    const auto l = sb::split_list(skip);
    return std::find(l.begin(), l.end(), t) != l.end();
  };
  sb::apply_thread_plan(common.threads, swarm::DType::F32);
  sb::print_run_header(SWARM_SOURCE_DIR, common.quick, "as the trainer plans it");
  std::printf(
      "each case in its own process, address space limited to %.0f GiB; activations = the step's tensor "
      "memory above what it started with\n",
      runner.limit_gib);
  const fs::path smol = common.smollm2_random();

  if (!skipped("1")) {
    std::printf("\n## 1. One sequence, SmolLM2-135M shape, fp32: activation peak of a training step\n\n");
    std::printf("| tokens | path | activations MiB | vs today | peak RSS MiB | step s | outcome |\n");
    std::printf("|---:|---|---:|---:|---:|---:|---|\n");
    for (const std::string& ls : sb::split_list(lengths_arg)) {
      const int64_t n = std::stoll(ls);
      json today;
      for (const auto& [name, packing, attention, ckpt] :
           std::vector<std::tuple<std::string, bool, std::string, bool>>{
               {"today: padded, eager, no checkpointing", false, "eager", false},
               {"packed, blockwise", true, "blockwise", false},
               {"packed, blockwise, checkpointed", true, "blockwise", true}}) {
        const json r = runner.run({{"model", smol.string()},
                                   {"dtype", "fp32"},
                                   {"lengths", {n}},
                                   {"packing", packing},
                                   {"attention", attention},
                                   {"checkpoint", ckpt},
                                   {"steps", 1}});
        if (attention == "eager") today = r;
        std::string ratio = "—";
        if (r.value("ok", false) && today.value("ok", false))
          ratio = fmt("%.3f", r.at("activations_peak_bytes").get<double>() /
                                  today.at("activations_peak_bytes").get<double>());
        std::printf("| %lld | %s | %s | %s | %s | %s | %s |\n", static_cast<long long>(n), name.c_str(),
                    mib_or(r, "activations_peak_bytes").c_str(), ratio.c_str(),
                    mib_or(r, "rss_peak_bytes").c_str(),
                    r.value("ok", false) ? fmt("%.2f", r.at("update_s").get<double>()).c_str() : "—",
                    outcome(r).c_str());
        std::fflush(stdout);
      }
    }
    std::printf(
        "\ntarget: checkpointed blockwise <= 1/4 of today's activation peak at 4,096 tokens "
        "(compare the rows above)\n");
  }

  if (!skipped("2")) {
    std::printf(
        "\n## 2. Activation checkpointing's cost: 8 x 512 tokens, SmolLM2-135M shape, packed, blockwise\n\n");
    std::printf(
        "| dtype | checkpointing | update s | tokens/s | activations MiB | time vs off | target <= 1.35x "
        "|\n");
    std::printf("|---|---|---:|---:|---:|---:|---|\n");
    for (const std::string dtype : {"fp32", "bf16"}) {
      json off;
      for (const bool ckpt : {false, true}) {
        const json r = runner.run({{"model", smol.string()},
                                   {"dtype", dtype},
                                   {"lengths", std::vector<int64_t>(8, 512)},
                                   {"packing", true},
                                   {"attention", "blockwise"},
                                   {"checkpoint", ckpt},
                                   {"steps", steps}});
        if (!ckpt) off = r;
        std::string ratio = "—", met = "—";
        if (ckpt && r.value("ok", false) && off.value("ok", false)) {
          const double x = r.at("update_s").get<double>() / off.at("update_s").get<double>();
          ratio = fmt("%.2fx", x);
          met = x <= 1.35 ? "met" : "missed";
        }
        std::printf(
            "| %s | %s | %s | %s | %s | %s | %s |\n", dtype.c_str(), ckpt ? "on" : "off",
            r.value("ok", false) ? fmt("%.2f", r.at("update_s").get<double>()).c_str() : outcome(r).c_str(),
            r.value("ok", false) ? fmt("%.0f", r.at("tokens_per_s").get<double>()).c_str() : "—",
            mib_or(r, "activations_peak_bytes").c_str(), ratio.c_str(), met.c_str());
        std::fflush(stdout);
      }
    }
  }

  if (!skipped("3")) {
    std::printf(
        "\n## 3. Sequence packing: 64 sequences of 20-200 tokens, micro-batches of 2,048 tokens, fp32\n\n");
    std::mt19937_64 rng(3);
    std::uniform_int_distribution<int64_t> len(20, 200);
    std::vector<int64_t> lengths;
    for (int i = 0; i < 64; ++i) lengths.push_back(len(rng));
    std::printf(
        "| rows | attention | update s | tokens/s | padding_fraction | vs padded | target >= 1.3x |\n");
    std::printf("|---|---|---:|---:|---:|---:|---|\n");
    json padded;
    for (const auto& [packing, attention] :
         std::vector<std::pair<bool, std::string>>{{false, "eager"}, {true, "blockwise"}, {true, "eager"}}) {
      const json r = runner.run({{"model", smol.string()},
                                 {"dtype", "fp32"},
                                 {"lengths", lengths},
                                 {"packing", packing},
                                 {"attention", attention},
                                 {"checkpoint", false},
                                 {"micro_batch_max_tokens", 2048},
                                 {"steps", steps}});
      if (!packing) padded = r;
      std::string ratio = "—", met = "—";
      if (packing && r.value("ok", false) && padded.value("ok", false)) {
        const double x = r.at("tokens_per_s").get<double>() / padded.at("tokens_per_s").get<double>();
        ratio = fmt("%.2fx", x);
        met = x >= 1.3 ? "met" : "missed";
      }
      std::printf(
          "| %s | %s | %s | %s | %s | %s | %s |\n", packing ? "packed" : "padded (today)", attention.c_str(),
          r.value("ok", false) ? fmt("%.2f", r.at("update_s").get<double>()).c_str() : outcome(r).c_str(),
          r.value("ok", false) ? fmt("%.0f", r.at("tokens_per_s").get<double>()).c_str() : "—",
          r.value("ok", false) ? fmt("%.3f", r.at("padding_fraction").get<double>()).c_str() : "—",
          ratio.c_str(), met.c_str());
      std::fflush(stdout);
    }
  }

  if (!skipped("4") && (qwen05b || long_tokens > 0)) {
    std::printf("\n## 4. Long samples\n\n");
    std::printf("| model | tokens | path | activations MiB | peak RSS MiB | step s | outcome |\n");
    std::printf("|---|---:|---|---:|---:|---:|---|\n");
    std::vector<std::tuple<std::string, fs::path, int64_t>> runs;
    if (qwen05b) {
      // Qwen2.5-0.5B's shape (config.json of Qwen/Qwen2.5-0.5B), random fp32 weights.
      const fs::path dir = fs::path(common.model_cache) / "qwen2.5-0.5b-shape-random-f32-seed0";
      if (!fs::exists(dir / "config.json")) {
        swarm::InitModelOptions init;
        init.from = fs::path(common.fixtures) / "models/smollm2-135m-instruct-noweights";
        init.out = dir;
        init.dtype = swarm::DType::F32;
        init.config_overrides = {{"architectures", "[\"Qwen2ForCausalLM\"]"},
                                 {"model_type", "\"qwen2\""},
                                 {"hidden_size", "896"},
                                 {"intermediate_size", "4864"},
                                 {"num_hidden_layers", "24"},
                                 {"num_attention_heads", "14"},
                                 {"num_key_value_heads", "2"},
                                 {"head_dim", "64"},
                                 {"vocab_size", "151936"},
                                 {"max_position_embeddings", "32768"},
                                 {"rope_theta", "1000000.0"},
                                 {"rms_norm_eps", "1e-6"},
                                 {"tie_word_embeddings", "true"}};
        progress("writing the Qwen2.5-0.5B-shaped random model into %s (once)", dir.c_str());
        swarm::init_random_model(init);
      }
      runs.emplace_back("Qwen2.5-0.5B shape", dir, 4096);
    }
    if (long_tokens > 0) {
      // SmolLM2-135M allows 8,192 positions: longer samples get the same shape with
      // max_position_embeddings raised to the sample (random fp32 weights, written once).
      fs::path dir = smol;
      if (long_tokens > swarm::ModelConfig::from_directory(smol).max_position_embeddings) {
        dir = fs::path(common.model_cache) /
              ("smollm2-135m-shape-random-f32-seed0-pos" + std::to_string(long_tokens));
        if (!fs::exists(dir / "config.json")) {
          swarm::InitModelOptions init;
          init.from = fs::path(common.fixtures) / "models/smollm2-135m-instruct-noweights";
          init.out = dir;
          init.dtype = swarm::DType::F32;
          init.config_overrides = {{"max_position_embeddings", std::to_string(long_tokens)}};
          progress("writing a SmolLM2-shaped random model with %lld positions into %s (once)",
                   static_cast<long long>(long_tokens), dir.c_str());
          swarm::init_random_model(init);
        }
      }
      runs.emplace_back("SmolLM2-135M shape", dir, long_tokens);
    }
    for (const auto& [name, dir, n] : runs) {
      const bool is_long = name.rfind("SmolLM2", 0) == 0;
      for (const auto& [path, packing, attention, ckpt] :
           std::vector<std::tuple<std::string, bool, std::string, bool>>{
               {"today: padded, eager, no checkpointing", false, "eager", false},
               {"packed, blockwise, checkpointed", true, "blockwise", true}}) {
        if (is_long && attention == "eager") continue;  // 16k² scores: known not to fit
        const json r = runner.run({{"model", dir.string()},
                                   {"dtype", "fp32"},
                                   {"lengths", {n}},
                                   {"packing", packing},
                                   {"attention", attention},
                                   {"checkpoint", ckpt},
                                   {"steps", 1}});
        std::printf("| %s | %lld | %s | %s | %s | %s | %s |\n", name.c_str(), static_cast<long long>(n),
                    path.c_str(), mib_or(r, "activations_peak_bytes").c_str(),
                    mib_or(r, "rss_peak_bytes").c_str(),
                    r.value("ok", false) ? fmt("%.1f", r.at("update_s").get<double>()).c_str() : "—",
                    outcome(r).c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
