// ModelConfig / GenerationConfig: the real fixtures in tests/fixtures/ and hand-written configs of
// the Qwen2, Qwen3, Mistral and Llama-3 families (values as their Hugging Face repos ship).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "model/model_config.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;

fs::path fixture_model(const char* name) { return fs::path(SWARM_FIXTURES_DIR) / "models" / name; }

#define REQUIRE_FIXTURE(dir)                                                       \
  ASSERT_TRUE(fs::is_directory(dir)) << "test fixture missing: " << (dir)          \
                                     << " (SWARM_FIXTURES_DIR=" SWARM_FIXTURES_DIR \
                                        "; see tests/fixtures/README.md)"

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a SwarmError";
  return "";
}

bool has_tensor(const ModelConfig& c, const std::string& name) {
  for (const auto& t : c.expected_tensors()) {
    if (t.name == name) return true;
  }
  return false;
}

std::vector<int64_t> shape_of(const ModelConfig& c, const std::string& name) {
  for (const auto& t : c.expected_tensors()) {
    if (t.name == name) return t.shape;
  }
  ADD_FAILURE() << "no expected tensor " << name;
  return {};
}

// Qwen2.5-0.5B-Instruct's config.json.
constexpr const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// Qwen3-0.6B's config.json.
constexpr const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// Mistral-7B-v0.1's config.json.
constexpr const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";

// Llama-3.1-8B-Instruct's config.json.
constexpr const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 128256})";

std::string with(const char* base, const nlohmann::json& patch) {
  nlohmann::json j = nlohmann::json::parse(base);
  for (const auto& [key, value] : patch.items()) j[key] = value;  // replace, not merge
  return j.dump();
}

TEST(ModelConfig, TinyStoriesFixture) {
  const fs::path dir = fixture_model("tinystories-656k");
  REQUIRE_FIXTURE(dir);
  const ModelConfig c = ModelConfig::from_directory(dir);
  EXPECT_EQ(c.architecture, Architecture::LLAMA);
  EXPECT_EQ(c.architecture_name, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 2048);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.intermediate_size, 384);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::NONE);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_EQ(c.torch_dtype, "float32");
  ASSERT_TRUE(c.generation.has_value());
  EXPECT_EQ(c.generation->eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(c.generation->bos_token_id, 1);
  EXPECT_FALSE(c.generation->temperature.has_value());
  EXPECT_EQ(c.stop_token_ids(), std::vector<int64_t>{2});

  // embed + 2 x 9 per layer + final norm; tied, so no lm_head.
  const auto tensors = c.expected_tensors();
  EXPECT_EQ(tensors.size(), 20u);
  EXPECT_FALSE(has_tensor(c, "lm_head.weight"));
  EXPECT_EQ(shape_of(c, "model.embed_tokens.weight"), (std::vector<int64_t>{2048, 128}));
  EXPECT_EQ(shape_of(c, "model.layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(shape_of(c, "model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{128, 384}));
  EXPECT_EQ(c.parameter_count(), 656000);  // the "656k" of its name
}

TEST(ModelConfig, SmolLM2Fixture) {
  const fs::path dir = fixture_model("smollm2-135m-instruct-noweights");
  REQUIRE_FIXTURE(dir);
  const ModelConfig c = ModelConfig::from_directory(dir);
  EXPECT_EQ(c.architecture, Architecture::LLAMA);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_NEAR(c.initializer_range, 0.0416667, 1e-6);
  EXPECT_EQ(c.pad_token_id, 2);
  EXPECT_EQ(shape_of(c, "model.layers.29.self_attn.k_proj.weight"), (std::vector<int64_t>{192, 576}));
  EXPECT_EQ(c.parameter_count(), 134515008);  // SmolLM2-135M as published
}

TEST(ModelConfig, Qwen2HasQkvBiasButNoOutputBias) {
  const ModelConfig c = ModelConfig::from_json(kQwen2);
  EXPECT_EQ(c.architecture, Architecture::QWEN2);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.attention_output_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.sliding_window.has_value()) << "use_sliding_window is false";
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(shape_of(c, "model.layers.0.self_attn.q_proj.bias"), std::vector<int64_t>{896});
  EXPECT_EQ(shape_of(c, "model.layers.0.self_attn.k_proj.bias"), std::vector<int64_t>{128});
  EXPECT_EQ(shape_of(c, "model.layers.23.self_attn.v_proj.bias"), std::vector<int64_t>{128});
  EXPECT_FALSE(has_tensor(c, "model.layers.0.self_attn.o_proj.bias"));
  EXPECT_FALSE(has_tensor(c, "lm_head.weight"));
  EXPECT_EQ(c.parameter_count(), 494032768);  // Qwen2.5-0.5B as published

  const ModelConfig windowed = ModelConfig::from_json(with(kQwen2, {{"use_sliding_window", true}}));
  EXPECT_EQ(windowed.sliding_window, 32768);
}

// transformers' Qwen2/Qwen3 rule: with use_sliding_window, the layers i >= max_window_layers
// (default 28), or those an explicit layer_types names "sliding_attention"; an absent
// sliding_window is the config class's 4096, a null one none.
TEST(ModelConfig, QwenSlidingWindowIsPerLayer) {
  const ModelConfig c =
      ModelConfig::from_json(with(kQwen2, {{"use_sliding_window", true}}));  // 24 layers, 21
  ASSERT_EQ(c.sliding_window_layers.size(), 24u);
  for (int64_t l = 0; l < 24; ++l) EXPECT_EQ(c.layer_window(l).has_value(), l >= 21) << "layer " << l;
  EXPECT_TRUE(c.any_layer_windowed());

  nlohmann::json j = nlohmann::json::parse(with(kQwen2, {{"use_sliding_window", true}}));
  j.erase("max_window_layers");  // default 28 >= 24 layers: none windowed
  EXPECT_FALSE(ModelConfig::from_json(j.dump()).any_layer_windowed());
  j.erase("sliding_window");  // absent: 4096
  j["max_window_layers"] = 0;
  EXPECT_EQ(ModelConfig::from_json(j.dump()).layer_window(0), 4096);
  j["sliding_window"] = nullptr;  // null: none
  EXPECT_FALSE(ModelConfig::from_json(j.dump()).sliding_window.has_value());

  nlohmann::json types = nlohmann::json::array();
  for (int l = 0; l < 24; ++l) types.push_back(l % 2 ? "sliding_attention" : "full_attention");
  const ModelConfig typed =
      ModelConfig::from_json(with(kQwen2, {{"use_sliding_window", true}, {"layer_types", types}}));
  for (int64_t l = 0; l < 24; ++l) EXPECT_EQ(typed.layer_window(l).has_value(), l % 2 == 1) << "layer " << l;
  EXPECT_EQ(ModelConfig::from_json(typed.to_json()), typed) << typed.to_json();
  // layer_types without use_sliding_window: no window (transformers sets sliding_window to None).
  EXPECT_FALSE(ModelConfig::from_json(with(kQwen2, {{"layer_types", types}})).any_layer_windowed());

  EXPECT_EQ(error_of([] {
              ModelConfig::from_json(
                  with(kQwen2, {{"use_sliding_window", true}, {"layer_types", {"full_attention"}}}));
            }),
            "config.json: key 'layer_types' must be a list of num_hidden_layers (24) entries, got "
            "[\"full_attention\"]");
  types[3] = "chunked_attention";
  EXPECT_EQ(error_of([&] {
              ModelConfig::from_json(with(kQwen2, {{"use_sliding_window", true}, {"layer_types", types}}));
            }),
            "config.json: key 'layer_types' entry 3 must be \"full_attention\" or \"sliding_attention\", got "
            "\"chunked_attention\"");
}

TEST(ModelConfig, Qwen3HasQkNorm) {
  const ModelConfig c = ModelConfig::from_json(kQwen3);
  EXPECT_EQ(c.architecture, Architecture::QWEN3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 128) << "explicit head_dim, not hidden/heads = 64";
  EXPECT_EQ(shape_of(c, "model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{2048, 1024}));
  EXPECT_EQ(shape_of(c, "model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{1024, 2048}));
  EXPECT_EQ(shape_of(c, "model.layers.27.self_attn.q_norm.weight"), std::vector<int64_t>{128});
  EXPECT_EQ(shape_of(c, "model.layers.27.self_attn.k_norm.weight"), std::vector<int64_t>{128});
  EXPECT_FALSE(has_tensor(c, "model.layers.0.self_attn.q_proj.bias"));
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.parameter_count(), 596049920);  // Qwen3-0.6B

  // Without "architectures" the family comes from model_type.
  nlohmann::json j = nlohmann::json::parse(kQwen3);
  j.erase("architectures");
  EXPECT_EQ(ModelConfig::from_json(j.dump()).architecture, Architecture::QWEN3);
}

TEST(ModelConfig, MistralStoresSlidingWindow) {
  const ModelConfig c = ModelConfig::from_json(kMistral);
  EXPECT_EQ(c.architecture, Architecture::MISTRAL);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(has_tensor(c, "lm_head.weight"));
  EXPECT_EQ(c.parameter_count(), 7241732096);  // Mistral-7B-v0.1
  EXPECT_FALSE(
      ModelConfig::from_json(with(kMistral, {{"sliding_window", nullptr}})).sliding_window.has_value());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) EXPECT_EQ(c.layer_window(l), 4096) << "layer " << l;
  // Absent: MistralConfig's default, 4096 (null above is none).
  nlohmann::json j = nlohmann::json::parse(kMistral);
  j.erase("sliding_window");
  const ModelConfig absent = ModelConfig::from_json(j.dump());
  EXPECT_EQ(absent.sliding_window, 4096);
  EXPECT_EQ(absent.layer_window(31), 4096);
}

TEST(ModelConfig, Llama31RopeScalingAndEosList) {
  const ModelConfig c = ModelConfig::from_json(kLlama31);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::LLAMA3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.parameter_count(), 8030261248);  // Llama-3.1-8B

  const ModelConfig linear =
      ModelConfig::from_json(with(kLlama31, {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}));
  EXPECT_EQ(linear.rope_scaling.type, RopeScalingType::LINEAR);
  EXPECT_DOUBLE_EQ(linear.rope_scaling.factor, 2.0);
  const ModelConfig dynamic =
      ModelConfig::from_json(with(kLlama31, {{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4}}}}));
  EXPECT_EQ(dynamic.rope_scaling.type, RopeScalingType::DYNAMIC);
  const ModelConfig none =
      ModelConfig::from_json(with(kLlama31, {{"rope_scaling", {{"rope_type", "default"}}}}));
  EXPECT_EQ(none.rope_scaling.type, RopeScalingType::NONE);
}

TEST(ModelConfig, LlamaBiasFlagsCoverAllProjections) {
  const ModelConfig c = ModelConfig::from_json(
      with(kLlama31, {{"attention_bias", true}, {"mlp_bias", true}, {"num_hidden_layers", 1}}));
  EXPECT_TRUE(has_tensor(c, "model.layers.0.self_attn.o_proj.bias"));
  EXPECT_TRUE(has_tensor(c, "model.layers.0.self_attn.q_proj.bias"));
  EXPECT_EQ(shape_of(c, "model.layers.0.mlp.down_proj.bias"), std::vector<int64_t>{4096});
}

TEST(ModelConfig, DefaultsWhenKeysAreAbsent) {
  const ModelConfig c = ModelConfig::from_json(R"({"model_type": "llama", "vocab_size": 100,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.architecture_name, "LlamaForCausalLM");
}

TEST(ModelConfig, ToJsonRoundTrips) {
  for (const char* text : {kQwen2, kQwen3, kMistral, kLlama31}) {
    const ModelConfig c = ModelConfig::from_json(text);
    const std::string out = c.to_json();
    EXPECT_EQ(ModelConfig::from_json(out), c) << out;
  }
  const ModelConfig windowed = ModelConfig::from_json(with(kQwen2, {{"use_sliding_window", true}}));
  EXPECT_EQ(ModelConfig::from_json(windowed.to_json()), windowed);
}

TEST(ModelConfig, DeepNestingIsAClearError) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(error_of([&] {
              ModelConfig::from_json(with(kQwen2, {{"x", 1}}).insert(1, "\"deep\": " + deep + ", "));
            }),
            "config.json is nested deeper than 128 levels");
}

TEST(ModelConfig, UnsupportedArchitectureIsAClearError) {
  const std::string msg = error_of([] {
    ModelConfig::from_json(with(kQwen2, {{"architectures", {"GPT2LMHeadModel"}}}));
  });
  EXPECT_EQ(msg,
            "config.json: unsupported architecture 'GPT2LMHeadModel' (supported: LlamaForCausalLM, "
            "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM)");
  nlohmann::json j = nlohmann::json::parse(kQwen2);
  j.erase("architectures");
  j["model_type"] = "gpt2";
  EXPECT_NE(error_of([&] { ModelConfig::from_json(j.dump()); }).find("unsupported model_type 'gpt2'"),
            std::string::npos);
  j.erase("model_type");
  EXPECT_NE(
      error_of([&] { ModelConfig::from_json(j.dump()); }).find("neither 'architectures' nor 'model_type'"),
      std::string::npos);
}

TEST(ModelConfig, RejectsYarnAndIncompleteRopeScaling) {
  const std::string yarn = error_of([] {
    ModelConfig::from_json(with(
        kQwen3, {{"rope_scaling",
                  {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}}));
  });
  EXPECT_NE(yarn.find("config.json: unsupported rope scaling type 'yarn'"), std::string::npos) << yarn;
  EXPECT_NE(yarn.find("supported: linear, dynamic, llama3"), std::string::npos) << yarn;

  nlohmann::json j = nlohmann::json::parse(kLlama31);
  j["rope_scaling"].erase("low_freq_factor");
  const std::string missing = error_of([&] { ModelConfig::from_json(j.dump()); });
  EXPECT_NE(missing.find("rope_scaling.low_freq_factor"), std::string::npos) << missing;
  const std::string no_type = error_of([] {
    ModelConfig::from_json(with(kLlama31, {{"rope_scaling", {{"factor", 2}}}}));
  });
  EXPECT_NE(no_type.find("rope_type"), std::string::npos) << no_type;
}

TEST(ModelConfig, ErrorsNameTheFileAndKey) {
  nlohmann::json j = nlohmann::json::parse(kMistral);
  j.erase("hidden_size");
  EXPECT_EQ(error_of([&] { ModelConfig::from_json(j.dump(), "/m/config.json"); }),
            "/m/config.json: missing required key 'hidden_size'");
  const std::string type = error_of([] {
    ModelConfig::from_json(with(kMistral, {{"hidden_size", "4096"}}));
  });
  EXPECT_NE(type.find("config.json: key 'hidden_size' must be an integer, got string"), std::string::npos)
      << type;
  const std::string gqa = error_of([] {
    ModelConfig::from_json(with(kMistral, {{"num_key_value_heads", 5}}));
  });
  EXPECT_NE(gqa.find("'num_attention_heads' (32) must be a multiple of 'num_key_value_heads' (5)"),
            std::string::npos)
      << gqa;
  const std::string neg = error_of([] {
    ModelConfig::from_json(with(kMistral, {{"num_hidden_layers", 0}}));
  });
  EXPECT_NE(neg.find("'num_hidden_layers' must be positive"), std::string::npos) << neg;
  const std::string act = error_of([] { ModelConfig::from_json(with(kMistral, {{"hidden_act", "gelu"}})); });
  EXPECT_NE(act.find("unsupported hidden_act 'gelu'"), std::string::npos) << act;
  const std::string eos = error_of([] {
    ModelConfig::from_json(with(kMistral, {{"eos_token_id", {1, "x"}}}));
  });
  EXPECT_NE(eos.find("'eos_token_id' must be an integer"), std::string::npos) << eos;
  EXPECT_NE(
      error_of([] { ModelConfig::from_json("{\"vocab_size\": 1,"); }).find("config.json: not valid JSON"),
      std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::from_json("[1, 2]"); }).find("expected a JSON object"),
            std::string::npos);
  const std::string dir = error_of([] { ModelConfig::from_directory("/nonexistent/model"); });
  EXPECT_NE(dir.find("/nonexistent/model/config.json: not found"), std::string::npos) << dir;
}

TEST(GenerationConfig, ParsesSamplingDefaultsAndMergesStopIds) {
  const GenerationConfig g = GenerationConfig::from_json(R"({"bos_token_id": 151643, "do_sample": true,
      "eos_token_id": [151645, 151643], "pad_token_id": 151643, "temperature": 0.6, "top_k": 20,
      "top_p": 0.95, "max_new_tokens": 512, "transformers_version": "4.51.0"})");
  EXPECT_EQ(g.do_sample, true);
  EXPECT_DOUBLE_EQ(*g.temperature, 0.6);
  EXPECT_DOUBLE_EQ(*g.top_p, 0.95);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_EQ(g.max_new_tokens, 512);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(GenerationConfig::from_json(g.to_json()), g);

  ModelConfig c = ModelConfig::from_json(kQwen3);
  c.generation = g;
  EXPECT_EQ(c.stop_token_ids(), (std::vector<int64_t>{151645, 151643}));

  const std::string bad = error_of([] { GenerationConfig::from_json(R"({"top_p": 1.5})"); });
  EXPECT_NE(bad.find("generation_config.json: key 'top_p' must be in (0, 1]"), std::string::npos) << bad;
  const std::string type = error_of([] { GenerationConfig::from_json(R"({"do_sample": "yes"})"); });
  EXPECT_NE(type.find("'do_sample' must be a boolean"), std::string::npos) << type;
}

}  // namespace
}  // namespace swarm
