// Tool calls and reasoning in generated text: splits a model's raw output into the OpenAI
// message fields (content, reasoning, tool_calls), whole or as a stream of deltas.
//
// Formats (per model family, picked by the job or detected from the chat template):
//   tool calls  HERMES       <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5/3)
//               LLAMA3_JSON  [<|python_tag|>]{"name": ..., "parameters": {...}}[; {...}] (Llama 3.x)
//   reasoning   THINK        <think>...</think> before the answer (Qwen3, DeepSeek-R1)
//
// Nothing here throws on any input: text that does not parse as a call stays in the content
// and is counted as a parse failure.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace swarm {

/// How a model writes tool calls. Job key `tool_call_parser` (plus `auto`, resolved by the
/// caller with detect_tool_call_format).
enum class ToolCallFormat { NONE, HERMES, LLAMA3_JSON };

/// "none" | "hermes" | "llama3_json" → *out; false (and *out untouched) for anything else.
bool parse_tool_call_format(const std::string& name, ToolCallFormat* out);
/// The job key value of a format ("none", "hermes", "llama3_json").
const char* tool_call_format_name(ToolCallFormat format);
/// From a chat template's source: HERMES when it mentions `<tool_call>`; LLAMA3_JSON when it is
/// a Llama-3 template (`<|start_header_id|>`) that renders tool calls as JSON (mentions
/// `<|python_tag|>` or `"parameters"`); NONE otherwise (e.g. Llama 3.0, plain ChatML).
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

/// How a model separates its reasoning. Job key `reasoning_parser` (plus `auto`).
enum class ReasoningFormat { NONE, THINK };

/// "none" | "think" → *out; false (and *out untouched) for anything else.
bool parse_reasoning_format(const std::string& name, ReasoningFormat* out);
const char* reasoning_format_name(ReasoningFormat format);
/// THINK when the template mentions `<think>` or `</think>`, else NONE.
ReasoningFormat detect_reasoning_format(std::string_view chat_template);

/// Where generation starts relative to a <think> block (THINK only; ignored with NONE).
///   AUTO             the output itself says: `<think>` at its start opens reasoning; else a
///                    `</think>` anywhere ends reasoning that the prompt opened; else no reasoning.
///                    Costs streaming latency when the output does not start with `<think>`:
///                    the parser cannot know whether a `</think>` will come, so it holds
///                    everything back until one does or the output ends.
///   IN_REASONING     the prompt ends inside an open `<think>` (Qwen3-Thinking, DeepSeek-R1
///                    templates): everything up to the first `</think>` is reasoning (all of it
///                    when none comes), streamed as it is generated.
///   AFTER_REASONING  the prompt already closed the block (Qwen3 with enable_thinking=false
///                    renders `<think>\n\n</think>\n\n`): no reasoning is split off.
enum class ReasoningStart { AUTO, IN_REASONING, AFTER_REASONING };

/// Reads the end of a rendered prompt: trailing whitespace aside, ending in `<think>` →
/// IN_REASONING, in `</think>` → AFTER_REASONING, else AUTO.
ReasoningStart reasoning_start_from_prompt(std::string_view prompt);

/// One tool call as generated.
struct ParsedToolCall {
  std::string name;
  /// The arguments object's JSON text exactly as generated (the raw bytes, not re-serialized),
  /// so that a template rendering it back reproduces the same tokens. When the model wrote the
  /// arguments as a JSON string holding a JSON object, the string's decoded value.
  std::string arguments;

  bool operator==(const ParsedToolCall&) const = default;
};

/// A whole generated assistant message split into its OpenAI fields.
struct ParsedAssistant {
  /// Text outside reasoning and tool calls. nullopt when there are tool calls and no text
  /// (whitespace aside); "" is kept when there are no tool calls.
  std::optional<std::string> content;
  /// The reasoning text without the tags; nullopt when there is none (or it is empty).
  std::optional<std::string> reasoning;
  std::vector<ParsedToolCall> tool_calls;
  /// Blocks that looked like tool calls but did not parse (they stay in content verbatim).
  int parse_failures = 0;
};

/// Splits a whole generated text.
///
/// Reasoning (THINK) is split first and tool calls are parsed only in the text after it:
/// * leading whitespace then `<think>`: up to the first `</think>` is reasoning; with no
///   `</think>` (generation cut off) everything after `<think>` is reasoning and content is "";
/// * otherwise a `</think>` anywhere: everything before it is reasoning (the prompt opened it);
/// * the reasoning is stripped of leading and trailing '\n' and the text after `</think>` of
///   leading '\n' — what Qwen3's template strips when it renders a message's reasoning_content
///   back (`<think>\n` + reasoning + `\n</think>\n\n` + content), so the fields re-render to the
///   generated text. Spaces are kept.
///
/// HERMES: each `<tool_call>JSON</tool_call>` whose JSON is an object with a non-empty string
/// `name` and an `arguments` (or `parameters`) object, or a string holding a JSON object, is a
/// call. Content = the text before the first call with trailing whitespace trimmed, followed by
/// the text between and after calls where that is not whitespace only (kept verbatim).
/// A block that does not parse stays in the content verbatim (one failure); so does an unclosed
/// `<tool_call>` at the end (one failure).
///
/// LLAMA3_JSON: the whole text (whitespace and one leading `<|python_tag|>` aside) is one call
/// object `{"name": ..., "parameters"|"arguments": {...}}` or several separated by `;`; then
/// content is nullopt. Otherwise the text is content verbatim, and one failure when it starts
/// with `{` (after the optional tag).
///
/// parallel_tool_calls=false keeps only the first call (the others are dropped, not content).
/// "Whitespace" is ASCII whitespace throughout.
ParsedAssistant parse_assistant_output(std::string_view text, ToolCallFormat tools, ReasoningFormat reasoning,
                                       bool parallel_tool_calls = true,
                                       ReasoningStart start = ReasoningStart::AUTO);

/// One piece of a streamed assistant message.
struct StreamEvent {
  enum Kind { CONTENT, REASONING, TOOL_CALL_START, TOOL_CALL_ARGUMENTS };
  Kind kind = CONTENT;
  std::string text;  ///< CONTENT / REASONING text, or a TOOL_CALL_ARGUMENTS piece
  int index = 0;     ///< tool call index (0, 1, ... among the calls returned)
  std::string name;  ///< TOOL_CALL_START: the function name
};

/// The streamed form of parse_assistant_output: for any split of a text into deltas, the
/// concatenated CONTENT equals its content (nullopt read as ""), REASONING its reasoning, the
/// calls (TOOL_CALL_START, then TOOL_CALL_ARGUMENTS for that index) its tool_calls, and
/// parse_failures() its parse_failures.
///
/// Text is held back only while it could still change meaning: a possible start of `<think>`,
/// `</think>` or `<tool_call>`; whitespace that would be trimmed if a tool call follows;
/// trailing '\n' of reasoning; a tool-call block until it closes (then START + one ARGUMENTS
/// piece with the whole arguments text, or CONTENT with the verbatim block if it fails);
/// LLAMA3_JSON output that starts with `{` or `<|python_tag|>` until the end; and, with
/// ReasoningStart::AUTO, output that does not start with `<think>` until a `</think>` or the end.
/// Adjacent CONTENT (or REASONING) pieces from one call are merged into one event.
///
/// Not thread-safe (one parser per generation).
class StreamingAssistantParser {
 public:
  StreamingAssistantParser(ToolCallFormat tools, ReasoningFormat reasoning, bool parallel_tool_calls = true,
                           ReasoningStart start = ReasoningStart::AUTO);

  /// The events that the new text settles. Ignored (no events) after finish().
  std::vector<StreamEvent> feed(std::string_view delta);
  /// The end of the generation: flushes what is held back (an unclosed tool-call block becomes
  /// content and one failure). Later calls return nothing.
  std::vector<StreamEvent> finish();

  int parse_failures() const { return parse_failures_; }

 private:
  enum class Phase { START, IMPLICIT, REASONING, BODY };
  enum class ToolPhase { TEXT, BLOCK, LLAMA_START, LLAMA_HOLD, LLAMA_PASS };

  void feed_reasoning(std::string_view delta);
  void scan_implicit();
  void feed_reasoning_text(std::string_view delta);
  void emit_reasoning(std::string_view text);
  void enter_body(std::string_view rest, bool strip_newlines);
  void feed_body(std::string_view delta);
  void feed_hermes(std::string_view delta);
  void feed_llama(std::string_view delta);
  void content_piece(std::string_view text);
  void tool_call(ParsedToolCall call);
  void emit(StreamEvent::Kind kind, std::string_view text);
  std::vector<StreamEvent> take();

  ToolCallFormat tools_;
  bool parallel_tool_calls_;
  bool finished_ = false;
  int parse_failures_ = 0;
  std::vector<StreamEvent> out_;

  // Reasoning split.
  Phase phase_ = Phase::BODY;
  std::string held_;                  // START/IMPLICIT: all text so far; REASONING: a tail that may end it
  size_t implicit_searched_ = 0;      // IMPLICIT: no "</think>" starts before this offset
  bool reasoning_started_ = false;    // leading '\n' of the reasoning already dropped
  bool strip_body_newlines_ = false;  // still dropping the '\n' right after "</think>"

  // Tool calls.
  ToolPhase tool_phase_ = ToolPhase::TEXT;
  std::string tool_buf_;       // TEXT: a possible "<tool_call>" prefix; BLOCK / LLAMA_*: the held text
  size_t block_searched_ = 0;  // BLOCK: no "</tool_call>" starts before this offset

  // Content whitespace (HERMES): text before the first call is right-trimmed, whitespace-only
  // text between or after calls is dropped.
  int calls_seen_ = 0;  // calls parsed, including those parallel_tool_calls=false drops
  int calls_emitted_ = 0;
  bool segment_has_text_ = false;
  std::string pending_space_;
};

/// How a chat template takes an assistant tool call's `function.arguments` back in a history.
/// OpenAI clients send them as a JSON string; Hugging Face's chat-template convention (and what
/// vLLM hands a template) is the parsed object, which templates print with `tojson`.
enum class ToolArgumentsForm { OBJECT, STRING };

/// From a chat template's source: STRING when the template joins the arguments into text with
/// `+` or `~` (`'...' + tool['function']['arguments']`) and never tests them with `is string` /
/// `is mapping` — it needs the JSON text; OBJECT otherwise (`tool_call.arguments | tojson`,
/// `| items`, templates that accept both, templates that never look at them).
ToolArgumentsForm detect_tool_arguments_form(std::string_view chat_template);

/// Tool calls of assistant messages as vLLM hands them to a chat template, in place: an empty
/// `tool_calls` array is removed (templates test `'tool_calls' in message`), and with OBJECT
/// every `function.arguments` that is a JSON string holding an object becomes that object (key
/// order kept), a missing, null or "" one becomes {}. Arguments that are not JSON, JSON that is
/// not an object, or nested deeper than 64 levels stay the string the client sent (vLLM would
/// put {} there, losing them). Other messages and shapes are left alone; never throws.
void normalize_tool_calls(nlohmann::ordered_json& messages, ToolArgumentsForm form);

/// The text of an OpenAI message `content`: a string → itself; null → ""; an array of parts →
/// the concatenation (no separator) of the `text` of every part that has a string `text`
/// (`{"type": "text", "text": ...}`), bare strings in the array included; anything else → "".
/// Never throws. Both JSON flavours, as the server keeps requests in ordered_json.
std::string message_content_text(const nlohmann::json& content);
std::string message_content_text(const nlohmann::ordered_json& content);

}  // namespace swarm
