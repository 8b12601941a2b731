// Hugging Face tokenizers (tokenizer.json + tokenizer_config.json), encode and decode exact to
// the last id: BPE models (byte-level GPT-2 / Qwen / Llama-3 style, and SentencePiece-style with
// byte fallback), their normalizers, pre-tokenizers, post-processors and decoders, added and
// special tokens. No Python, no Rust: PCRE2 runs the split regexes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/token_id.hpp"

namespace swarm {

namespace tokenizer_detail {
struct TokenizerImpl;
struct DecodeState;
}  // namespace tokenizer_detail

/// A loaded tokenizer. Immutable after loading and thread-safe: encode/decode may be called
/// from any number of threads at once (an internal word cache has its own short-held locks).
///
/// Semantics are those of the Hugging Face `tokenizers` library (the Rust core behind
/// `transformers`' fast tokenizers), with one deliberate exception taken from `transformers`:
/// a `LlamaTokenizer` whose tokenizer_config.json says `"legacy": false` encodes the
/// SentencePiece way of `legacy=False` (no "▁" after special tokens, the text's first section
/// only gets the prefix), which is what transformers' slow tokenizer and transformers.js do.
class Tokenizer : public std::enable_shared_from_this<Tokenizer> {
 public:
  /// Loads dir/tokenizer.json and, if present, dir/tokenizer_config.json (add_bos_token,
  /// add_eos_token, bos/eos/pad/unk tokens as strings or {content} objects, legacy,
  /// clean_up_tokenization_spaces, additional_special_tokens; chat_template is ignored here).
  /// Throws SwarmError(INVALID_ARGUMENT) naming the file and what is unsupported or malformed.
  static std::shared_ptr<const Tokenizer> from_directory(const std::string& dir);
  /// Same from the two files' contents (tokenizer_config_json may be empty).
  static std::shared_ptr<const Tokenizer> from_json(const std::string& tokenizer_json,
                                                    const std::string& tokenizer_config_json = "");

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// HF `encode(text, add_special_tokens)`: added tokens are matched first (lstrip / rstrip /
  /// single_word / normalized as HF does), then normalizer, pre-tokenizer, BPE model and
  /// post-processor: tokenizer.json's TemplateProcessing, or bos/eos per tokenizer_config.json
  /// when the tokenizer.json has no post-processor adding tokens; for the classes whose
  /// transformers fast tokenizer rebuilds the post-processor from add_bos_token / add_eos_token
  /// (Llama, CodeLlama, Gemma, Cohere: defaults bos on, eos off; GPT-NeoX: both off), those
  /// flags alone. Invalid UTF-8 in `text` is read as U+FFFD per bad sequence.
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const;

  /// HF `decode(ids, skip_special_tokens)` through the decoder chain (ByteLevel, Replace,
  /// ByteFallback, Fuse, Strip, Metaspace, ...); clean_up_tokenization_spaces when the config
  /// asks for it. Ids outside the vocabulary are skipped (like HF); invalid UTF-8 becomes U+FFFD.
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = true) const;

  /// Raw bytes a token stands for (byte-level: the un-mapped bytes; SentencePiece: "▁" as a
  /// space, <0xNN> as that byte; added tokens: their content). Throws for an id out of range.
  std::string token_bytes(TokenId id) const;
  /// The vocabulary string of a token ("Ġhello", "▁the", "<|im_end|>"); "" for an unused id
  /// inside the range. Throws SwarmError(INVALID_ARGUMENT) for an id out of range.
  const std::string& token_string(TokenId id) const;
  /// Id of a vocabulary string or added token content.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  /// Number of ids including added tokens (max id + 1).
  int64_t vocab_size() const;
  /// True for added tokens marked special and for tokenizer_config's additional_special_tokens.
  bool is_special(TokenId id) const;

  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  std::optional<TokenId> pad_id() const;
  const std::string& bos_token() const;  // "" if none
  const std::string& eos_token() const;  // "" if none

  /// Streaming detokenizer: push ids one by one and get text that never ends inside a UTF-8
  /// character; the pushes concatenated with flush() equal decode(all ids). Not thread-safe:
  /// one per stream. Keeps its tokenizer alive.
  class IncrementalDecoder {
   public:
    IncrementalDecoder(IncrementalDecoder&&) noexcept;
    IncrementalDecoder& operator=(IncrementalDecoder&&) noexcept;
    ~IncrementalDecoder();
    /// Text that became final with this id (often "", e.g. in the middle of a character).
    std::string push(TokenId id);
    /// Everything still held back (incomplete characters become U+FFFD); the stream may go on.
    std::string flush();

   private:
    friend class Tokenizer;
    IncrementalDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens);
    std::shared_ptr<const Tokenizer> tokenizer_;
    std::unique_ptr<tokenizer_detail::DecodeState> state_;
  };
  IncrementalDecoder incremental_decoder(bool skip_special_tokens = true) const;

 private:
  explicit Tokenizer(std::unique_ptr<tokenizer_detail::TokenizerImpl> impl);
  std::unique_ptr<tokenizer_detail::TokenizerImpl> impl_;
};

}  // namespace swarm
