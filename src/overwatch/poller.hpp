// One poll of a swarm-server over HTTP: the pool information (required), the engine
// status and /metrics (optional extras).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "overwatch/snapshot.hpp"

namespace swarm {
class HttpClient;
}

namespace swarm::overwatch {

struct PollResult {
  std::optional<Snapshot> snapshot;  // set when the server answered usefully
  std::string error;                 // one line saying why not, otherwise
};

/// Polls one server over a keep-alive connection. NOT thread-safe: one polling loop owns it.
class Poller {
 public:
  /// `base_url` like "http://127.0.0.1:10086" (trailing slashes ignored). Throws
  /// std::invalid_argument for a URL the HTTP client cannot use (e.g. https://).
  Poller(std::string base_url, std::chrono::milliseconds timeout);
  ~Poller();

  /// Never throws: transport failures, error statuses and unusable bodies of the pool
  /// route become `error`. A failing engine-status or metrics route only leaves its
  /// part of the snapshot empty.
  PollResult poll();

  const std::string& url() const { return url_; }

 private:
  std::string url_;
  std::unique_ptr<HttpClient> http_;
};

/// The URL without trailing slashes.
std::string normalize_url(std::string url);

}  // namespace swarm::overwatch
