#include "api/error_mapping.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "rollout_pool/rollout_pool.hpp"
#include "api/chat_dialect.hpp"
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
  if (style == ErrorStyle::COMMAND) body["success"] = false;
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  if (status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
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
