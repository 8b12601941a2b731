// The one place an error becomes an HTTP answer, in the shape of the API the request was
// for: the command routes, the OpenAI routes, the Anthropic routes, or (before routing, when
// the transport itself refuses a request) every shape at once. No Beast here.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "http/http_types.hpp"

namespace swarm {

/// Which error body shape a route family uses.
enum class ErrorStyle {
  COMMAND,    // {"success": false, "error": {...}, "detail"} — swarm command routes
  OPENAI,     // {"error": {...}, "detail"} — OpenAI routes
  ANTHROPIC,  // {"type": "error", "error": {"type", "message"}} — /v1/messages routes
  ANY,        // every field of the three (the transport's own refusals, before a route is known)
};

/// The style of the routes under `path`: /v1/messages... Anthropic, other /v1/... OpenAI, the
/// rest the command routes'.
ErrorStyle error_style_for_path(std::string_view path);

/// An error response for a known status, OpenAI error type and message. `code` ("" = null) is
/// the machine-readable reason. A 401 carries `WWW-Authenticate: Bearer`.
HttpResponse error_response(ErrorStyle style, int status, const std::string& type, const std::string& message,
                            const std::string& code = "");

/// The same for an ErrorKind: its status and type (common/error.hpp).
HttpResponse error_response(ErrorStyle style, ErrorKind kind, const std::string& message,
                            const std::string& code = "");

/// Maps the in-flight exception (call inside a catch block) to a response:
/// SwarmError → its kind's status; ConfigError / nlohmann errors → 400; anything else
/// → 500 with a logged incident id (the message says only the id).
HttpResponse error_response_from_current_exception(ErrorStyle style, const std::string& route);

/// The Anthropic error body: {"type": "error", "error": {"type", "message"}}, its type from the
/// status.
nlohmann::json anthropic_error_body(int status, const std::string& message);

}  // namespace swarm
