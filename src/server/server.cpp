#include "server/server.hpp"

#include <spdlog/spdlog.h>

#include <fstream>
#include <mutex>
#include <sstream>

#include "http/http_transport.hpp"
#include "api/metrics.hpp"
#include "server/swarm_service.hpp"
#include "server/verbose_log.hpp"
#include "swarm/errors.hpp"

namespace swarm {

// Teardown (docs/reliability.md, "Shutdown"): stop() stops the HTTP server, then shuts the
// engine down, which waits for its control thread (stop-time checkpoint, the backend's
// release, which ends the generations still in flight). Only then do the members go, http
// first and the engine last; what an answer still in flight needs (the metrics, the last
// call) it also holds by shared ownership.
struct SwarmServer::Impl {
  SwarmServerOptions options;
  Engine engine;
  std::shared_ptr<Metrics> metrics = std::make_shared<Metrics>();
  std::unique_ptr<SwarmService> service;
  std::unique_ptr<HttpServer> http;
  std::mutex mu;
  bool stopped = false;

  explicit Impl(SwarmServerOptions o) : options(std::move(o)), engine(options.engine) {}
};

// The verbose-log sink joins the default logger before the engine's threads exist: adding a
// sink while another thread logs is a data race in spdlog.
SwarmServer::SwarmServer(SwarmServerOptions options)
    : impl_((install_verbose_log_sink(), std::make_unique<Impl>(std::move(options)))) {
  if (!impl_->options.config_path.empty()) {
    std::ifstream in(impl_->options.config_path);
    if (!in) throw ConfigError("cannot read config file '" + impl_->options.config_path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      impl_->engine.sync_train_config(ss.str());
    } catch (const SwarmError& e) {
      throw ConfigError(impl_->options.config_path + ": " + e.what());
    }
  }
}

SwarmServer::~SwarmServer() { stop(); }

void SwarmServer::start() {
  std::lock_guard lk(impl_->mu);
  auto& o = impl_->options;
  impl_->http =
      std::make_unique<HttpServer>(o.http, [this](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
        impl_->service->handle(std::move(req), std::move(sink));
      });
  impl_->service = std::make_unique<SwarmService>(
      impl_->engine, impl_->metrics,
      [this] { return impl_->options.http.host + ":" + std::to_string(impl_->http->port()); },
      o.sse_keep_alive, o.tokens);
  impl_->http->start();
  spdlog::info("swarm-server listening on {}://{}:{} (engine: {})", impl_->http->tls() ? "https" : "http",
               o.http.host, impl_->http->port(), o.engine.backend);
  spdlog::info("swarm-server: control routes {}; episode routes {}",
               o.tokens.admin.empty() ? "open (no admin token)" : "need the admin token",
               o.tokens.client.empty() ? "open (no client token)" : "need the client token");
}

void SwarmServer::stop() {
  std::lock_guard lk(impl_->mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  if (impl_->http) impl_->http->stop();
  impl_->engine.shutdown();
}

uint16_t SwarmServer::port() const { return impl_->http ? impl_->http->port() : 0; }

Engine& SwarmServer::engine() { return impl_->engine; }

}  // namespace swarm
