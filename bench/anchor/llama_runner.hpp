// llama.cpp, loaded at run time (dlopen) from node-llama-cpp's prebuilt linux-x64 CPU build,
// driven the way bench_anchor drives our engine: greedy ids of one prompt, chunked prefill of
// several prompts, batched decode (one token per sequence per llama_decode). The function
// types come from the llama.h that prepare.sh extracted from the same release, so this file
// is compiled only when CMake found those headers (SWARM_ANCHOR_WITH_LLAMA).
// Not thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "anchor/gguf_writer.hpp"
#include "common/engine_runs.hpp"

namespace swarm::bench {

/// libllama and its ggml backends, opened once per process and never closed (ggml keeps
/// global state).
class LlamaLibrary {
 public:
  struct Api;

  /// Opens libllama*.so in `dir` and loads the best ggml CPU backend variant there, or the one
  /// named (`cpu_variant`: "haswell" loads libggml-cpu-haswell.so). Throws std::runtime_error
  /// naming the file or symbol on failure.
  static const LlamaLibrary& open(const std::filesystem::path& dir, const std::string& cpu_variant = "");

  const Api& api() const { return *api_; }
  const std::filesystem::path& path() const { return path_; }
  /// llama_print_system_info(): the CPU features the loaded backend uses.
  std::string system_info() const;

  LlamaLibrary(std::filesystem::path path, std::unique_ptr<Api> api);
  ~LlamaLibrary();

 private:
  std::filesystem::path path_;
  std::unique_ptr<Api> api_;
};

/// One GGUF model in llama.cpp on the CPU with `threads` threads (generation and batch), a
/// context per case: non-unified KV cache, one stream per sequence, K/V stored as the weights'
/// type (F32 / F16 / BF16, like our engine's cache in its compute dtype).
class LlamaModel {
 public:
  LlamaModel(const LlamaLibrary& lib, const std::filesystem::path& gguf, GgufTensorType type, int threads);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  int64_t vocab_size() const;
  /// Greedy continuation of `prompt` by `new_tokens` tokens (argmax, ties to the lowest id).
  std::vector<int32_t> greedy_ids(const std::vector<int32_t>& prompt, int64_t new_tokens);
  /// Best of `reps` seconds to prefill `prompts` (one sequence each) in llama_decode calls of
  /// at most `chunk` tokens, the first token of each prompt picked greedily.
  double prefill_seconds(const std::vector<std::vector<int32_t>>& prompts, int64_t chunk, int64_t reps);
  /// `spec.batch` sequences, each first prefilled with `prompt` random tokens (untimed), then
  /// decoded greedily one token per sequence per llama_decode.
  EngineDecodeResult decode(const EngineDecodeSpec& spec, int64_t prompt, std::mt19937& gen);

 private:
  struct Context;
  std::unique_ptr<Context> make_context(int64_t sequences, int64_t tokens_per_sequence) const;

  const LlamaLibrary& lib_;
  GgufTensorType type_;
  int threads_;
  void* model_ = nullptr;  // llama_model*
};

}  // namespace swarm::bench
