// The four model-facing APIs as dialects of one generation path. OpenAI chat completions,
// Anthropic Messages (Claude Code, the Claude Agent SDK) and OpenAI Responses (Codex) are
// chat-like: the latter two are converted into the one internal request form — an OpenAI chat
// body (messages, tools, tool_choice, sampling) — and every chat-like request goes through the
// same path (prompt rendering, exact tokens across turns, structured outputs, recording).
// OpenAI completions takes a prompt and answers raw text. The generation handler
// (openai_routes.cpp) records calls and writes bytes; a ChatDialect turns the finished or
// streaming answer into the request's own API. No torch, no HTTP transport.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/token_id.hpp"
#include "http/http_error.hpp"
#include "inference/generation.hpp"
#include "text/tool_calls.hpp"

namespace swarm {

namespace dialect_detail {
/// A 400 naming what is wrong (the conversions' one error).
[[noreturn]] inline void bad(const std::string& message) {
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, message);
}
/// Only whitespace (or nothing): such text between blocks opens no text block / message item.
inline bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }
}  // namespace dialect_detail

/// How generated text is split into an answer's fields, resolved per request (the chat
/// template's formats, the request's tools and tool_choice, where the prompt leaves reasoning).
struct OutputFormat {
  ToolCallFormat tools = ToolCallFormat::NONE;
  ReasoningFormat reasoning = ReasoningFormat::NONE;
  bool parallel_tool_calls = true;  // false: at most the first call is returned
  ReasoningStart reasoning_start = ReasoningStart::AUTO;

  ParsedAssistant parse(const std::string& text) const {
    return parse_assistant_output(text, tools, reasoning, parallel_tool_calls, reasoning_start);
  }
  std::unique_ptr<StreamingAssistantParser> stream_parser() const {
    return std::make_unique<StreamingAssistantParser>(tools, reasoning, parallel_tool_calls, reasoning_start);
  }
};

/// One finished choice, as the dialects describe it.
struct DialectChoice {
  const GenerationChoice* generated = nullptr;  // ids, text, log-probs as generated
  ParsedAssistant parsed;                 // the whole text split (chat-like APIs; empty for completions)
  std::string finish_reason;              // "stop" or "length"
  std::string stop_sequence;              // the stop string that ended it ("" = none)
  std::vector<StreamEvent> final_events;  // streamed chat-like answers: what the parser flushed last
};

/// One finished answer.
struct DialectAnswer {
  std::vector<DialectChoice> choices;  // in choice order
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // every choice's, the end-of-turn tokens included
  int64_t policy_version = 0;     // the weights version that generated it
  const DialectChoice& first() const { return choices.front(); }
};

/// Writes answers in one API's shape. Not thread-safe: the generation handler calls one
/// dialect from one thread at a time. A streamed answer is started once, fed its text in
/// order (split into parser events for the chat-like APIs, raw for completions), then finished
/// once (or failed); each call returns the SSE text to send.
class ChatDialect {
 public:
  virtual ~ChatDialect() = default;
  /// The API's name for logs and replay_latest_llm_call ("chat_completions", "completions",
  /// "anthropic_messages", "responses").
  virtual const char* api() const = 0;
  /// The shape of this API's error bodies.
  virtual ErrorStyle error_style() const { return ErrorStyle::OPENAI; }
  /// True when generated text is split (reasoning, tool calls) before it is written; false
  /// for completions, whose text is written as generated (stream_text).
  virtual bool splits_text() const { return true; }
  /// True when an answer must hold a choice (the single-answer APIs); an empty result is then
  /// an internal error.
  virtual bool needs_a_choice() const { return false; }

  /// The whole answer (not streamed).
  virtual nlohmann::json answer(const DialectAnswer& a) = 0;
  /// What replay_latest_llm_call shows for this call, as JSON text; nullopt records nothing.
  /// `sent`: the body answered when not streamed (nullptr when streamed).
  virtual std::optional<std::string> recorded(const DialectAnswer& a, const nlohmann::json* sent);

  virtual std::string stream_start(int64_t prompt_tokens) = 0;
  /// Chat-like APIs: the events the parser settled in one choice's new text.
  virtual std::string stream_events(size_t choice, const std::vector<StreamEvent>& events) = 0;
  /// Completions: one choice's new text, as generated.
  virtual std::string stream_text(size_t choice, const std::string& delta);
  /// The end: each choice's final_events, then the API's closing events.
  virtual std::string stream_finish(const DialectAnswer& a) = 0;
  virtual std::string stream_error(ErrorKind kind, const std::string& message) = 0;
  /// What keeps an idle stream alive (Anthropic: a `ping` event).
  virtual std::string keep_alive() const { return ": keep-alive\n\n"; }
  /// Written after the last event, also after an error (OpenAI: `data: [DONE]`; the harness
  /// APIs: nothing).
  virtual std::string stream_trailer() const { return ""; }
};

// ----------------------------------------------------------------------------- OpenAI

/// What the OpenAI dialects need beyond the answer: the request's options and where it came
/// from. `backend` spells tokens for log-probs.
struct OpenAIDialectOptions {
  std::string model;
  int64_t n = 1;                  // choices
  bool logprobs = false;          // include log-probs
  bool include_usage = false;     // streamed: a last chunk with usage
  bool return_token_ids = false;  // prompt_token_ids / token_ids in the answer
  std::vector<TokenId> prompt;    // the prompt's ids (for prompt_token_ids)
  std::string episode_uuid;       // the answer's `swarm` field
  std::function<std::string(TokenId)> token_text;
};

/// OpenAI chat completions (POST /v1/chat/completions): chat.completion / chat.completion.chunk.
std::unique_ptr<ChatDialect> make_chat_completions_dialect(OpenAIDialectOptions options);
/// OpenAI completions (POST /v1/completions): text_completion, raw text.
std::unique_ptr<ChatDialect> make_completions_dialect(OpenAIDialectOptions options);

/// The OpenAI chat assistant message of a parsed answer: content, reasoning (as
/// `reasoning_content` and `reasoning`), tool calls with fresh ids. `finish` becomes
/// "tool_calls" when there are calls.
nlohmann::json chat_assistant_message(const ParsedAssistant& parsed, std::string& finish);

// ---------------------------------------------------------------------------- Anthropic

/// Which Anthropic route a request came to: /v1/messages requires max_tokens, count_tokens not.
enum class AnthropicRoute { MESSAGES, COUNT_TOKENS };

/// Anthropic Messages request → the internal chat request. Throws SwarmError
/// (INVALID_ARGUMENT) naming the field for what the API requires and is missing (max_tokens,
/// messages, each message's content, a tool_use for each tool_result) and for what cannot be
/// served (image / document blocks, malformed blocks). `notes` gets what was dropped (server
/// tools).
nlohmann::ordered_json anthropic_to_chat(const nlohmann::ordered_json& body, std::vector<std::string>& notes,
                                         AnthropicRoute route = AnthropicRoute::MESSAGES);

/// `model`: what the answer names as its model.
std::unique_ptr<ChatDialect> make_anthropic_dialect(std::string model);

/// The signature emitted with a thinking block: a keyed hash of its text under this server's
/// key (an integrity check that the thinking a harness sends back is what was generated; not a
/// security boundary).
std::string thinking_signature(const std::string& thinking);
bool thinking_signature_valid(const std::string& thinking, const std::string& signature);

// ---------------------------------------------------------------------- OpenAI Responses

/// Responses request → the internal chat request (same contract as anthropic_to_chat).
/// `previous_response_id` is refused: nothing is stored across requests.
nlohmann::ordered_json responses_to_chat(const nlohmann::ordered_json& body, std::vector<std::string>& notes);

/// `request`: the Responses request (echoed fields: tools, tool_choice, instructions, ...).
std::unique_ptr<ChatDialect> make_responses_dialect(std::string model, const nlohmann::ordered_json& request,
                                                    std::vector<std::string> notes);

}  // namespace swarm
