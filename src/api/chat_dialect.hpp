// Agent harnesses speak other APIs than OpenAI chat (issue 22): Claude Code and the Claude
// Agent SDK the Anthropic Messages API, Codex the OpenAI Responses API. Each such request is
// converted into the one internal request form — an OpenAI chat body (messages, tools,
// tool_choice, sampling) — and goes through the chat route's path (prompt rendering, exact
// tokens across turns, structured outputs, recording); only the answer is written back in the
// request's own API by a ChatDialect. No torch, no HTTP.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
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

/// One finished answer, as the dialects describe it.
struct DialectAnswer {
  ParsedAssistant parsed;     // the whole text split (reasoning, content, tool calls)
  std::string finish_reason;  // "stop" or "length"
  std::string stop_sequence;  // the stop string that ended it ("" = none)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // the end-of-turn token included
};

/// Writes answers in one API's shape. A streamed answer is fed its parser's events in order
/// (from one thread at a time), then finished once; each call returns the SSE text to send.
class ChatDialect {
 public:
  virtual ~ChatDialect() = default;
  /// The whole answer (not streamed).
  virtual nlohmann::json answer(const DialectAnswer& a) = 0;
  virtual std::string stream_start(int64_t prompt_tokens) = 0;
  virtual std::string stream_events(const std::vector<StreamEvent>& events) = 0;
  virtual std::string stream_finish(const DialectAnswer& a) = 0;
  virtual std::string stream_error(ErrorKind kind, const std::string& message) = 0;
  /// What keeps an idle stream alive (Anthropic: a `ping` event).
  virtual std::string keep_alive() const { return ": keep-alive\n\n"; }
  /// Written after the last event (OpenAI chat: `data: [DONE]`; these APIs: nothing).
  virtual std::string stream_trailer() const { return ""; }
  /// The API's name for logs and replay_latest_llm_call ("anthropic_messages", "responses").
  virtual const char* api() const = 0;
};

// ---------------------------------------------------------------------------- Anthropic

/// Anthropic Messages request → the internal chat request. Throws SwarmError
/// (INVALID_ARGUMENT) naming the field for what cannot be served (image / document blocks,
/// malformed blocks). `notes` gets what was dropped (server tools).
nlohmann::ordered_json anthropic_to_chat(const nlohmann::ordered_json& body, std::vector<std::string>& notes);

/// `model`: what the answer names as its model.
std::unique_ptr<ChatDialect> make_anthropic_dialect(std::string model);

/// The signature emitted with a thinking block: a keyed hash of its text under this server's
/// key (an integrity check that the thinking a harness sends back is what was generated; not a
/// security boundary).
std::string thinking_signature(const std::string& thinking);
bool thinking_signature_valid(const std::string& thinking, const std::string& signature);

/// The Anthropic error body: {"type": "error", "error": {"type", "message"}}.
nlohmann::json anthropic_error_body(int status, const std::string& message);

// ---------------------------------------------------------------------- OpenAI Responses

/// Responses request → the internal chat request (same contract as anthropic_to_chat).
/// `previous_response_id` is refused: nothing is stored across requests.
nlohmann::ordered_json responses_to_chat(const nlohmann::ordered_json& body, std::vector<std::string>& notes);

/// `request`: the Responses request (echoed fields: tools, tool_choice, instructions, ...).
std::unique_ptr<ChatDialect> make_responses_dialect(std::string model, const nlohmann::ordered_json& request,
                                                    std::vector<std::string> notes);

}  // namespace swarm
