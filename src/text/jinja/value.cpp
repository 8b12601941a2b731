#include "text/jinja/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "text/jinja/unicode.hpp"

namespace swarm::jinja {

// ---------------------------------------------------------------- containers

const Value* DictObj::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* DictObj::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

void DictObj::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

// NOLINTNEXTLINE(performance-unnecessary-value-param): the virtual's signature
bool Object::set_attr(const std::string&, Value) { return false; }

// ---------------------------------------------------------------- construction

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.ptr_ = std::make_shared<std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.type_ = Type::NONE;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::BOOL;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::INT;
  v.i_ = i;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.type_ = Type::FLOAT;
  v.f_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::STRING;
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}

Value Value::list(std::vector<Value> items) {
  Value v;
  v.type_ = Type::LIST;
  v.ptr_ = std::make_shared<ListObj>(ListObj{std::move(items), false});
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v;
  v.type_ = Type::LIST;
  v.ptr_ = std::make_shared<ListObj>(ListObj{std::move(items), true});
  return v;
}

Value Value::dict(DictObj d) {
  Value v;
  v.type_ = Type::DICT;
  v.ptr_ = std::make_shared<DictObj>(std::move(d));
  return v;
}

Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.type_ = Type::OBJECT;
  v.ptr_ = std::move(o);
  return v;
}

Value Value::callable(std::shared_ptr<const Callable> f) {
  Value v;
  v.type_ = Type::CALLABLE;
  v.ptr_ = std::const_pointer_cast<Callable>(std::move(f));
  return v;
}

double Value::as_double() const {
  switch (type_) {
    case Type::FLOAT:
      return f_;
    case Type::INT:
      return static_cast<double>(i_);
    case Type::BOOL:
      return b_ ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

std::string Value::undefined_hint() const {
  if (type_ != Type::UNDEFINED || !ptr_) return {};
  return *static_cast<const std::string*>(ptr_.get());
}

[[noreturn]] void throw_undefined(const Value& v) {
  std::string hint = v.undefined_hint();
  throw Error(hint.empty() ? "undefined value" : hint);
}

// ---------------------------------------------------------------- Python semantics

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Type::UNDEFINED:
      return "Undefined";
    case Type::NONE:
      return "NoneType";
    case Type::BOOL:
      return "bool";
    case Type::INT:
      return "int";
    case Type::FLOAT:
      return "float";
    case Type::STRING:
      return "str";
    case Type::LIST:
      return v.is_tuple() ? "tuple" : "list";
    case Type::DICT:
      return "dict";
    case Type::OBJECT:
      return v.as_object().type_name();
    case Type::CALLABLE:
      return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case Type::UNDEFINED:
    case Type::NONE:
      return false;
    case Type::BOOL:
      return v.as_bool();
    case Type::INT:
      return v.as_int() != 0;
    case Type::FLOAT:
      return v.as_double() != 0.0;
    case Type::STRING:
      return !v.as_string().empty();
    case Type::LIST:
      return !v.items().empty();
    case Type::DICT:
      return !v.as_dict().items.empty();
    case Type::OBJECT:
    case Type::CALLABLE:
      return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (!s.empty() && s[0] == '-') {
    out.push_back('-');
    s.remove_prefix(1);
  }
  const size_t e_pos = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e_pos))
    if (c != '.') digits.push_back(c);
  int exp10 = 0;
  std::from_chars(s.data() + e_pos + 1 + (s[e_pos + 1] == '+' ? 1 : 0), s.data() + s.size(), exp10);
  const int decpt = exp10 + 1;  // position of the decimal point relative to the digits
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (n > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    out.push_back('e');
    out.push_back(exp10 < 0 ? '-' : '+');
    const int ae = exp10 < 0 ? -exp10 : exp10;
    if (ae < 10) out.push_back('0');
    out += std::to_string(ae);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= n) {
    out += digits;
    out.append(static_cast<size_t>(decpt - n), '0');
    out += ".0";
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decpt), std::string::npos);
  }
  return out;
}

namespace {

void append_hex(std::string& out, unsigned v, int width) {
  static const char* kHex = "0123456789abcdef";
  for (int i = width - 1; i >= 0; --i) out.push_back(kHex[(v >> (4 * i)) & 0xF]);
}

void append_string_repr(const std::string& s, std::string& out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out.push_back(quote);
  bool ascii = true;
  for (char ch : s) ascii = ascii && static_cast<unsigned char>(ch) < 0x80;
  auto emit = [&](char32_t c) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0x20 && c != 0x7F && (c < 0x80 || unicode::is_printable(c))) {
      unicode::append(out, c);
    } else if (c <= 0xFF) {  // C0 controls, DEL, Latin-1 that does not print
      out += "\\x";
      append_hex(out, c, 2);
    } else if (c <= 0xFFFF) {
      out += "\\u";
      append_hex(out, c, 4);
    } else {
      out += "\\U";
      append_hex(out, c, 8);
    }
  };
  if (ascii) {
    for (char ch : s) emit(static_cast<unsigned char>(ch));
  } else {
    for (char32_t c : unicode::decode(s)) emit(c);
  }
  out.push_back(quote);
}

}  // namespace

namespace {
constexpr int kMaxDepth = 512;  // nesting limit for printing and JSON conversion

void check_depth(int depth) {
  if (depth > kMaxDepth)
    throw Error("value nested too deeply (more than " + std::to_string(kMaxDepth) + " levels)");
}

void repr_at(const Value& v, std::string& out, int depth);
}  // namespace

void append_repr(const Value& v, std::string& out) { repr_at(v, out, 0); }

namespace {
void repr_at(const Value& v, std::string& out, int depth) {
  check_depth(depth);
  switch (v.type()) {
    case Type::STRING:
      append_string_repr(v.as_string(), out);
      return;
    case Type::LIST: {
      const auto& l = v.as_list();
      out.push_back(l.tuple ? '(' : '[');
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        repr_at(l.items[i], out, depth + 1);
      }
      if (l.tuple && l.items.size() == 1) out.push_back(',');
      out.push_back(l.tuple ? ')' : ']');
      return;
    }
    case Type::DICT: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, val] : v.as_dict().items) {
        if (!first) out += ", ";
        first = false;
        repr_at(k, out, depth + 1);
        out += ": ";
        repr_at(val, out, depth + 1);
      }
      out.push_back('}');
      return;
    }
    case Type::UNDEFINED:
      out += "Undefined";
      return;
    default:
      out += to_str(v);
      return;
  }
}
}  // namespace

std::string repr(const Value& v) {
  std::string out;
  append_repr(v, out);
  return out;
}

std::string to_str(const Value& v) {
  switch (v.type()) {
    case Type::UNDEFINED:
      return "";
    case Type::NONE:
      return "None";
    case Type::BOOL:
      return v.as_bool() ? "True" : "False";
    case Type::INT:
      return std::to_string(v.as_int());
    case Type::FLOAT:
      return float_repr(v.as_double());
    case Type::STRING:
      return v.as_string();
    case Type::LIST:
    case Type::DICT:
      return repr(v);
    case Type::OBJECT:
      return v.as_object().repr();
    case Type::CALLABLE:
      return "<function " + v.as_callable().name() + ">";
  }
  return "";
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Type::UNDEFINED:
    case Type::NONE:
      return true;
    case Type::STRING:
      return a.as_string() == b.as_string();
    case Type::LIST: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equals(x.items[i], y.items[i])) return false;
      return true;
    }
    case Type::DICT: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw Error("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

// ---------------------------------------------------------------- JSON

namespace {

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  bool ascii = true;
  for (char ch : s) ascii = ascii && static_cast<unsigned char>(ch) < 0x80;
  auto emit_ascii = [&](unsigned char c) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
          out += "\\u";
          append_hex(out, c, 4);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  };
  if (ascii || !ensure_ascii) {
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (c >= 0x80)
        out.push_back(ch);
      else
        emit_ascii(c);
    }
  } else {
    for (char32_t c : unicode::decode(s)) {
      if (c < 0x80) {
        emit_ascii(static_cast<unsigned char>(c));
      } else if (c <= 0xFFFF) {
        out += "\\u";
        append_hex(out, c, 4);
      } else {
        const char32_t v = c - 0x10000;
        out += "\\u";
        append_hex(out, 0xD800 + (v >> 10), 4);
        out += "\\u";
        append_hex(out, 0xDC00 + (v & 0x3FF), 4);
      }
    }
  }
  out.push_back('"');
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

void json_value(const Value& v, const JsonFormat& f, int depth, std::string& out);

void json_newline(const JsonFormat& f, int depth, std::string& out) {
  out.push_back('\n');
  for (int i = 0; i < depth; ++i) out += *f.indent;
}

std::string json_key(const Value& k) {
  switch (k.type()) {
    case Type::STRING:
      return k.as_string();
    case Type::INT:
      return std::to_string(k.as_int());
    case Type::FLOAT:
      return json_float(k.as_double());
    case Type::BOOL:
      return k.as_bool() ? "true" : "false";
    case Type::NONE:
      return "null";
    default:
      throw Error("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void json_value(const Value& v, const JsonFormat& f, int depth, std::string& out) {
  check_depth(depth);
  switch (v.type()) {
    case Type::NONE:
      out += "null";
      return;
    case Type::BOOL:
      out += v.as_bool() ? "true" : "false";
      return;
    case Type::INT:
      out += std::to_string(v.as_int());
      return;
    case Type::FLOAT:
      out += json_float(v.as_double());
      return;
    case Type::STRING:
      json_string(v.as_string(), f.ensure_ascii, out);
      return;
    case Type::LIST: {
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += f.item_separator;
        if (f.indent) json_newline(f, depth + 1, out);
        json_value(items[i], f, depth + 1, out);
      }
      if (f.indent) json_newline(f, depth, out);
      out.push_back(']');
      return;
    }
    case Type::DICT: {
      const auto& d = v.as_dict();
      if (d.items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      entries.reserve(d.items.size());
      for (const auto& kv : d.items) entries.push_back(&kv);
      if (f.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return compare(a->first, b->first) < 0; });
      out.push_back('{');
      bool first = true;
      for (const auto* kv : entries) {
        if (!first) out += f.item_separator;
        first = false;
        if (f.indent) json_newline(f, depth + 1, out);
        json_string(json_key(kv->first), f.ensure_ascii, out);
        out += f.key_separator;
        json_value(kv->second, f, depth + 1, out);
      }
      if (f.indent) json_newline(f, depth, out);
      out.push_back('}');
      return;
    }
    default:
      throw Error("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

template <class Json>
Value convert_json(const Json& j, int depth = 0) {
  check_depth(depth);
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(convert_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      DictObj d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(Value::string(it.key()), convert_json(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      throw Error("unsupported JSON value (binary or discarded)");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonFormat& format) {
  std::string out;
  json_value(v, format, 0, out);
  return out;
}

Value from_json(const nlohmann::json& j) { return convert_json(j); }
Value from_json(const nlohmann::ordered_json& j) { return convert_json(j); }

}  // namespace swarm::jinja
