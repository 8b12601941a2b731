#include "text/jinja/builtins.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <initializer_list>
#include <optional>
#include <unordered_map>

#include "text/jinja/interpreter.hpp"
#include "text/jinja/unicode.hpp"

namespace swarm::jinja {

namespace {

// ---------------------------------------------------------------- argument binding

using Bound = std::vector<std::optional<Value>>;

// Binds positional then keyword arguments to the named parameters of `fn`.
Bound bind(std::string_view fn, const CallArgs& a, std::initializer_list<std::string_view> names) {
  Bound out(names.size());
  if (a.pos.size() > names.size())
    throw Error(std::string(fn) + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
                std::to_string(a.pos.size()) + " given)");
  for (size_t i = 0; i < a.pos.size(); ++i) out[i] = a.pos[i];
  for (const auto& [k, v] : a.kw) {
    size_t idx = 0;
    bool found = false;
    for (auto n : names) {
      if (n == k) {
        found = true;
        break;
      }
      ++idx;
    }
    if (!found) throw Error(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
    if (out[idx]) throw Error(std::string(fn) + "() got multiple values for argument '" + k + "'");
    out[idx] = v;
  }
  return out;
}

Value arg_or(const Bound& b, size_t i, const Value& dflt) { return b[i] ? *b[i] : dflt; }

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

const std::string& require_string(const Value& v, const char* what) {
  if (!v.is_string()) {
    if (v.is_undefined()) throw_undefined(v);
    throw Error(std::string(what) + " must be str, not " + type_name(v));
  }
  return v.as_string();
}

int64_t require_int(const Value& v, const char* what) {
  if (!v.is_integral()) {
    if (v.is_undefined()) throw_undefined(v);
    throw Error(std::string(what) + ": '" + type_name(v) + "' object cannot be interpreted as an integer");
  }
  return v.as_int();
}

Value str_value(std::u32string_view s) { return Value::string(unicode::encode(s)); }

int64_t py_len(const Value& v) {
  switch (v.type()) {
    case Type::UNDEFINED:
      return 0;
    case Type::STRING:
      return static_cast<int64_t>(unicode::length(v.as_string()));
    case Type::LIST:
      return static_cast<int64_t>(v.items().size());
    case Type::DICT:
      return static_cast<int64_t>(v.as_dict().items.size());
    default:
      throw Error("object of type '" + type_name(v) + "' has no len()");
  }
}

// Code point index of a byte offset in a UTF-8 string.
int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(unicode::length(std::string_view(s).substr(0, byte_pos)));
}

// ---------------------------------------------------------------- string helpers (Python str)

std::string strip_impl(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string set;
  const bool default_ws = chars == nullptr || chars->is_none() || chars->is_undefined();
  if (!default_ws) set = unicode::decode(require_string(*chars, "strip arg"));
  auto strip_char = [&](char32_t c) {
    return default_ws ? unicode::is_space(c) : set.find(c) != std::u32string::npos;
  };
  if (is_ascii(s) && (default_ws || is_ascii(chars->as_string()))) {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && strip_char(static_cast<unsigned char>(s[b]))) ++b;
    if (right)
      while (e > b && strip_char(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
  }
  std::u32string cps = unicode::decode(s);
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_char(cps[b])) ++b;
  if (right)
    while (e > b && strip_char(cps[e - 1])) --e;
  return unicode::encode(std::u32string_view(cps).substr(b, e - b));
}

std::vector<Value> split_impl(const std::string& s, const Value& sep_v, int64_t maxsplit, bool from_right) {
  std::vector<Value> out;
  if (sep_v.is_none() || sep_v.is_undefined()) {
    // Runs of whitespace; leading/trailing whitespace ignored.
    std::u32string cps = unicode::decode(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    const size_t n = cps.size();
    if (!from_right) {
      while (i < n) {
        while (i < n && unicode::is_space(cps[i])) ++i;
        if (i >= n) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = n;
          while (e > i && unicode::is_space(cps[e - 1])) --e;
          words.emplace_back(i, e);
          break;
        }
        size_t j = i;
        while (j < n && !unicode::is_space(cps[j])) ++j;
        words.emplace_back(i, j);
        i = j;
      }
    } else {
      size_t j = n;
      while (j > 0) {
        while (j > 0 && unicode::is_space(cps[j - 1])) --j;
        if (j == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t b = 0;
          while (b < j && unicode::is_space(cps[b])) ++b;
          words.emplace_back(b, j);
          break;
        }
        size_t b = j;
        while (b > 0 && !unicode::is_space(cps[b - 1])) --b;
        words.emplace_back(b, j);
        j = b;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto [b, e] : words) out.push_back(str_value(std::u32string_view(cps).substr(b, e - b)));
    return out;
  }
  const std::string& sep = require_string(sep_v, "separator");
  if (sep.empty()) throw Error("empty separator");
  if (!from_right) {
    size_t start = 0;
    int64_t splits = 0;
    while (maxsplit < 0 || splits < maxsplit) {
      const size_t p = s.find(sep, start);
      if (p == std::string::npos) break;
      out.push_back(Value::string(s.substr(start, p - start)));
      start = p + sep.size();
      ++splits;
    }
    out.push_back(Value::string(s.substr(start)));
  } else {
    size_t end = s.size();
    int64_t splits = 0;
    std::vector<Value> rev;
    while (maxsplit < 0 || splits < maxsplit) {
      if (end < sep.size()) break;
      const size_t p = s.rfind(sep, end - sep.size());
      if (p == std::string::npos) break;
      rev.push_back(Value::string(s.substr(p + sep.size(), end - p - sep.size())));
      end = p;
      ++splits;
    }
    rev.push_back(Value::string(s.substr(0, end)));
    out.assign(rev.rbegin(), rev.rend());
  }
  return out;
}

std::vector<Value> splitlines_impl(const std::string& s, bool keepends) {
  std::vector<Value> out;
  std::u32string cps = unicode::decode(s);
  size_t i = 0, start = 0;
  while (i < cps.size()) {
    if (unicode::is_line_break(cps[i])) {
      size_t eol = i + 1;
      if (cps[i] == '\r' && eol < cps.size() && cps[eol] == '\n') ++eol;
      out.push_back(str_value(std::u32string_view(cps).substr(start, (keepends ? eol : i) - start)));
      start = i = eol;
    } else {
      ++i;
    }
  }
  if (start < cps.size()) out.push_back(str_value(std::u32string_view(cps).substr(start)));
  return out;
}

std::string replace_impl(const std::string& s, const std::string& old, const std::string& repl,
                         int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement between every character (and at both ends).
    std::u32string cps = unicode::decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) unicode::append(out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += repl;
    start = p + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string pad_impl(const std::string& s, int64_t width, const std::string& fill_s,
                     int where /*-1 ljust, 0 center, 1 rjust*/) {
  std::u32string fill = unicode::decode(fill_s);
  if (fill.size() != 1) throw Error("The fill character must be exactly one character long");
  const auto len = static_cast<int64_t>(unicode::length(s));
  if (width <= len) return s;
  const int64_t marg = width - len;
  int64_t left = 0;
  if (where == 0)
    left = marg / 2 + (marg & width & 1);
  else if (where == 1)
    left = marg;
  std::u32string out(static_cast<size_t>(left), fill[0]);
  out += unicode::decode(s);
  out.append(static_cast<size_t>(marg - left), fill[0]);
  return unicode::encode(out);
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python's int(str): optional sign, digits with single underscores, surrounding whitespace.
std::optional<int64_t> parse_int(const std::string& text, int base) {
  std::string s = strip_impl(text, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  bool neg = false;
  size_t i = 0;
  if (s[0] == '+' || s[0] == '-') {
    neg = s[0] == '-';
    i = 1;
  }
  if (base == 16 && s.size() > i + 1 && s[i] == '0' && (s[i + 1] | 0x20) == 'x') i += 2;
  if (base == 8 && s.size() > i + 1 && s[i] == '0' && (s[i + 1] | 0x20) == 'o') i += 2;
  if (base == 2 && s.size() > i + 1 && s[i] == '0' && (s[i + 1] | 0x20) == 'b') i += 2;
  std::string digits;
  for (; i < s.size(); ++i) {
    if (s[i] == '_' && !digits.empty() && i + 1 < s.size() && s[i + 1] != '_') continue;
    digits.push_back(s[i]);
  }
  if (digits.empty()) return std::nullopt;
  int64_t v = 0;
  auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
  if (res.ec != std::errc() || res.ptr != digits.data() + digits.size()) return std::nullopt;
  return neg ? -v : v;
}

// Python's float(str).
std::optional<double> parse_float(const std::string& text) {
  std::string s = strip_impl(text, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  std::string lower = unicode::lower(s);
  std::string body = lower;
  bool neg = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    neg = body[0] == '-';
    body = body.substr(1);
  }
  if (body == "inf" || body == "infinity") return neg ? -INFINITY : INFINITY;
  if (body == "nan") return NAN;
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1])))
        return std::nullopt;
      continue;
    }
    clean.push_back(s[i]);
  }
  for (char c : clean)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' ||
          c == '-'))
      return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

// ---------------------------------------------------------------- attribute getters

// Jinja's make_attrgetter: "a.b.0" looks up each part with getitem.
Value get_attribute_path(Runtime& rt, const Value& item, const Value& attribute) {
  if (attribute.is_integral()) return rt.getitem(item, attribute);
  const std::string& path = require_string(attribute, "attribute");
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    std::optional<int64_t> idx;
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
      idx = parse_int(part, 10);
    cur = idx ? rt.getitem(cur, Value::integer(*idx)) : rt.getitem(cur, Value::string(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(unicode::lower(v.as_string())) : v; }

// ---------------------------------------------------------------- strftime

std::string strftime_impl(const std::string& fmt, std::chrono::system_clock::time_point tp) {
  const std::time_t t = std::chrono::system_clock::to_time_t(tp);
  std::tm local{};
  localtime_r(&t, &local);
  auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(tp.time_since_epoch()).count() % 1000000;
  if (micros < 0) micros += 1000000;
  // Python handles %f itself and prints %z/%Z as empty for naive datetimes.
  std::string f;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%' || i + 1 >= fmt.size()) {
      f.push_back(fmt[i]);
      continue;
    }
    const char c = fmt[++i];
    if (c == 'f') {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "%06lld", static_cast<long long>(micros));
      f += buf;
    } else if (c == 'z' || c == 'Z') {
      // empty
    } else {
      f.push_back('%');
      f.push_back(c);
    }
  }
  if (f.empty()) return "";
  std::string out(256 + f.size() * 8, '\0');
  size_t n = std::strftime(out.data(), out.size(), f.c_str(), &local);
  out.resize(n);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- percent formatting

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> list;
  const Value* mapping = nullptr;
  if (args.is_tuple())
    list = args.items();
  else if (args.is_dict())
    mapping = &args;
  else
    list.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) throw Error("incomplete format");
    Value arg;
    bool have_arg = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) throw Error("incomplete format key");
      if (!mapping) throw Error("format requires a mapping");
      const Value* v = mapping->as_dict().find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!v) throw Error("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      arg = *v;
      have_arg = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos)
      flags.push_back(fmt[i++]);
    std::string width, precision;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) width.push_back(fmt[i++]);
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = "0";
      std::string p;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) p.push_back(fmt[i++]);
      if (!p.empty()) precision = p;
    }
    if (i >= fmt.size()) throw Error("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) {
      if (mapping) {
        arg = *mapping;
      } else {
        if (next >= list.size()) throw Error("not enough arguments for format string");
        arg = list[next++];
      }
    }
    std::string spec = "%" + flags + width + (precision.empty() ? "" : "." + precision);
    char buf[512];
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conv == 's' ? to_str(arg) : repr(arg);
        if (!precision.empty()) {
          std::u32string cps = unicode::decode(s);
          const auto p = static_cast<size_t>(std::stoll(precision));
          if (cps.size() > p) s = unicode::encode(std::u32string_view(cps).substr(0, p));
        }
        const int64_t w = width.empty() ? 0 : std::stoll(width);
        s = pad_impl(s, w, " ", flags.find('-') != std::string::npos ? -1 : 1);
        out += s;
        break;
      }
      case 'd':
      case 'i':
      case 'u': {
        if (!arg.is_number()) throw Error("%d format: a real number is required, not " + type_name(arg));
        const long long v =
            arg.is_float() ? static_cast<long long>(std::trunc(arg.as_double())) : arg.as_int();
        std::snprintf(buf, sizeof(buf), (spec + "lld").c_str(), v);
        out += buf;
        break;
      }
      case 'x':
      case 'X':
      case 'o': {
        if (!arg.is_integral())
          throw Error(std::string("%") + conv + " format: an integer is required, not " + type_name(arg));
        const long long v = arg.as_int();
        std::snprintf(buf, sizeof(buf), (spec + "ll" + conv).c_str(), v < 0 ? -v : v);
        out += (v < 0 ? "-" : "") + std::string(buf);
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!arg.is_number()) throw Error(std::string("must be real number, not ") + type_name(arg));
        std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), arg.as_double());
        out += buf;
        break;
      }
      case 'c': {
        if (arg.is_integral()) {
          unicode::append(out, static_cast<char32_t>(arg.as_int()));
        } else {
          out += to_str(arg);
        }
        break;
      }
      default:
        throw Error(std::string("unsupported format character '") + conv + "'");
    }
  }
  // Python treats a non-tuple argument with __getitem__ (list, dict, Undefined) as a mapping:
  // leaving it unused is not an error.
  const bool mapping_like = args.is_dict() || (args.is_list() && !args.is_tuple()) || args.is_undefined();
  if (!mapping && !mapping_like && next < list.size())
    throw Error("not all arguments converted during string formatting");
  return out;
}

namespace {

// Python's str.format with {} / {0} / {name}, !r / !s conversions and simple format specs.
std::string brace_format(Runtime& rt, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      throw Error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw Error("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec, conversion;
    if (auto colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (auto bang = field.find('!'); bang != std::string::npos) {
      conversion = field.substr(bang + 1);
      field.resize(bang);
    }
    // field: name or index, then .attr / [key] parts
    size_t p = 0;
    while (p < field.size() && field[p] != '.' && field[p] != '[') ++p;
    std::string head = field.substr(0, p);
    Value v;
    if (head.empty()) {
      if (auto_index >= args.pos.size())
        throw Error("Replacement index " + std::to_string(auto_index) + " out of range");
      v = args.pos[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const size_t idx = std::stoul(head);
      if (idx >= args.pos.size()) throw Error("Replacement index " + head + " out of range");
      v = args.pos[idx];
    } else {
      bool found = false;
      for (const auto& [k, val] : args.kw) {
        if (k == head) {
          v = val;
          found = true;
        }
      }
      if (!found) throw Error("KeyError: '" + head + "'");
    }
    while (p < field.size()) {
      if (field[p] == '.') {
        size_t q = p + 1;
        while (q < field.size() && field[q] != '.' && field[q] != '[') ++q;
        v = rt.getattr(v, field.substr(p + 1, q - p - 1));
        p = q;
      } else {
        const size_t q = field.find(']', p);
        if (q == std::string::npos) throw Error("Missing ']' in format string");
        std::string key = field.substr(p + 1, q - p - 1);
        auto as_int = parse_int(key, 10);
        v = as_int ? rt.getitem(v, Value::integer(*as_int)) : rt.getitem(v, Value::string(key));
        p = q + 1;
      }
    }
    std::string s;
    if (conversion == "r" || conversion == "a")
      s = repr(v);
    else if (spec.empty() || !v.is_number())
      s = to_str(v);
    if (!spec.empty()) {
      if (v.is_number() && conversion.empty()) {
        // Numeric spec: map the common cases onto printf.
        char type = spec.back();
        std::string body = spec;
        if (std::isalpha(static_cast<unsigned char>(type)))
          body.pop_back();
        else
          type = v.is_float() ? 'g' : 'd';
        char buf[512];
        if (type == 'd') {
          std::snprintf(buf, sizeof(buf), ("%" + body + "lld").c_str(), static_cast<long long>(v.as_int()));
        } else {
          std::snprintf(buf, sizeof(buf), ("%" + body + type).c_str(), v.as_double());
        }
        s = buf;
      } else {
        // [[fill]align][width]
        char align = '<', fill = ' ';
        std::string w = spec;
        if (w.size() >= 2 && (w[1] == '<' || w[1] == '>' || w[1] == '^')) {
          fill = w[0];
          align = w[1];
          w = w.substr(2);
        } else if (!w.empty() && (w[0] == '<' || w[0] == '>' || w[0] == '^')) {
          align = w[0];
          w = w.substr(1);
        }
        const int64_t width = w.empty() ? 0 : std::stoll(w);
        s = pad_impl(s, width, std::string(1, fill), align == '<' ? -1 : align == '>' ? 1 : 0);
      }
    }
    out += s;
  }
  return out;
}

// ---------------------------------------------------------------- methods

Value m_startswith(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("startswith", a, {"prefix"});
  const std::string& s = self.as_string();
  const Value prefix = arg_or(b, 0, Value());
  if (prefix.is_tuple() || prefix.is_list()) {
    for (const auto& p : prefix.items())
      if (s.compare(0, require_string(p, "startswith arg").size(), p.as_string()) == 0)
        return Value::boolean(true);
    return Value::boolean(false);
  }
  const std::string& p = require_string(prefix, "startswith first arg");
  return Value::boolean(s.compare(0, p.size(), p) == 0);
}

Value m_endswith(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("endswith", a, {"suffix"});
  const std::string& s = self.as_string();
  auto ends = [&](const std::string& p) {
    return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  const Value suffix = arg_or(b, 0, Value());
  if (suffix.is_tuple() || suffix.is_list()) {
    for (const auto& p : suffix.items())
      if (ends(require_string(p, "endswith arg"))) return Value::boolean(true);
    return Value::boolean(false);
  }
  return Value::boolean(ends(require_string(suffix, "endswith first arg")));
}

Value m_split(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("split", a, {"sep", "maxsplit"});
  return Value::list(split_impl(self.as_string(), arg_or(b, 0, Value::none()),
                                require_int(arg_or(b, 1, Value::integer(-1)), "maxsplit"), false));
}

Value m_rsplit(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("rsplit", a, {"sep", "maxsplit"});
  return Value::list(split_impl(self.as_string(), arg_or(b, 0, Value::none()),
                                require_int(arg_or(b, 1, Value::integer(-1)), "maxsplit"), true));
}

Value m_splitlines(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("splitlines", a, {"keepends"});
  return Value::list(splitlines_impl(self.as_string(), truthy(arg_or(b, 0, Value::boolean(false)))));
}

Value m_strip(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("strip", a, {"chars"});
  const Value chars = arg_or(b, 0, Value::none());
  return Value::string(strip_impl(self.as_string(), &chars, true, true));
}

Value m_lstrip(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("lstrip", a, {"chars"});
  const Value chars = arg_or(b, 0, Value::none());
  return Value::string(strip_impl(self.as_string(), &chars, true, false));
}

Value m_rstrip(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("rstrip", a, {"chars"});
  const Value chars = arg_or(b, 0, Value::none());
  return Value::string(strip_impl(self.as_string(), &chars, false, true));
}

Value m_replace(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("replace", a, {"old", "new", "count"});
  if (!b[0] || !b[1]) throw Error("replace() takes at least 2 arguments");
  return Value::string(replace_impl(self.as_string(), require_string(*b[0], "replace() argument 1"),
                                    require_string(*b[1], "replace() argument 2"),
                                    require_int(arg_or(b, 2, Value::integer(-1)), "count")));
}

Value m_upper(Runtime&, const Value& self, CallArgs& a) {
  bind("upper", a, {});
  return Value::string(unicode::upper(self.as_string()));
}
Value m_lower(Runtime&, const Value& self, CallArgs& a) {
  bind("lower", a, {});
  return Value::string(unicode::lower(self.as_string()));
}
Value m_title(Runtime&, const Value& self, CallArgs& a) {
  bind("title", a, {});
  return Value::string(unicode::title(self.as_string()));
}
Value m_capitalize(Runtime&, const Value& self, CallArgs& a) {
  bind("capitalize", a, {});
  return Value::string(unicode::capitalize(self.as_string()));
}
Value m_swapcase(Runtime&, const Value& self, CallArgs& a) {
  bind("swapcase", a, {});
  return Value::string(unicode::swapcase(self.as_string()));
}

// find/rfind/index/rindex/count share the (sub, start, end) handling on code points.
struct FindArgs {
  std::string sub;
  size_t begin_byte = 0, end_byte = 0;
  int64_t begin_cp = 0;
};

FindArgs find_args(const char* fn, const Value& self, CallArgs& a) {
  auto b = bind(fn, a, {"sub", "start", "end"});
  if (!b[0]) throw Error(std::string(fn) + "() takes at least 1 argument (0 given)");
  FindArgs f;
  f.sub = require_string(*b[0], fn);
  const std::string& s = self.as_string();
  const auto len = static_cast<int64_t>(unicode::length(s));
  auto norm = [&](const std::optional<Value>& v, int64_t dflt) {
    if (!v || v->is_none()) return dflt;
    int64_t i = require_int(*v, fn);
    if (i < 0) i = std::max<int64_t>(0, i + len);
    return std::min(i, len);
  };
  const int64_t start = norm(b[1], 0), end = norm(b[2], len);
  // byte offsets of code point positions
  auto byte_of = [&](int64_t cp) {
    size_t byte = 0;
    int64_t k = 0;
    while (byte < s.size() && k < cp) {
      ++byte;
      while (byte < s.size() && (static_cast<unsigned char>(s[byte]) & 0xC0) == 0x80) ++byte;
      ++k;
    }
    return byte;
  };
  f.begin_cp = start;
  f.begin_byte = byte_of(start);
  f.end_byte = end < start ? f.begin_byte : byte_of(end);
  return f;
}

int64_t find_impl(const char* fn, const Value& self, CallArgs& a, bool reverse) {
  FindArgs f = find_args(fn, self, a);
  const std::string& s = self.as_string();
  std::string_view window(s.data() + f.begin_byte, f.end_byte - f.begin_byte);
  const size_t p = reverse ? window.rfind(f.sub) : window.find(f.sub);
  if (p == std::string_view::npos) return -1;
  return f.begin_cp + cp_index(std::string(window), p);
}

Value m_find(Runtime&, const Value& self, CallArgs& a) {
  return Value::integer(find_impl("find", self, a, false));
}
Value m_rfind(Runtime&, const Value& self, CallArgs& a) {
  return Value::integer(find_impl("rfind", self, a, true));
}
Value m_index(Runtime&, const Value& self, CallArgs& a) {
  const int64_t r = find_impl("index", self, a, false);
  if (r < 0) throw Error("substring not found");
  return Value::integer(r);
}
Value m_rindex(Runtime&, const Value& self, CallArgs& a) {
  const int64_t r = find_impl("rindex", self, a, true);
  if (r < 0) throw Error("substring not found");
  return Value::integer(r);
}
Value m_count(Runtime&, const Value& self, CallArgs& a) {
  FindArgs f = find_args("count", self, a);
  std::string_view window(self.as_string().data() + f.begin_byte, f.end_byte - f.begin_byte);
  if (f.sub.empty()) return Value::integer(static_cast<int64_t>(unicode::length(window)) + 1);
  int64_t n = 0;
  for (size_t p = window.find(f.sub); p != std::string_view::npos; p = window.find(f.sub, p + f.sub.size()))
    ++n;
  return Value::integer(n);
}

Value m_join(Runtime& rt, const Value& self, CallArgs& a) {
  auto b = bind("join", a, {"iterable"});
  if (!b[0]) throw Error("join() takes exactly one argument (0 given)");
  std::string out;
  size_t i = 0;
  for (const auto& item : rt.iterate(*b[0])) {
    if (!item.is_string())
      throw Error("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) +
                  " found");
    if (i++) out += self.as_string();
    out += item.as_string();
  }
  return Value::string(std::move(out));
}

Value m_format(Runtime& rt, const Value& self, CallArgs& a) {
  return Value::string(brace_format(rt, self.as_string(), a));
}

template <bool (*Pred)(char32_t)>
Value str_predicate(const Value& self, CallArgs& a) {
  bind("is*", a, {});
  std::u32string cps = unicode::decode(self.as_string());
  if (cps.empty()) return Value::boolean(false);
  for (char32_t c : cps)
    if (!Pred(c)) return Value::boolean(false);
  return Value::boolean(true);
}
Value m_isdigit(Runtime&, const Value& self, CallArgs& a) {
  return str_predicate<unicode::is_digit>(self, a);
}
Value m_isalpha(Runtime&, const Value& self, CallArgs& a) {
  return str_predicate<unicode::is_alpha>(self, a);
}
Value m_isalnum(Runtime&, const Value& self, CallArgs& a) {
  return str_predicate<unicode::is_alnum>(self, a);
}
Value m_isspace(Runtime&, const Value& self, CallArgs& a) {
  return str_predicate<unicode::is_space>(self, a);
}

Value case_predicate(const Value& self, CallArgs& a, bool upper) {
  bind(upper ? "isupper" : "islower", a, {});
  bool cased = false;
  for (char32_t c : unicode::decode(self.as_string())) {
    if (upper ? unicode::is_lower(c) : unicode::is_upper(c)) return Value::boolean(false);
    cased = cased || (upper ? unicode::is_upper(c) : unicode::is_lower(c));
  }
  return Value::boolean(cased);
}
Value m_isupper(Runtime&, const Value& self, CallArgs& a) { return case_predicate(self, a, true); }
Value m_islower(Runtime&, const Value& self, CallArgs& a) { return case_predicate(self, a, false); }

Value m_zfill(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("zfill", a, {"width"});
  const int64_t width = require_int(arg_or(b, 0, Value::integer(0)), "zfill");
  const std::string& s = self.as_string();
  const auto len = static_cast<int64_t>(unicode::length(s));
  if (width <= len) return self;
  std::string out = s;
  size_t at = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  out.insert(at, static_cast<size_t>(width - len), '0');
  return Value::string(std::move(out));
}

Value pad_method(const char* fn, const Value& self, CallArgs& a, int where) {
  auto b = bind(fn, a, {"width", "fillchar"});
  if (!b[0]) throw Error(std::string(fn) + "() takes at least 1 argument (0 given)");
  return Value::string(pad_impl(self.as_string(), require_int(*b[0], fn),
                                require_string(arg_or(b, 1, Value::string(" ")), fn), where));
}
Value m_ljust(Runtime&, const Value& self, CallArgs& a) { return pad_method("ljust", self, a, -1); }
Value m_rjust(Runtime&, const Value& self, CallArgs& a) { return pad_method("rjust", self, a, 1); }
Value m_center(Runtime&, const Value& self, CallArgs& a) { return pad_method("center", self, a, 0); }

Value partition_impl(const char* fn, const Value& self, CallArgs& a, bool reverse) {
  auto b = bind(fn, a, {"sep"});
  if (!b[0]) throw Error(std::string(fn) + "() takes exactly one argument (0 given)");
  const std::string& sep = require_string(*b[0], fn);
  if (sep.empty()) throw Error("empty separator");
  const std::string& s = self.as_string();
  const size_t p = reverse ? s.rfind(sep) : s.find(sep);
  if (p == std::string::npos) {
    if (reverse) return Value::tuple({Value::string(""), Value::string(""), self});
    return Value::tuple({self, Value::string(""), Value::string("")});
  }
  return Value::tuple(
      {Value::string(s.substr(0, p)), Value::string(sep), Value::string(s.substr(p + sep.size()))});
}
Value m_partition(Runtime&, const Value& self, CallArgs& a) {
  return partition_impl("partition", self, a, false);
}
Value m_rpartition(Runtime&, const Value& self, CallArgs& a) {
  return partition_impl("rpartition", self, a, true);
}

Value m_removeprefix(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("removeprefix", a, {"prefix"});
  const std::string& p = require_string(arg_or(b, 0, Value()), "removeprefix");
  const std::string& s = self.as_string();
  return s.compare(0, p.size(), p) == 0 ? Value::string(s.substr(p.size())) : self;
}

Value m_removesuffix(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("removesuffix", a, {"suffix"});
  const std::string& p = require_string(arg_or(b, 0, Value()), "removesuffix");
  const std::string& s = self.as_string();
  if (!p.empty() && s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
    return Value::string(s.substr(0, s.size() - p.size()));
  return self;
}

Value m_dict_items(Runtime&, const Value& self, CallArgs& a) {
  bind("items", a, {});
  std::vector<Value> out;
  out.reserve(self.as_dict().items.size());
  for (const auto& [k, v] : self.as_dict().items) out.push_back(Value::tuple({k, v}));
  return Value::list(std::move(out));
}

Value m_dict_keys(Runtime&, const Value& self, CallArgs& a) {
  bind("keys", a, {});
  std::vector<Value> out;
  for (const auto& kv : self.as_dict().items) out.push_back(kv.first);
  return Value::list(std::move(out));
}

Value m_dict_values(Runtime&, const Value& self, CallArgs& a) {
  bind("values", a, {});
  std::vector<Value> out;
  for (const auto& kv : self.as_dict().items) out.push_back(kv.second);
  return Value::list(std::move(out));
}

Value m_dict_get(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("get", a, {"key", "default"});
  if (!b[0]) throw Error("get expected at least 1 argument, got 0");
  if (const Value* v = self.as_dict().find(*b[0])) return *v;
  return arg_or(b, 1, Value::none());
}

Value m_dict_copy(Runtime&, const Value& self, CallArgs& a) {
  bind("copy", a, {});
  return Value::dict(self.as_dict());
}

Value m_list_index(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("index", a, {"value"});
  const Value needle = arg_or(b, 0, Value());
  const auto& items = self.items();
  for (size_t i = 0; i < items.size(); ++i)
    if (equals(items[i], needle)) return Value::integer(static_cast<int64_t>(i));
  throw Error(repr(needle) + " is not in list");
}

Value m_list_count(Runtime&, const Value& self, CallArgs& a) {
  auto b = bind("count", a, {"value"});
  const Value needle = arg_or(b, 0, Value());
  int64_t n = 0;
  for (const auto& item : self.items()) n += equals(item, needle) ? 1 : 0;
  return Value::integer(n);
}

using MethodTable = std::unordered_map<std::string_view, MethodFn>;

const MethodTable& string_methods() {
  static const MethodTable t = {
      {"startswith", m_startswith},
      {"endswith", m_endswith},
      {"split", m_split},
      {"rsplit", m_rsplit},
      {"splitlines", m_splitlines},
      {"strip", m_strip},
      {"lstrip", m_lstrip},
      {"rstrip", m_rstrip},
      {"replace", m_replace},
      {"upper", m_upper},
      {"lower", m_lower},
      {"casefold", m_lower},
      {"title", m_title},
      {"capitalize", m_capitalize},
      {"swapcase", m_swapcase},
      {"find", m_find},
      {"rfind", m_rfind},
      {"index", m_index},
      {"rindex", m_rindex},
      {"count", m_count},
      {"join", m_join},
      {"format", m_format},
      {"isdigit", m_isdigit},
      {"isdecimal", m_isdigit},
      {"isnumeric", m_isdigit},
      {"isalpha", m_isalpha},
      {"isalnum", m_isalnum},
      {"isspace", m_isspace},
      {"isupper", m_isupper},
      {"islower", m_islower},
      {"zfill", m_zfill},
      {"ljust", m_ljust},
      {"rjust", m_rjust},
      {"center", m_center},
      {"partition", m_partition},
      {"rpartition", m_rpartition},
      {"removeprefix", m_removeprefix},
      {"removesuffix", m_removesuffix},
  };
  return t;
}

const MethodTable& dict_methods() {
  static const MethodTable t = {
      {"items", m_dict_items}, {"keys", m_dict_keys}, {"values", m_dict_values},
      {"get", m_dict_get},     {"copy", m_dict_copy},
  };
  return t;
}

const MethodTable& list_methods() {
  static const MethodTable t = {{"index", m_list_index}, {"count", m_list_count}};
  return t;
}

class BoundMethod final : public Callable {
 public:
  BoundMethod(Value self, std::string name, MethodFn fn)
      : self_(std::move(self)), name_(std::move(name)), fn_(fn) {}
  Value call(Runtime& rt, CallArgs& args) const override { return fn_(rt, self_, args); }
  std::string name() const override { return name_; }

 private:
  Value self_;
  std::string name_;
  MethodFn fn_;
};

// ---------------------------------------------------------------- filters

Value f_abs(Runtime&, const Value& v, CallArgs& a) {
  bind("abs", a, {});
  if (v.is_integral()) return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (v.is_undefined()) throw_undefined(v);
  throw Error("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Runtime& rt, const Value& v, CallArgs& a) {
  auto b = bind("attr", a, {"name"});
  const std::string& name = require_string(arg_or(b, 0, Value()), "attr name");
  if (v.is_dict()) {
    if (MethodFn m = find_method(v, name)) return bind_method(v, name, m);
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return rt.getattr(v, name);
}

Value f_batch(Runtime& rt, const Value& v, CallArgs& a) {
  auto b = bind("batch", a, {"linecount", "fill_with"});
  const int64_t n = require_int(arg_or(b, 0, Value()), "batch linecount");
  if (n <= 0) throw Error("batch linecount must be positive");
  std::vector<Value> out, cur;
  for (const auto& item : rt.iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (b[1] && !b[1]->is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*b[1]);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(Runtime&, const Value& v, CallArgs& a) {
  bind("capitalize", a, {});
  return Value::string(unicode::capitalize(to_str(v)));
}

Value f_center(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("center", a, {"width"});
  return Value::string(
      pad_impl(to_str(v), require_int(arg_or(b, 0, Value::integer(80)), "center width"), " ", 0));
}

Value f_length(Runtime&, const Value& v, CallArgs& a) {
  bind("length", a, {});
  return Value::integer(py_len(v));
}

Value f_default(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("default", a, {"default_value", "boolean"});
  const bool boolean = truthy(arg_or(b, 1, Value::boolean(false)));
  if (v.is_undefined() || (boolean && !truthy(v))) return arg_or(b, 0, Value::string(""));
  return v;
}

Value f_dictsort(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) {
    if (v.is_undefined()) return Value::list({});
    throw Error("dictsort filter: expected a mapping");
  }
  const bool cs = truthy(arg_or(b, 0, Value::boolean(false)));
  const std::string by = to_str(arg_or(b, 1, Value::string("key")));
  if (by != "key" && by != "value") throw Error("You can only sort by either \"key\" or \"value\"");
  const bool rev = truthy(arg_or(b, 2, Value::boolean(false)));
  std::vector<Value> items;
  for (const auto& [k, val] : v.as_dict().items) items.push_back(Value::tuple({k, val}));
  const size_t pos = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = x.items()[pos], ky = y.items()[pos];
    if (!cs) kx = ignore_case(kx), ky = ignore_case(ky);
    return rev ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
  });
  return Value::list(std::move(items));
}

Value f_escape(Runtime&, const Value& v, CallArgs& a) {
  bind("escape", a, {});
  return Value::string(html_escape(to_str(v)));
}

Value f_first(Runtime& rt, const Value& v, CallArgs& a) {
  bind("first", a, {});
  if (v.is_list())
    return v.items().empty() ? Value::undefined("No first item, sequence was empty.") : v.items()[0];
  std::vector<Value> items = rt.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Runtime& rt, const Value& v, CallArgs& a) {
  bind("last", a, {});
  if (v.is_list())
    return v.items().empty() ? Value::undefined("No last item, sequence was empty.") : v.items().back();
  std::vector<Value> items = rt.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("float", a, {"default"});
  Value dflt = arg_or(b, 0, Value::number(0.0));
  if (v.is_undefined()) throw_undefined(v);  // Undefined.__float__ raises
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    if (auto d = parse_float(v.as_string())) return Value::number(*d);
  }
  return dflt;
}

Value f_format(Runtime&, const Value& v, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty())
    throw Error("can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    DictObj d;
    for (const auto& [k, val] : a.kw) d.set(Value::string(k), val);
    return Value::string(percent_format(to_str(v), Value::dict(std::move(d))));
  }
  return Value::string(percent_format(to_str(v), Value::tuple(a.pos)));
}

Value f_indent(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("indent", a, {"width", "first", "blank"});
  const Value width = arg_or(b, 0, Value::integer(4));
  const std::string indention =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, require_int(width, "indent width"))), ' ');
  const bool first = truthy(arg_or(b, 1, Value::boolean(false)));
  const bool blank = truthy(arg_or(b, 2, Value::boolean(false)));
  if (v.is_undefined()) throw_undefined(v);
  if (!v.is_string()) throw Error("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  std::string s = v.as_string() + "\n";
  std::vector<Value> lines = splitlines_impl(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i].as_string();
    }
  } else {
    rv = lines.empty() ? "" : lines[0].as_string();
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].as_string().empty()) rv += indention;
      rv += lines[i].as_string();
    }
  }
  if (first) rv = indention + rv;
  return Value::string(std::move(rv));
}

Value f_int(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("int", a, {"default", "base"});
  Value dflt = arg_or(b, 0, Value::integer(0));
  const int base = static_cast<int>(require_int(arg_or(b, 1, Value::integer(10)), "int base"));
  if (v.is_undefined()) throw_undefined(v);  // Undefined.__int__ raises
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (std::isnan(d)) return dflt;
    if (std::isinf(d) || std::fabs(d) >= 9.2e18) throw Error("cannot convert float to integer");
    return Value::integer(static_cast<int64_t>(std::trunc(d)));
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), base)) return Value::integer(*i);
    if (auto d = parse_float(v.as_string())) {
      if (std::isnan(*d)) return dflt;
      if (std::isinf(*d) || std::fabs(*d) >= 9.2e18) throw Error("cannot convert float to integer");
      return Value::integer(static_cast<int64_t>(std::trunc(*d)));
    }
  }
  return dflt;
}

Value f_items(Runtime&, const Value& v, CallArgs& a) {
  bind("items", a, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw Error("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.as_dict().items) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value f_join(Runtime& rt, const Value& v, CallArgs& a) {
  auto b = bind("join", a, {"d", "attribute"});
  const std::string sep = to_str(arg_or(b, 0, Value::string("")));
  std::string out;
  bool first = true;
  for (const auto& item : rt.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += b[1] && !b[1]->is_none() ? to_str(get_attribute_path(rt, item, *b[1])) : to_str(item);
  }
  return Value::string(std::move(out));
}

Value f_list(Runtime& rt, const Value& v, CallArgs& a) {
  bind("list", a, {});
  if (v.is_list() && !v.is_tuple()) return v;
  return Value::list(rt.iterate(v));
}

Value f_lower(Runtime&, const Value& v, CallArgs& a) {
  bind("lower", a, {});
  return Value::string(unicode::lower(to_str(v)));
}

Value f_upper(Runtime&, const Value& v, CallArgs& a) {
  bind("upper", a, {});
  return Value::string(unicode::upper(to_str(v)));
}

Value f_title(Runtime&, const Value& v, CallArgs& a) {
  bind("title", a, {});
  // Jinja's title: words start after '-', whitespace, '(', '{', '[' or '<'.
  std::u32string out;
  bool at_start = true;
  for (char32_t c : unicode::decode(to_str(v))) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || unicode::is_space(c);
    if (sep) {
      out.push_back(c);
      at_start = true;
    } else if (at_start) {
      unicode::append_upper(out, c);
      at_start = false;
    } else {
      unicode::append_lower(out, c);
    }
  }
  return str_value(out);
}

Value f_trim(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("trim", a, {"chars"});
  const Value chars = arg_or(b, 0, Value::none());
  return Value::string(strip_impl(to_str(v), &chars, true, true));
}

Value apply_named_filter(Runtime& rt, const std::string& name, const Value& item,
                         const std::vector<Value>& args,
                         const std::vector<std::pair<std::string, Value>>& kw) {
  FilterFn fn = find_filter(name);
  if (!fn) throw Error("unknown filter '" + name + "'");
  CallArgs a{args, kw};
  return fn(rt, item, a);
}

bool apply_named_test(Runtime& rt, const std::string& name, const Value& item,
                      const std::vector<Value>& args) {
  TestFn fn = find_test(name);
  if (!fn) throw Error("unknown test '" + name + "'");
  CallArgs a{args, {}};
  return fn(rt, item, a);
}

Value f_map(Runtime& rt, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (a.pos.empty()) {
    const Value* attribute = nullptr;
    const Value* dflt = nullptr;
    for (const auto& [k, val] : a.kw) {
      if (k == "attribute")
        attribute = &val;
      else if (k == "default")
        dflt = &val;
      else
        throw Error("Unexpected keyword argument '" + k + "'");
    }
    if (!attribute) throw Error("map requires a filter name or attribute=");
    for (const auto& item : rt.iterate(v)) {
      Value r = get_attribute_path(rt, item, *attribute);
      if (r.is_undefined() && dflt) r = *dflt;
      out.push_back(std::move(r));
    }
    return Value::list(std::move(out));
  }
  const std::string& name = require_string(a.pos[0], "map filter name");
  std::vector<Value> args(a.pos.begin() + 1, a.pos.end());
  for (const auto& item : rt.iterate(v)) out.push_back(apply_named_filter(rt, name, item, args, a.kw));
  return Value::list(std::move(out));
}

Value select_impl(Runtime& rt, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  std::vector<Value> out;
  size_t k = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) throw Error("Missing parameter for attribute name");
    attribute = a.pos[k++];
  }
  std::string test;
  std::vector<Value> targs;
  if (k < a.pos.size()) {
    test = require_string(a.pos[k++], "test name");
    targs.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k), a.pos.end());
  }
  for (const auto& item : rt.iterate(v)) {
    const Value subject = by_attr ? get_attribute_path(rt, item, attribute) : item;
    const bool r = test.empty() ? truthy(subject) : apply_named_test(rt, test, subject, targs);
    if (r == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Runtime& rt, const Value& v, CallArgs& a) { return select_impl(rt, v, a, false, true); }
Value f_reject(Runtime& rt, const Value& v, CallArgs& a) { return select_impl(rt, v, a, false, false); }
Value f_selectattr(Runtime& rt, const Value& v, CallArgs& a) { return select_impl(rt, v, a, true, true); }
Value f_rejectattr(Runtime& rt, const Value& v, CallArgs& a) { return select_impl(rt, v, a, true, false); }

Value sort_key(Runtime& rt, const Value& item, const std::optional<Value>& attribute, bool case_sensitive) {
  Value k = attribute && !attribute->is_none() ? get_attribute_path(rt, item, *attribute) : item;
  return case_sensitive ? k : ignore_case(k);
}

Value minmax_impl(Runtime& rt, const Value& v, CallArgs& a, bool want_max) {
  auto b = bind(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const bool cs = truthy(arg_or(b, 0, Value::boolean(false)));
  std::vector<Value> items = rt.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(rt, items[0], b[1], cs);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = sort_key(rt, items[i], b[1], cs);
    const int c = compare(key, best_key);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

Value f_max(Runtime& rt, const Value& v, CallArgs& a) { return minmax_impl(rt, v, a, true); }
Value f_min(Runtime& rt, const Value& v, CallArgs& a) { return minmax_impl(rt, v, a, false); }

Value f_pprint(Runtime&, const Value& v, CallArgs& a) {
  bind("pprint", a, {});
  return Value::string(repr(v));
}

Value f_replace(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("replace", a, {"old", "new", "count"});
  if (!b[0] || !b[1]) throw Error("replace filter takes at least 2 arguments");
  const Value count = arg_or(b, 2, Value::none());
  return Value::string(replace_impl(to_str(v), to_str(*b[0]), to_str(*b[1]),
                                    count.is_none() ? -1 : require_int(count, "replace count")));
}

Value f_reverse(Runtime& rt, const Value& v, CallArgs& a) {
  bind("reverse", a, {});
  if (v.is_string()) {
    std::u32string cps = unicode::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return str_value(cps);
  }
  std::vector<Value> items = rt.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("round", a, {"precision", "method"});
  const int64_t precision = require_int(arg_or(b, 0, Value::integer(0)), "round precision");
  const std::string method = to_str(arg_or(b, 1, Value::string("common")));
  if (method != "common" && method != "ceil" && method != "floor")
    throw Error("method must be 'common', 'ceil' or 'floor'");
  if (!v.is_number()) {
    if (v.is_undefined()) throw_undefined(v);
    throw Error("type " + type_name(v) + " doesn't define __round__ method");
  }
  if (method == "common") {
    if (v.is_integral() && precision >= 0) return Value::integer(v.as_int());
    const double x = v.as_double();
    if (!std::isfinite(x)) return Value::number(x);
    if (precision >= 0) {
      // printf rounds the exact binary value half-to-even, as Python's round() does.
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)), x);
      const double r = std::strtod(buf, nullptr);
      return Value::number(r);
    }
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    const double r = std::nearbyint(x / scale) * scale;
    if (v.is_integral()) return Value::integer(static_cast<int64_t>(r));
    return Value::number(r);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double y = v.as_double() * scale;
  return Value::number((method == "ceil" ? std::ceil(y) : std::floor(y)) / scale);
}

Value f_safe(Runtime&, const Value& v, CallArgs& a) {
  bind("safe", a, {});
  return v.is_string() ? v : Value::string(to_str(v));
}

Value f_slice(Runtime& rt, const Value& v, CallArgs& a) {
  auto b = bind("slice", a, {"slices", "fill_with"});
  const int64_t slices = require_int(arg_or(b, 0, Value()), "slice count");
  if (slices <= 0) throw Error("slice count must be positive");
  std::vector<Value> seq = rt.iterate(v);
  const auto length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices, extra = length % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t i = 0; i < slices; ++i) {
    const int64_t start = offset + i * per;
    if (i < extra) ++offset;
    const int64_t end = offset + (i + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (b[1] && !b[1]->is_none() && i >= extra) tmp.push_back(*b[1]);
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::list(std::move(out));
}

Value f_sort(Runtime& rt, const Value& v, CallArgs& a) {
  auto b = bind("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool rev = truthy(arg_or(b, 0, Value::boolean(false)));
  const bool cs = truthy(arg_or(b, 1, Value::boolean(false)));
  std::vector<Value> items = rt.iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (auto& item : items) keyed.emplace_back(sort_key(rt, item, b[2], cs), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::list(std::move(out));
}

Value f_string(Runtime&, const Value& v, CallArgs& a) {
  bind("string", a, {});
  return v.is_string() ? v : Value::string(to_str(v));
}

Value f_sum(Runtime& rt, const Value& v, CallArgs& a) {
  auto b = bind("sum", a, {"attribute", "start"});
  Value total = arg_or(b, 1, Value::integer(0));
  for (const auto& item : rt.iterate(v)) {
    const Value x = b[0] && !b[0]->is_none() ? get_attribute_path(rt, item, *b[0]) : item;
    total = binary_op(BinaryOp::ADD, total, x);
  }
  return total;
}

// Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonFormat f;
  f.ensure_ascii = truthy(arg_or(b, 0, Value::boolean(false)));
  const Value indent = arg_or(b, 1, Value::none());
  if (indent.is_string()) {
    f.indent = indent.as_string();
  } else if (indent.is_integral()) {
    f.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
  } else if (!indent.is_none()) {
    throw Error("tojson indent must be an int, a str or None");
  }
  if (f.indent) f.item_separator = ",";
  const Value seps = arg_or(b, 2, Value::none());
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.items().size() != 2 || !seps.items()[0].is_string() ||
        !seps.items()[1].is_string())
      throw Error("tojson separators must be a (item_separator, key_separator) pair of strings");
    f.item_separator = seps.items()[0].as_string();
    f.key_separator = seps.items()[1].as_string();
  }
  f.sort_keys = truthy(arg_or(b, 3, Value::boolean(false)));
  return Value::string(to_json(v, f));
}

Value f_truncate(Runtime&, const Value& v, CallArgs& a) {
  auto b = bind("truncate", a, {"length", "killwords", "end", "leeway"});
  const int64_t length = require_int(arg_or(b, 0, Value::integer(255)), "truncate length");
  const bool killwords = truthy(arg_or(b, 1, Value::boolean(false)));
  const std::u32string end = unicode::decode(to_str(arg_or(b, 2, Value::string("..."))));
  const Value leeway_v = arg_or(b, 3, Value::none());
  const int64_t leeway = leeway_v.is_none() ? 5 : require_int(leeway_v, "truncate leeway");
  if (length < static_cast<int64_t>(end.size()))
    throw Error("expected length >= " + std::to_string(end.size()) + ", got " + std::to_string(length));
  if (leeway < 0) throw Error("expected leeway >= 0, got " + std::to_string(leeway));
  std::u32string s = unicode::decode(to_str(v));
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value::string(to_str(v));
  std::u32string head = s.substr(0, static_cast<size_t>(length) - end.size());
  if (!killwords) {
    const size_t sp = head.rfind(U' ');
    if (sp != std::u32string::npos) head.resize(sp);
  }
  return str_value(head + end);
}

Value f_unique(Runtime& rt, const Value& v, CallArgs& a) {
  auto b = bind("unique", a, {"case_sensitive", "attribute"});
  const bool cs = truthy(arg_or(b, 0, Value::boolean(false)));
  std::vector<Value> out, seen;
  for (const auto& item : rt.iterate(v)) {
    Value key = sort_key(rt, item, b[1], cs);
    bool dup = false;
    for (const auto& s : seen) dup = dup || equals(s, key);
    if (dup) continue;
    seen.push_back(std::move(key));
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Runtime&, const Value& v, CallArgs& a) {
  bind("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : unicode::decode(to_str(v))) {
    const bool w = unicode::is_alnum(c) || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> t = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_escape},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"pprint", f_pprint},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"slice", f_slice},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return t;
}

// ---------------------------------------------------------------- tests

Value test_arg(const CallArgs& a, const char* name) {
  if (a.pos.empty()) throw Error(std::string("test '") + name + "' requires an argument");
  return a.pos[0];
}

bool t_boolean(Runtime&, const Value& v, CallArgs&) { return v.is_bool(); }
// Jinja's Undefined defines __call__ (to raise), so it counts as callable.
bool t_callable(Runtime&, const Value& v, CallArgs&) { return v.is_callable() || v.is_undefined(); }
bool t_defined(Runtime&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Runtime&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Runtime&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_true(Runtime&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Runtime&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_number(Runtime&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_integer(Runtime&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Runtime&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_string(Runtime&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Runtime&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Runtime&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
}
bool t_sequence(Runtime&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
}
bool t_escaped(Runtime&, const Value&, CallArgs&) { return false; }
bool t_eq(Runtime&, const Value& v, CallArgs& a) { return equals(v, test_arg(a, "eq")); }
bool t_ne(Runtime&, const Value& v, CallArgs& a) { return !equals(v, test_arg(a, "ne")); }
bool t_lt(Runtime&, const Value& v, CallArgs& a) { return compare(v, test_arg(a, "lt")) < 0; }
bool t_le(Runtime&, const Value& v, CallArgs& a) { return compare(v, test_arg(a, "le")) <= 0; }
bool t_gt(Runtime&, const Value& v, CallArgs& a) { return compare(v, test_arg(a, "gt")) > 0; }
bool t_ge(Runtime&, const Value& v, CallArgs& a) { return compare(v, test_arg(a, "ge")) >= 0; }
bool t_in(Runtime&, const Value& v, CallArgs& a) { return contains(test_arg(a, "in"), v); }
bool t_sameas(Runtime&, const Value& v, CallArgs& a) {
  const Value other = test_arg(a, "sameas");
  if (v.type() != other.type()) return false;
  switch (v.type()) {
    case Type::UNDEFINED:
    case Type::NONE:
      return true;
    case Type::BOOL:
    case Type::INT:
    case Type::FLOAT:
      return equals(v, other);
    default:
      return v.identity() == other.identity();
  }
}
bool t_divisibleby(Runtime&, const Value& v, CallArgs& a) {
  return equals(binary_op(BinaryOp::MOD, v, test_arg(a, "divisibleby")), Value::integer(0));
}
bool t_even(Runtime&, const Value& v, CallArgs&) {
  return equals(binary_op(BinaryOp::MOD, v, Value::integer(2)), Value::integer(0));
}
bool t_odd(Runtime&, const Value& v, CallArgs&) {
  return equals(binary_op(BinaryOp::MOD, v, Value::integer(2)), Value::integer(1));
}
bool t_lower(Runtime&, const Value& v, CallArgs&) {
  CallArgs none;
  return truthy(case_predicate(Value::string(to_str(v)), none, false));
}
bool t_upper(Runtime&, const Value& v, CallArgs&) {
  CallArgs none;
  return truthy(case_predicate(Value::string(to_str(v)), none, true));
}
bool t_filter(Runtime&, const Value& v, CallArgs&) {
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(Runtime&, const Value& v, CallArgs&) {
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> t = {
      {"boolean", t_boolean},
      {"callable", t_callable},
      {"defined", t_defined},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"escaped", t_escaped},
      {"even", t_even},
      {"false", t_false},
      {"filter", t_filter},
      {"float", t_float},
      {"ge", t_ge},
      {">=", t_ge},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"in", t_in},
      {"integer", t_integer},
      {"iterable", t_iterable},
      {"le", t_le},
      {"<=", t_le},
      {"lower", t_lower},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"mapping", t_mapping},
      {"ne", t_ne},
      {"!=", t_ne},
      {"none", t_none},
      {"number", t_number},
      {"odd", t_odd},
      {"sameas", t_sameas},
      {"sequence", t_sequence},
      {"string", t_string},
      {"test", t_test},
      {"true", t_true},
      {"undefined", t_undefined},
      {"upper", t_upper},
  };
  return t;
}

// ---------------------------------------------------------------- globals

class NamespaceObject final : public Object {
 public:
  DictObj attrs;
  Value attr(std::string_view name) const override {
    if (const Value* v = attrs.find(name)) return *v;
    return Value::undefined("'Namespace object' has no attribute '" + std::string(name) + "'");
  }
  bool set_attr(const std::string& name, Value value) override {
    // A namespace holding itself would print without end and, owned by itself, never be freed.
    if (holds(value, 0)) throw Error("cannot set '" + name + "': a namespace cannot hold itself");
    attrs.set(Value::string(name), std::move(value));
    return true;
  }
  std::string repr() const override {
    // Printing recurses through nested namespaces: bounded like every other nesting.
    static thread_local int nesting = 0;
    if (nesting >= kMaxNamespaceNesting) throw Error("namespaces nested too deeply to print");
    ++nesting;
    struct Leave {
      ~Leave() { --nesting; }
    } leave;
    DictObj copy = attrs;
    return "<Namespace " + swarm::jinja::repr(Value::dict(std::move(copy))) + ">";
  }
  const char* type_name() const override { return "Namespace"; }

 private:
  static constexpr int kMaxNamespaceNesting = 64;
  // Whether `v` is this namespace or holds it, through lists, dicts and other namespaces.
  bool holds(const Value& v, int depth) const {
    if (depth > kMaxNamespaceNesting * 8) throw Error("value nested too deeply to set on a namespace");
    if (v.is_list()) {
      for (const Value& item : v.items())
        if (holds(item, depth + 1)) return true;
    } else if (v.is_dict()) {
      for (const auto& [k, val] : v.as_dict().items)
        if (holds(val, depth + 1)) return true;
    } else if (v.is_object()) {
      const auto* ns = dynamic_cast<const NamespaceObject*>(&v.as_object());
      if (ns == this) return true;
      if (ns != nullptr)
        for (const auto& [k, val] : ns->attrs.items)
          if (holds(val, depth + 1)) return true;
    }
    return false;
  }
};

class NativeFunction final : public Callable {
 public:
  using Fn = Value (*)(Runtime&, CallArgs&);
  NativeFunction(std::string name, Fn fn) : name_(std::move(name)), fn_(fn) {}
  Value call(Runtime& rt, CallArgs& args) const override { return fn_(rt, args); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Fn fn_;
};

constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox limit

Value g_range(Runtime&, CallArgs& a) {
  if (!a.kw.empty()) throw Error("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) throw Error("range expected 1 to 3 arguments");
  int64_t start = 0, stop = 0, step = 1;
  if (a.pos.size() == 1) {
    stop = require_int(a.pos[0], "range");
  } else {
    start = require_int(a.pos[0], "range");
    stop = require_int(a.pos[1], "range");
    if (a.pos.size() == 3) step = require_int(a.pos[2], "range");
  }
  if (step == 0) throw Error("range() arg 3 must not be zero");
  int64_t n = 0;
  if (step > 0 && start < stop) n = (stop - start + step - 1) / step;
  if (step < 0 && start > stop) n = (start - stop - step - 1) / (-step);
  if (n > kMaxRange)
    throw Error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                std::to_string(kMaxRange) + ").");
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(Value::integer(start + i * step));
  return Value::list(std::move(out));
}

Value g_dict(Runtime& rt, CallArgs& a) {
  DictObj d;
  if (a.pos.size() > 1) throw Error("dict expected at most 1 argument");
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      d = src.as_dict();
    } else {
      for (const auto& pair : rt.iterate(src)) {
        std::vector<Value> kv = rt.iterate(pair);
        if (kv.size() != 2) throw Error("dictionary update sequence element has wrong length");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.set(Value::string(k), v);
  return Value::dict(std::move(d));
}

Value g_namespace(Runtime& rt, CallArgs& a) {
  auto ns = std::make_shared<NamespaceObject>();
  ns->attrs = g_dict(rt, a).as_dict();
  return Value::object(std::move(ns));
}

Value g_raise_exception(Runtime&, CallArgs& a) {
  const Value msg = a.pos.empty() ? Value::string("") : a.pos[0];
  throw Error(to_str(msg));
}

Value g_strftime_now(Runtime& rt, CallArgs& a) {
  auto b = bind("strftime_now", a, {"format"});
  return Value::string(strftime_impl(require_string(arg_or(b, 0, Value()), "strftime_now format"), rt.now()));
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  const auto& t = filters();
  auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  const auto& t = tests();
  auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

MethodFn find_method(const Value& self, std::string_view name) {
  const MethodTable* table = self.is_string() ? &string_methods()
                             : self.is_dict() ? &dict_methods()
                             : self.is_list() ? &list_methods()
                                              : nullptr;
  if (!table) return nullptr;
  auto it = table->find(name);
  return it == table->end() ? nullptr : it->second;
}

bool is_unsafe_method(const Value& self, std::string_view name) {
  static constexpr std::string_view kList[] = {"append", "clear",  "extend",  "insert",
                                               "pop",    "remove", "reverse", "sort"};
  static constexpr std::string_view kDict[] = {"clear", "pop", "popitem", "setdefault", "update"};
  if (self.is_list() && !self.is_tuple())
    return std::find(std::begin(kList), std::end(kList), name) != std::end(kList);
  if (self.is_dict()) return std::find(std::begin(kDict), std::end(kDict), name) != std::end(kDict);
  return false;
}

Value bind_method(const Value& self, std::string name, MethodFn fn) {
  return Value::callable(std::make_shared<BoundMethod>(self, std::move(name), fn));
}

const std::vector<std::pair<std::string, Value>>& global_functions() {
  static const std::vector<std::pair<std::string, Value>> g = [] {
    std::vector<std::pair<std::string, Value>> v;
    auto add = [&](const char* name, NativeFunction::Fn fn) {
      v.emplace_back(name, Value::callable(std::make_shared<NativeFunction>(name, fn)));
    };
    add("range", g_range);
    add("dict", g_dict);
    add("namespace", g_namespace);
    add("raise_exception", g_raise_exception);
    add("strftime_now", g_strftime_now);
    return v;
  }();
  return g;
}

}  // namespace swarm::jinja
