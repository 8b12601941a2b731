// The one exception family used inside swarm-server, and the SWARM_CHECK macros.
// Exactly one place (src/http/http_error.cpp) turns these into HTTP answers.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

namespace swarm {

/// What went wrong, which decides the HTTP status the server answers with.
enum class ErrorKind {
  INVALID_ARGUMENT,    // 400: malformed or semantically bad input
  UNAUTHORIZED,        // 401: missing or wrong API key
  FORBIDDEN,           // 403: the caller does not own the resource
  NOT_FOUND,           // 404: unknown episode, route, model
  METHOD_NOT_ALLOWED,  // 405: known route, wrong HTTP method
  CONFLICT,            // 409: request not valid in the current engine state
  PAYLOAD_TOO_LARGE,   // 413
  UNAVAILABLE,         // 503: temporarily cannot serve (shutting down, queue full)
  INTERNAL,            // 500: a bug or an unexpected failure
};

/// Thrown for every error inside the server. Carries its kind and where it was raised.
class SwarmError : public std::runtime_error {
 public:
  SwarmError(ErrorKind kind, const std::string& message,
             std::source_location where = std::source_location::current())
      : std::runtime_error(message), kind_(kind), where_(where) {}

  ErrorKind kind() const noexcept { return kind_; }
  const std::source_location& where() const noexcept { return where_; }

 private:
  ErrorKind kind_;
  std::source_location where_;
};

/// HTTP status for an error kind.
int http_status_for(ErrorKind kind) noexcept;
/// OpenAI-style error "type" string for an error kind (e.g. "invalid_request_error").
const char* error_type_for(ErrorKind kind) noexcept;

}  // namespace swarm

/// Throws SwarmError(kind, msg) when cond is false. msg may be any expression yielding a string.
#define SWARM_REQUIRE(cond, kind, msg)                     \
  do {                                                     \
    if (!(cond)) throw ::swarm::SwarmError((kind), (msg)); \
  } while (0)

/// Invariant check: a failure is a bug (500), reported with the condition text.
#define SWARM_CHECK(cond, msg)                                                     \
  do {                                                                             \
    if (!(cond))                                                                   \
      throw ::swarm::SwarmError(::swarm::ErrorKind::INTERNAL,                      \
                                std::string("check failed: " #cond ": ") + (msg)); \
  } while (0)
