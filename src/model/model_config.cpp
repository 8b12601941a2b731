#include "model/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_nesting.hpp"
#include "model/file_io.hpp"

namespace swarm {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

[[noreturn]] void fail(std::string_view source, const std::string& message) {
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string(source) + ": " + message);
}

json parse_object(std::string_view text, std::string_view source) {
  require_json_nesting(text, source);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(source, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(source, std::string("expected a JSON object, got ") + j.type_name());
  return j;
}

// Typed access to the keys of one JSON object; every error names the file and the key.
// A key that is absent or null counts as "not set", as in Hugging Face configs.
class KeyReader {
 public:
  KeyReader(const json& obj, std::string_view source, std::string prefix = "")
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  const json* get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const char* key) const { return get(key) != nullptr; }
  // Present at all, null included (transformers tells a null sliding_window from an absent one).
  bool present(const char* key) const { return obj_.contains(key); }

  std::optional<int64_t> opt_int(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    return to_int(*v, key);
  }
  int64_t req_int(const char* key) const {
    auto v = opt_int(key);
    if (!v) fail(source_, "missing required key '" + name(key) + "'");
    return *v;
  }
  std::optional<double> opt_double(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) type_error(key, "a number", *v);
    double d = v->get<double>();
    if (!std::isfinite(d)) fail(source_, "key '" + name(key) + "' must be finite");
    return d;
  }
  std::optional<bool> opt_bool(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) type_error(key, "a boolean", *v);
    return v->get<bool>();
  }
  std::optional<std::string> opt_string(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) type_error(key, "a string", *v);
    return v->get<std::string>();
  }
  // "eos_token_id": 2 or [2, 7]
  std::vector<int64_t> int_or_list(const char* key) const {
    const json* v = get(key);
    if (!v) return {};
    if (v->is_array()) {
      std::vector<int64_t> out;
      for (const auto& e : *v) out.push_back(to_int(e, key));
      return out;
    }
    return {to_int(*v, key)};
  }

  std::string name(const char* key) const { return prefix_ + key; }

  [[noreturn]] void type_error(const char* key, const char* expected, const json& got) const {
    fail(source_,
         "key '" + name(key) + "' must be " + expected + ", got " + got.type_name() + " " + got.dump());
  }

 private:
  int64_t to_int(const json& v, const char* key) const {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(source_, "key '" + name(key) + "' is out of range: " + v.dump());
      }
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {  // some exporters write 32768.0
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    type_error(key, "an integer", v);
  }

  const json& obj_;
  std::string_view source_;
  std::string prefix_;
};

struct ArchInfo {
  Architecture arch;
  const char* class_name;
  const char* model_type;
  int64_t default_max_positions;
};

constexpr ArchInfo kArchitectures[] = {
    {Architecture::LLAMA, "LlamaForCausalLM", "llama", 2048},
    {Architecture::QWEN2, "Qwen2ForCausalLM", "qwen2", 32768},
    {Architecture::QWEN3, "Qwen3ForCausalLM", "qwen3", 32768},
    {Architecture::MISTRAL, "MistralForCausalLM", "mistral", int64_t{4096} * 32},
};

const ArchInfo& info_of(Architecture arch) {
  for (const auto& a : kArchitectures) {
    if (a.arch == arch) return a;
  }
  return kArchitectures[0];
}

std::string supported_list(bool class_names) {
  std::string out;
  for (const auto& a : kArchitectures) {
    if (!out.empty()) out += ", ";
    out += class_names ? a.class_name : a.model_type;
  }
  return out;
}

const ArchInfo& detect_architecture(const KeyReader& r, std::string_view source) {
  if (const json* archs = r.get("architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      r.type_error("architectures", "a non-empty list of class names", *archs);
    }
    std::string name = (*archs)[0].get<std::string>();
    for (const auto& a : kArchitectures) {
      if (name == a.class_name) return a;
    }
    fail(source, "unsupported architecture '" + name + "' (supported: " + supported_list(true) + ")");
  }
  if (auto type = r.opt_string("model_type")) {
    for (const auto& a : kArchitectures) {
      if (*type == a.model_type) return a;
    }
    fail(source, "unsupported model_type '" + *type + "' (supported: " + supported_list(false) + ")");
  }
  fail(source, "neither 'architectures' nor 'model_type' is set; cannot tell the model family");
}

RopeScaling parse_rope_scaling(const json& rs, const std::string& key, std::string_view source) {
  RopeScaling out;
  if (!rs.is_object()) {
    fail(source, "key '" + key + "' must be an object or null, got " + rs.type_name());
  }
  KeyReader r(rs, source, key + ".");
  std::optional<std::string> type = r.opt_string("rope_type");
  if (!type) type = r.opt_string("type");
  if (!type) fail(source, "key '" + key + "' has no 'rope_type' (or 'type')");
  auto need_double = [&](const char* k) {
    auto v = r.opt_double(k);
    if (!v) fail(source, "rope scaling '" + *type + "' needs key '" + r.name(k) + "'");
    return *v;
  };
  if (*type == "default") return out;
  if (*type == "linear" || *type == "dynamic") {
    out.type = *type == "linear" ? RopeScalingType::LINEAR : RopeScalingType::DYNAMIC;
    out.factor = need_double("factor");
    out.original_max_position_embeddings = r.opt_int("original_max_position_embeddings").value_or(0);
  } else if (*type == "llama3") {
    out.type = RopeScalingType::LLAMA3;
    out.factor = need_double("factor");
    out.low_freq_factor = need_double("low_freq_factor");
    out.high_freq_factor = need_double("high_freq_factor");
    auto orig = r.opt_int("original_max_position_embeddings");
    if (!orig)
      fail(source, "rope scaling 'llama3' needs key '" + r.name("original_max_position_embeddings") + "'");
    out.original_max_position_embeddings = *orig;
    if (out.original_max_position_embeddings <= 0) {
      fail(source, "key '" + r.name("original_max_position_embeddings") + "' must be positive");
    }
    if (!(out.high_freq_factor > out.low_freq_factor)) {
      fail(source, "key '" + r.name("high_freq_factor") + "' must be greater than low_freq_factor");
    }
  } else {
    fail(source, "unsupported rope scaling type '" + *type + "' in key '" + key +
                     "' (supported: linear, dynamic, llama3)");
  }
  if (!(out.factor > 0)) fail(source, "key '" + r.name("factor") + "' must be positive");
  return out;
}

void require_positive(std::string_view source, const char* key, int64_t value) {
  if (value <= 0)
    fail(source, "key '" + std::string(key) + "' must be positive, got " + std::to_string(value));
}

ordered_json ids_to_json(const std::vector<int64_t>& ids) {
  if (ids.size() == 1) return ids[0];
  return ordered_json(ids);
}

}  // namespace

const char* architecture_class_name(Architecture arch) noexcept { return info_of(arch).class_name; }
const char* architecture_model_type(Architecture arch) noexcept { return info_of(arch).model_type; }

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------- GenerationConfig

GenerationConfig GenerationConfig::from_json(std::string_view text, std::string_view source) {
  json j = parse_object(text, source);
  KeyReader r(j, source);
  GenerationConfig g;
  g.temperature = r.opt_double("temperature");
  g.top_p = r.opt_double("top_p");
  g.top_k = r.opt_int("top_k");
  g.max_new_tokens = r.opt_int("max_new_tokens");
  g.max_length = r.opt_int("max_length");
  g.do_sample = r.opt_bool("do_sample");
  g.bos_token_id = r.opt_int("bos_token_id");
  g.pad_token_id = r.opt_int("pad_token_id");
  g.eos_token_ids = r.int_or_list("eos_token_id");
  if (g.temperature && *g.temperature < 0) fail(source, "key 'temperature' must be >= 0");
  if (g.top_p && (*g.top_p <= 0 || *g.top_p > 1)) fail(source, "key 'top_p' must be in (0, 1]");
  if (g.top_k && *g.top_k < 0) fail(source, "key 'top_k' must be >= 0");
  if (g.max_new_tokens && *g.max_new_tokens <= 0) fail(source, "key 'max_new_tokens' must be positive");
  return g;
}

GenerationConfig GenerationConfig::from_file(const std::filesystem::path& path) {
  return from_json(read_text_file(path), path.string());
}

std::string GenerationConfig::to_json() const {
  ordered_json j = ordered_json::object();
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (!eos_token_ids.empty()) j["eos_token_id"] = ids_to_json(eos_token_ids);
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  if (do_sample) j["do_sample"] = *do_sample;
  if (temperature) j["temperature"] = *temperature;
  if (top_p) j["top_p"] = *top_p;
  if (top_k) j["top_k"] = *top_k;
  if (max_new_tokens) j["max_new_tokens"] = *max_new_tokens;
  if (max_length) j["max_length"] = *max_length;
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------- ModelConfig

ModelConfig ModelConfig::from_json(std::string_view text, std::string_view source) {
  json j = parse_object(text, source);
  KeyReader r(j, source);
  ModelConfig c;

  const ArchInfo& arch = detect_architecture(r, source);
  c.architecture = arch.arch;
  c.architecture_name = arch.class_name;
  c.model_type = r.opt_string("model_type").value_or(arch.model_type);

  c.vocab_size = r.req_int("vocab_size");
  c.hidden_size = r.req_int("hidden_size");
  c.intermediate_size = r.req_int("intermediate_size");
  c.num_hidden_layers = r.req_int("num_hidden_layers");
  c.num_attention_heads = r.req_int("num_attention_heads");
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    require_positive(source, key, *r.opt_int(key));
  }
  c.num_key_value_heads = r.opt_int("num_key_value_heads").value_or(c.num_attention_heads);
  require_positive(source, "num_key_value_heads", c.num_key_value_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    fail(source, "key 'num_attention_heads' (" + std::to_string(c.num_attention_heads) +
                     ") must be a multiple of 'num_key_value_heads' (" +
                     std::to_string(c.num_key_value_heads) + ")");
  }
  if (auto hd = r.opt_int("head_dim")) {
    c.head_dim = *hd;
    require_positive(source, "head_dim", c.head_dim);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      fail(source, "key 'hidden_size' (" + std::to_string(c.hidden_size) +
                       ") is not a multiple of 'num_attention_heads' and no 'head_dim' is given");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = r.opt_int("max_position_embeddings").value_or(arch.default_max_positions);
  require_positive(source, "max_position_embeddings", c.max_position_embeddings);

  // Newer transformers nest rope settings in "rope_parameters"; older ones use rope_theta +
  // rope_scaling at the top level.
  const json* rope_params = r.get("rope_parameters");
  if (auto theta = r.opt_double("rope_theta")) {
    c.rope_theta = *theta;
  } else if (rope_params && rope_params->is_object()) {
    KeyReader rp(*rope_params, source, "rope_parameters.");
    c.rope_theta = rp.opt_double("rope_theta").value_or(c.rope_theta);
  }
  if (!(c.rope_theta > 0)) fail(source, "key 'rope_theta' must be positive");
  if (const json* rs = r.get("rope_scaling")) {
    c.rope_scaling = parse_rope_scaling(*rs, "rope_scaling", source);
  } else if (rope_params) {
    c.rope_scaling = parse_rope_scaling(*rope_params, "rope_parameters", source);
  }

  c.rms_norm_eps = r.opt_double("rms_norm_eps").value_or(1e-6);
  if (!(c.rms_norm_eps > 0)) fail(source, "key 'rms_norm_eps' must be positive");
  c.initializer_range = r.opt_double("initializer_range").value_or(0.02);
  if (!(c.initializer_range >= 0)) fail(source, "key 'initializer_range' must be >= 0");
  c.hidden_act = r.opt_string("hidden_act").value_or("silu");
  if (c.hidden_act != "silu") {
    fail(source, "unsupported hidden_act '" + c.hidden_act + "' (supported: silu)");
  }

  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings").value_or(false);
  bool attention_bias = r.opt_bool("attention_bias").value_or(false);
  switch (c.architecture) {
    case Architecture::QWEN2:  // Qwen2Attention: q/k/v always biased, o never
      c.attention_bias = true;
      c.attention_output_bias = false;
      break;
    case Architecture::LLAMA:
    case Architecture::QWEN3:
    case Architecture::MISTRAL:
      c.attention_bias = attention_bias;
      c.attention_output_bias = attention_bias;
      break;
  }
  c.mlp_bias = c.architecture == Architecture::LLAMA && r.opt_bool("mlp_bias").value_or(false);
  c.qk_norm = c.architecture == Architecture::QWEN3;

  // Sliding windows as transformers' configs and attention layers apply them (see the field's
  // comment in model_config.hpp). An absent sliding_window is the config class's default, 4096;
  // a null one is none.
  constexpr int64_t kDefaultSlidingWindow = 4096;
  const std::optional<int64_t> window = r.present("sliding_window")
                                            ? r.opt_int("sliding_window")
                                            : std::optional<int64_t>(kDefaultSlidingWindow);
  if (c.architecture == Architecture::MISTRAL) {
    c.sliding_window = window;
    if (c.sliding_window) c.sliding_window_layers.assign(static_cast<size_t>(c.num_hidden_layers), true);
  } else if (c.architecture == Architecture::QWEN2 || c.architecture == Architecture::QWEN3) {
    const bool use = r.opt_bool("use_sliding_window").value_or(false);
    const int64_t max_window_layers = r.opt_int("max_window_layers").value_or(28);
    if (max_window_layers < 0) fail(source, "key 'max_window_layers' must be >= 0");
    std::vector<bool> layers(static_cast<size_t>(c.num_hidden_layers), false);
    if (const json* types = r.get("layer_types")) {
      if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_hidden_layers) {
        fail(source, "key 'layer_types' must be a list of num_hidden_layers (" +
                         std::to_string(c.num_hidden_layers) + ") entries, got " + types->dump());
      }
      for (size_t l = 0; l < types->size(); ++l) {
        const json& t = (*types)[l];
        if (t == "sliding_attention") {
          layers[l] = true;
        } else if (t != "full_attention") {
          fail(source, "key 'layer_types' entry " + std::to_string(l) +
                           " must be \"full_attention\" or \"sliding_attention\", got " + t.dump());
        }
      }
    } else {
      for (int64_t l = max_window_layers; l < c.num_hidden_layers; ++l) layers[static_cast<size_t>(l)] = true;
    }
    if (use && window) {
      c.sliding_window = window;
      c.sliding_window_layers = std::move(layers);
    }
  }
  if (c.sliding_window) require_positive(source, "sliding_window", *c.sliding_window);

  c.bos_token_id = r.opt_int("bos_token_id");
  c.pad_token_id = r.opt_int("pad_token_id");
  c.eos_token_ids = r.int_or_list("eos_token_id");
  if (auto dt = r.opt_string("torch_dtype")) {
    c.torch_dtype = *dt;
  } else if (auto dt2 = r.opt_string("dtype")) {
    c.torch_dtype = *dt2;
  }
  return c;
}

ModelConfig ModelConfig::from_directory(const std::filesystem::path& dir) {
  std::filesystem::path config_path = dir / "config.json";
  if (!std::filesystem::is_regular_file(config_path)) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, config_path.string() + ": not found (is " + dir.string() +
                                                      " a Hugging Face model directory?)");
  }
  ModelConfig c = from_json(read_text_file(config_path), config_path.string());
  std::filesystem::path gen_path = dir / "generation_config.json";
  if (std::filesystem::is_regular_file(gen_path)) c.generation = GenerationConfig::from_file(gen_path);
  return c;
}

std::string ModelConfig::to_json() const {
  ordered_json j = ordered_json::object();
  j["architectures"] = {architecture_name.empty() ? architecture_class_name(architecture)
                                                  : architecture_name};
  j["model_type"] = model_type.empty() ? architecture_model_type(architecture) : model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  switch (rope_scaling.type) {
    case RopeScalingType::NONE:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScalingType::LINEAR:
    case RopeScalingType::DYNAMIC: {
      ordered_json rs;
      rs["rope_type"] = rope_scaling.type == RopeScalingType::LINEAR ? "linear" : "dynamic";
      rs["factor"] = rope_scaling.factor;
      if (rope_scaling.original_max_position_embeddings > 0) {
        rs["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
      }
      j["rope_scaling"] = rs;
      break;
    }
    case RopeScalingType::LLAMA3: {
      ordered_json rs;
      rs["rope_type"] = "llama3";
      rs["factor"] = rope_scaling.factor;
      rs["low_freq_factor"] = rope_scaling.low_freq_factor;
      rs["high_freq_factor"] = rope_scaling.high_freq_factor;
      rs["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
      j["rope_scaling"] = rs;
      break;
    }
  }
  j["rms_norm_eps"] = rms_norm_eps;
  j["initializer_range"] = initializer_range;
  j["hidden_act"] = hidden_act;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (architecture != Architecture::QWEN2) j["attention_bias"] = attention_bias;
  if (architecture == Architecture::LLAMA) j["mlp_bias"] = mlp_bias;
  if (architecture == Architecture::MISTRAL) {
    j["sliding_window"] = sliding_window ? ordered_json(*sliding_window) : ordered_json(nullptr);
  } else if (architecture == Architecture::QWEN2 || architecture == Architecture::QWEN3) {
    j["use_sliding_window"] = sliding_window.has_value();
    j["sliding_window"] = sliding_window ? ordered_json(*sliding_window) : ordered_json(nullptr);
    if (sliding_window) {  // which layers, explicitly (transformers reads layer_types first)
      ordered_json types = ordered_json::array();
      for (bool w : sliding_window_layers) types.push_back(w ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
    }
  }
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (!eos_token_ids.empty()) j["eos_token_id"] = ids_to_json(eos_token_ids);
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

std::vector<TensorSpec> ModelConfig::expected_tensors() const {
  const int64_t q_dim = num_attention_heads * head_dim;
  const int64_t kv_dim = num_key_value_heads * head_dim;
  std::vector<TensorSpec> out;
  out.reserve(static_cast<size_t>(num_hidden_layers) * 16 + 3);
  out.push_back({"model.embed_tokens.weight", {vocab_size, hidden_size}});
  for (int64_t i = 0; i < num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto linear = [&](const std::string& name, int64_t out_dim, int64_t in_dim, bool bias) {
      out.push_back({p + name + ".weight", {out_dim, in_dim}});
      if (bias) out.push_back({p + name + ".bias", {out_dim}});
    };
    linear("self_attn.q_proj", q_dim, hidden_size, attention_bias);
    linear("self_attn.k_proj", kv_dim, hidden_size, attention_bias);
    linear("self_attn.v_proj", kv_dim, hidden_size, attention_bias);
    linear("self_attn.o_proj", hidden_size, q_dim, attention_output_bias);
    if (qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {head_dim}});
    }
    linear("mlp.gate_proj", intermediate_size, hidden_size, mlp_bias);
    linear("mlp.up_proj", intermediate_size, hidden_size, mlp_bias);
    linear("mlp.down_proj", hidden_size, intermediate_size, mlp_bias);
    out.push_back({p + "input_layernorm.weight", {hidden_size}});
    out.push_back({p + "post_attention_layernorm.weight", {hidden_size}});
  }
  out.push_back({"model.norm.weight", {hidden_size}});
  if (!tie_word_embeddings) out.push_back({"lm_head.weight", {vocab_size, hidden_size}});
  return out;
}

int64_t ModelConfig::parameter_count() const {
  int64_t n = 0;
  for (const auto& t : expected_tensors()) n += t.numel();
  return n;
}

std::vector<int64_t> ModelConfig::stop_token_ids() const {
  std::vector<int64_t> out;
  auto add = [&](const std::vector<int64_t>& ids) {
    for (int64_t id : ids) {
      if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
    }
  };
  add(eos_token_ids);
  if (generation) add(generation->eos_token_ids);
  return out;
}

}  // namespace swarm
