// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}). Private to
// src/text/tokenizer*.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace swarm::tokenizer_detail {

using Id = std::int32_t;

/// GPT-2's byte <-> printable character table used by byte-level BPE.
uint32_t byte_to_unicode(uint8_t b);
/// The byte a byte-level character stands for, or -1.
int unicode_to_byte(uint32_t cp);
/// Maps a byte-level token string ("Ġhello") back to raw bytes; nullopt if some character is
/// not in the byte-level alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view token);
/// Maps raw bytes to a byte-level string ("Ġhello").
std::string bytes_to_byte_level(std::string_view bytes);

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, Id, StringHash, std::equal_to<>>;

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  /// Words arrive as raw bytes and each byte is one initial symbol (its byte-level character).
  bool byte_level = false;
};

/// Byte-pair encoding with merge ranks, exactly like the Rust `tokenizers` BPE (dropout is not
/// supported). Thread-safe; results per word are kept in a bounded cache.
class BpeModel {
 public:
  /// merges: pairs of token strings, in rank order. Throws std::invalid_argument for a merge
  /// whose parts or result are not in the vocabulary.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  ~BpeModel();

  /// Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<Id>& out) const;

  const Vocab& vocab() const { return vocab_; }
  const BpeOptions& options() const { return options_; }

 private:
  struct MergeTable;
  struct Cache;
  void merge_word(std::string_view word, std::vector<Id>& out) const;
  std::optional<Id> lookup(std::string_view s) const;

  Vocab vocab_;
  Vocab raw_vocab_;  // byte-level: raw bytes -> id (for ignore_merges)
  BpeOptions options_;
  std::optional<Id> unk_id_;
  std::array<Id, 256> byte_symbol_{};    // byte-level initial symbol per byte (-1: none)
  std::array<Id, 256> byte_fallback_{};  // id of "<0xNN>" (-1: none)
  bool plain_symbols_ = true;            // no subword prefix / suffix
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace swarm::tokenizer_detail
