// Error types thrown by libswarm_client. Transport exceptions never leak out of the SDK.
#pragma once

#include <stdexcept>
#include <string>

namespace swarm {

/// Base of every exception the client SDK throws.
class ClientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The server could not be reached or the connection broke (refused, reset, timeout,
/// DNS). Retryable: the SDK's own retrying calls (begin_episode, run_episodes_...) retry
/// these with backoff; a single call surfaces it to the caller.
class TransportError : public ClientError {
 public:
  using ClientError::ClientError;
};

/// The server answered with an error status. `status()` is the HTTP status;
/// `type()` and `message` come from the server's JSON error body.
/// 5xx and 503 are retryable; 4xx are not (the request itself is wrong).
class ServerError : public ClientError {
 public:
  ServerError(int status, std::string type, const std::string& message)
      : ClientError("HTTP " + std::to_string(status) + " (" + type + "): " + message),
        status_(status),
        type_(std::move(type)) {}
  int status() const noexcept { return status_; }
  const std::string& type() const noexcept { return type_; }
  bool retryable() const noexcept { return status_ >= 500; }

 private:
  int status_;
  std::string type_;
};

/// A deadline given to a waiting call (e.g. begin_episode) passed. Not retried.
class TimeoutError : public ClientError {
 public:
  using ClientError::ClientError;
};

/// Bad configuration or arguments detected on the client side (e.g. invalid Job).
class ConfigError : public ClientError {
 public:
  using ClientError::ClientError;
};

}  // namespace swarm
