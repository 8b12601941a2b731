// Whole-model-directory operations behind the swarm-model tool: inspect a Hugging Face model
// directory, and create one with deterministic random weights (benchmarks, tests).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "model/model_config.hpp"
#include "model/safetensors.hpp"

namespace swarm {

/// Random weights for every tensor of `config`, generated while writing: matrices (and the
/// embedding) ~ normal(0, config.initializer_range), norm weights = 1, biases = 0. Each tensor
/// has its own stream seeded from (seed, tensor name), so the bytes do not depend on order
/// or sharding: the same seed gives identical files. `dtype` must be floating-point.
std::vector<TensorSource> random_init_tensors(const ModelConfig& config, uint64_t seed, DType dtype);

/// The tokenizer / chat-template files a model directory may carry (copied by init).
const std::vector<std::string>& tokenizer_file_names();

/// Built-in model presets for `init --preset` (a config plus generated tokenizer files):
///   tiny-char  a ~1M-parameter Llama (4 layers x 128 wide) with a character-level tokenizer:
///              every printable ASCII character, tab and newline is one token (a BPE vocabulary
///              of single characters and no merges), <unk> for anything else, the special tokens
///              <|pad|> <|bos|> <|eos|> <|system|> <|user|> <|assistant|>, and a short chat
///              template "<|bos|><|user|>text<|assistant|>" (replies end with <|eos|>), so a
///              prompt costs a few tokens. For learning tests that start from random weights.
const std::vector<std::string>& model_preset_names();

struct InitModelOptions {
  std::filesystem::path from;  // a directory with config.json (weights not needed); or
  std::string preset;          // a built-in preset (model_preset_names()): exactly one of the two
  std::filesystem::path out;   // created if needed; must differ from `from`
  uint64_t seed = 0;
  DType dtype = DType::BF16;
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  /// config.json keys to replace (or add) before anything is derived from it, e.g.
  /// {"hidden_size": 64, "num_hidden_layers": 2}: a small model of a real family's layout.
  std::vector<std::pair<std::string, std::string>> config_overrides;  // key, JSON value
};

/// Writes a loadable Hugging Face model directory: config.json (from's or the preset's, with
/// torch_dtype set to `dtype`), generation_config.json (copied, or derived from config.json),
/// the tokenizer files `from` has (or the preset generates), and random weights (sharded above
/// max_shard_bytes). Validates the result against the config before returning. Throws
/// SwarmError(INVALID_ARGUMENT) when both or neither of `from` / `preset` are given, or the
/// preset is unknown.
ModelWriteResult init_random_model(const InitModelOptions& options);

/// A human-readable JSON summary of a model directory: architecture and sizes, parameter
/// count from the config and from the stored tensors, dtypes, bytes on disk, memory
/// estimates, tokenizer files, and whether the tensors match the config (with the problems).
/// Works without weights too (then reports that none were found).
std::string inspect_model(const std::filesystem::path& dir);

}  // namespace swarm
