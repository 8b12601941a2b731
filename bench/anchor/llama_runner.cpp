#include "anchor/llama_runner.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

namespace swarm::bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Every llama.cpp function bench_anchor calls: member, symbol. The types are the declarations'
// (decltype), so a header/binary mismatch in a signature fails to compile, not at run time.
#define SWARM_LLAMA_FUNCTIONS(X)                          \
  X(backend_init, llama_backend_init)                     \
  X(log_set, llama_log_set)                               \
  X(ggml_log_set, ggml_log_set)                           \
  X(load_backends, ggml_backend_load_all_from_path)       \
  X(load_backend, ggml_backend_load)                      \
  X(print_system_info, llama_print_system_info)           \
  X(model_default_params, llama_model_default_params)     \
  X(model_load_from_file, llama_model_load_from_file)     \
  X(model_free, llama_model_free)                         \
  X(model_get_vocab, llama_model_get_vocab)               \
  X(vocab_n_tokens, llama_vocab_n_tokens)                 \
  X(context_default_params, llama_context_default_params) \
  X(init_from_model, llama_init_from_model)               \
  X(free, llama_free)                                     \
  X(get_memory, llama_get_memory)                         \
  X(memory_clear, llama_memory_clear)                     \
  X(memory_seq_rm, llama_memory_seq_rm)                   \
  X(batch_init, llama_batch_init)                         \
  X(batch_free, llama_batch_free)                         \
  X(decode, llama_decode)                                 \
  X(get_logits_ith, llama_get_logits_ith)

struct LlamaLibrary::Api {
#define SWARM_LLAMA_MEMBER(member, symbol) decltype(&::symbol) member = nullptr;
  SWARM_LLAMA_FUNCTIONS(SWARM_LLAMA_MEMBER)
#undef SWARM_LLAMA_MEMBER
};

namespace {

/// llama.cpp's and ggml's log lines: errors only (the rest would bury the tables).
void log_errors(enum ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

fs::path find_libllama(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // libllama.so or libllama.<version>.so, not libllama-common.so
    if (name.rfind("libllama.", 0) == 0 && name.size() > 3 && name.substr(name.size() - 3) == ".so")
      return entry.path();
  }
  throw std::runtime_error("no libllama*.so in " + dir.string() +
                           " (npm ci --prefix bench/anchor --omit=optional --ignore-scripts)");
}

int32_t argmax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

/// llama_batch_init's batch, freed with the library's llama_batch_free.
class Batch {
 public:
  Batch(const LlamaLibrary::Api& api, int32_t capacity) : api_(api), b_(api.batch_init(capacity, 0, 1)) {}
  ~Batch() { api_.batch_free(b_); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  void clear() { b_.n_tokens = 0; }
  void add(int32_t token, int64_t pos, int32_t seq, bool logits) {
    const int32_t i = b_.n_tokens++;
    b_.token[i] = token;
    b_.pos[i] = static_cast<llama_pos>(pos);
    b_.n_seq_id[i] = 1;
    b_.seq_id[i][0] = seq;
    b_.logits[i] = logits ? 1 : 0;
  }
  int32_t size() const { return b_.n_tokens; }
  const llama_batch& get() const { return b_; }

 private:
  const LlamaLibrary::Api& api_;
  llama_batch b_;
};

}  // namespace

LlamaLibrary::LlamaLibrary(fs::path path, std::unique_ptr<Api> api)
    : path_(std::move(path)), api_(std::move(api)) {}
LlamaLibrary::~LlamaLibrary() = default;

const LlamaLibrary& LlamaLibrary::open(const fs::path& dir, const std::string& cpu_variant) {
  static std::unique_ptr<LlamaLibrary> lib;
  if (lib) return *lib;
  const fs::path path = find_libllama(dir);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw std::runtime_error(std::string("dlopen: ") + dlerror());
  auto api = std::make_unique<Api>();
  auto bind = [&](auto& fn, const char* symbol) {
    void* p = dlsym(handle, symbol);
    if (!p) throw std::runtime_error(path.string() + ": no symbol " + symbol);
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
#define SWARM_LLAMA_BIND(member, symbol) bind(api->member, #symbol);
  SWARM_LLAMA_FUNCTIONS(SWARM_LLAMA_BIND)
#undef SWARM_LLAMA_BIND
  api->ggml_log_set(log_errors, nullptr);
  api->log_set(log_errors, nullptr);
  // The CPU backend is a separate library per instruction-set level (libggml-cpu-haswell.so,
  // ...); ggml scores them against this CPU and loads the best, unless one is named.
  if (cpu_variant.empty()) {
    api->load_backends(dir.c_str());
  } else {
    const fs::path backend = dir / ("libggml-cpu-" + cpu_variant + ".so");
    if (!fs::exists(backend)) throw std::runtime_error("no ggml CPU backend " + backend.string());
    if (api->load_backend(backend.c_str()) == nullptr)
      throw std::runtime_error("ggml could not load " + backend.string() + " (does this CPU run it?)");
  }
  api->backend_init();
  lib = std::make_unique<LlamaLibrary>(path, std::move(api));
  return *lib;
}

std::string LlamaLibrary::system_info() const { return api_->print_system_info(); }

struct LlamaModel::Context {
  const LlamaLibrary::Api& api;
  llama_context* ctx;
  ~Context() { api.free(ctx); }
};

LlamaModel::LlamaModel(const LlamaLibrary& lib, const fs::path& gguf, GgufTensorType type, int threads)
    : lib_(lib), type_(type), threads_(threads) {
  llama_model_params params = lib.api().model_default_params();
  params.n_gpu_layers = 0;
  model_ = lib.api().model_load_from_file(gguf.c_str(), params);
  if (!model_) throw std::runtime_error("llama.cpp could not load " + gguf.string());
}

LlamaModel::~LlamaModel() { lib_.api().model_free(static_cast<llama_model*>(model_)); }

int64_t LlamaModel::vocab_size() const {
  return lib_.api().vocab_n_tokens(lib_.api().model_get_vocab(static_cast<llama_model*>(model_)));
}

std::unique_ptr<LlamaModel::Context> LlamaModel::make_context(int64_t sequences,
                                                              int64_t tokens_per_sequence) const {
  const LlamaLibrary::Api& api = lib_.api();
  llama_context_params p = api.context_default_params();
  const int64_t per_seq = (tokens_per_sequence + 255) / 256 * 256;  // llama.cpp pads to 256
  p.n_ctx = static_cast<uint32_t>(per_seq * sequences);
  p.n_batch = 512;
  p.n_ubatch = 512;
  p.n_seq_max = static_cast<uint32_t>(sequences);
  p.n_threads = threads_;
  p.n_threads_batch = threads_;
  p.kv_unified = false;  // a stream per sequence: attention never scans the others' cells
  p.no_perf = true;
  const ggml_type kv = type_ == GgufTensorType::F32   ? GGML_TYPE_F32
                       : type_ == GgufTensorType::F16 ? GGML_TYPE_F16
                                                      : GGML_TYPE_BF16;
  p.type_k = kv;
  p.type_v = kv;
  llama_context* ctx = api.init_from_model(static_cast<llama_model*>(model_), p);
  if (!ctx) throw std::runtime_error("llama_init_from_model failed");
  return std::unique_ptr<Context>(new Context{api, ctx});
}

std::vector<int32_t> LlamaModel::greedy_ids(const std::vector<int32_t>& prompt, int64_t new_tokens) {
  const LlamaLibrary::Api& api = lib_.api();
  auto ctx = make_context(1, static_cast<int64_t>(prompt.size()) + new_tokens);
  const int64_t vocab = vocab_size();
  Batch batch(api, 512);
  std::vector<int32_t> out;
  int64_t pos = 0;
  std::vector<int32_t> next = prompt;
  for (int64_t i = 0; i < new_tokens; ++i) {
    batch.clear();
    for (size_t t = 0; t < next.size(); ++t) batch.add(next[t], pos++, 0, t + 1 == next.size());
    if (api.decode(ctx->ctx, batch.get()) != 0) throw std::runtime_error("llama_decode failed (greedy ids)");
    const int32_t id = argmax(api.get_logits_ith(ctx->ctx, -1), vocab);
    out.push_back(id);
    next = {id};
  }
  return out;
}

double LlamaModel::prefill_seconds(const std::vector<std::vector<int32_t>>& prompts, int64_t chunk,
                                   int64_t reps) {
  const LlamaLibrary::Api& api = lib_.api();
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  auto ctx = make_context(static_cast<int64_t>(prompts.size()), static_cast<int64_t>(longest));
  const int64_t vocab = vocab_size();
  Batch batch(api, static_cast<int32_t>(chunk));
  double best = 1e30;
  for (int64_t rep = 0; rep < reps; ++rep) {
    api.memory_clear(api.get_memory(ctx->ctx), true);
    auto t0 = Clock::now();
    // Tokens in prompt order, cut into calls of `chunk` (as engine_prefill packs them).
    size_t p = 0, t = 0;
    while (p < prompts.size()) {
      batch.clear();
      while (p < prompts.size() && batch.size() < chunk) {
        const bool last = t + 1 == prompts[p].size();
        batch.add(prompts[p][t], static_cast<int64_t>(t), static_cast<int32_t>(p), last);
        if (++t == prompts[p].size()) {
          ++p;
          t = 0;
        }
      }
      if (api.decode(ctx->ctx, batch.get()) != 0) throw std::runtime_error("llama_decode failed (prefill)");
      for (int32_t i = 0; i < batch.size(); ++i) {
        if (batch.get().logits[i]) argmax(api.get_logits_ith(ctx->ctx, i), vocab);
      }
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

EngineDecodeResult LlamaModel::decode(const EngineDecodeSpec& spec, int64_t prompt, std::mt19937& gen) {
  const LlamaLibrary::Api& api = lib_.api();
  const int64_t B = spec.batch;
  auto ctx = make_context(B, prompt + spec.warmup + spec.steps);
  const int64_t vocab = vocab_size();
  Batch batch(api, static_cast<int32_t>(std::max<int64_t>(512, B)));

  // The prompts, untimed (our engine gets random K/V instead: the same attention work).
  const auto prompts = random_token_prompts(B, prompt, vocab, gen);
  int64_t s = 0, t = 0;
  while (s < B) {
    batch.clear();
    while (s < B && batch.size() < 512) {
      batch.add(prompts[static_cast<size_t>(s)][static_cast<size_t>(t)], t, static_cast<int32_t>(s), false);
      if (++t == prompt) {
        ++s;
        t = 0;
      }
    }
    if (api.decode(ctx->ctx, batch.get()) != 0)
      throw std::runtime_error("llama_decode failed (decode prompts)");
  }

  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  for (auto& tok : tokens) tok = dist(gen);
  auto step = [&](int64_t pos, double& forward_s, double& sample_s) {
    batch.clear();
    for (int64_t b = 0; b < B; ++b)
      batch.add(tokens[static_cast<size_t>(b)], pos, static_cast<int32_t>(b), true);
    auto t0 = Clock::now();
    if (api.decode(ctx->ctx, batch.get()) != 0) throw std::runtime_error("llama_decode failed (decode)");
    auto t1 = Clock::now();
    for (int64_t b = 0; b < B; ++b)
      tokens[static_cast<size_t>(b)] = argmax(api.get_logits_ith(ctx->ctx, static_cast<int32_t>(b)), vocab);
    forward_s += std::chrono::duration<double>(t1 - t0).count();
    sample_s += std::chrono::duration<double>(Clock::now() - t1).count();
  };
  // Each pass covers the same positions: drop the previous pass's cells first.
  const EngineDecodeResult r = best_decode_pass(spec, prompt, step, [&](int64_t first) {
    api.memory_seq_rm(api.get_memory(ctx->ctx), -1, static_cast<llama_pos>(first), -1);
  });
  return r;
}

}  // namespace swarm::bench
