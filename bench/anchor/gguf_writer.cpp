#include "anchor/gguf_writer.hpp"

#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "model/model_config.hpp"
#include "model/safetensors.hpp"

namespace swarm::bench {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kAlignment = 32;  // general.alignment's default; we do not write the key

// gguf_type: the type tag of a metadata value.
enum class ValueType : uint32_t { UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7, STRING = 8, ARRAY = 9 };

// llama_token_type (tokenizer.ggml.token_type).
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUserDefined = 4;

// general.file_type (llama_ftype): what most tensors are.
uint32_t file_type(GgufTensorType type) {
  switch (type) {
    case GgufTensorType::F32:
      return 0;  // LLAMA_FTYPE_ALL_F32
    case GgufTensorType::F16:
      return 1;  // LLAMA_FTYPE_MOSTLY_F16
    case GgufTensorType::BF16:
      return 32;  // LLAMA_FTYPE_MOSTLY_BF16
  }
  return 0;
}

size_t element_size(GgufTensorType type) { return type == GgufTensorType::F32 ? 4 : 2; }

uint64_t align_up(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

/// Little-endian serialisation into a byte buffer (x86-64 and aarch64 are little-endian).
class Bytes {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof v);
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  void pad_to_alignment() { buf_.resize(align_up(buf_.size()), '\0'); }
  const std::vector<char>& data() const { return buf_; }

 private:
  std::vector<char> buf_;
};

/// The metadata section, built key by key.
class Metadata {
 public:
  void u32(const std::string& key, uint32_t v) {
    begin(key, ValueType::UINT32);
    out_.put(v);
  }
  void f32(const std::string& key, float v) {
    begin(key, ValueType::FLOAT32);
    out_.put(v);
  }
  void boolean(const std::string& key, bool v) {
    begin(key, ValueType::BOOL);
    out_.put<uint8_t>(v ? 1 : 0);
  }
  void string(const std::string& key, const std::string& v) {
    begin(key, ValueType::STRING);
    out_.put_string(v);
  }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    begin(key, ValueType::ARRAY);
    out_.put(static_cast<uint32_t>(ValueType::STRING));
    out_.put<uint64_t>(v.size());
    for (const auto& s : v) out_.put_string(s);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    begin(key, ValueType::ARRAY);
    out_.put(static_cast<uint32_t>(ValueType::INT32));
    out_.put<uint64_t>(v.size());
    for (int32_t x : v) out_.put(x);
  }
  int64_t count() const { return count_; }
  const Bytes& bytes() const { return out_; }

 private:
  void begin(const std::string& key, ValueType type) {
    out_.put_string(key);
    out_.put(static_cast<uint32_t>(type));
    ++count_;
  }
  Bytes out_;
  int64_t count_ = 0;
};

/// One tensor to write: its GGUF name, dims (ne[0] first: the innermost, contiguous one), type
/// and a function producing its elements as float32 in row-major order.
struct PendingTensor {
  std::string name;
  std::vector<uint64_t> dims;
  GgufTensorType type;
  std::function<std::vector<float>()> values;

  uint64_t numel() const {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    return n;
  }
  uint64_t nbytes() const { return numel() * element_size(type); }
};

void write_values(std::ofstream& out, const std::vector<float>& v, GgufTensorType type) {
  if (type == GgufTensorType::F32) {
    out.write(reinterpret_cast<const char*>(v.data()),
              static_cast<std::streamsize>(v.size() * sizeof(float)));
    return;
  }
  std::vector<uint16_t> half(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    half[i] = type == GgufTensorType::F16 ? swarm::f32_to_f16(v[i]) : swarm::f32_to_bf16(v[i]);
  out.write(reinterpret_cast<const char*>(half.data()), static_cast<std::streamsize>(half.size() * 2));
}

/// tokenizer.json's byte-level BPE as tokenizer.ggml.* ("gpt2" model): every id's string,
/// its type (added special tokens are control tokens) and the merges as "left right".
void add_tokenizer(Metadata& md, const fs::path& model_dir, const swarm::ModelConfig& config) {
  const fs::path path = model_dir / "tokenizer.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot open");
  const json tok = json::parse(in);
  const json& model = tok.at("model");
  if (model.value("type", "") != "BPE")
    throw std::runtime_error(path.string() + ": only BPE tokenizers are supported");

  const size_t n = static_cast<size_t>(config.vocab_size);
  std::vector<std::string> tokens(n);
  std::vector<int32_t> types(n, kTokenNormal);
  std::vector<bool> seen(n, false);
  auto place = [&](const std::string& text, int64_t id) {
    if (id < 0 || static_cast<size_t>(id) >= n)
      throw std::runtime_error(path.string() + ": token id " + std::to_string(id) +
                               " outside the vocabulary");
    tokens[static_cast<size_t>(id)] = text;
    seen[static_cast<size_t>(id)] = true;
  };
  for (const auto& [text, id] : model.at("vocab").items()) place(text, id.get<int64_t>());
  for (const json& added : tok.value("added_tokens", json::array())) {
    const int64_t id = added.at("id").get<int64_t>();
    place(added.at("content").get<std::string>(), id);
    types[static_cast<size_t>(id)] = added.value("special", false) ? kTokenControl : kTokenUserDefined;
  }
  for (size_t i = 0; i < n; ++i) {  // padding rows of a vocabulary larger than the tokenizer
    if (!seen[i]) {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = kTokenUserDefined;
    }
  }

  std::vector<std::string> merges;
  for (const json& m : model.at("merges")) {  // "a b" (older files) or ["a", "b"]
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
  }

  md.string("tokenizer.ggml.model", "gpt2");
  // The pre-tokenizer regex llama.cpp applies; SmolLM's is GPT-2's with single digits.
  md.string("tokenizer.ggml.pre", "smollm");
  md.strings("tokenizer.ggml.tokens", tokens);
  md.i32s("tokenizer.ggml.token_type", types);
  md.strings("tokenizer.ggml.merges", merges);
  if (config.bos_token_id) md.u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*config.bos_token_id));
  if (!config.eos_token_ids.empty())
    md.u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(config.eos_token_ids.front()));
  if (config.pad_token_id)
    md.u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*config.pad_token_id));
  md.boolean("tokenizer.ggml.add_bos_token", false);
  std::ifstream jinja(model_dir / "chat_template.jinja");
  if (jinja) md.string("tokenizer.chat_template", std::string(std::istreambuf_iterator<char>(jinja), {}));
}

/// GGUF's name for a Hugging Face llama tensor, and how many heads a Q/K projection has (0:
/// not permuted). Throws on a tensor the llama architecture does not have.
std::pair<std::string, int64_t> gguf_name(const std::string& hf, const swarm::ModelConfig& c) {
  if (hf == "model.embed_tokens.weight") return {"token_embd.weight", 0};
  if (hf == "model.norm.weight") return {"output_norm.weight", 0};
  if (hf == "lm_head.weight") return {"output.weight", 0};
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) == 0) {
    const size_t dot = hf.find('.', prefix.size());
    const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
    const std::string rest = hf.substr(dot + 1);
    static const std::pair<const char*, const char*> kMap[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    for (const auto& [from, to] : kMap) {
      if (rest == from) {
        const int64_t heads = rest == "self_attn.q_proj.weight"   ? c.num_attention_heads
                              : rest == "self_attn.k_proj.weight" ? c.num_key_value_heads
                                                                  : 0;
        return {"blk." + layer + "." + to, heads};
      }
    }
  }
  throw std::runtime_error("no GGUF llama name for tensor '" + hf + "'");
}

}  // namespace

const char* gguf_type_name(GgufTensorType type) noexcept {
  switch (type) {
    case GgufTensorType::F32:
      return "F32";
    case GgufTensorType::F16:
      return "F16";
    case GgufTensorType::BF16:
      return "BF16";
  }
  return "?";
}

std::vector<float> permute_rope_rows(std::span<const float> w, int64_t n_head, int64_t head_dim,
                                     int64_t cols) {
  if (head_dim % 2 != 0 || static_cast<int64_t>(w.size()) != n_head * head_dim * cols)
    throw std::invalid_argument("permute_rope_rows: shape does not match");
  const int64_t half = head_dim / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t from = h * head_dim + j * half + i;
        const int64_t to = h * head_dim + 2 * i + j;
        std::memcpy(&out[static_cast<size_t>(to * cols)], &w[static_cast<size_t>(from * cols)],
                    static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
  return out;
}

GgufWriteResult write_llama_gguf(const fs::path& model_dir, const fs::path& out, GgufTensorType type) {
  const swarm::ModelConfig config = swarm::ModelConfig::from_directory(model_dir);
  if (config.model_type != "llama") throw std::runtime_error(model_dir.string() + ": not a llama model");
  if (config.attention_bias || config.attention_output_bias || config.mlp_bias || config.qk_norm ||
      config.rope_scaling.type != swarm::RopeScalingType::NONE)
    throw std::runtime_error(model_dir.string() + ": biases, q/k norms and rope scaling are not supported");
  const swarm::SafetensorsModel weights = swarm::SafetensorsModel::open(model_dir);
  weights.validate_against(config);

  Metadata md;
  md.string("general.architecture", "llama");
  md.string("general.name", model_dir.filename().string());
  md.u32("general.file_type", file_type(type));
  md.u32("llama.vocab_size", static_cast<uint32_t>(config.vocab_size));
  md.u32("llama.context_length", static_cast<uint32_t>(config.max_position_embeddings));
  md.u32("llama.embedding_length", static_cast<uint32_t>(config.hidden_size));
  md.u32("llama.block_count", static_cast<uint32_t>(config.num_hidden_layers));
  md.u32("llama.feed_forward_length", static_cast<uint32_t>(config.intermediate_size));
  md.u32("llama.attention.head_count", static_cast<uint32_t>(config.num_attention_heads));
  md.u32("llama.attention.head_count_kv", static_cast<uint32_t>(config.num_key_value_heads));
  md.u32("llama.attention.key_length", static_cast<uint32_t>(config.head_dim));
  md.u32("llama.attention.value_length", static_cast<uint32_t>(config.head_dim));
  md.u32("llama.rope.dimension_count", static_cast<uint32_t>(config.head_dim));
  md.f32("llama.rope.freq_base", static_cast<float>(config.rope_theta));
  md.f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(config.rms_norm_eps));
  add_tokenizer(md, model_dir, config);

  std::vector<PendingTensor> tensors;
  for (const swarm::TensorSpec& spec : config.expected_tensors()) {
    auto [name, heads] = gguf_name(spec.name, config);
    PendingTensor t;
    t.name = name;
    for (auto it = spec.shape.rbegin(); it != spec.shape.rend(); ++it)
      t.dims.push_back(static_cast<uint64_t>(*it));
    t.type = spec.shape.size() == 1 ? GgufTensorType::F32 : type;
    const swarm::TensorView* view = &weights.at(spec.name);
    const int64_t head_dim = config.head_dim;
    const int64_t cols = spec.shape.back();
    t.values = [view, heads, head_dim, cols] {
      std::vector<float> v = view->to_f32();
      return heads > 0 ? permute_rope_rows(v, heads, head_dim, cols) : v;
    };
    tensors.push_back(std::move(t));
  }

  Bytes head;
  head.put<uint32_t>(0x46554747);  // "GGUF"
  head.put<uint32_t>(kGgufVersion);
  head.put<uint64_t>(tensors.size());
  head.put<uint64_t>(static_cast<uint64_t>(md.count()));
  Bytes infos;
  uint64_t offset = 0;  // from the start of the data section
  for (const PendingTensor& t : tensors) {
    infos.put_string(t.name);
    infos.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) infos.put(d);
    infos.put(static_cast<uint32_t>(t.type));
    infos.put(offset);
    offset = align_up(offset + t.nbytes());
  }

  const fs::path tmp = out.string() + ".tmp";
  fs::create_directories(out.parent_path());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(tmp.string() + ": cannot create");
    auto write = [&](const std::vector<char>& b) {
      f.write(b.data(), static_cast<std::streamsize>(b.size()));
    };
    write(head.data());
    write(md.bytes().data());
    const size_t header_bytes = head.data().size() + md.bytes().data().size() + infos.data().size();
    write(infos.data());
    const std::vector<char> zeros(kAlignment, '\0');
    f.write(zeros.data(), static_cast<std::streamsize>(align_up(header_bytes) - header_bytes));
    for (const PendingTensor& t : tensors) {
      write_values(f, t.values(), t.type);
      f.write(zeros.data(), static_cast<std::streamsize>(align_up(t.nbytes()) - t.nbytes()));
    }
    if (!f.flush()) throw std::runtime_error(tmp.string() + ": write failed");
  }
  fs::rename(tmp, out);
  return {fs::file_size(out), static_cast<int64_t>(tensors.size()), md.count()};
}

}  // namespace swarm::bench
