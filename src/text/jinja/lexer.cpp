#include "text/jinja/lexer.hpp"

#include <charconv>
#include <cstdlib>

#include "text/jinja/unicode.hpp"
#include "text/jinja/value.hpp"

namespace swarm::jinja {

std::string normalize_source(const std::string& source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Python's \s: ASCII whitespace plus the Unicode spaces.
bool all_whitespace(std::string_view s) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
    if (!is_ascii_space(c) && !(c >= 0x1C && c <= 0x1F)) return false;
  }
  if (ascii) return true;
  for (char32_t c : unicode::decode(s))
    if (!unicode::is_space(c)) return false;
  return true;
}

// Python str.rstrip() with no arguments.
void rstrip_whitespace(std::string& s) {
  std::u32string cps = unicode::decode(s);
  size_t end = cps.size();
  while (end > 0 && unicode::is_space(cps[end - 1])) --end;
  if (end == cps.size()) return;
  cps.resize(end);
  s = unicode::encode(cps);
}

// Length in bytes of the whitespace run starting at pos (Python \s).
size_t whitespace_run(const std::string& s, size_t pos) {
  size_t i = pos;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (is_ascii_space(static_cast<char>(c)) || (c >= 0x1C && c <= 0x1F)) {
        ++i;
        continue;
      }
      break;
    }
    // Non-ASCII: decode one character.
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    std::u32string cp = unicode::decode(std::string_view(s).substr(i, len));
    if (cp.size() == 1 && unicode::is_space(cp[0])) {
      i += len;
      continue;
    }
    break;
  }
  return i - pos;
}

bool starts_with_at(const std::string& s, size_t pos, std::string_view what) {
  return s.compare(pos, what.size(), what) == 0;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes a string literal body with Python's unicode-escape rules.
std::string unescape(std::string_view body, size_t offset) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    char e = body[++i];
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        if (i + digits >= body.size()) {
          throw Error("truncated \\" + std::string(1, e) + " escape in string literal", offset);
        }
        char32_t cp = 0;
        for (size_t k = 1; k <= digits; ++k) {
          const int h = hex_value(body[i + k]);
          if (h < 0) throw Error("truncated \\" + std::string(1, e) + " escape in string literal", offset);
          cp = cp * 16 + static_cast<char32_t>(h);
        }
        if (cp > 0x10FFFF) throw Error("illegal Unicode character in string literal", offset);
        unicode::append(out, cp);
        i += digits;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            cp = cp * 8 + static_cast<char32_t>(body[++i] - '0');
          unicode::append(out, cp);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& src, const LexerOptions& opt) : src_(src), opt_(opt) {}

  std::vector<Token> run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t p = find_opener(pos_);
      if (p == std::string::npos) {
        emit_data(src_.substr(pos_), pos_);
        pos_ = n;
        break;
      }
      const char kind = src_[p + 1];
      size_t q = p + 2;
      char sign = 0;
      if (q < n && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];

      size_t raw_body = 0;
      const bool raw = kind == '%' && match_raw_begin(q, raw_body);

      std::string text = src_.substr(pos_, p - pos_);
      apply_left_control(text, sign, kind != '{');
      emit_data(std::move(text), pos_);

      if (kind == '#') {
        lex_comment(p, q);
      } else if (raw) {
        lex_raw(p, raw_body);
      } else {
        lex_tag(p, q, kind == '%');
      }
    }
    tokens_.push_back(Token{TokenType::END, "", 0, 0.0, n});
    return std::move(tokens_);
  }

 private:
  size_t find_opener(size_t from) const {
    size_t p = from;
    while (true) {
      p = src_.find('{', p);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      ++p;
    }
  }

  // The whitespace control that applies to the text before a tag.
  void apply_left_control(std::string& text, char sign, bool lstrip_applies) const {
    if (sign == '-') {
      rstrip_whitespace(text);
    } else if (sign != '+' && opt_.lstrip_blocks && lstrip_applies) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting_) {
        std::string_view tail(text.data() + l_pos, text.size() - l_pos);
        if (!tail.empty() && all_whitespace(tail)) text.resize(l_pos);
      }
    }
  }

  void emit_data(std::string text, size_t offset) {
    if (text.empty()) return;
    tokens_.push_back(Token{TokenType::DATA, std::move(text), 0, 0.0, offset});
  }

  // `{%[-+]? raw %}` starting after the sign; on success body_start is where the raw text begins.
  bool match_raw_begin(size_t q, size_t& body_start) const {
    size_t r = q + whitespace_run(src_, q);
    if (!starts_with_at(src_, r, "raw")) return false;
    r += 3;
    r += whitespace_run(src_, r);
    if (starts_with_at(src_, r, "-%}")) {
      r += 3;
      r += whitespace_run(src_, r);
    } else if (starts_with_at(src_, r, "%}")) {
      r += 2;
    } else {
      return false;
    }
    body_start = r;
    return true;
  }

  void finish_tag(size_t end) {
    pos_ = end;
    line_starting_ = end > 0 && src_[end - 1] == '\n';
  }

  // Position after a block end ("%}" family) at `i`, or npos.
  size_t match_block_end(size_t i) const {
    if (starts_with_at(src_, i, "+%}")) return i + 3;
    if (starts_with_at(src_, i, "-%}")) return i + 3 + whitespace_run(src_, i + 3);
    if (starts_with_at(src_, i, "%}")) {
      size_t e = i + 2;
      if (opt_.trim_blocks && e < src_.size() && src_[e] == '\n') ++e;
      return e;
    }
    return std::string::npos;
  }

  void lex_comment(size_t open, size_t q) {
    for (size_t i = q; i + 1 < src_.size(); ++i) {
      size_t end = std::string::npos;
      if (starts_with_at(src_, i, "+#}")) {
        end = i + 3;
      } else if (starts_with_at(src_, i, "-#}")) {
        end = i + 3 + whitespace_run(src_, i + 3);
      } else if (starts_with_at(src_, i, "#}")) {
        end = i + 2;
        if (opt_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
      }
      if (end != std::string::npos) {
        finish_tag(end);
        return;
      }
    }
    throw Error("missing end of comment tag", open);
  }

  void lex_raw(size_t open, size_t body) {
    // line_starting for the raw text is decided by the raw-begin tag itself.
    line_starting_ = body > 0 && src_[body - 1] == '\n';
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t r = i + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      r += whitespace_run(src_, r);
      if (!starts_with_at(src_, r, "endraw")) continue;
      r += 6;
      r += whitespace_run(src_, r);
      const size_t end = match_block_end(r);
      if (end == std::string::npos) continue;
      std::string text = src_.substr(body, i - body);
      apply_left_control(text, sign, true);
      emit_data(std::move(text), body);
      finish_tag(end);
      return;
    }
    throw Error("missing end of raw directive", open);
  }

  void lex_tag(size_t open, size_t q, bool block) {
    tokens_.push_back(Token{block ? TokenType::BLOCK_BEGIN : TokenType::VAR_BEGIN, "", 0, 0.0, open});
    std::vector<char> stack;
    size_t i = q;
    const size_t n = src_.size();
    while (true) {
      if (stack.empty()) {
        size_t end = std::string::npos;
        if (block) {
          end = match_block_end(i);
        } else if (starts_with_at(src_, i, "-}}")) {
          end = i + 3 + whitespace_run(src_, i + 3);
        } else if (starts_with_at(src_, i, "}}")) {
          end = i + 2;
        }
        if (end != std::string::npos) {
          tokens_.push_back(Token{block ? TokenType::BLOCK_END : TokenType::VAR_END, "", 0, 0.0, i});
          finish_tag(end);
          return;
        }
      }
      const size_t ws = whitespace_run(src_, i);
      if (ws) {
        i += ws;
        continue;
      }
      if (i >= n) {
        throw Error(std::string("unexpected end of template, expected '") + (block ? "%}" : "}}") + "'",
                    open);
      }
      const char c = src_[i];
      if (is_digit(c)) {
        i = lex_number(i);
      } else if (is_name_start(c)) {
        size_t j = i;
        while (j < n && is_name_char(src_[j])) ++j;
        tokens_.push_back(Token{TokenType::NAME, src_.substr(i, j - i), 0, 0.0, i});
        i = j;
      } else if (c == '\'' || c == '"') {
        size_t j = i + 1;
        while (j < n && src_[j] != c) {
          if (src_[j] == '\\') ++j;
          ++j;
        }
        if (j >= n) throw Error("unterminated string literal", i);
        tokens_.push_back(Token{TokenType::STRING,
                                unescape(std::string_view(src_).substr(i + 1, j - i - 1), i), 0, 0.0, i});
        i = j + 1;
      } else {
        i = lex_operator(i, stack);
      }
    }
  }

  size_t lex_number(size_t i) {
    const size_t n = src_.size();
    auto digits = [&](size_t j) {  // (\d+_)*\d+ starting at j; returns end or j when none
      size_t k = j;
      while (k < n && is_digit(src_[k])) {
        while (k < n && is_digit(src_[k])) ++k;
        if (k + 1 < n && src_[k] == '_' && is_digit(src_[k + 1])) ++k;
      }
      return k;
    };
    // Prefixed integers: 0b, 0o, 0x.
    if (src_[i] == '0' && i + 2 < n) {
      const char p = static_cast<char>(src_[i + 1] | 0x20);
      const int base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 0;
      if (base) {
        size_t j = i + 2;
        std::string clean;
        while (j < n && (src_[j] == '_' || (hex_value(src_[j]) >= 0 && hex_value(src_[j]) < base))) {
          if (src_[j] != '_') clean.push_back(src_[j]);
          ++j;
        }
        if (!clean.empty()) {
          int64_t v = 0;
          auto res = std::from_chars(clean.data(), clean.data() + clean.size(), v, base);
          if (res.ec != std::errc()) throw Error("integer literal too large", i);
          tokens_.push_back(Token{TokenType::INTEGER, src_.substr(i, j - i), v, 0.0, i});
          return j;
        }
      }
    }
    size_t j = digits(i);
    bool is_float = false;
    if (j + 1 < n && src_[j] == '.' && is_digit(src_[j + 1])) {
      j = digits(j + 1);
      is_float = true;
    }
    if (j < n && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      if (k < n && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < n && is_digit(src_[k])) {
        j = digits(k);
        is_float = true;
      }
    }
    std::string text = src_.substr(i, j - i);
    std::string clean;
    for (char ch : text)
      if (ch != '_') clean.push_back(ch);
    Token t{is_float ? TokenType::FLOAT : TokenType::INTEGER, text, 0, 0.0, i};
    if (is_float) {
      t.float_value = std::strtod(clean.c_str(), nullptr);
    } else {
      auto res = std::from_chars(clean.data(), clean.data() + clean.size(), t.int_value);
      if (res.ec != std::errc()) throw Error("integer literal too large: " + text, i);
    }
    tokens_.push_back(std::move(t));
    return j;
  }

  size_t lex_operator(size_t i, std::vector<char>& stack) {
    static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (starts_with_at(src_, i, op)) {
        tokens_.push_back(Token{TokenType::OPERATOR, op, 0, 0.0, i});
        return i + 2;
      }
    }
    const char c = src_[i];
    static const std::string kOne = "+-/*%~[](){}<>=.:|,;";
    if (kOne.find(c) == std::string::npos) {
      throw Error(std::string("unexpected character '") + c + "'", i);
    }
    if (c == '(') stack.push_back(')');
    if (c == '[') stack.push_back(']');
    if (c == '{') stack.push_back('}');
    if (c == ')' || c == ']' || c == '}') {
      if (stack.empty()) throw Error(std::string("unexpected '") + c + "'", i);
      if (stack.back() != c)
        throw Error(std::string("unexpected '") + c + "', expected '" + stack.back() + "'", i);
      stack.pop_back();
    }
    tokens_.push_back(Token{TokenType::OPERATOR, std::string(1, c), 0, 0.0, i});
    return i + 1;
  }

  const std::string& src_;
  const LexerOptions& opt_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexerOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace swarm::jinja
