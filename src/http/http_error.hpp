// The one place where exceptions become HTTP error responses.
#pragma once

#include <exception>

#include "http/http_types.hpp"

namespace swarm {

/// Which error body shape a route family uses.
enum class ErrorStyle {
  COMMAND,    // {"success": false, "error": {...}} — swarm command routes
  OPENAI,     // {"error": {...}} — OpenAI routes
  ANTHROPIC,  // {"type": "error", "error": {"type", "message"}} — /v1/messages routes
};

/// Maps the in-flight exception (call inside a catch block) to a response:
/// SwarmError → its kind's status; ConfigError / nlohmann errors → 400; anything else
/// → 500 with a logged incident id (the message says only the id).
HttpResponse error_response_from_current_exception(ErrorStyle style, const std::string& route);

/// An error response for a known kind and message.
HttpResponse error_response(ErrorStyle style, int status, const std::string& type, const std::string& message,
                            const std::string& code = "");

}  // namespace swarm
