// bench_structured: constrained decoding. For the SmolLM2-135M shape (random
// fp32 weights, 49k-token byte-level BPE) and a tiny Qwen3 (2 layers, random, Qwen3's 151k
// tokenizer):
//
//  * decode tokens/s of the serving engine at batch 1 and 32, unconstrained and constrained by
//    three JSON schemas, each an object holding an array of 64 values (so no request ends before
//    --tokens): "bounded" numbers in [0, 100] (a zod .min(0).max(100)), "free" strings (what zod's z.string() sends: inside a string the grammar state
//    repeats, so masks come from the cache) and "counted" strings of at most 16 characters (the
//    counter changes the state at every token: every mask is computed, the worst case);
//    temperature 1, no end-of-sequence; the best of --repeats runs;
//  * the token-mask figures behind it: building the vocabulary trie (once per engine), a cold
//    mask (a state never seen), and the hit rate of the mask cache during the constrained run;
//  * compile time of a 20-property schema with bounded integers and numbers (median of 50).
//
// Targets: constrained batch-1 decode >= 80 % of unconstrained; compile <= 50 ms.
// Prints tables with the commit and the machine; never a timed assertion.
//
//   bench_structured [--tokens 64] [--repeats 3] [--models smollm2,qwen3] [--schemas free,counted] [--threads N]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/torch_bench.hpp"
#include "grammar/json_schema_grammar.hpp"
#include "grammar/token_mask.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/serving_engine.hpp"
#include "text/tokenizer.hpp"

namespace {

using namespace swarm;
using namespace swarm::bench;
using ojson = nlohmann::ordered_json;

struct Waiter : GenerationObserver {
  std::mutex mu;
  std::condition_variable cv;
  int remaining = 0;
  int64_t tokens = 0;
  std::string error;
  void on_complete(GenerationResult r) override {
    std::lock_guard lk(mu);
    for (const auto& c : r.choices) tokens += static_cast<int64_t>(c.ids.size());
    --remaining;
    cv.notify_all();
  }
  void on_error(ErrorKind, const std::string& what) override {
    std::lock_guard lk(mu);
    error = what;
    --remaining;
    cv.notify_all();
  }
};

const ojson kCountedSchema = ojson::parse(R"({"type": "object", "properties": {"items": {"type": "array",
    "items": {"type": "string", "maxLength": 16}, "minItems": 64, "maxItems": 64}}, "required": ["items"],
    "additionalProperties": false})");
// What zod's z.number().min(0).max(100) sends: every number compared with both bounds, digit by
// digit, for every exponent a number may have.
const ojson kBoundedSchema = ojson::parse(R"({"type": "object", "properties": {"items": {"type": "array",
    "items": {"type": "number", "minimum": 0, "maximum": 100}, "minItems": 64, "maxItems": 64}}, "required": ["items"],
    "additionalProperties": false})");
const ojson kFreeSchema = ojson::parse(R"({"type": "object", "properties": {"items": {"type": "array",
    "items": {"type": "string"}, "minItems": 64, "maxItems": 64}}, "required": ["items"],
    "additionalProperties": false})");

ojson twenty_properties() {
  ojson props = ojson::object();
  const char* types[] = {"string", "integer", "boolean", "number"};
  for (int i = 0; i < 20; ++i) {
    ojson p = {{"type", types[i % 4]}, {"description", "field " + std::to_string(i)}};
    if (i % 4 == 1) p["minimum"] = 0, p["maximum"] = 1000 + i;
    if (i % 4 == 3) p["exclusiveMinimum"] = -2.5, p["maximum"] = 97.25 + i;
    if (i % 5 == 0)
      p = {{"type", "array"}, {"items", {{"type", "string"}, {"maxLength", 32}}}, {"maxItems", 8}};
    if (i % 7 == 0) p = {{"enum", {"alpha", "beta", "gamma"}}};
    props["field_" + std::to_string(i)] = p;
  }
  ojson required = ojson::array();
  for (auto it = props.begin(); it != props.end(); ++it) required.push_back(it.key());
  return {{"type", "object"}, {"properties", props}, {"required", required}, {"additionalProperties", false}};
}

// Tokens/s of `batch` requests of `tokens` tokens each (best of `repeats`).
double decode_rate(ServingEngine& engine, int64_t vocab, int batch, int tokens, int repeats,
                   const std::shared_ptr<const grammar::Grammar>& g) {
  double best = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    auto w = std::make_shared<Waiter>();
    w->remaining = batch;
    const auto t0 = Clock::now();
    for (int b = 0; b < batch; ++b) {
      GenerationRequest req;
      for (int i = 0; i < 32; ++i)
        req.prompt_ids.push_back(static_cast<TokenId>((i * 7919 + b * 131) % (vocab - 1) + 1));
      req.params.temperature = 1.0;
      req.params.max_tokens = tokens;
      req.params.seed = static_cast<uint64_t>(rep * 1000 + b);
      req.grammar = g;
      engine.submit(std::move(req), w);
    }
    std::unique_lock lk(w->mu);
    w->cv.wait(lk, [&] { return w->remaining == 0; });
    if (!w->error.empty()) throw std::runtime_error(w->error);
    best = std::max(best, static_cast<double>(w->tokens) / seconds_since(t0));
  }
  return best;
}

struct Row {
  std::string model, schema;
  int batch;
  double plain, constrained;
};

struct MaskRow {
  std::string model, schema;
  int64_t vocab;
  size_t trie_nodes;
  double trie_ms, cold_ms, walk_ms, warm_ms, hit_rate;
};

}  // namespace

int main(int argc, char** argv) {
  swarm::bound_openmp_spin_wait(argv);  // first: it may re-execute this program
  CLI::App app{"bench_structured: constrained vs unconstrained decoding, token masks, schema compile time"};
  int tokens = 64, repeats = 3, threads = 0;
  std::string models = "smollm2,qwen3";
  CommonOptions common{SWARM_DEFAULT_FIXTURES_DIR, SWARM_BENCH_MODEL_CACHE, SWARM_BENCH_PYTHON_SCRIPT};
  app.add_option("--tokens", tokens, "Tokens per request")->capture_default_str();
  app.add_option("--repeats", repeats, "Runs per case (the best counts)")->capture_default_str();
  app.add_option("--models", models, "smollm2, qwen3")->capture_default_str();
  std::string schemas = "free,counted,bounded";
  app.add_option("--schemas", schemas,
                 "free (unbounded strings), counted (maxLength 16), bounded (numbers in [0, 100])")
      ->capture_default_str();
  app.add_option("--threads", threads, "Compute threads (0 = every CPU)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const int cores = threads > 0 ? threads : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    const ThreadPlan plan = apply_thread_plan(cores, DType::F32);
    print_run_header(SWARM_SOURCE_DIR, false, std::to_string(plan.openblas_threads) + " threads");

    // Compile time of a 20-property schema.
    const ojson schema20 = twenty_properties();
    std::vector<double> ms;
    size_t rules = 0;
    for (int i = 0; i < 50; ++i) {
      const auto t0 = Clock::now();
      const grammar::Grammar g = grammar::json_schema_grammar(schema20);
      ms.push_back(seconds_since(t0) * 1000);
      rules = g.num_rules();
    }
    std::sort(ms.begin(), ms.end());
    const double compile_ms = ms[ms.size() / 2];

    std::vector<Row> rows;
    std::vector<MaskRow> mask_rows;
    for (const std::string& name : split_list(models)) {
      fs::path dir;
      if (name == "smollm2") {
        dir = common.smollm2_random();
      } else if (name == "qwen3") {
        const fs::path cfg = fs::path(common.model_cache) / "tiny-qwen3-config";
        fs::create_directories(cfg);
        for (const char* f : {"config.json", "generation_config.json"})
          fs::copy_file(fs::path(SWARM_SOURCE_DIR) / "tests/data/tiny-qwen3" / f, cfg / f,
                        fs::copy_options::overwrite_existing);
        for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
          fs::copy_file(fs::path(common.fixtures) / "tokenizers/qwen3" / f, cfg / f,
                        fs::copy_options::overwrite_existing);
        dir = prepare_random_model(cfg, common.model_cache, "tiny-qwen3-random-f32-seed0");
      } else {
        throw std::invalid_argument("unknown model '" + name + "' (smollm2, qwen3)");
      }
      auto model = DecoderModel::load(dir, DType::F32);
      auto tokenizer = std::shared_ptr<const Tokenizer>(Tokenizer::from_directory(dir.string()));
      const int64_t vocab = tokenizer->vocab_size();

      // The mask machinery alone.
      auto t0 = Clock::now();
      const std::shared_ptr<const grammar::TokenTrie> trie = vocabulary_trie(*tokenizer);
      const double trie_ms = seconds_since(t0) * 1000;
      ServingConfig sc;
      sc.kv_cache_tokens = 40 * (32 + tokens + 16);
      sc.max_batch_sequences = 64;
      sc.max_context = 32 + tokens + 16;
      ServingEngine engine(model, tokenizer, sc);  // no eos: every request runs its --tokens
      for (const auto& [schema_name, schema] :
           {std::pair{"free", &kFreeSchema}, std::pair{"counted", &kCountedSchema},
            std::pair{"bounded", &kBoundedSchema}}) {
        const std::vector<std::string> wanted = split_list(schemas);
        if (std::find(wanted.begin(), wanted.end(), schema_name) == wanted.end()) continue;
        auto g = std::make_shared<const grammar::Grammar>(grammar::json_schema_grammar(*schema));
        grammar::Matcher m(*g);
        grammar::TokenMasker masker(trie, {});
        grammar::Matcher::State s = m.state();
        // Inside a value: a string, or a number.
        const std::string probe =
            std::string(schema_name) == "bounded" ? "{\"items\": [4" : "{\"items\": [\"ab";
        for (unsigned char c : probe) s = m.advance(s, c);
        t0 = Clock::now();
        masker.allowed(m, s);
        const double cold_ms = seconds_since(t0) * 1000;
        // Masks along a walk of `tokens` random allowed tokens (a fresh grammar object's matcher
        // and cache, as a new schema would get; transitions memoised as it goes).
        // Masks along walks of `tokens` random allowed tokens (a fresh grammar object's matcher
        // and cache, as a new schema would get; transitions memoised as it goes). The second
        // walk reuses the first one's caches (as the next request with the schema does) but
        // goes through other states.
        grammar::Matcher walk(*g);
        grammar::TokenMasker walk_masker(trie, {});
        double walk_ms = 0, warm_ms = 0, hit_rate = 0;
        for (int pass = 0; pass < 2; ++pass) {
          std::mt19937_64 rng(1 + pass);
          grammar::Matcher::StateId ws = walk.state_id(walk.state());
          const size_t hits0 = walk_masker.cache_hits();
          int walked = 0;
          double mask_seconds = 0;
          for (; walked < tokens; ++walked) {
            const auto m0 = Clock::now();
            const grammar::TokenMask& mask = walk_masker.allowed(walk, ws);
            mask_seconds += seconds_since(m0);
            std::vector<uint32_t> ok;
            for (uint32_t id = 0; id < static_cast<uint32_t>(vocab); ++id)
              if (grammar::mask_allows(mask, id)) ok.push_back(id);
            if (ok.empty()) break;
            const uint32_t pick = ok[rng() % ok.size()];
            for (unsigned char c : tokenizer->token_bytes(static_cast<TokenId>(pick)))
              ws = walk.step_id(ws, c);
          }
          (pass == 0 ? walk_ms : warm_ms) = walked ? mask_seconds * 1000 / walked : 0;
          if (pass == 0)
            hit_rate = walked ? static_cast<double>(walk_masker.cache_hits() - hits0) / walked : 0;
        }
        mask_rows.push_back(
            {name, schema_name, vocab, trie->num_nodes(), trie_ms, cold_ms, walk_ms, warm_ms, hit_rate});
        for (int batch : {1, 32}) {
          Row r{name, schema_name, batch, 0, 0};
          r.plain = decode_rate(engine, vocab, batch, tokens, repeats, nullptr);
          r.constrained = decode_rate(engine, vocab, batch, tokens, repeats, g);
          rows.push_back(r);
          std::fprintf(stderr, "[bench] %s %s batch %d: %.1f vs %.1f tok/s\n", name.c_str(), schema_name,
                       batch, r.plain, r.constrained);
        }
      }
    }
    std::printf(
        "\n| model | values | vocab | trie nodes | trie build ms | first mask ms | mask ms per token (first "
        "walk) | (second walk) | mask cache hits (first) |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const MaskRow& r : mask_rows)
      std::printf("| %s | %s | %lld | %zu | %.0f | %.1f | %.2f | %.2f | %.0f %% |\n", r.model.c_str(),
                  r.schema.c_str(), static_cast<long long>(r.vocab), r.trie_nodes, r.trie_ms, r.cold_ms,
                  r.walk_ms, r.warm_ms, 100 * r.hit_rate);
    std::printf(
        "\n| model | values | batch | unconstrained tok/s | constrained tok/s | ratio | target >= 80 %% "
        "|\n|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf("| %s | %s | %d | %.1f | %.1f | %.0f %% | %s |\n", r.model.c_str(), r.schema.c_str(),
                  r.batch, r.plain, r.constrained, 100 * r.constrained / r.plain,
                  r.batch != 1 ? "-" : (r.constrained >= 0.8 * r.plain ? "met" : "missed"));
    std::printf("\nschema compile (20 properties, %zu rules): median %.2f ms of 50 — target <= 50 ms: %s\n",
                rules, compile_ms, compile_ms <= 50 ? "met" : "missed");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_structured: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
