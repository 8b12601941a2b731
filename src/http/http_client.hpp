// Minimal synchronous HTTP/1.1 client with keep-alive (Beast hidden in the .cpp).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace swarm {

struct HttpClientResponse {
  int status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
};

/// One keep-alive connection to one server (host:port), reconnecting as needed.
/// NOT thread-safe: use one per thread, or HttpClientPool.
/// Errors: throws swarm::TransportError (include/swarm/errors.hpp) when the server cannot
/// be reached, the connection breaks, or the timeout passes. Never throws Beast/Asio types.
class HttpClient {
 public:
  /// base_url like "http://127.0.0.1:10086" or "https://host:port" (a path prefix such as
  /// "/v1" is kept and prepended to every request path). https: the server's certificate must
  /// chain to the system's CAs or to `ca_file` (PEM; empty = $SWARM_CA_FILE when set) and be
  /// issued for the URL's host; TransportError says why when it is not.
  explicit HttpClient(const std::string& base_url,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60),
                      const std::string& ca_file = {});
  ~HttpClient();
  HttpClient(HttpClient&&) noexcept;
  HttpClient& operator=(HttpClient&&) noexcept;

  /// Sends a request and reads the whole response. `extra_headers` e.g. Authorization.
  /// A request on a stale keep-alive connection is retried once on a fresh connection
  /// (only if nothing of the response had been read).
  HttpClientResponse request(const std::string& method, const std::string& path, const std::string& body = "",
                             const std::vector<std::pair<std::string, std::string>>& extra_headers = {},
                             const std::string& content_type = "application/json");

  /// Streaming variant: the response body is delivered in pieces as they arrive
  /// (chunked transfer decoded). `on_data` returning false stops reading and closes the
  /// connection. Returns status and headers (body left empty). The timeout covers the
  /// request up to the response headers, then applies to each wait for the next piece.
  HttpClientResponse request_stream(const std::string& method, const std::string& path,
                                    const std::string& body,
                                    const std::vector<std::pair<std::string, std::string>>& extra_headers,
                                    const std::function<bool(std::string_view)>& on_data,
                                    const std::string& content_type = "application/json");

  void set_timeout(std::chrono::milliseconds timeout);
  const std::string& host() const;
  const std::string& port() const;
  /// Closes the connection (the next request reconnects).
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarm
