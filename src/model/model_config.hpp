// Hugging Face config.json / generation_config.json for the decoder-only families swarm runs:
// Llama (incl. Llama-3 rope scaling), Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm), Mistral.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace swarm {

/// The model families swarm knows how to run. Anything that shares their blocks works too.
enum class Architecture { LLAMA, QWEN2, QWEN3, MISTRAL };

/// The Hugging Face class name ("LlamaForCausalLM", ...).
const char* architecture_class_name(Architecture arch) noexcept;
/// The Hugging Face model_type ("llama", "qwen2", ...).
const char* architecture_model_type(Architecture arch) noexcept;

/// RoPE frequency scaling (config.json "rope_scaling"). yarn / longrope are rejected on load.
enum class RopeScalingType { NONE, LINEAR, DYNAMIC, LLAMA3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::NONE;
  double factor = 1.0;
  double low_freq_factor = 1.0;                  // llama3 only
  double high_freq_factor = 4.0;                 // llama3 only
  int64_t original_max_position_embeddings = 0;  // llama3 (required), dynamic (optional)

  bool operator==(const RopeScaling&) const = default;
};

/// A tensor the config implies, with its Hugging Face name and shape.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;

  int64_t numel() const;
  bool operator==(const TensorSpec&) const = default;
};

/// generation_config.json. Every field is optional: absent means "the model does not say",
/// and the caller's defaults apply.
struct GenerationConfig {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<int64_t> max_new_tokens;
  std::optional<int64_t> max_length;
  std::optional<bool> do_sample;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  std::vector<int64_t> eos_token_ids;  // "eos_token_id": int or list

  /// Parses generation_config.json text; errors name `source` and the key.
  static GenerationConfig from_json(std::string_view text,
                                    std::string_view source = "generation_config.json");
  static GenerationConfig from_file(const std::filesystem::path& path);
  std::string to_json() const;

  bool operator==(const GenerationConfig&) const = default;
};

/// The architecture hyper-parameters of a model (config.json). A plain value type.
struct ModelConfig {
  Architecture architecture = Architecture::LLAMA;
  std::string architecture_name;  // as written in the file, e.g. "Qwen2ForCausalLM"
  std::string model_type;         // "llama", "qwen2", "qwen3", "mistral"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA; = num_attention_heads when absent
  int64_t head_dim = 0;             // = hidden_size / num_attention_heads when absent
  int64_t max_position_embeddings = 0;

  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  std::string hidden_act = "silu";

  bool tie_word_embeddings = false;
  bool attention_bias = false;         // bias on q/k/v_proj (Qwen2: always)
  bool attention_output_bias = false;  // bias on o_proj (Llama/Qwen3/Mistral attention_bias; never Qwen2)
  bool mlp_bias = false;               // bias on gate/up/down_proj (Llama mlp_bias)
  bool qk_norm = false;                // per-head RMSNorm on q and k (Qwen3)
  // Sliding-window attention as transformers applies it: a windowed layer's query at position i
  // sees keys j with i - j < sliding_window. Mistral windows every layer (sliding_window 4096
  // when the key is absent, none when it is null); Qwen2/3 only with use_sliding_window, and then
  // the layers that `layer_types` names "sliding_attention", or without that list the layers
  // i >= max_window_layers (default 28). sliding_window_layers has one entry per layer when
  // sliding_window is set (possibly all false), and is empty otherwise.
  std::optional<int64_t> sliding_window;
  std::vector<bool> sliding_window_layers;

  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  std::vector<int64_t> eos_token_ids;  // "eos_token_id": int or list
  std::string torch_dtype;             // "float32", "bfloat16", ...; empty when absent

  /// generation_config.json, when the directory has one.
  std::optional<GenerationConfig> generation;

  /// Reads DIR/config.json and, when present, DIR/generation_config.json.
  /// Throws SwarmError(INVALID_ARGUMENT) naming the file and key on anything unsupported.
  static ModelConfig from_directory(const std::filesystem::path& dir);
  /// Parses config.json text; `source` names the file in error messages.
  static ModelConfig from_json(std::string_view text, std::string_view source = "config.json");
  /// A config.json that Hugging Face transformers and from_json() both accept.
  std::string to_json() const;

  /// Number of parameters implied by the shapes (tied embeddings counted once).
  int64_t parameter_count() const;
  /// Every tensor a checkpoint of this config holds, Hugging Face names, in layer order.
  /// With tied embeddings lm_head.weight is not listed (it is model.embed_tokens.weight).
  std::vector<TensorSpec> expected_tensors() const;
  /// The attention window of layer `layer` (nullopt: it attends to the whole prefix).
  std::optional<int64_t> layer_window(int64_t layer) const {
    if (!sliding_window || layer < 0 || layer >= static_cast<int64_t>(sliding_window_layers.size()) ||
        !sliding_window_layers[static_cast<size_t>(layer)]) {
      return std::nullopt;
    }
    return sliding_window;
  }
  /// Whether any layer attends within a window.
  bool any_layer_windowed() const {
    for (bool w : sliding_window_layers) {
      if (w) return sliding_window.has_value();
    }
    return false;
  }
  /// Token ids that end generation: config.json's and generation_config.json's, deduplicated.
  std::vector<int64_t> stop_token_ids() const;

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace swarm
