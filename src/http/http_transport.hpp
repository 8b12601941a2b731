// Asynchronous HTTP/1.1 server on Boost.Beast (implementation hides Beast entirely).
#pragma once

#include <cstdint>
#include <memory>

#include "http/http_types.hpp"

namespace swarm {

/// An asynchronous HTTP/1.1 server: several I/O threads, keep-alive, per-connection
/// read timeout, body size limit (413), bounded pipelining, chunked streaming.
/// Thread-safe: start/stop may be called from any thread (stop is idempotent).
class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // stops if running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Loads the TLS certificate and key when set, binds and starts the I/O threads. Throws
  /// std::runtime_error if a TLS file cannot be used or the bind fails.
  /// A server starts at most once (std::logic_error otherwise).
  void start();
  /// The bound port (useful with port 0).
  uint16_t port() const;
  /// Whether connections speak TLS (options.tls_cert_file was loaded by start()).
  bool tls() const;
  /// Stops accepting, gives in-flight requests up to `grace_ms` to be answered,
  /// closes all connections and joins the I/O threads. Answers given after that are
  /// dropped. Must not be called from a handler / I/O thread (std::logic_error).
  void stop(int grace_ms = 2000);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarm
