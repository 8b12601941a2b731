// A compiled Jinja template: the entry point of the interpreter.
//
//   jinja::Template t("Hello {{ name }}!");
//   t.render({{"name", jinja::Value::string("world")}});   // "Hello world!"
//
// Semantics follow Python's jinja2 with the environment Hugging Face uses for chat templates
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, autoescape off).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/interpreter.hpp"
#include "text/jinja/value.hpp"

namespace swarm::jinja {

struct TemplateOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  /// Errors read "<error_prefix> error at line L, column C: <message>".
  std::string error_prefix = "template";
};

/// Top-level variables of one render.
using Variables = std::vector<std::pair<std::string, Value>>;

/// A parsed template. Immutable after construction: render() is const and safe to call from
/// many threads at once. Copies share the parsed tree.
class Template {
 public:
  /// Parses `source`; throws SwarmError(INVALID_ARGUMENT) naming line and column on errors.
  explicit Template(const std::string& source, TemplateOptions options = {});

  /// Renders with the given variables (plus the globals range, dict, namespace,
  /// raise_exception, strftime_now). `clock` drives strftime_now (system clock if empty).
  /// Throws SwarmError(INVALID_ARGUMENT) naming line and column on runtime errors.
  /// `size_hint`: expected output size, reserved up front (saves regrowing large outputs).
  std::string render(const Variables& variables, const WallClock& clock = nullptr,
                     size_t size_hint = 0) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace swarm::jinja
