// A real swarm-server on an ephemeral loopback port, for integration tests.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/mock_backend.hpp"
#include "server/server.hpp"

namespace swarm::testing {

/// Captures every batch the engine trains on (mock backend otherwise).
struct BatchLog {
  std::mutex mu;
  std::vector<TrainBatch> batches;
  std::vector<TrainStepReport> reports;  // what each step reported (its metrics), in order
  std::vector<TrainBatch> copy() {
    std::lock_guard lk(mu);
    return batches;
  }
  std::vector<TrainStepReport> copy_reports() {
    std::lock_guard lk(mu);
    return reports;
  }
  void add_report(const TrainStepReport& r) {
    std::lock_guard lk(mu);
    reports.push_back(r);
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
    TrainStepReport r = MockBackend::train_step(batch, step, stop);
    log_->add_report(r);
    return r;
  }

 private:
  std::shared_ptr<BatchLog> log_;
};

/// Wraps any backend and captures every batch it trains on (e.g. the torch backend).
class RecordingBackend : public Backend {
 public:
  RecordingBackend(std::unique_ptr<Backend> inner, std::shared_ptr<BatchLog> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  std::string name() const override { return inner_->name(); }
  void boot(const Job& job, std::stop_token stop) override { inner_->boot(job, stop); }
  std::string model_id() const override { return inner_->model_id(); }
  int64_t max_context_length() const override { return inner_->max_context_length(); }
  std::vector<TokenId> render_chat(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& tools,
                                   bool add_generation_prompt) const override {
    return inner_->render_chat(messages, tools, add_generation_prompt);
  }
  std::vector<TokenId> render_chat_with_kwargs(const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools,
                                               bool add_generation_prompt,
                                               const nlohmann::ordered_json& template_kwargs) const override {
    return inner_->render_chat_with_kwargs(messages, tools, add_generation_prompt, template_kwargs);
  }
  std::string chat_template_source() const override { return inner_->chat_template_source(); }
  std::optional<std::string> render_chat_text(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                              const nlohmann::ordered_json& template_kwargs) const override {
    return inner_->render_chat_text(messages, tools, add_generation_prompt, template_kwargs);
  }
  std::vector<TokenId> encode_rendered(const std::string& text) const override {
    return inner_->encode_rendered(text);
  }
  std::vector<TokenId> encode(const std::string& text) const override { return inner_->encode(text); }
  std::string decode(const std::vector<TokenId>& ids) const override { return inner_->decode(ids); }
  std::string token_text(TokenId id) const override { return inner_->token_text(id); }
  void generate(GenerationRequest request, std::shared_ptr<GenerationObserver> observer) override {
    inner_->generate(std::move(request), std::move(observer));
  }
  TrainStepReport train_step(const TrainBatch& batch, int64_t step, std::stop_token stop) override {
    {
      std::lock_guard lk(log_->mu);
      log_->batches.push_back(batch);
    }
    TrainStepReport r = inner_->train_step(batch, step, stop);
    log_->add_report(r);
    return r;
  }
  void set_policy_version(int64_t version) override { inner_->set_policy_version(version); }
  std::map<std::string, double> inference_metrics() const override { return inner_->inference_metrics(); }
  void release() override { inner_->release(); }

 private:
  std::unique_ptr<Backend> inner_;
  std::shared_ptr<BatchLog> log_;
};

/// Starts on construction, stops on destruction.
class TestServer {
 public:
  /// A server whose engine runs `inner()` (any backend), recording its training batches.
  explicit TestServer(std::function<std::unique_ptr<Backend>()> inner, double janitor_interval_seconds = 0.05,
                      std::chrono::milliseconds sse_keep_alive = std::chrono::seconds(5)) {
    SwarmServerOptions o;
    o.sse_keep_alive = sse_keep_alive;
    o.http.host = "127.0.0.1";
    o.http.port = 0;
    o.http.io_threads = 2;
    o.engine.janitor_interval_seconds = janitor_interval_seconds;
    o.engine.factory = [log = batches, inner = std::move(inner)] {
      return std::make_unique<RecordingBackend>(inner(), log);
    };
    server = std::make_unique<SwarmServer>(o);
    server->start();
  }
  /// A server on the mock backend; `tls_cert` / `tls_key` set: it speaks HTTPS (url() says so).
  explicit TestServer(double janitor_interval_seconds = 0.05, size_t max_body_bytes = 1 << 20,
                      AccessTokens tokens = {}, const std::string& tls_cert = {},
                      const std::string& tls_key = {}) {
    SwarmServerOptions o;
    o.tokens = std::move(tokens);
    o.http.tls_cert_file = tls_cert;
    o.http.tls_key_file = tls_key;
    scheme_ = tls_cert.empty() ? "http" : "https";
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
  std::string url() const { return scheme_ + "://127.0.0.1:" + std::to_string(server->port()); }
  uint16_t port() const { return server->port(); }
  Engine& engine() { return server->engine(); }

  std::shared_ptr<BatchLog> batches = std::make_shared<BatchLog>();
  std::unique_ptr<SwarmServer> server;

 private:
  std::string scheme_ = "http";
};

}  // namespace swarm::testing
