// Per-render interpreter state: variable scopes, the clock for strftime_now, recursion
// depth, and the Jinja operations (attribute/item lookup, calls, iteration) that nodes and
// built-ins share. One Runtime per render call; never shared between threads.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/value.hpp"

namespace swarm::jinja {

/// One level of variables (the template's top level, a loop iteration, a macro call...).
struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Scope> parent;

  explicit Scope(std::shared_ptr<Scope> parent_scope = nullptr) : parent(std::move(parent_scope)) {}
  /// Looks `name` up here and in the enclosing scopes; null if not found.
  const Value* find(std::string_view name) const;
  /// Sets `name` in this scope.
  void set(const std::string& name, Value value);
};

/// Wall clock used by strftime_now (injectable for deterministic tests).
using WallClock = std::function<std::chrono::system_clock::time_point()>;

class Runtime {
 public:
  Runtime(std::shared_ptr<Scope> root, WallClock clock);

  /// The innermost scope; statements push and pop scopes around loops and macro calls.
  std::shared_ptr<Scope> scope;

  Value lookup(const std::string& name) const;
  /// Jinja's `obj.name`.
  Value getattr(const Value& obj, const std::string& name) const;
  /// Jinja's `obj[key]`.
  Value getitem(const Value& obj, const Value& key) const;
  /// Calls a callable value.
  Value call(const Value& callee, CallArgs& args);
  /// Python iteration (str → characters, dict → keys); undefined is empty.
  std::vector<Value> iterate(const Value& v) const;
  /// Executes statements, stopping at break/continue.
  Flow exec_body(const Body& body, std::string& out);
  /// Renders statements in a new child scope and returns the output.
  std::string render_scoped(const Body& body, std::shared_ptr<Scope> parent);

  std::chrono::system_clock::time_point now() const;

  /// Guards against runaway macro recursion.
  void enter_call();
  void leave_call() { --depth_; }

 private:
  WallClock clock_;
  int depth_ = 0;
};

/// Restores the runtime's scope on destruction.
class ScopeGuard {
 public:
  ScopeGuard(Runtime& rt, std::shared_ptr<Scope> scope) : rt_(rt), saved_(std::move(rt.scope)) {
    rt_.scope = std::move(scope);
  }
  ~ScopeGuard() { rt_.scope = std::move(saved_); }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  Runtime& rt_;
  std::shared_ptr<Scope> saved_;
};

/// Python slicing of a list, tuple or str (start/stop/step may be None).
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);

/// Binary operators with Python semantics (shared with built-ins such as sum).
Value binary_op(BinaryOp op, const Value& a, const Value& b);
/// Python `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);

}  // namespace swarm::jinja
