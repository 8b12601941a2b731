// PCRE2 (UTF-8 + UCP, JIT when available) behind a small interface, for the split patterns
// tokenizer.json files carry. Private to src/text/tokenizer*.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace swarm::tokenizer_detail {

/// A compiled pattern. Immutable and thread-safe (match data is per thread).
class Regex {
 public:
  /// Compiles a pattern written for the Rust `tokenizers` library (Oniguruma / Rust regex
  /// syntax). \s, \S, \w, \W are rewritten to Unicode White_Space / word classes so they match
  /// what Oniguruma matches rather than PCRE2's own definitions. Throws std::invalid_argument.
  static std::unique_ptr<Regex> compile(std::string_view pattern);
  /// A pattern that matches `literal` exactly.
  static std::unique_ptr<Regex> literal(std::string_view literal);
  ~Regex();

  /// Finds the next match in subject (valid UTF-8) at or after `from`; false if none.
  /// After an empty match at p, call again with `from` = p and `not_empty_at_start` = true.
  bool find(std::string_view subject, size_t from, size_t& begin, size_t& end,
            bool not_empty_at_start = false) const;

  /// Calls f(begin, end) for each non-overlapping match, left to right.
  template <class F>
  void for_each_match(std::string_view subject, F&& f) const {
    size_t from = 0, b = 0, e = 0;
    bool not_empty = false;
    while (from <= subject.size() && find(subject, from, b, e, not_empty)) {
      f(b, e);
      not_empty = b == e;
      from = e;
      if (not_empty && from == subject.size()) break;
    }
  }

 private:
  Regex() = default;
  struct Code;
  std::unique_ptr<Code> code_;
};

/// The rewrite compile() applies (exposed for tests).
std::string translate_pattern(std::string_view pattern);

}  // namespace swarm::tokenizer_detail
