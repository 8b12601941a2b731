#include "text/jinja/interpreter.hpp"

#include <climits>
#include <cmath>

#include "text/jinja/unicode.hpp"

namespace swarm::jinja {

namespace {

constexpr int kMaxCallDepth = 200;

bool is_ascii(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

class CallDepthGuard {
 public:
  explicit CallDepthGuard(Runtime& rt) : rt_(rt) { rt_.enter_call(); }
  ~CallDepthGuard() { rt_.leave_call(); }
  CallDepthGuard(const CallDepthGuard&) = delete;
  CallDepthGuard& operator=(const CallDepthGuard&) = delete;

 private:
  Runtime& rt_;
};

// The `loop` variable of a for loop.
class LoopObject final : public Object {
 public:
  explicit LoopObject(std::shared_ptr<const std::vector<Value>> items) : items_(std::move(items)) {}

  void set_index(size_t i) { index0_ = i; }

  Value attr(std::string_view name) const override {
    const size_t n = items_->size();
    const auto i = static_cast<int64_t>(index0_);
    const auto len = static_cast<int64_t>(n);
    if (name == "index") return Value::integer(i + 1);
    if (name == "index0") return Value::integer(i);
    if (name == "revindex") return Value::integer(len - i);
    if (name == "revindex0") return Value::integer(len - i - 1);
    if (name == "first") return Value::boolean(index0_ == 0);
    if (name == "last") return Value::boolean(index0_ + 1 == n);
    if (name == "length") return Value::integer(len);
    if (name == "depth") return Value::integer(1);
    if (name == "depth0") return Value::integer(0);
    if (name == "previtem")
      return index0_ > 0 ? (*items_)[index0_ - 1] : Value::undefined("there is no previous item");
    if (name == "nextitem")
      return index0_ + 1 < n ? (*items_)[index0_ + 1] : Value::undefined("there is no next item");
    if (name == "cycle") return Value::callable(std::make_shared<Cycle>(index0_));
    if (name == "changed") return Value::callable(std::make_shared<Changed>(changed_state_));
    return Value::undefined("'LoopContext object' has no attribute '" + std::string(name) + "'");
  }

  std::string repr() const override {
    return "<LoopContext " + std::to_string(index0_ + 1) + "/" + std::to_string(items_->size()) + ">";
  }
  const char* type_name() const override { return "LoopContext"; }

 private:
  class Cycle final : public Callable {
   public:
    explicit Cycle(size_t index) : index_(index) {}
    Value call(Runtime&, CallArgs& args) const override {
      if (args.pos.empty()) throw Error("no items for cycling given");
      return args.pos[index_ % args.pos.size()];
    }
    std::string name() const override { return "cycle"; }

   private:
    size_t index_;
  };

  struct ChangedState {
    bool has_last = false;
    std::vector<Value> last;
  };

  class Changed final : public Callable {
   public:
    explicit Changed(std::shared_ptr<ChangedState> state) : state_(std::move(state)) {}
    Value call(Runtime&, CallArgs& args) const override {
      bool same = state_->has_last && state_->last.size() == args.pos.size();
      for (size_t i = 0; same && i < args.pos.size(); ++i) same = equals(state_->last[i], args.pos[i]);
      if (same) return Value::boolean(false);
      state_->has_last = true;
      state_->last = args.pos;
      return Value::boolean(true);
    }
    std::string name() const override { return "changed"; }

   private:
    std::shared_ptr<ChangedState> state_;
  };

  std::shared_ptr<const std::vector<Value>> items_;
  size_t index0_ = 0;
  std::shared_ptr<ChangedState> changed_state_ = std::make_shared<ChangedState>();
};

void assign_target(Runtime& rt, const Target& target, const Value& value) {
  switch (target.kind) {
    case Target::Kind::NAME:
      rt.scope->set(target.name, value);
      return;
    case Target::Kind::TUPLE: {
      std::vector<Value> items = rt.iterate(value);
      const size_t want = target.items.size();
      if (items.size() > want)
        throw Error("too many values to unpack (expected " + std::to_string(want) + ")", target.offset);
      if (items.size() < want)
        throw Error("not enough values to unpack (expected " + std::to_string(want) + ", got " +
                        std::to_string(items.size()) + ")",
                    target.offset);
      for (size_t i = 0; i < want; ++i) assign_target(rt, target.items[i], items[i]);
      return;
    }
    case Target::Kind::ATTR: {
      const Value* ns = rt.scope->find(target.name);
      if (!ns || !ns->is_object() || !ns->as_object().set_attr(target.attr, value))
        throw Error("cannot assign attribute on non-namespace object", target.offset);
      return;
    }
  }
}

// Binds call arguments to a macro's (or caller's) parameters in a fresh scope.
void bind_parameters(Runtime& rt, const std::string& fn_name, const std::vector<Param>& params,
                     CallArgs& args, bool uses_varargs, bool uses_kwargs, bool uses_caller) {
  Scope& scope = *rt.scope;
  std::vector<bool> bound(params.size(), false);
  for (size_t i = 0; i < args.pos.size() && i < params.size(); ++i) {
    scope.set(params[i].name, args.pos[i]);
    bound[i] = true;
  }
  std::vector<Value> extra;
  if (args.pos.size() > params.size()) {
    if (!uses_varargs)
      throw Error("macro '" + fn_name + "' takes not more than " + std::to_string(params.size()) +
                  " argument(s)");
    extra.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(params.size()), args.pos.end());
  }
  DictObj extra_kw;
  for (auto& [name, value] : args.kw) {
    bool matched = false;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].name != name) continue;
      if (bound[i]) throw Error("macro '" + fn_name + "' got multiple values for argument '" + name + "'");
      scope.set(name, value);
      bound[i] = true;
      matched = true;
      break;
    }
    if (matched) continue;
    if (name == "caller" && uses_caller) {
      scope.set("caller", value);
    } else if (uses_kwargs) {
      extra_kw.set(Value::string(name), value);
    } else {
      throw Error("macro '" + fn_name + "' takes no keyword argument '" + name + "'");
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) continue;
    if (params[i].default_value)
      scope.set(params[i].name, params[i].default_value->eval(rt));
    else
      scope.set(params[i].name, Value::undefined("parameter '" + params[i].name + "' was not provided"));
  }
  scope.set("varargs", Value::tuple(std::move(extra)));
  scope.set("kwargs", Value::dict(std::move(extra_kw)));
}

class MacroFunction final : public Callable {
 public:
  MacroFunction(const Macro* node, std::weak_ptr<Scope> closure)
      : node_(node), closure_(std::move(closure)) {}

  Value call(Runtime& rt, CallArgs& args) const override {
    auto closure = closure_.lock();
    if (!closure) throw Error("macro '" + node_->name + "' called outside of the scope that defined it");
    CallDepthGuard depth(rt);
    ScopeGuard guard(rt, std::make_shared<Scope>(closure));
    bind_parameters(rt, node_->name, node_->params, args, node_->uses_varargs, node_->uses_kwargs,
                    node_->uses_caller);
    std::string out;
    rt.exec_body(node_->body, out);
    return Value::string(std::move(out));
  }
  std::string name() const override { return node_->name; }

 private:
  const Macro* node_;
  std::weak_ptr<Scope> closure_;
};

class CallerFunction final : public Callable {
 public:
  CallerFunction(const CallBlock* node, std::weak_ptr<Scope> closure)
      : node_(node), closure_(std::move(closure)) {}

  Value call(Runtime& rt, CallArgs& args) const override {
    auto closure = closure_.lock();
    if (!closure) throw Error("caller() called outside of its call block");
    CallDepthGuard depth(rt);
    ScopeGuard guard(rt, std::make_shared<Scope>(closure));
    bind_parameters(rt, "caller", node_->caller_params, args, false, false, false);
    std::string out;
    rt.exec_body(node_->body, out);
    return Value::string(std::move(out));
  }
  std::string name() const override { return "caller"; }

 private:
  const CallBlock* node_;
  std::weak_ptr<Scope> closure_;
};

[[noreturn]] void type_error(const char* op, const Value& a, const Value& b) {
  throw Error(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" +
              type_name(b) + "'");
}

[[noreturn]] void overflow() { throw Error("integer overflow (values beyond 64 bits are not supported)"); }

int64_t add_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}

int64_t sub_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}

int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

// Python's float divmod.
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    if (n > 0) {
      if (seq.as_string().size() * static_cast<size_t>(n) > (size_t{1} << 30))
        throw Error("string too large");
      out.reserve(seq.as_string().size() * static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    }
    return Value::string(std::move(out));
  }
  std::vector<Value> out;
  if (n > 0) {
    if (seq.items().size() * static_cast<size_t>(n) > (size_t{1} << 24)) throw Error("list too large");
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  }
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

}  // namespace

// ---------------------------------------------------------------- Scope / Runtime

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

Runtime::Runtime(std::shared_ptr<Scope> root, WallClock clock)
    : scope(std::move(root)), clock_(std::move(clock)) {}

std::chrono::system_clock::time_point Runtime::now() const {
  return clock_ ? clock_() : std::chrono::system_clock::now();
}

void Runtime::enter_call() {
  if (++depth_ > kMaxCallDepth) {
    --depth_;
    throw Error("maximum recursion depth exceeded in macro calls");
  }
}

Value Runtime::lookup(const std::string& name) const {
  if (const Value* v = scope->find(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

Value Runtime::getattr(const Value& obj, const std::string& name) const {
  switch (obj.type()) {
    case Type::UNDEFINED:
      throw_undefined(obj);
    case Type::OBJECT: {
      Value v = obj.as_object().attr(name);
      return v;
    }
    case Type::DICT:
    case Type::STRING:
    case Type::LIST: {
      if (MethodFn m = find_method(obj, name)) return bind_method(obj, name, m);
      if (is_unsafe_method(obj, name))
        return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) +
                                "' object is unsafe.");
      if (obj.is_dict())
        if (const Value* v = obj.as_dict().find(std::string_view(name))) return *v;
      return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
    }
    case Type::NONE:
      return Value::undefined("'None' has no attribute '" + name + "'");
    default:
      return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
  }
}

Value Runtime::getitem(const Value& obj, const Value& key) const {
  switch (obj.type()) {
    case Type::UNDEFINED:
      throw_undefined(obj);
    case Type::DICT: {
      if (const Value* v = obj.as_dict().find(key)) return *v;
      if (key.is_string()) return getattr(obj, key.as_string());
      return Value::undefined("'dict object' has no attribute " + repr(key));
    }
    case Type::LIST: {
      if (key.is_integral()) {
        const auto& items = obj.items();
        int64_t i = key.as_int();
        const auto n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
        return Value::undefined(type_name(obj) + " object has no element " + std::to_string(key.as_int()));
      }
      if (key.is_string()) return getattr(obj, key.as_string());
      return Value::undefined(type_name(obj) + " object has no element " + repr(key));
    }
    case Type::STRING: {
      if (key.is_integral()) {
        const std::string& s = obj.as_string();
        int64_t i = key.as_int();
        if (is_ascii(s)) {
          const auto n = static_cast<int64_t>(s.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::string(std::string(1, s[static_cast<size_t>(i)]));
        } else {
          const std::u32string cps = unicode::decode(s);
          const auto n = static_cast<int64_t>(cps.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n)
            return Value::string(unicode::encode(std::u32string(1, cps[static_cast<size_t>(i)])));
        }
        return Value::undefined("str object has no element " + std::to_string(key.as_int()));
      }
      if (key.is_string()) return getattr(obj, key.as_string());
      return Value::undefined("str object has no element " + repr(key));
    }
    default:
      if (key.is_string()) return getattr(obj, key.as_string());
      return Value::undefined("'" + type_name(obj) + " object' has no element " + repr(key));
  }
}

Value Runtime::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) throw_undefined(callee);
  if (!callee.is_callable()) throw Error("'" + type_name(callee) + "' object is not callable");
  return callee.as_callable().call(*this, args);
}

std::vector<Value> Runtime::iterate(const Value& v) const {
  switch (v.type()) {
    case Type::UNDEFINED:
      return {};
    case Type::LIST:
      return v.items();
    case Type::DICT: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().items.size());
      for (const auto& kv : v.as_dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Type::STRING: {
      std::vector<Value> chars;
      const std::string& s = v.as_string();
      if (is_ascii(s)) {
        for (char c : s) chars.push_back(Value::string(std::string(1, c)));
      } else {
        for (char32_t c : unicode::decode(s))
          chars.push_back(Value::string(unicode::encode(std::u32string(1, c))));
      }
      return chars;
    }
    default:
      throw Error("'" + type_name(v) + "' object is not iterable");
  }
}

Flow Runtime::exec_body(const Body& body, std::string& out) {
  for (const auto& stmt : body) {
    const Flow f = stmt->exec(*this, out);
    if (f != Flow::NORMAL) return f;
  }
  return Flow::NORMAL;
}

std::string Runtime::render_scoped(const Body& body, std::shared_ptr<Scope> parent) {
  ScopeGuard guard(*this, std::make_shared<Scope>(std::move(parent)));
  std::string out;
  exec_body(body, out);
  return out;
}

// ---------------------------------------------------------------- operators

Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) throw_undefined(obj);
  // Jinja compiles slices to a plain Python subscript, so other types raise.
  if (obj.is_dict()) throw Error("unhashable type: 'slice'");
  if (!obj.is_list() && !obj.is_string()) throw Error("'" + type_name(obj) + "' object is not subscriptable");
  auto index_of = [](const Value& v) {
    if (!v.is_integral()) throw Error("slice indices must be integers or None or have an __index__ method");
    return v.as_int();
  };
  const bool ascii = obj.is_string() && is_ascii(obj.as_string());
  std::u32string cps;
  if (obj.is_string() && !ascii) cps = unicode::decode(obj.as_string());
  const int64_t len = obj.is_list() ? static_cast<int64_t>(obj.items().size())
                      : ascii       ? static_cast<int64_t>(obj.as_string().size())
                                    : static_cast<int64_t>(cps.size());
  const int64_t st = step.is_none() || step.is_undefined() ? 1 : index_of(step);
  if (st == 0) throw Error("slice step cannot be zero");
  const int64_t lower = st < 0 ? -1 : 0;
  const int64_t upper = st < 0 ? len - 1 : len;
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = index_of(v);
    if (i < 0) {
      i += len;
      if (i < lower) i = lower;
    } else if (i > upper) {
      i = upper;
    }
    return i;
  };
  const int64_t b = clamp(start, st < 0 ? upper : lower);
  const int64_t e = clamp(stop, st < 0 ? lower : upper);
  std::vector<size_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(static_cast<size_t>(i));
  if (obj.is_list()) {
    std::vector<Value> out;
    out.reserve(idx.size());
    for (size_t i : idx) out.push_back(obj.items()[i]);
    return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  if (ascii) {
    std::string out;
    out.reserve(idx.size());
    for (size_t i : idx) out.push_back(obj.as_string()[i]);
    return Value::string(std::move(out));
  }
  std::u32string out;
  for (size_t i : idx) out.push_back(cps[i]);
  return Value::string(unicode::encode(out));
}

Value binary_op(BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::CONCAT) return Value::string(to_str(a) + to_str(b));
  if (op == BinaryOp::MOD && a.is_string()) return Value::string(percent_format(a.as_string(), b));
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  switch (op) {
    case BinaryOp::ADD:
      if (ints) return Value::integer(add_checked(a.as_int(), b.as_int()));
      if (nums) return Value::number(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) return Value::string(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
        std::vector<Value> out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return a.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
      if (a.is_string()) throw Error("can only concatenate str (not \"" + type_name(b) + "\") to str");
      if (a.is_list())
        throw Error("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " +
                    type_name(a));
      type_error("+", a, b);
    case BinaryOp::SUB:
      if (ints) return Value::integer(sub_checked(a.as_int(), b.as_int()));
      if (nums) return Value::number(a.as_double() - b.as_double());
      type_error("-", a, b);
    case BinaryOp::MUL:
      if (ints) return Value::integer(mul_checked(a.as_int(), b.as_int()));
      if (nums) return Value::number(a.as_double() * b.as_double());
      if ((a.is_string() || a.is_list()) && b.is_integral()) return repeat(a, b.as_int());
      if (a.is_integral() && (b.is_string() || b.is_list())) return repeat(b, a.as_int());
      type_error("*", a, b);
    case BinaryOp::DIV:
      if (nums) {
        if (b.as_double() == 0.0) throw Error("division by zero");
        return Value::number(a.as_double() / b.as_double());
      }
      type_error("/", a, b);
    case BinaryOp::FLOORDIV:
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) throw Error("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) overflow();
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::integer(q);
      }
      if (nums) {
        if (b.as_double() == 0.0) throw Error("float floor division by zero");
        double fd, md;
        float_divmod(a.as_double(), b.as_double(), fd, md);
        return Value::number(fd);
      }
      type_error("//", a, b);
    case BinaryOp::MOD:
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) throw Error("integer modulo by zero");
        if (y == -1) return Value::integer(0);
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::integer(m);
      }
      if (nums) {
        if (b.as_double() == 0.0) throw Error("float modulo by zero");
        double fd, md;
        float_divmod(a.as_double(), b.as_double(), fd, md);
        return Value::number(md);
      }
      type_error("%", a, b);
    case BinaryOp::POW:
      if (ints && b.as_int() >= 0) {
        int64_t base = a.as_int(), e = b.as_int(), acc = 1;
        while (e > 0) {
          if (e & 1) acc = mul_checked(acc, base);
          e >>= 1;
          if (e > 0) base = mul_checked(base, base);
        }
        return Value::integer(acc);
      }
      if (nums) {
        if (a.as_double() == 0.0 && b.as_double() < 0)
          throw Error("0.0 cannot be raised to a negative power");
        return Value::number(std::pow(a.as_double(), b.as_double()));
      }
      type_error("** or pow()", a, b);
    case BinaryOp::CONCAT:
      break;
  }
  return Value();
}

bool contains(const Value& haystack, const Value& needle) {
  switch (haystack.type()) {
    case Type::STRING:
      if (needle.is_undefined()) throw_undefined(needle);
      if (!needle.is_string())
        throw Error("'in <string>' requires string as left operand, not " + type_name(needle));
      return haystack.as_string().find(needle.as_string()) != std::string::npos;
    case Type::LIST:
      for (const auto& item : haystack.items())
        if (equals(item, needle)) return true;
      return false;
    case Type::DICT:
      return haystack.as_dict().find(needle) != nullptr;
    case Type::UNDEFINED:
      return false;
    default:
      throw Error("argument of type '" + type_name(haystack) + "' is not iterable");
  }
}

// ---------------------------------------------------------------- expression nodes

Value Expr::eval(Runtime& rt) const {
  try {
    return do_eval(rt);
  } catch (Error& e) {
    if (e.offset == Error::kNoOffset) e.offset = offset;
    throw;
  }
}

Value Literal::do_eval(Runtime&) const { return value; }

Value Name::do_eval(Runtime& rt) const { return rt.lookup(name); }

Value ListExpr::do_eval(Runtime& rt) const {
  std::vector<Value> out;
  out.reserve(items.size());
  for (const auto& item : items) out.push_back(item->eval(rt));
  return tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value DictExpr::do_eval(Runtime& rt) const {
  DictObj d;
  for (const auto& [k, v] : items) {
    Value key = k->eval(rt);
    d.set(std::move(key), v->eval(rt));
  }
  return Value::dict(std::move(d));
}

Value GetAttr::do_eval(Runtime& rt) const { return rt.getattr(object->eval(rt), name); }

Value GetItem::do_eval(Runtime& rt) const {
  Value obj = object->eval(rt);
  return rt.getitem(obj, key->eval(rt));
}

Value SliceExpr::do_eval(Runtime& rt) const {
  Value obj = object->eval(rt);
  if (obj.is_undefined()) throw_undefined(obj);
  Value b = start ? start->eval(rt) : Value::none();
  Value e = stop ? stop->eval(rt) : Value::none();
  Value s = step ? step->eval(rt) : Value::none();
  return slice_value(obj, b, e, s);
}

CallArgs Call::eval_args(Runtime& rt) const {
  CallArgs a;
  a.pos.reserve(args.size());
  for (const auto& e : args) a.pos.push_back(e->eval(rt));
  for (const auto& kw : kwargs) a.kw.emplace_back(kw.name, kw.value->eval(rt));
  return a;
}

Value Call::do_eval(Runtime& rt) const {
  if (const auto* ga = dynamic_cast<const GetAttr*>(callee.get())) {
    // Method call: dispatch str/dict/list methods directly without binding.
    Value self = ga->object->eval(rt);
    if (self.is_string() || self.is_dict() || self.is_list()) {
      if (MethodFn m = find_method(self, ga->name)) {
        CallArgs a = eval_args(rt);
        return m(rt, self, a);
      }
    }
    Value fn = rt.getattr(self, ga->name);
    CallArgs a = eval_args(rt);
    return rt.call(fn, a);
  }
  Value fn = callee->eval(rt);
  CallArgs a = eval_args(rt);
  return rt.call(fn, a);
}

Value FilterExpr::apply(Runtime& rt, const Value& input_value) const {
  if (!fn) throw Error("unknown filter '" + name + "'");
  CallArgs a;
  a.pos.reserve(args.size());
  for (const auto& e : args) a.pos.push_back(e->eval(rt));
  for (const auto& kw : kwargs) a.kw.emplace_back(kw.name, kw.value->eval(rt));
  return fn(rt, input_value, a);
}

Value FilterExpr::do_eval(Runtime& rt) const {
  if (!fn) throw Error("unknown filter '" + name + "'");
  return apply(rt, input->eval(rt));
}

Value TestExpr::do_eval(Runtime& rt) const {
  if (!fn) throw Error("unknown test '" + name + "'");
  Value v = input->eval(rt);
  CallArgs a;
  for (const auto& e : args) a.pos.push_back(e->eval(rt));
  for (const auto& kw : kwargs) a.kw.emplace_back(kw.name, kw.value->eval(rt));
  const bool r = fn(rt, v, a);
  return Value::boolean(negated ? !r : r);
}

Value Unary::do_eval(Runtime& rt) const {
  Value v = operand->eval(rt);
  if (op == UnaryOp::NOT) return Value::boolean(!truthy(v));
  if (v.is_undefined()) throw_undefined(v);
  if (v.is_integral()) {
    if (op == UnaryOp::POS) return Value::integer(v.as_int());
    if (v.as_int() == INT64_MIN) overflow();
    return Value::integer(-v.as_int());
  }
  if (v.is_float()) return Value::number(op == UnaryOp::NEG ? -v.as_double() : v.as_double());
  throw Error(std::string("bad operand type for unary ") + (op == UnaryOp::NEG ? "-" : "+") + ": '" +
              type_name(v) + "'");
}

Value Binary::do_eval(Runtime& rt) const {
  Value a = left->eval(rt);
  Value b = right->eval(rt);
  return binary_op(op, a, b);
}

Value Logical::do_eval(Runtime& rt) const {
  Value l = left->eval(rt);
  if (is_and ? !truthy(l) : truthy(l)) return l;
  return right->eval(rt);
}

Value Compare::do_eval(Runtime& rt) const {
  Value l = first->eval(rt);
  for (const auto& [op, expr] : rest) {
    Value r = expr->eval(rt);
    bool ok = false;
    switch (op) {
      case CompareOp::EQ:
        ok = equals(l, r);
        break;
      case CompareOp::NE:
        ok = !equals(l, r);
        break;
      case CompareOp::LT:
        ok = compare(l, r) < 0;
        break;
      case CompareOp::LE:
        ok = compare(l, r) <= 0;
        break;
      case CompareOp::GT:
        ok = compare(l, r) > 0;
        break;
      case CompareOp::GE:
        ok = compare(l, r) >= 0;
        break;
      case CompareOp::IN:
        ok = contains(r, l);
        break;
      case CompareOp::NOT_IN:
        ok = !contains(r, l);
        break;
    }
    if (!ok) return Value::boolean(false);
    l = std::move(r);
  }
  return Value::boolean(true);
}

Value CondExpr::do_eval(Runtime& rt) const {
  if (truthy(test->eval(rt))) return then->eval(rt);
  if (otherwise) return otherwise->eval(rt);
  return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
}

// ---------------------------------------------------------------- statement nodes

Flow Stmt::exec(Runtime& rt, std::string& out) const {
  try {
    return do_exec(rt, out);
  } catch (Error& e) {
    if (e.offset == Error::kNoOffset) e.offset = offset;
    throw;
  }
}

Flow Text::do_exec(Runtime&, std::string& out) const {
  out += text;
  return Flow::NORMAL;
}

Flow Print::do_exec(Runtime& rt, std::string& out) const {
  Value v = expr->eval(rt);
  if (v.is_string())
    out += v.as_string();
  else
    out += to_str(v);
  return Flow::NORMAL;
}

Flow If::do_exec(Runtime& rt, std::string& out) const {
  for (const auto& [cond, body] : branches)
    if (truthy(cond->eval(rt))) return rt.exec_body(body, out);
  return rt.exec_body(else_body, out);
}

Flow For::do_exec(Runtime& rt, std::string& out) const {
  Value iterable = iter->eval(rt);
  auto items = std::make_shared<std::vector<Value>>(rt.iterate(iterable));
  const std::shared_ptr<Scope> parent = rt.scope;
  if (filter) {
    std::vector<Value> kept;
    for (auto& item : *items) {
      ScopeGuard guard(rt, std::make_shared<Scope>(parent));
      assign_target(rt, target, item);
      if (truthy(filter->eval(rt))) kept.push_back(std::move(item));
    }
    *items = std::move(kept);
  }
  if (items->empty()) return rt.exec_body(else_body, out);
  auto loop = std::make_shared<LoopObject>(items);
  const Value loop_value = Value::object(loop);
  for (size_t i = 0; i < items->size(); ++i) {
    loop->set_index(i);
    ScopeGuard guard(rt, std::make_shared<Scope>(parent));
    rt.scope->set("loop", loop_value);
    assign_target(rt, target, (*items)[i]);
    if (rt.exec_body(body, out) == Flow::BREAK) break;
  }
  return Flow::NORMAL;
}

Flow Assign::do_exec(Runtime& rt, std::string&) const {
  assign_target(rt, target, value->eval(rt));
  return Flow::NORMAL;
}

Flow AssignBlock::do_exec(Runtime& rt, std::string&) const {
  Value v = Value::string(rt.render_scoped(body, rt.scope));
  for (const auto& f : filters) v = f->apply(rt, v);
  assign_target(rt, target, v);
  return Flow::NORMAL;
}

Flow Macro::do_exec(Runtime& rt, std::string&) const {
  rt.scope->set(name, Value::callable(std::make_shared<MacroFunction>(this, rt.scope)));
  return Flow::NORMAL;
}

Flow CallBlock::do_exec(Runtime& rt, std::string& out) const {
  Value fn = call->callee->eval(rt);
  CallArgs a = call->eval_args(rt);
  a.kw.emplace_back("caller", Value::callable(std::make_shared<CallerFunction>(this, rt.scope)));
  out += to_str(rt.call(fn, a));
  return Flow::NORMAL;
}

Flow FilterBlock::do_exec(Runtime& rt, std::string& out) const {
  Value v = Value::string(rt.render_scoped(body, rt.scope));
  for (const auto& f : filters) v = f->apply(rt, v);
  out += to_str(v);
  return Flow::NORMAL;
}

Flow With::do_exec(Runtime& rt, std::string& out) const {
  std::vector<Value> values;
  for (const auto& [target, expr] : assignments) values.push_back(expr->eval(rt));
  ScopeGuard guard(rt, std::make_shared<Scope>(rt.scope));
  for (size_t i = 0; i < assignments.size(); ++i) assign_target(rt, assignments[i].first, values[i]);
  return rt.exec_body(body, out);
}

Flow LoopControl::do_exec(Runtime&, std::string&) const { return is_break ? Flow::BREAK : Flow::CONTINUE; }

}  // namespace swarm::jinja
