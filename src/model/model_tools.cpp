#include "model/model_tools.hpp"

#include "common/random.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_nesting.hpp"
#include "model/file_io.hpp"

namespace swarm {

namespace {

using ordered_json = nlohmann::ordered_json;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// xoshiro256** (src/common/random.hpp): std::normal_distribution is not reproducible
// across standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  // Uniform in (0, 1].
  double uniform() { return static_cast<double>((gen_.next() >> 11) + 1) * 0x1.0p-53; }

 private:
  Xoshiro256 gen_;
};

// Box-Muller, both outputs used.
void fill_normal(std::vector<float>& out, double stddev, uint64_t seed) {
  Rng rng(seed);
  constexpr double kTwoPi = 6.283185307179586476925;
  for (size_t i = 0; i < out.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(rng.uniform())) * stddev;
    const double theta = kTwoPi * rng.uniform();
    out[i] = static_cast<float>(r * std::cos(theta));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(r * std::sin(theta));
  }
}

void store(const std::vector<float>& values, DType dtype, std::span<std::byte> dst) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst.data(), values.data(), values.size() * 4);
      return;
    case DType::BF16:
    case DType::F16:
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t h = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
        std::memcpy(dst.data() + 2 * i, &h, 2);
      }
      return;
    case DType::F64:
      for (size_t i = 0; i < values.size(); ++i) {
        double d = values[i];
        std::memcpy(dst.data() + 8 * i, &d, 8);
      }
      return;
    default:
      SWARM_CHECK(false, std::string("random init into ") + dtype_name(dtype));
  }
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string human_count(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) {
    n /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.1f%s", n, units[u]);
  return buf;
}

const char* rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::NONE:
      return "none";
    case RopeScalingType::LINEAR:
      return "linear";
    case RopeScalingType::DYNAMIC:
      return "dynamic";
    case RopeScalingType::LLAMA3:
      return "llama3";
  }
  return "?";
}

const char* torch_dtype_name(DType d) {
  switch (d) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    case DType::F64:
      return "float64";
    default:
      return "";
  }
}

void copy_model_file(const std::filesystem::path& from, const std::filesystem::path& to) {
  write_text_file_atomic(to, read_text_file(from));
}

// ------------------------------------------------------------------ presets

// A preset: config.json plus the files that go beside it (tokenizer, generation config).
struct Preset {
  ordered_json config;
  std::vector<std::pair<std::string, std::string>> files;  // name, content
};

// Short on purpose: every character of a rendered prompt is a token of a tiny context.
// Any role but system and assistant is shown as a user turn (tool results included).
constexpr const char* kTinyCharChatTemplate =
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>{% elif message['role'] == 'assistant' %}<|assistant|>"
    "{% else %}<|user|>{% endif %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

Preset tiny_char_preset() {
  // Ids: the special tokens first, then tab, newline and printable ASCII (space .. '~').
  const std::vector<std::string> specials = {"<unk>",      "<|pad|>",  "<|bos|>",      "<|eos|>",
                                             "<|system|>", "<|user|>", "<|assistant|>"};
  std::vector<std::string> chars = {"\t", "\n"};
  for (int c = 0x20; c <= 0x7E; ++c) chars.emplace_back(1, static_cast<char>(c));

  ordered_json vocab = ordered_json::object();
  ordered_json added = ordered_json::array();
  int64_t id = 0;
  for (const auto& t : specials) {
    added.push_back({{"id", id},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    vocab[t] = id++;
  }
  for (const auto& c : chars) vocab[c] = id++;
  const int64_t vocab_size = id;
  const auto id_of = [&](const std::string& t) { return vocab[t].get<int64_t>(); };

  // A BPE model without merges is a character-level tokenizer; no pre-tokenizer or normalizer
  // (spaces are tokens like any other character) and a Fuse decoder (tokens are concatenated).
  ordered_json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", {{"type", "Fuse"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", ordered_json::array()}}},
  };

  ModelConfig c;
  c.architecture = Architecture::LLAMA;
  c.vocab_size = vocab_size;
  c.hidden_size = 128;
  c.intermediate_size = 512;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.max_position_embeddings = 256;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.initializer_range = 0.02;
  c.tie_word_embeddings = true;
  c.bos_token_id = id_of("<|bos|>");
  c.eos_token_ids = {id_of("<|eos|>")};
  c.pad_token_id = id_of("<|pad|>");

  ordered_json added_decoder = ordered_json::object();
  for (const auto& a : added)
    added_decoder[std::to_string(a["id"].get<int64_t>())] = {{"content", a["content"]}, {"lstrip", false},
                                                             {"normalized", false},     {"rstrip", false},
                                                             {"single_word", false},    {"special", true}};
  ordered_json tokenizer_config = {
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"added_tokens_decoder", added_decoder},
      {"bos_token", "<|bos|>"},
      {"eos_token", "<|eos|>"},
      {"pad_token", "<|pad|>"},
      {"unk_token", "<unk>"},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", c.max_position_embeddings},
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"chat_template", kTinyCharChatTemplate},
  };

  GenerationConfig g;
  g.bos_token_id = c.bos_token_id;
  g.eos_token_ids = c.eos_token_ids;
  g.pad_token_id = c.pad_token_id;

  Preset p;
  p.config = ordered_json::parse(c.to_json());
  p.files = {{"tokenizer.json", tokenizer.dump(2) + "\n"},
             {"tokenizer_config.json", tokenizer_config.dump(2) + "\n"},
             {"generation_config.json", g.to_json()}};
  return p;
}

Preset make_preset(const std::string& name) {
  if (name == "tiny-char") return tiny_char_preset();
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "init: unknown preset '" + name + "' (known: " + known + ")");
}

}  // namespace

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = {"tiny-char"};
  return names;
}

std::vector<TensorSource> random_init_tensors(const ModelConfig& config, uint64_t seed, DType dtype) {
  if (!dtype_is_floating(dtype)) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     std::string("random weights need a floating-point dtype, not ") + dtype_name(dtype));
  }
  std::vector<TensorSource> out;
  for (const auto& spec : config.expected_tensors()) {
    const bool is_norm = spec.name.ends_with("norm.weight");  // *_layernorm, model.norm, q_norm, k_norm
    const bool is_bias = spec.name.ends_with(".bias");
    const double stddev = config.initializer_range;
    uint64_t state = seed ^ fnv1a(spec.name);
    const uint64_t tensor_seed = splitmix64(state);
    const size_t numel = static_cast<size_t>(spec.numel());
    out.push_back(TensorSource{spec.name, dtype, spec.shape, [=](std::span<std::byte> dst) {
                                 std::vector<float> values(numel, is_norm ? 1.0f : 0.0f);
                                 if (!is_norm && !is_bias) fill_normal(values, stddev, tensor_seed);
                                 store(values, dtype, dst);
                               }});
  }
  return out;
}

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {
      "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
      "chat_template.jinja", "tokenizer.model",       "vocab.json",
      "merges.txt",          "added_tokens.json",
  };
  return names;
}

ModelWriteResult init_random_model(const InitModelOptions& options) {
  const bool from_preset = !options.preset.empty();
  if (from_preset == !options.from.empty())
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     from_preset ? "init: give either --from or --preset, not both"
                                 : "init: give --from DIR (a directory with config.json) or --preset NAME");
  std::optional<Preset> preset;
  ordered_json raw;
  if (from_preset) {
    preset = make_preset(options.preset);
    raw = preset->config;
  } else {
    const std::string text = read_text_file(options.from / "config.json");
    require_json_nesting(text, (options.from / "config.json").string());
    raw = ordered_json::parse(text, nullptr, false);
    if (raw.is_discarded() || !raw.is_object())
      throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                       "init: " + (options.from / "config.json").string() + " is not a JSON object");
  }
  const std::string config_source =
      from_preset ? "preset " + options.preset + " config.json" : (options.from / "config.json").string();
  for (const auto& [key, value] : options.config_overrides) {
    require_json_nesting(value, "--config " + key);
    ordered_json v = ordered_json::parse(value, nullptr, false);
    if (v.is_discarded()) v = value;  // not JSON: a plain string
    raw[key] = std::move(v);
  }
  // Overriding the width without head_dim would keep a stale head_dim: derive it again.
  if (raw.contains("head_dim") &&
      std::none_of(options.config_overrides.begin(), options.config_overrides.end(),
                   [](const auto& kv) { return kv.first == "head_dim"; }) &&
      std::any_of(options.config_overrides.begin(), options.config_overrides.end(), [](const auto& kv) {
        return kv.first == "hidden_size" || kv.first == "num_attention_heads";
      }))
    raw.erase("head_dim");
  const ModelConfig config = ModelConfig::from_json(raw.dump(), config_source);
  std::error_code ec;
  if (!from_preset && std::filesystem::exists(options.out) &&
      std::filesystem::equivalent(options.from, options.out, ec)) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     "init: --out must differ from --from (" + options.out.string() + ")");
  }
  std::filesystem::create_directories(options.out, ec);
  if (ec) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     "init: cannot create " + options.out.string() + ": " + ec.message());
  }

  // config.json as shipped (unknown keys kept) plus the overrides, with torch_dtype saying
  // what the weights are.
  raw["torch_dtype"] = torch_dtype_name(options.dtype);
  write_text_file_atomic(options.out / "config.json", raw.dump(2) + "\n");

  if (from_preset) {
    for (const auto& [name, content] : preset->files) write_text_file_atomic(options.out / name, content);
  } else if (std::filesystem::is_regular_file(options.from / "generation_config.json")) {
    copy_model_file(options.from / "generation_config.json", options.out / "generation_config.json");
  } else {
    GenerationConfig g;  // what transformers derives from config.json
    g.bos_token_id = config.bos_token_id;
    g.eos_token_ids = config.eos_token_ids;
    g.pad_token_id = config.pad_token_id;
    write_text_file_atomic(options.out / "generation_config.json", g.to_json());
  }
  for (const auto& name : tokenizer_file_names()) {
    if (!from_preset && std::filesystem::is_regular_file(options.from / name))
      copy_model_file(options.from / name, options.out / name);
  }

  const std::vector<TensorSource> tensors = random_init_tensors(config, options.seed, options.dtype);
  ModelWriteResult result = write_safetensors_model(options.out, tensors, options.max_shard_bytes);
  SafetensorsModel::open(options.out).validate_against(config);
  return result;
}

std::string inspect_model(const std::filesystem::path& dir) {
  const ModelConfig c = ModelConfig::from_directory(dir);
  ordered_json j;
  j["path"] = dir.string();
  j["architecture"] = c.architecture_name;
  j["model_type"] = c.model_type;
  j["layers"] = c.num_hidden_layers;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["attention_heads"] = c.num_attention_heads;
  j["kv_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = rope_scaling_name(c.rope_scaling.type);
  if (c.rope_scaling.type != RopeScalingType::NONE) j["rope_scaling_factor"] = c.rope_scaling.factor;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["qk_norm"] = c.qk_norm;
  j["sliding_window"] = c.sliding_window ? ordered_json(*c.sliding_window) : ordered_json(nullptr);
  ordered_json windowed = ordered_json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.layer_window(l)) windowed.push_back(l);
  }
  j["sliding_window_layers"] = windowed;
  j["config_torch_dtype"] = c.torch_dtype;
  j["stop_token_ids"] = c.stop_token_ids();

  const int64_t params = c.parameter_count();
  j["parameters_from_config"] = params;
  j["parameters_from_config_human"] = human_count(static_cast<double>(params));

  const bool has_weights = std::filesystem::is_regular_file(dir / "model.safetensors") ||
                           std::filesystem::is_regular_file(dir / "model.safetensors.index.json");
  if (has_weights) {
    const SafetensorsModel model = SafetensorsModel::open(dir);
    int64_t stored = 0;
    std::map<std::string, int64_t> dtypes;
    for (const auto& name : model.names()) {
      const TensorView& t = model.at(name);
      stored += t.numel();
      dtypes[dtype_name(t.dtype)] += 1;
    }
    ordered_json files = ordered_json::array();
    for (const auto& f : model.files()) files.push_back(f->path().filename().string());
    j["parameters_from_tensors"] = stored;
    j["tensors"] = model.size();
    j["tensor_aliases"] = model.aliases();
    j["weight_files"] = files;
    j["dtypes"] = dtypes;
    j["bytes_on_disk"] = model.file_bytes();
    j["bytes_on_disk_human"] = human_bytes(static_cast<double>(model.file_bytes()));
    const std::vector<std::string> problems = model.check_against(c);
    j["tensors_match_config"] = problems.empty();
    if (!problems.empty()) j["problems"] = problems;
  } else {
    j["weights"] = "none (no model.safetensors or model.safetensors.index.json)";
    j["tensors_match_config"] = false;
  }
  j["memory_fp32"] = human_bytes(static_cast<double>(params) * 4);
  j["memory_bf16"] = human_bytes(static_cast<double>(params) * 2);

  ordered_json tokenizer = ordered_json::array();
  for (const auto& name : tokenizer_file_names()) {
    if (std::filesystem::is_regular_file(dir / name)) tokenizer.push_back(name);
  }
  j["tokenizer_files"] = tokenizer;
  return j.dump(2);
}

}  // namespace swarm
