// UTF-8 and Unicode helpers for the tokenizer: decoding, lossy validation, NFC, White_Space.
// Private to src/text/tokenizer*.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/utf8.hpp"

namespace swarm {

namespace unicode_data {
struct CccRange {
  uint32_t first, last, ccc;
};
struct Decomposition {
  uint32_t cp, first, second;  // second == 0: singleton
};
struct Composition {
  uint32_t first, second, composite;
};
struct CodePointRange {
  uint32_t first, last;
};
extern const CccRange kCccRanges[];
extern const size_t kCccRangesSize;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionsSize;
extern const Composition kCompositions[];
extern const size_t kCompositionsSize;
extern const CodePointRange kQcNoRanges[];
extern const size_t kQcNoRangesSize;
extern const CodePointRange kQcMaybeRanges[];
extern const size_t kQcMaybeRangesSize;
}  // namespace unicode_data

namespace unicode {

/// Decodes the UTF-8 character at s[i] (s must be valid UTF-8) and advances i.
inline uint32_t next_code_point(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  if (c < 0xE0) {
    uint32_t cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    i += 2;
    return cp;
  }
  if (c < 0xF0) {
    uint32_t cp = ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
                  (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
    i += 3;
    return cp;
  }
  uint32_t cp = ((c & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
                ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) |
                (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  i += 4;
  return cp;
}

/// Byte length of the UTF-8 character starting with lead byte c (valid input).
inline size_t char_length(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

using ::swarm::append_utf8;  // common/utf8.hpp

/// Length of the longest valid UTF-8 sequence starting at s[i] (1-4), or 0 if the bytes there
/// are not a valid character. Follows the Unicode "maximal subpart" rules: `maximal_subpart`
/// gets the number of bytes an invalid sequence spans (>= 1), as U+FFFD replacement counts them.
size_t valid_sequence_length(std::string_view s, size_t i, size_t* maximal_subpart = nullptr);

/// True if s is valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool is_valid_utf8(std::string_view s);

/// Appends s to out with each maximal invalid subpart replaced by U+FFFD (WHATWG / Rust
/// from_utf8_lossy semantics).
void append_lossy(std::string& out, std::string_view s);

/// Unicode White_Space property (what Rust's char::is_whitespace and regex \s match).
bool is_white_space(uint32_t cp);

/// Canonical combining class.
uint8_t combining_class(uint32_t cp);

/// NFC normalization of valid UTF-8. Returns false (and leaves out untouched) when s is
/// already in NFC, which is the common case and costs one scan.
bool nfc(std::string_view s, std::string& out);

}  // namespace unicode
}  // namespace swarm
