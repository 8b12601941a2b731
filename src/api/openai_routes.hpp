// OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models; and the agent
// harnesses' APIs served through the chat path (chat_dialect.hpp): /v1/messages (Anthropic),
// /v1/messages/count_tokens, /v1/responses (OpenAI Responses).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "http/http_types.hpp"
#include "api/metrics.hpp"

namespace swarm {

/// The model-facing API a request arrived on; each is a dialect of the one generation path.
enum class ApiKind { CHAT_COMPLETIONS, COMPLETIONS, ANTHROPIC_MESSAGES, RESPONSES };

/// The most recent chat request and the ChatCompletion answered to it (streamed answers are
/// assembled into one), for AgentJet's overwatch (POST /replay_latest_llm_call). Thread-safe.
class LastChatCall {
 public:
  struct Call {
    std::string request_body;  // as the agent sent it
    std::string response;      // the answer in the request's API (a ChatCompletion for chat), JSON text
    std::string api;           // "chat_completions", "anthropic_messages" or "responses"
  };
  void record(std::string request_body, std::string response, std::string api = "chat_completions");
  std::optional<Call> get() const;

 private:
  mutable std::mutex mu_;
  std::optional<Call> call_;
};

/// A streamed answer the heartbeat may keep alive.
class SseStream {
 public:
  virtual ~SseStream() = default;
  /// Writes an SSE comment if nothing was written for `silence`; false once the stream ended.
  virtual bool keep_alive(std::chrono::steady_clock::time_point now, std::chrono::milliseconds silence) = 0;
};

/// Sends `: keep-alive` SSE comments on streamed answers that have been silent for `interval`
/// (a long prefill, a full KV cache), so clients and proxies with idle timeouts keep waiting.
/// One thread; holds its streams weakly (bounded by the streams open).
class SseHeartbeat {
 public:
  explicit SseHeartbeat(std::chrono::milliseconds interval);
  ~SseHeartbeat();
  SseHeartbeat(const SseHeartbeat&) = delete;
  SseHeartbeat& operator=(const SseHeartbeat&) = delete;
  void add(std::weak_ptr<SseStream> stream);

 private:
  void run(std::stop_token stop);
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::vector<std::weak_ptr<SseStream>> streams_;
  std::jthread thread_;
};

/// What the OpenAI routes share across requests (both optional). The last call is shared with
/// the generations in flight, which may end after the service is gone; the heartbeat is only
/// read while the request is handed over.
struct OpenAIContext {
  std::shared_ptr<LastChatCall> last_chat;
  SseHeartbeat* heartbeat = nullptr;
};

/// GET /v1/models: the loaded model (empty list when no model is loaded).
HttpResponse openai_models(Engine& engine);

/// Serves one chat/completion request: authenticates the episode key, validates the
/// parameters, renders the prompt, generates (streaming or not), records the exact
/// prompt/completion ids and log-probs into the episode, and answers through `sink`.
/// Throws SwarmError for errors found before generation starts; later errors are
/// answered through the sink.
void serve_generation(Engine& engine, std::shared_ptr<Metrics> metrics, ApiKind kind,
                      const HttpRequest& request, std::shared_ptr<ResponseSink> sink,
                      const OpenAIContext& context = {});

/// POST /v1/messages/count_tokens: {"input_tokens"} of the prompt the same body would get on
/// /v1/messages (generation prompt included). Records no call.
HttpResponse anthropic_count_tokens(Engine& engine, const HttpRequest& request);

/// The episode key of an Anthropic-style request: `x-api-key`, else `Authorization: Bearer`.
std::string anthropic_api_key(const HttpRequest& request);

}  // namespace swarm
