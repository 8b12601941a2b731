// The environment variables swarm's programs read: one table, one reader. Every read goes
// through env_value(), and env_vars() lists each name with what reads it and what it does
// (docs/configuration.md's environment table is printed from it by
// `swarm-server config-reference`; test_env keeps the sources and the table in step).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace swarm {

struct EnvVar {
  std::string_view name;
  std::string_view read_by;  // the program or part that reads it
  std::string_view meaning;
};

/// Every variable env_value() may be asked for, in the order the reference prints them.
std::span<const EnvVar> env_vars();

/// The value of environment variable `name`; nullopt when it is unset or empty. `name` must be
/// one of env_vars() (a name missing from the table throws std::logic_error: a programming
/// error, caught by every test that reaches the read). Thread-safe as getenv is (nothing in
/// swarm sets variables after start-up but the OpenMP re-exec, before any thread exists).
std::optional<std::string> env_value(std::string_view name);

/// The environment table as Markdown (the part of docs/configuration.md after "## Environment").
std::string env_reference_markdown();

}  // namespace swarm
