// A bare Boost.Beast HTTP/1.1 server answering every request with a fixed small JSON
// body: the "transport ceiling" the server benchmarks compare swarm's HttpServer to.
// Same threading model as HttpServer (one io_context, N I/O threads, a strand per
// connection, keep-alive), but no routing, no pipelining queue, no sinks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace swarm::bench {

/// Thread-safety: start() and stop() from one controlling thread; stop() is idempotent
/// and also run by the destructor.
class BareBeastServer {
 public:
  /// port 0 picks an ephemeral port (see port()).
  BareBeastServer(std::string host, uint16_t port, int io_threads);
  ~BareBeastServer();
  BareBeastServer(const BareBeastServer&) = delete;
  BareBeastServer& operator=(const BareBeastServer&) = delete;

  /// Binds, listens and starts the I/O threads (once). Throws std::runtime_error if the
  /// bind fails.
  void start();
  /// The bound port.
  uint16_t port() const;
  /// Stops the I/O threads, then closes the listener and every connection.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarm::bench
