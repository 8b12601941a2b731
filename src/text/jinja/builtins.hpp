// Jinja's built-in filters, tests, global functions and the Python methods of str/dict/list
// that templates call (as Hugging Face's ImmutableSandboxedEnvironment allows them).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/value.hpp"

namespace swarm::jinja {

class Runtime;

using FilterFn = Value (*)(Runtime& rt, const Value& input, CallArgs& args);
using TestFn = bool (*)(Runtime& rt, const Value& input, CallArgs& args);
using MethodFn = Value (*)(Runtime& rt, const Value& self, CallArgs& args);

/// The filter called `name`, or null.
FilterFn find_filter(std::string_view name);
/// The test called `name`, or null.
TestFn find_test(std::string_view name);
/// The method `name` of a str, dict or list value, or null.
MethodFn find_method(const Value& self, std::string_view name);
/// Whether `name` is a mutating list/dict method the immutable sandbox refuses.
bool is_unsafe_method(const Value& self, std::string_view name);
/// A callable bound to `self` for method `fn` (for `x.method` used without calling it).
Value bind_method(const Value& self, std::string name, MethodFn fn);

/// Python's printf-style `fmt % args` (args: a tuple, a dict for %(name)s, or one value).
std::string percent_format(const std::string& fmt, const Value& args);

/// Global functions: range, dict, namespace, raise_exception, strftime_now.
const std::vector<std::pair<std::string, Value>>& global_functions();

}  // namespace swarm::jinja
