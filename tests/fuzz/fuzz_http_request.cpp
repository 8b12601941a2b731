// libFuzzer target: the HTTP request path end to end on the mock engine — raw bytes are parsed
// as an HTTP/1.1 request by Beast with the server's limits, then handled by the SwarmService
// (every route: the swarm command API, the OpenAI / Anthropic / Responses endpoints, their JSON
// body handlers) against a running engine. Bad input of any kind must get an answer that is
// not a 500 (a 500 means a bug, never a client's fault), and the service must keep serving.
//
// So that fuzzed requests reach past authentication, the text KEY in an input is replaced by
// the API key of an episode the harness holds, EPISODE by its uuid and CLIENT by its client
// uuid (see the seed corpus in corpus-http/). Control routes may stop or reconfigure the
// engine; the harness brings it back to ROLLING with its own config after such an input.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/spdlog.h>

#include "engine/engine.hpp"
#include "api/metrics.hpp"
#include "server/swarm_service.hpp"

namespace {

namespace http = boost::beast::http;
using namespace std::chrono_literals;

constexpr const char* kConfig =
    "algorithm: grpo\nmodel: mock\nbatch_size: 2\nnum_repeat: 2\nmax_parallel_episodes: 64\n"
    "max_response_length: 16\nmax_llm_calls_per_episode: 100000\n";

// Collects one answer (complete or streamed); the harness waits for it.
class Sink final : public swarm::ResponseSink {
 public:
  void respond(swarm::HttpResponse r) override { finish(r.status); }
  void start_stream(int status, const std::string&) override {
    std::lock_guard lk(mu_);
    status_ = status;
  }
  bool write(std::string chunk) override {
    std::lock_guard lk(mu_);
    bytes_ += chunk.size();
    return bytes_ < (1u << 20);
  }
  void end_stream() override { finish(status_); }
  bool client_connected() const override { return true; }
  // The status, or 0 when no answer came within `wait`.
  int wait(std::chrono::milliseconds wait) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, wait, [&] { return done_; });
    return done_ ? status_ : 0;
  }

 private:
  void finish(int status) {
    std::lock_guard lk(mu_);
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int status_ = 0;
  size_t bytes_ = 0;
  bool done_ = false;
};

struct Harness {
  Harness() {
    spdlog::set_level(spdlog::level::off);
    swarm::EngineOptions o;
    o.backend = "mock";
    o.write_run_files = false;
    o.janitor_interval_seconds = 0;
    engine = std::make_unique<swarm::Engine>(o);
    service = std::make_unique<swarm::SwarmService>(
        *engine, metrics, [] { return std::string("127.0.0.1:1"); }, std::chrono::seconds(5));
    ensure_rolling();
  }

  void ensure_rolling() {
    if (engine->status().state != swarm::EngineState::ROLLING) {
      engine->stop_engine();
      engine->sync_train_config(kConfig);
      engine->start_engine();
      if (!engine->wait_for_state(swarm::EngineState::ROLLING, 10s)) {
        std::fprintf(stderr, "harness: the engine did not come back to ROLLING: %s\n",
                     engine->status().detail.c_str());
        std::abort();
      }
    }
    if (!engine->can_continue_episode(client, episode.episode_uuid)) {
      swarm::ClaimRequest req{client, swarm::EpisodeType::TRAIN, 600};
      const swarm::ClaimResult r = engine->claim_episode(req);
      if (r.episode) episode = *r.episode;
    }
  }

  std::shared_ptr<swarm::Metrics> metrics = std::make_shared<swarm::Metrics>();
  std::unique_ptr<swarm::Engine> engine;
  std::unique_ptr<swarm::SwarmService> service;
  std::string client = "fuzz-client";
  swarm::ClaimedEpisode episode;
};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (to.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness h;
  h.ensure_rolling();
  std::string bytes(reinterpret_cast<const char*>(data), size);
  replace_all(bytes, "KEY", h.episode.api_key);
  replace_all(bytes, "EPISODE", h.episode.episode_uuid);
  replace_all(bytes, "CLIENT", h.client);

  // The transport's parser and limits (http_transport.cpp): a request it refuses gets a 4xx
  // from the transport and never reaches the service.
  http::request_parser<http::string_body> parser;
  parser.body_limit(1 << 20);
  parser.header_limit(16 * 1024);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  while (used < bytes.size() && !parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == http::error::need_more) break;
    if (ec) return 0;
    if (n == 0) break;
    used += n;
  }
  if (!parser.is_done()) return 0;
  auto& msg = parser.get();
  swarm::HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  const auto q = req.target.find('?');
  req.path = q == std::string::npos ? req.target : req.target.substr(0, q);
  for (const auto& f : msg) {
    std::string name(f.name_string());
    for (char& c : name)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    req.headers.emplace_back(std::move(name), std::string(f.value()));
  }
  req.body = std::move(msg.body());
  req.remote_address = "127.0.0.1";

  auto sink = std::make_shared<Sink>();
  h.service->handle(std::move(req), sink);
  const int status = sink->wait(10s);
  if (status == 0) {
    std::fprintf(stderr, "no answer within 10 s\n");
    std::abort();
  }
  if (status >= 500 && status != 503) {
    std::fprintf(stderr, "answered %d: a 5xx for a client's request is a bug\n", status);
    std::abort();
  }
  return 0;
}
