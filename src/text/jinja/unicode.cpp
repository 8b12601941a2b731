#include "text/jinja/unicode.hpp"

#include <locale.h>
#include <wctype.h>

namespace swarm::jinja::unicode {

namespace {

// A UTF-8 C locale for the wide-character classification functions; glibc ships C.UTF-8
// with full Unicode simple case mappings. Without it, only ASCII is classified.
locale_t utf8_locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    if (l == static_cast<locale_t>(nullptr))
      l = newlocale(LC_CTYPE_MASK, "en_US.UTF-8", static_cast<locale_t>(nullptr));
    return l;
  }();
  return loc;
}

char32_t simple_upper(char32_t c) {
  if (c < 128) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  locale_t l = utf8_locale();
  return l ? static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), l)) : c;
}

char32_t simple_lower(char32_t c) {
  if (c < 128) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  locale_t l = utf8_locale();
  return l ? static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), l)) : c;
}

}  // namespace

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if ((b0 & 0xE0) == 0xC0) {
      len = 2, cp = b0 & 0x1F, min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, cp = b0 & 0x0F, min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    if (i + len > n) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (b & 0x3F);
    }
    if (!ok || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append(out, c);
  return out;
}

size_t length(std::string_view s) {
  // Valid UTF-8 (the common case): count the bytes that start a character.
  size_t n = 0;
  for (char ch : s)
    if ((static_cast<unsigned char>(ch) & 0xC0) != 0x80) ++n;
  return n;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB))
    return false;
  if ((c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000) return false;
  if (c == 0xFFFE || c == 0xFFFF || c > 0x10FFFF) return false;
  return true;
}

bool is_alpha(char32_t c) {
  if (c < 128) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  locale_t l = utf8_locale();
  return l && iswalpha_l(static_cast<wint_t>(c), l);
}

bool is_digit(char32_t c) {
  if (c < 128) return c >= '0' && c <= '9';
  locale_t l = utf8_locale();
  return l && iswdigit_l(static_cast<wint_t>(c), l);
}

bool is_alnum(char32_t c) { return is_alpha(c) || is_digit(c); }

bool is_cased(char32_t c) { return simple_upper(c) != c || simple_lower(c) != c || c == 0xDF; }
bool is_upper(char32_t c) { return simple_lower(c) != c && simple_upper(c) == c; }
bool is_lower(char32_t c) { return (simple_upper(c) != c && simple_lower(c) == c) || c == 0xDF; }

void append_upper(std::u32string& out, char32_t c) {
  if (c == 0xDF) {  // ß
    out += U"SS";
    return;
  }
  out.push_back(simple_upper(c));
}

void append_lower(std::u32string& out, char32_t c) {
  if (c == 0x130) {  // İ
    out += U"i\u0307";
    return;
  }
  out.push_back(simple_lower(c));
}

std::string upper(std::string_view s) {
  bool ascii = true;
  for (char ch : s) ascii = ascii && static_cast<unsigned char>(ch) < 0x80;
  if (ascii) {
    std::string r(s);
    for (char& ch : r)
      if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 32);
    return r;
  }
  std::u32string out;
  for (char32_t c : decode(s)) append_upper(out, c);
  return encode(out);
}

std::string lower(std::string_view s) {
  bool ascii = true;
  for (char ch : s) ascii = ascii && static_cast<unsigned char>(ch) < 0x80;
  if (ascii) {
    std::string r(s);
    for (char& ch : r)
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
    return r;
  }
  std::u32string out;
  for (char32_t c : decode(s)) append_lower(out, c);
  return encode(out);
}

std::string title(std::string_view s) {
  std::u32string out;
  bool prev_cased = false;
  for (char32_t c : decode(s)) {
    if (prev_cased)
      append_lower(out, c);
    else if (c == 0xDF)
      out += U"Ss";
    else
      append_upper(out, c);
    prev_cased = is_cased(c);
  }
  return encode(out);
}

std::string capitalize(std::string_view s) {
  std::u32string out;
  bool first = true;
  for (char32_t c : decode(s)) {
    if (first) {
      if (c == 0xDF)
        out += U"Ss";
      else
        append_upper(out, c);
      first = false;
    } else {
      append_lower(out, c);
    }
  }
  return encode(out);
}

std::string swapcase(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode(s)) {
    if (is_upper(c))
      append_lower(out, c);
    else if (is_lower(c))
      append_upper(out, c);
    else
      out.push_back(c);
  }
  return encode(out);
}

}  // namespace swarm::jinja::unicode
