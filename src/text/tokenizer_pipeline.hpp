// The parts of a loaded tokenizer.json, shared by tokenizer.cpp (loading, encoding) and
// tokenizer_decode.cpp (decoding). Private to src/text/tokenizer*.cpp.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/tokenizer.hpp"
#include "text/tokenizer_bpe.hpp"
#include "text/tokenizer_regex.hpp"

namespace swarm::tokenizer_detail {

struct AddedToken {
  std::string content;
  Id id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

/// Leftmost-longest matcher over added token contents (what HF's Aho-Corasick does).
class AddedTokenMatcher {
 public:
  void add(std::string_view pattern, size_t index);
  bool empty() const { return nodes_.size() <= 1; }
  /// Finds the leftmost-longest match at or after `from`: sets begin/end and the pattern index.
  bool find(std::string_view text, size_t from, size_t& begin, size_t& end, size_t& index) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int64_t pattern = -1;
  };
  int32_t child(int32_t node, unsigned char c) const;
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_byte_{};
};

// ------------------------------------------------------------------ normalizers
struct NormalizerStep {
  enum class Kind { PREPEND, REPLACE, NFC, STRIP } kind;
  NormalizerStep(Kind k, std::string t = "") : kind(k), text(std::move(t)) {}
  std::string text;                // PREPEND: prefix; REPLACE: content
  std::unique_ptr<Regex> pattern;  // REPLACE
  bool strip_left = false, strip_right = false;
};

// ------------------------------------------------------------------ pre-tokenizers
enum class SplitBehavior { REMOVED, ISOLATED, MERGED_WITH_PREVIOUS, MERGED_WITH_NEXT, CONTIGUOUS };
enum class PrependScheme { ALWAYS, FIRST, NEVER };

struct PreTokenizerStep {
  enum class Kind { SPLIT, BYTE_LEVEL, METASPACE } kind;
  PreTokenizerStep(Kind k) : kind(k) {}  // NOLINT: implicit on purpose
  // SPLIT (also Digits, Whitespace, WhitespaceSplit)
  std::unique_ptr<Regex> pattern;
  SplitBehavior behavior = SplitBehavior::ISOLATED;
  bool invert = false;
  // BYTE_LEVEL
  bool add_prefix_space = false;
  bool use_regex = true;
  // METASPACE
  std::string replacement;
  PrependScheme prepend_scheme = PrependScheme::ALWAYS;
  bool split = true;
};

// ------------------------------------------------------------------ post-processor
/// One template ("single" of TemplateProcessing, or [cls] $A [sep]): special ids around $A.
struct Template {
  std::vector<Id> before, after;
};

// ------------------------------------------------------------------ decoder
struct DecoderStep {
  enum class Kind { REPLACE, STRIP, METASPACE, BYTE_FALLBACK, FUSE, BYTE_LEVEL } kind;
  DecoderStep(Kind k) : kind(k) {}  // NOLINT: implicit on purpose
  std::string pattern_literal;      // REPLACE with a String pattern
  std::unique_ptr<Regex> pattern;   // REPLACE with a Regex pattern
  std::string content;              // REPLACE: replacement; STRIP: the stripped char
  size_t start = 0, stop = 0;       // STRIP
  std::string replacement;          // METASPACE
  bool drop_first = true;           // METASPACE: prepend_scheme != never
};

struct TokenizerImpl {
  // Vocabulary (model vocab + added tokens).
  std::vector<std::string> id_to_token;
  std::vector<uint8_t> is_added, is_special;
  Vocab added_ids;  // content -> id
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher, normalized_matcher;  // pattern index -> added[index]
  std::unique_ptr<Regex> word_char;                   // for single_word

  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::vector<Template> templates;           // applied in order when add_special_tokens
  std::optional<Id> config_bos, config_eos;  // added when the post-processor adds nothing

  bool has_decoder = false;
  std::vector<DecoderStep> decoder;
  bool clean_up_tokenization_spaces = false;

  // transformers' SentencePiece `legacy=False` encoding (see Tokenizer's class comment).
  bool sentencepiece_non_legacy = false;

  std::string bos_token, eos_token;
  std::optional<Id> bos_id, eos_id, pad_id;

  bool byte_level_tokens = false;  // token strings are in GPT-2's byte alphabet

  void encode(std::string_view text, bool add_special_tokens, std::vector<Id>& out) const;
  /// The string a token id contributes to decoding, or nullptr to skip it.
  const std::string* decodable(Id id, bool skip_special_tokens) const;
};

/// Streaming state of the decoder chain; Tokenizer::decode runs it once over all ids.
struct DecodeState {
  DecodeState(const TokenizerImpl& impl, bool skip_special_tokens);
  ~DecodeState();
  void push(Id id, std::string& out);
  void flush(std::string& out);

  struct Stage;
  const TokenizerImpl& impl;
  bool skip_special;
  std::vector<std::unique_ptr<Stage>> stages;
};

}  // namespace swarm::tokenizer_detail
