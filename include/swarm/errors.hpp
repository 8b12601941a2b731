// Error types of swarm's public API (libswarm_client, the Job). Transport exceptions never leak
// out of the SDK.
#pragma once

#include <stdexcept>
#include <string>

namespace swarm {

/// Base of every exception the public API throws: catch this to catch them all.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Talking to a server failed: the base of the SDK's call errors below.
class ClientError : public Error {
 public:
  using Error::Error;
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

/// An invalid job or configuration, wherever it is read: a Job validated by the SDK, a config
/// file or synced config parsed by the server, a bad URL or flag. Names the key or the value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

}  // namespace swarm
