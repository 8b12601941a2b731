// A real swarm-server on an ephemeral loopback port, for integration tests.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/mock_backend.hpp"
#include "server/swarm_server.hpp"

namespace swarm::testing {

/// Captures every batch the engine trains on (mock backend otherwise).
struct BatchLog {
  std::mutex mu;
  std::vector<TrainBatch> batches;
  std::vector<TrainBatch> copy() {
    std::lock_guard lk(mu);
    return batches;
  }
};

class RecordingMockBackend : public MockBackend {
 public:
  explicit RecordingMockBackend(std::shared_ptr<BatchLog> log) : log_(std::move(log)) {}
  TrainStepReport train_step(const TrainBatch& batch, int64_t step, std::stop_token stop) override {
    {
      std::lock_guard lk(log_->mu);
      log_->batches.push_back(batch);
    }
    return MockBackend::train_step(batch, step, stop);
  }

 private:
  std::shared_ptr<BatchLog> log_;
};

/// Starts on construction, stops on destruction.
class TestServer {
 public:
  explicit TestServer(double janitor_interval_seconds = 0.05, size_t max_body_bytes = 1 << 20) {
    SwarmServerOptions o;
    o.http.host = "127.0.0.1";
    o.http.port = 0;
    o.http.io_threads = 2;
    o.http.max_body_bytes = max_body_bytes;
    o.engine.janitor_interval_seconds = janitor_interval_seconds;
    o.engine.factory = [log = batches] { return std::make_unique<RecordingMockBackend>(log); };
    server = std::make_unique<SwarmServer>(o);
    server->start();
  }
  ~TestServer() { server->stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server->port()); }
  uint16_t port() const { return server->port(); }
  Engine& engine() { return server->engine(); }

  std::shared_ptr<BatchLog> batches = std::make_shared<BatchLog>();
  std::unique_ptr<SwarmServer> server;
};

}  // namespace swarm::testing
