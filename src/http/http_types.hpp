// Plain HTTP request/response types: the only thing routes see of the transport.
// Beast types never leave src/http/http_transport.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace swarm {

/// One parsed HTTP request. Header names are lower-cased by the transport.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path with query string, e.g. "/v1/models?x=1"
  std::string path;    // target without the query string
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote_address;  // peer IP, for logs
  bool secure = false;         // arrived over TLS (the server was started with a certificate)

  /// Value of a header (name must be lower-case), or empty if absent.
  const std::string& header(const std::string& lower_name) const {
    static const std::string kEmpty;
    for (const auto& [k, v] : headers)
      if (k == lower_name) return v;
    return kEmpty;
  }
  bool has_header(const std::string& lower_name) const {
    for (const auto& kv : headers)
      if (kv.first == lower_name) return true;
    return false;
  }
};

/// A complete (non-streaming) HTTP response.
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string body;
};

/// Where a handler writes its answer. Exactly one of respond() or the
/// start_stream()/write()/end_stream() sequence must be used, once.
/// Thread-safe: may be called from any thread (e.g. the inference loop) after the
/// handler returned. If the sink is destroyed without an answer, the transport sends
/// a 500 so the client is never left hanging.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  /// Sends a complete response.
  virtual void respond(HttpResponse response) = 0;
  /// Starts a chunked streaming response (e.g. text/event-stream for SSE).
  virtual void start_stream(int status, const std::string& content_type) = 0;
  /// Sends one chunk of a streaming response. Returns false when the client is gone.
  virtual bool write(std::string chunk) = 0;
  /// Ends a streaming response.
  virtual void end_stream() = 0;
  /// False once the peer disconnected (lets long work be cancelled).
  virtual bool client_connected() const = 0;
};

/// The application side of the server: called on an I/O thread for every request.
/// Must not block for long: quick work inline, long work handed off with the sink.
/// Must not throw (the transport answers 500 if it does).
using HttpHandler = std::function<void(HttpRequest&& request, std::shared_ptr<ResponseSink> sink)>;

/// Transport settings.
struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 10086;  // 0 = pick an ephemeral port
  int io_threads = 2;
  size_t max_body_bytes = size_t{8} * 1024 * 1024;  // larger bodies get 413
  int read_timeout_seconds = 60;                    // idle keep-alive / slow request limit
  int max_pipelined = 16;                           // queued requests per connection before reading pauses
  // Open connections at most; a connection beyond it is answered 503 and closed at once. The
  // process's open-file limit is raised to fit (HttpServer::start).
  int max_connections = 4096;
  // From a request's first byte to the end of its headers (slowloris), and from a new
  // connection to its first byte. Bodies then have read_timeout_seconds.
  int header_timeout_seconds = 10;
  // Bytes of a streamed answer (SSE) waiting for a client that does not read them: past this
  // the connection is dropped (and the generation with it), so memory stays bounded.
  size_t max_stream_backlog_bytes = size_t{4} * 1024 * 1024;
  // TLS: both set = every connection speaks HTTPS (TLS 1.2 or newer) with this PEM certificate
  // chain and unencrypted PEM private key; both empty = plain HTTP. Loaded by HttpServer::start.
  std::string tls_cert_file;
  std::string tls_key_file;
};

}  // namespace swarm
