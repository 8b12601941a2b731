#include "text/tokenizer_regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

namespace swarm::tokenizer_detail {
namespace {

// Unicode White_Space, which Oniguruma's and Rust's \s match (PCRE2's UCP \s differs: it also
// matches U+180E).
constexpr const char* kWhiteSpaceItems =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
// Rust regex's \w: Alphabetic, marks, decimal numbers, connector punctuation, joiners.
constexpr const char* kWordItems = "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}";

struct MatchData {
  pcre2_match_data* data = nullptr;
  MatchData() : data(pcre2_match_data_create(1, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(data); }
};

pcre2_match_data* thread_match_data() {
  thread_local MatchData md;
  return md.data;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      const char* items = e == 's' || e == 'S'   ? kWhiteSpaceItems
                          : e == 'w' || e == 'W' ? kWordItems
                                                 : nullptr;
      if (items != nullptr) {
        bool negated = e == 'S' || e == 'W';
        if (in_class) {
          if (negated) throw std::invalid_argument(std::string("\\") + e + " inside a character class");
          out += items;
        } else {
          out += negated ? "[^" : "[";
          out += items;
          out += ']';
        }
        ++i;
        continue;
      }
      out += c;
      out += e;
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {  // POSIX class [:alpha:]
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::unique_ptr<Regex> Regex::compile(std::string_view pattern) {
  std::string translated = translate_pattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::invalid_argument("regex " + std::string(pattern) + ": " +
                                reinterpret_cast<const char*>(message) + " at offset " +
                                std::to_string(offset));
  }
  std::unique_ptr<Regex> re(new Regex());
  re->code_ = std::make_unique<Code>();
  re->code_->code = code;
  re->code_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

std::unique_ptr<Regex> Regex::literal(std::string_view literal) {
  std::string quoted;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) quoted += '\\';
    quoted += c;
  }
  return compile(quoted);
}

Regex::~Regex() = default;

bool Regex::find(std::string_view subject, size_t from, size_t& begin, size_t& end,
                 bool not_empty_at_start) const {
  pcre2_match_data* md = thread_match_data();
  uint32_t options = PCRE2_NO_UTF_CHECK | (not_empty_at_start ? PCRE2_NOTEMPTY_ATSTART : 0);
  auto subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = code_->jit ? pcre2_jit_match(code_->code, subj, subject.size(), from, options, md, nullptr)
                      : PCRE2_ERROR_JIT_BADOPTION;
  if (rc == PCRE2_ERROR_JIT_BADOPTION || rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(code_->code, subj, subject.size(), from, options, md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw std::runtime_error(std::string("regex match failed: ") + reinterpret_cast<const char*>(message));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  begin = ov[0];
  end = ov[1];
  return true;
}

}  // namespace swarm::tokenizer_detail
