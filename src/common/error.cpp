#include "common/error.hpp"

namespace swarm {

int http_status_for(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::INVALID_ARGUMENT:
      return 400;
    case ErrorKind::UNAUTHORIZED:
      return 401;
    case ErrorKind::FORBIDDEN:
      return 403;
    case ErrorKind::NOT_FOUND:
      return 404;
    case ErrorKind::METHOD_NOT_ALLOWED:
      return 405;
    case ErrorKind::CONFLICT:
      return 409;
    case ErrorKind::PAYLOAD_TOO_LARGE:
      return 413;
    case ErrorKind::UNAVAILABLE:
      return 503;
    case ErrorKind::INTERNAL:
      return 500;
  }
  return 500;
}

const char* error_type_for(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::INVALID_ARGUMENT:
      return "invalid_request_error";
    case ErrorKind::UNAUTHORIZED:
      return "authentication_error";
    case ErrorKind::FORBIDDEN:
      return "permission_error";
    case ErrorKind::NOT_FOUND:
      return "not_found_error";
    case ErrorKind::METHOD_NOT_ALLOWED:
      return "invalid_request_error";
    case ErrorKind::CONFLICT:
      return "conflict_error";
    case ErrorKind::PAYLOAD_TOO_LARGE:
      return "invalid_request_error";
    case ErrorKind::UNAVAILABLE:
      return "service_unavailable_error";
    case ErrorKind::INTERNAL:
      return "server_error";
  }
  return "server_error";
}

}  // namespace swarm
