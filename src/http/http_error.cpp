#include "http/http_error.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/random_id.hpp"
#include "http/json_body.hpp"
#include "swarm/errors.hpp"

namespace swarm {
namespace {

const char* code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::INVALID_ARGUMENT:
      return "invalid_argument";
    case ErrorKind::UNAUTHORIZED:
      return "invalid_api_key";
    case ErrorKind::FORBIDDEN:
      return "forbidden";
    case ErrorKind::NOT_FOUND:
      return "not_found";
    case ErrorKind::METHOD_NOT_ALLOWED:
      return "method_not_allowed";
    case ErrorKind::CONFLICT:
      return "wrong_state";
    case ErrorKind::PAYLOAD_TOO_LARGE:
      return "payload_too_large";
    case ErrorKind::UNAVAILABLE:
      return "unavailable";
    case ErrorKind::INTERNAL:
      return "internal_error";
  }
  return "internal_error";
}

}  // namespace

ErrorStyle error_style_for_path(std::string_view path) {
  if (path.rfind("/v1/messages", 0) == 0) return ErrorStyle::ANTHROPIC;
  if (path.rfind("/v1/", 0) == 0) return ErrorStyle::OPENAI;
  return ErrorStyle::COMMAND;
}

nlohmann::json anthropic_error_body(int status, const std::string& message) {
  const char* type = "api_error";
  switch (status) {
    case 400:
    case 405:
    case 409:
    case 422:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 503:
    case 529:
      type = "overloaded_error";
      break;
    default:
      break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

HttpResponse error_response(ErrorStyle style, int status, const std::string& type, const std::string& message,
                            const std::string& code) {
  nlohmann::json body;
  if (style == ErrorStyle::ANTHROPIC) {
    HttpResponse r;
    r.status = status;
    r.body = dump_json(anthropic_error_body(status, message));
    return r;
  }
  body["error"] = {
      {"message", message}, {"type", type}, {"code", code.empty() ? nullptr : nlohmann::json(code)}};
  // FastAPI's shape beside ours: AgentJet's Python client reads the top-level `detail`.
  body["detail"] = message;
  if (style == ErrorStyle::COMMAND || style == ErrorStyle::ANY) body["success"] = false;
  // Anthropic's clients look for the top-level "type": "error"; the others ignore it.
  if (style == ErrorStyle::ANY) body["type"] = "error";
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  if (status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

HttpResponse error_response(ErrorStyle style, ErrorKind kind, const std::string& message,
                            const std::string& code) {
  return error_response(style, http_status_for(kind), error_type_for(kind), message, code);
}

HttpResponse error_response_from_current_exception(ErrorStyle style, const std::string& route) {
  try {
    throw;
  } catch (const SwarmError& e) {
    if (e.kind() == ErrorKind::INTERNAL) {
      const std::string id = random_hex(6);
      spdlog::error("{}: internal error {} at {}:{}: {}", route, id, e.where().file_name(), e.where().line(),
                    e.what());
      return error_response(style, 500, error_type_for(e.kind()),
                            "internal server error (incident " + id + ")", code_for(e.kind()));
    }
    return error_response(style, http_status_for(e.kind()), error_type_for(e.kind()), e.what(),
                          code_for(e.kind()));
  } catch (const ConfigError& e) {
    return error_response(style, 400, "invalid_request_error", e.what(), "invalid_config");
  } catch (const nlohmann::json::exception& e) {
    // A JSON type error we did not anticipate is still the client's bad input.
    return error_response(style, 400, "invalid_request_error", std::string("invalid JSON value: ") + e.what(),
                          "invalid_argument");
  } catch (const std::exception& e) {
    const std::string id = random_hex(6);
    spdlog::error("{}: unexpected exception {}: {}", route, id, e.what());
    return error_response(style, 500, "server_error", "internal server error (incident " + id + ")",
                          "internal_error");
  } catch (...) {
    const std::string id = random_hex(6);
    spdlog::error("{}: unknown exception {}", route, id);
    return error_response(style, 500, "server_error", "internal server error (incident " + id + ")",
                          "internal_error");
  }
}

}  // namespace swarm
