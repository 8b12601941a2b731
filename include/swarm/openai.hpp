// OpenAIClient: a small OpenAI-compatible client, so a C++ agent needs nothing else to
// talk to the endpoint it got from SwarmClient::begin_episode().
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/client.hpp"
#include "swarm/errors.hpp"

namespace swarm {

/// Sampling and request options of a completion call. Unset optionals are not sent
/// (the server's defaults apply). `extra` is merged into the request object last, so it
/// can add or override any field (e.g. {"chat_template_kwargs": {...}}).
struct ChatParams {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> max_tokens;
  std::optional<int> top_k;
  std::optional<int> n;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool logprobs = false;
  std::optional<int> top_logprobs;
  std::string model = "swarm";
  /// Tools the model may call: an array of {"type": "function", "function": {name,
  /// description, parameters}} (null: none sent).
  nlohmann::json tools = nullptr;
  std::optional<std::string> tool_choice;  // "auto", "none" or "required" (a named function: extra)
  std::optional<bool> parallel_tool_calls;
  nlohmann::json extra = nlohmann::json::object();
};

/// One tool call of an assistant message. `arguments` is the JSON text as the model
/// generated it (parse it with nlohmann::json::parse).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

/// Token counts reported by the server.
struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int total_tokens = 0;
};

/// One (role, content) chat message, for the brace-list form of OpenAIClient::chat:
/// `llm.chat({{"system", "be brief"}, {"user", query}})`. The constructor is a template
/// on purpose: a nested braced list (a JSON message object such as
/// `{{"role", "user"}, {"content", "hi"}}`) cannot bind to it, so such arguments go to
/// the nlohmann::json overload instead of being misread as two strings.
struct ChatMessage {
  std::string role;
  std::string content;

  template <class R, class C>
  requires std::constructible_from<std::string, R&&> && std::constructible_from<std::string, C&&> ChatMessage(
      R&& r, C&& c)
      : role(std::forward<R>(r)), content(std::forward<C>(c)) {}
};

/// The first choice of a completion. `raw` is the whole response object (for a stream:
/// an equivalent `chat.completion` object assembled from the chunks).
struct ChatResult {
  std::string content;    // "" when the message is only tool calls
  std::string reasoning;  // reasoning_content (e.g. a <think> block), "" when none
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;  // "tool_calls" when the model called tools
  Usage usage;
  nlohmann::json raw;

  /// The assistant message to append to the conversation for the next turn (content null
  /// when it is only tool calls, as the OpenAI API returns it).
  nlohmann::json assistant_message() const;
  /// The message that answers `call` with the tool's output.
  static nlohmann::json tool_message(const ToolCall& call, const std::string& output);
};

/// Client of one OpenAI-compatible endpoint (`{base_url}/chat/completions`, ...) with a
/// bearer key. Keeps one keep-alive connection.
///
/// NOT thread-safe: use one per thread (typically one per episode).
/// Errors: TransportError (unreachable, broken connection, timeout), ServerError with the
/// OpenAI error body's type and message for a non-2xx status, ClientError for a response
/// that is not what the OpenAI schema says.
class OpenAIClient {
 public:
  /// `base_url` like "http://host:port/v1" or "https://...". Throws ConfigError if it is
  /// malformed. `ca_file`: as SwarmClientOptions::ca_file (https only).
  OpenAIClient(std::string base_url, std::string api_key,
               std::chrono::milliseconds timeout = std::chrono::seconds(120),
               const std::string& ca_file = {});
  /// Uses the endpoint of a claimed episode.
  explicit OpenAIClient(const OpenAIEndpoint& endpoint,
                        std::chrono::milliseconds timeout = std::chrono::seconds(120));
  ~OpenAIClient();
  OpenAIClient(OpenAIClient&&) noexcept;
  OpenAIClient& operator=(OpenAIClient&&) noexcept;

  /// `POST /chat/completions` with `messages` (a JSON array of {role, content}).
  ChatResult chat(const nlohmann::json& messages, const ChatParams& params = {});
  /// Convenience: messages given as (role, content) pairs.
  ChatResult chat(const std::vector<std::pair<std::string, std::string>>& role_content,
                  const ChatParams& params = {});
  /// Convenience for literals: `chat({{"user", "hi"}})` (a braced list of (role, content)
  /// pairs; preferred by overload resolution over the other two forms). A braced list of
  /// JSON objects (`{{{"role", ...}, {"content", ...}}}`) does not compile (ambiguous):
  /// wrap it in `nlohmann::json::array(...)`.
  ChatResult chat(std::initializer_list<ChatMessage> messages, const ChatParams& params = {});
  /// Streaming chat (`stream: true`, server-sent events). `on_delta` is called with each
  /// piece of content as it arrives; the result holds the whole content, the reasoning,
  /// the tool calls (assembled from their deltas), the finish_reason and the usage
  /// (requested with stream_options.include_usage). With
  /// params.n > 1 only choice 0 is followed (use chat() for every choice).
  /// An exception thrown by `on_delta` stops the stream and propagates.
  ChatResult chat_stream(const nlohmann::json& messages,
                         const std::function<void(std::string_view delta)>& on_delta,
                         const ChatParams& params = {});
  /// `POST /completions` with a raw prompt; content = choices[0].text.
  ChatResult complete(const std::string& prompt, const ChatParams& params = {});
  /// `GET /models`: the ids of the served models.
  std::vector<std::string> models();

  const std::string& base_url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarm
