// swarm-server as a library: engine + routes + HTTP transport, started and stopped as one.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/engine.hpp"
#include "http/http_types.hpp"
#include "server/swarm_service.hpp"

namespace swarm {

struct SwarmServerOptions {
  HttpServerOptions http;
  EngineOptions engine;
  std::string config_path;  // optional YAML synced at start (the engine stays OFFLINE)
  /// A streamed answer silent this long gets an SSE `: keep-alive` comment.
  std::chrono::milliseconds sse_keep_alive = std::chrono::seconds(5);
  /// Bearer tokens the command routes need (empty = open, AgentJet's default).
  AccessTokens tokens;
};

/// Owns the engine, the metrics, the service and the HTTP server. start() binds and
/// returns; stop() answers or closes open requests, then shuts the engine down (its control
/// thread finished: stop-time checkpoint, backend released) and joins threads.
/// Thread-safe start/stop; stop is idempotent.
class SwarmServer {
 public:
  explicit SwarmServer(SwarmServerOptions options);
  ~SwarmServer();

  void start();
  void stop();
  uint16_t port() const;
  Engine& engine();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarm
