// Exact tokens across the turns of a conversation (docs/design.md).
//
// An agent sends its whole history with every request. The assistant turns in it are the
// server's own answers, but re-serialized by the agent's SDK (tool-call arguments through
// JSON.stringify, key order, whitespace), so a fresh render of the history can give other ids
// than were generated, and the calls of one conversation no longer merge into one sample.
// Here an assistant turn the server produced is recognised by its canonical form, and the new
// prompt is spliced: the ids of the call that produced it (prompt + completion, exactly as
// generated), then only what the template renders after it (tool results, user messages,
// the generation prompt).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/token_id.hpp"
#include "text/tool_calls.hpp"

namespace swarm {

class Backend;

/// The canonical key of an assistant answer: its content without surrounding whitespace
/// (null and "" alike) and its tool calls as (name, arguments parsed as JSON, so key order and
/// whitespace do not matter; raw text when they do not parse). Reasoning and call ids are left
/// out: SDKs drop or keep them as they like.
std::string answer_key(const std::optional<std::string>& content,
                       const std::vector<ParsedToolCall>& tool_calls);

/// The keys of one chat request (messages normalised: content is a string).
struct ChatKeys {
  /// turn_keys[k]: identifies "messages[k] answered the conversation messages[0..k)" with
  /// these tools and template kwargs; compared with the key recorded for a call.
  std::vector<std::string> turn_keys;
  /// The key a call answering this whole request is recorded under: see answer_turn_key.
  std::string request_prefix;
};
ChatKeys chat_keys(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                   const nlohmann::ordered_json& template_kwargs);
/// The turn key of an answer (answer_key) to the request whose keys are `keys`.
std::string answer_turn_key(const ChatKeys& keys, const std::string& answer);

/// Returns the ids a turn key was generated with (that call's prompt + completion ids), or
/// nullopt when no call of the episode has that key.
using TurnLookup = std::function<std::optional<std::vector<TokenId>>(const std::string& turn_key)>;

/// The spliced prompt for a chat request, or nullopt when no assistant turn in it is one the
/// server produced in this episode (or the backend cannot render text): the caller renders
/// afresh. The latest recognised assistant turn wins; what follows it is rendered in context
/// by putting a marker in that turn's place, and the part of the template's end-of-turn text
/// the model already generated (its stop token) is not repeated.
std::optional<std::vector<TokenId>> splice_chat_prompt(const Backend& backend,
                                                       const nlohmann::ordered_json& messages,
                                                       const nlohmann::ordered_json& tools,
                                                       const nlohmann::ordered_json& template_kwargs,
                                                       const ChatKeys& keys, const TurnLookup& lookup);

}  // namespace swarm
