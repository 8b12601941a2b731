// The Jinja value model: Python-like values (None, bool, int, float, str, list, tuple, dict,
// namespace, callables) with Python's printing (str/repr), equality, ordering and truthiness,
// plus conversion from nlohmann JSON and json.dumps-compatible serialisation.
//
// Values are cheap to copy: strings, lists and dicts are shared and immutable once built
// (as in Jinja's ImmutableSandboxedEnvironment); only namespace() objects are mutable.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace swarm::jinja {

/// An error raised while parsing or rendering. `offset` is the byte offset in the template
/// source where it happened, or kNoOffset until the interpreter attaches one.
class Error : public std::runtime_error {
 public:
  static constexpr size_t kNoOffset = static_cast<size_t>(-1);
  explicit Error(const std::string& message, size_t offset = kNoOffset)
      : std::runtime_error(message), offset(offset) {}
  size_t offset;
};

class Value;
class Runtime;

struct ListObj {
  std::vector<Value> items;
  bool tuple = false;
};

/// Insertion-ordered mapping (Python dict semantics).
struct DictObj {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  /// Inserts, or replaces the value in place keeping the key's position.
  void set(Value key, Value value);
};

/// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

/// A host object with attributes that is not a dict (loop, namespace).
class Object {
 public:
  virtual ~Object() = default;
  /// The attribute, or an undefined value when there is none.
  virtual Value attr(std::string_view name) const = 0;
  /// Sets an attribute; false when the object does not allow it.
  virtual bool set_attr(const std::string& name, Value value);
  virtual std::string repr() const = 0;
  virtual const char* type_name() const = 0;
};

/// A function, macro or bound method.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual Value call(Runtime& rt, CallArgs& args) const = 0;
  virtual std::string name() const = 0;
};

enum class Type : uint8_t { UNDEFINED, NONE, BOOL, INT, FLOAT, STRING, LIST, DICT, OBJECT, CALLABLE };

class Value {
 public:
  /// An undefined value with no hint.
  Value() = default;

  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  static Value dict(DictObj d);
  static Value object(std::shared_ptr<Object> o);
  static Value callable(std::shared_ptr<const Callable> f);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::UNDEFINED; }
  bool is_none() const { return type_ == Type::NONE; }
  bool is_bool() const { return type_ == Type::BOOL; }
  bool is_int() const { return type_ == Type::INT; }
  bool is_float() const { return type_ == Type::FLOAT; }
  /// int, float or bool (bool is an int subclass in Python).
  bool is_number() const { return type_ == Type::INT || type_ == Type::FLOAT || type_ == Type::BOOL; }
  /// int or bool.
  bool is_integral() const { return type_ == Type::INT || type_ == Type::BOOL; }
  bool is_string() const { return type_ == Type::STRING; }
  bool is_list() const { return type_ == Type::LIST; }  // list or tuple
  bool is_tuple() const { return type_ == Type::LIST && as_list().tuple; }
  bool is_dict() const { return type_ == Type::DICT; }
  bool is_object() const { return type_ == Type::OBJECT; }
  bool is_callable() const { return type_ == Type::CALLABLE; }

  bool as_bool() const { return b_; }
  /// int or bool as int64.
  int64_t as_int() const { return type_ == Type::BOOL ? (b_ ? 1 : 0) : i_; }
  /// any number as double.
  double as_double() const;
  const std::string& as_string() const { return *static_cast<const std::string*>(ptr_.get()); }
  const ListObj& as_list() const { return *static_cast<const ListObj*>(ptr_.get()); }
  const std::vector<Value>& items() const { return as_list().items; }
  const DictObj& as_dict() const { return *static_cast<const DictObj*>(ptr_.get()); }
  Object& as_object() const { return *static_cast<Object*>(ptr_.get()); }
  const Callable& as_callable() const { return *static_cast<const Callable*>(ptr_.get()); }
  /// Why an undefined value is undefined ("'x' is undefined"); empty if unknown.
  std::string undefined_hint() const;
  /// Identity of the shared payload (for `is sameas`).
  const void* identity() const { return ptr_.get(); }

 private:
  Type type_ = Type::UNDEFINED;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<void> ptr_;
};

/// Raises the UndefinedError for an undefined value.
[[noreturn]] void throw_undefined(const Value& v);

/// Python type name ("int", "str", "list", "dict", "NoneType", ...).
std::string type_name(const Value& v);
/// Python truthiness (undefined is false).
bool truthy(const Value& v);
/// Python str(): what {{ v }} prints. Undefined prints as "".
std::string to_str(const Value& v);
/// Python repr() appended to `out`.
void append_repr(const Value& v, std::string& out);
std::string repr(const Value& v);
/// Python repr() of a float ("1.0", "1e+16", "0.1").
std::string float_repr(double d);
/// Python ==.
bool equals(const Value& a, const Value& b);
/// Python ordering (<0, 0, >0); throws Error for unorderable types.
int compare(const Value& a, const Value& b);

/// Options of json.dumps.
struct JsonFormat {
  std::optional<std::string> indent;  // none: single line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
/// json.dumps(v, ...) exactly as Python prints it.
std::string to_json(const Value& v, const JsonFormat& format);

/// JSON → Value; objects keep their key order.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

}  // namespace swarm::jinja
