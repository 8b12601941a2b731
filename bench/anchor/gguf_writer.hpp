// A small GGUF (v3) writer for bench_anchor: converts a Hugging Face llama-architecture model
// directory (config.json, model.safetensors, tokenizer.json) into the GGUF file llama.cpp
// loads, with the weight matrices stored as F32, F16 or BF16. Written from the GGUF format
// description (ggml's docs/gguf.md); only what a llama-architecture checkpoint needs.
// Not thread-safe; each call writes one file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace swarm::bench {

/// GGUF tensor types bench_anchor writes (values of ggml_type).
enum class GgufTensorType : uint32_t { F32 = 0, F16 = 1, BF16 = 30 };

/// "F32", "F16", "BF16".
const char* gguf_type_name(GgufTensorType type) noexcept;

struct GgufWriteResult {
  uint64_t bytes = 0;    // file size
  int64_t tensors = 0;   // tensor infos written
  int64_t metadata = 0;  // key/value pairs written
};

/// Writes `model_dir` (a llama-architecture Hugging Face model: LlamaForCausalLM, no biases,
/// no rope scaling) as a GGUF file at `out` for llama.cpp's "llama" architecture: the
/// hyper-parameters under llama.*, the BPE tokenizer of tokenizer.json under tokenizer.ggml.*,
/// the 2-D weights as `type` (1-D norm weights stay F32, as llama.cpp's converter keeps them),
/// and the rows of q_proj / k_proj permuted for llama.cpp's RoPE (permute_rope_rows).
/// Throws std::runtime_error naming the file or key on anything unsupported.
GgufWriteResult write_llama_gguf(const std::filesystem::path& model_dir, const std::filesystem::path& out,
                                 GgufTensorType type);

/// The Q/K row order llama.cpp expects for the llama architecture. Hugging Face's attention
/// rotates the two halves of each head (rotate_half: dimension i pairs with i + head_dim/2);
/// GGUF "llama" uses ggml's normal RoPE, which rotates adjacent pairs (2i, 2i+1). Moving row
/// (head h, half j, index i) to row (head h, 2i + j) makes the pairs adjacent, so both compute
/// the same attention. `w` is row-major [n_head * head_dim, cols].
std::vector<float> permute_rope_rows(std::span<const float> w, int64_t n_head, int64_t head_dim,
                                     int64_t cols);

}  // namespace swarm::bench
