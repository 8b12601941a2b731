// Structured outputs: what a chat request's completion is constrained to.
//
// * response_format {"type": "json_object"}: one JSON object;
// * response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: a JSON
//   value validating against the schema (src/grammar/json_schema_grammar.hpp says what is
//   supported; anything else is a 400 naming it);
// * tool_choice "required" / {"type": "function", "function": {"name"}}: one (or, with
//   parallel_tool_calls, one or more) tool calls in the model's own format — hermes
//   `<tool_call>\n{"name": "X", "arguments": ARGS}\n</tool_call>` with <tool_call> as the
//   tokenizer's own token where it has one, Llama-3 `{"name": "X", "parameters": ARGS}` — whose
//   arguments validate against the tool's parameters schema.
//
// Compiled grammars are cached by their source (a bounded LRU), so requests with the same
// schema share one grammar (and the engine's mask cache for it).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tool_calls.hpp"

namespace swarm {

namespace grammar {
class Grammar;
}
class Backend;

/// The grammar of a response_format, or nullptr for none / {"type": "text"}. Throws SwarmError
/// INVALID_ARGUMENT naming the field for a malformed or unsupported one.
std::shared_ptr<const grammar::Grammar> response_format_grammar(
    const nlohmann::ordered_json& response_format);

/// The grammar of forced tool calls: `only` names the function (tool_choice naming one), empty
/// for any of `tools` (tool_choice "required"). Throws SwarmError INVALID_ARGUMENT naming the
/// field (e.g. a tool whose parameters schema is unsupported, or no tool-call format).
std::shared_ptr<const grammar::Grammar> tool_choice_grammar(const nlohmann::ordered_json& tools,
                                                            const std::string& only, ToolCallFormat format,
                                                            bool parallel_tool_calls, const Backend& backend);

}  // namespace swarm
