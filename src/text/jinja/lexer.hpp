// Jinja lexer: splits template source into data and tag tokens, applying Jinja's whitespace
// control (`{%-`, `-%}`, `{%+`, `+%}`, trim_blocks, lstrip_blocks), comments and raw blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace swarm::jinja {

enum class TokenType {
  DATA,         // literal template text (value)
  VAR_BEGIN,    // {{
  VAR_END,      // }}
  BLOCK_BEGIN,  // {%
  BLOCK_END,    // %}
  NAME,         // identifier or keyword (value)
  STRING,       // string literal, escapes already decoded (value)
  INTEGER,      // int_value
  FLOAT,        // float_value
  OPERATOR,     // value: "+", "//", "(", ...
  END,          // end of the template
};

struct Token {
  TokenType type;
  std::string value;
  int64_t int_value = 0;
  double float_value = 0.0;
  size_t offset = 0;  // byte offset of the token in the source
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

/// Tokenises `source` (newlines already normalised to "\n"). Throws jinja::Error with the
/// offset of the problem on malformed input (unclosed tags, strings, comments).
std::vector<Token> tokenize(const std::string& source, const LexerOptions& options);

/// Normalises "\r\n" and "\r" to "\n" and, unless keep_trailing_newline, drops one trailing
/// newline, as Jinja does before lexing.
std::string normalize_source(const std::string& source, bool keep_trailing_newline);

}  // namespace swarm::jinja
