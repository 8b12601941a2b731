// The application behind the HTTP transport: command routes and OpenAI routes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.hpp"
#include "http/http_types.hpp"
#include "api/metrics.hpp"
#include "api/openai_routes.hpp"

namespace swarm {

/// Routes requests to the engine. Thread-safe (its state — the engine, metrics, the last chat
/// call, the SSE heartbeat — is). Never throws out of handle(): every error becomes a response.
/// Who may call what (docs/reliability.md "Who may call what"). Empty = that check is off.
/// admin: sync_train_config, start_engine, stop_engine, sync_train_code, and the routes that
/// show other clients' data (get_verbose_logs, replay_latest_llm_call, get_episode_buffer).
/// client: the episode routes (claim, end, abort, can_continue, agree_sync_weight); the admin
/// token is accepted there too. Both are sent as `Authorization: Bearer <token>`.
struct AccessTokens {
  std::string admin;
  std::string client;
};

class SwarmService {
 public:
  /// `fallback_authority` ("host:port") builds openai_base_url when a request has no
  /// Host header.
  /// Streamed answers silent for `keep_alive` get an SSE comment.
  /// `metrics` is shared with the answers still in flight (a stream that ends as the server
  /// stops records its status after the service is gone).
  SwarmService(Engine& engine, std::shared_ptr<Metrics> metrics,
               std::function<std::string()> fallback_authority,
               std::chrono::milliseconds keep_alive = std::chrono::seconds(5), AccessTokens tokens = {});

  void handle(HttpRequest&& request, std::shared_ptr<ResponseSink> sink);

 private:
  HttpResponse handle_command(const std::string& route, const HttpRequest& request);
  void handle_openai(const std::string& route, HttpRequest&& request, std::shared_ptr<ResponseSink> sink);

  Engine& engine_;
  std::shared_ptr<Metrics> metrics_;
  std::function<std::string()> fallback_authority_;
  AccessTokens tokens_;
  // Keys the hash that shows client ids on open routes when a client token is set (random per
  // process: the same client has the same id for as long as the server runs).
  std::string client_id_key_;
  std::shared_ptr<LastChatCall> last_chat_ = std::make_shared<LastChatCall>();
  SseHeartbeat heartbeat_;
};

}  // namespace swarm
