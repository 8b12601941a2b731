// swarm-server: the training server (OpenAI endpoint + command API + engine).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdlib>
#include <iostream>

#include "server/swarm_server.hpp"
#include "swarm/errors.hpp"

namespace {

int run_start(const std::string& host, int port, const std::string& engine, const std::string& config,
              const std::string& log_level, int io_threads, size_t max_body_mb) {
  auto level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    std::cerr << "swarm-server: unknown --log-level '" << log_level
              << "' (use trace, debug, info, warn, error, critical, off)\n";
    return 2;
  }
  spdlog::set_level(level);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");

  // Block the stop signals in every thread; one thread waits for them (no work in a handler).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  swarm::SwarmServerOptions options;
  options.http.host = host;
  options.http.port = static_cast<uint16_t>(port);
  options.http.io_threads = io_threads;
  options.http.max_body_bytes = max_body_mb * 1024 * 1024;
  options.engine.backend = engine;
  options.config_path = config;
  try {
    swarm::SwarmServer server(options);
    server.start();
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("swarm-server: received {}, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server.stop();
  } catch (const swarm::ConfigError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("swarm-server: {}", e.what());
    return 1;
  }
  spdlog::info("swarm-server: stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swarm-server: RL post-training server (OpenAI-compatible endpoint + swarm command API)"};
  app.require_subcommand(1);
  std::string host = "127.0.0.1", engine = "mock", config, log_level = "info";
  int port = 10086, io_threads = 2;
  size_t max_body_mb = 8;
  auto* start = app.add_subcommand("start", "Start the server (engine OFFLINE until a client starts it)");
  start->add_option("--host", host, "Address to listen on")->capture_default_str();
  start->add_option("--port", port, "Port to listen on (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  start->add_option("--engine", engine, "Backend: mock (no model, for tests) or torch")
      ->capture_default_str()
      ->check(CLI::IsMember({"mock", "torch"}));
  start->add_option("--config", config, "YAML job config to sync at start (see docs/configuration.md)")
      ->check(CLI::ExistingFile);
  start->add_option("--log-level", log_level, "trace, debug, info, warn, error, critical, off")->capture_default_str();
  start->add_option("--io-threads", io_threads, "HTTP I/O threads")->capture_default_str()->check(CLI::Range(1, 256));
  start->add_option("--max-body-mb", max_body_mb, "Largest request body in MiB (larger get 413)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  if (*start) return run_start(host, port, engine, config, log_level, io_threads, max_body_mb);
  return 0;
}
