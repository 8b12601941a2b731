#include "text/tool_calls.hpp"

#include <algorithm>
#include <cctype>
#include <utility>

#include "common/json_nesting.hpp"

namespace swarm {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr size_t npos = std::string_view::npos;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

bool all_space(std::string_view s) { return std::all_of(s.begin(), s.end(), is_space); }

size_t first_non_space(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (!is_space(s[i])) return i;
  return npos;
}

std::string_view rtrim_space(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view trim_space(std::string_view s) {
  size_t i = first_non_space(s);
  return i == npos ? std::string_view() : rtrim_space(s.substr(i));
}

std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

std::string_view strip_newlines(std::string_view s) { return rstrip_newlines(lstrip_newlines(s)); }

// The length of the longest proper prefix of `tag` that `buf` ends with: text that must be
// held back because the next delta may complete the tag.
size_t partial_tag_length(std::string_view buf, std::string_view tag) {
  for (size_t k = std::min(buf.size(), tag.size() - 1); k > 0; --k)
    if (buf.substr(buf.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

// --- JSON spans --------------------------------------------------------------------------------
// nlohmann::json validates; these find where a value's raw text lies, which it does not report.

// One past the closing quote of the JSON string that starts at s[pos] == '"'; npos if unclosed.
size_t skip_string(std::string_view s, size_t pos) {
  for (size_t i = pos + 1; i < s.size(); ++i) {
    if (s[i] == '\\')
      ++i;
    else if (s[i] == '"')
      return i + 1;
  }
  return npos;
}

// One past the bracket closing the one at s[pos] ('{' or '['), counting brackets outside
// strings; npos if it never closes. Whether the brackets pair up by kind is left to the parser.
size_t skip_bracketed(std::string_view s, size_t pos) {
  size_t depth = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      const size_t end = skip_string(s, i);
      if (end == npos) return npos;
      i = end - 1;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return npos;
}

// One past the value at s[pos] in JSON already known to be valid.
size_t skip_value(std::string_view s, size_t pos) {
  if (s[pos] == '"') return skip_string(s, pos);
  if (s[pos] == '{' || s[pos] == '[') return skip_bracketed(s, pos);
  size_t i = pos;
  while (i < s.size() && !is_space(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']') ++i;
  return i;
}

// Whether the JSON string literal `literal` (quotes included) decodes to `key`.
bool json_string_is(std::string_view literal, std::string_view key) {
  if (literal.find('\\') == npos) return literal.substr(1, literal.size() - 2) == key;
  const auto decoded = nlohmann::json::parse(literal.begin(), literal.end(), nullptr, false);
  return decoded.is_string() && decoded.get_ref<const std::string&>() == key;
}

// The raw text of member `key` of the valid JSON object `object` (no surrounding whitespace).
// With duplicate keys the last one wins, as in nlohmann::json (and Python, and JavaScript).
bool member_text(std::string_view object, std::string_view key, std::string_view* value) {
  bool found = false;
  size_t i = 1;
  auto skip_space = [&] {
    while (i < object.size() && is_space(object[i])) ++i;
  };
  while (true) {
    skip_space();
    if (i >= object.size() || object[i] != '"') return found;  // "}" of an empty object
    const size_t key_end = skip_string(object, i);
    if (key_end == npos) return found;
    const std::string_view literal = object.substr(i, key_end - i);
    i = key_end;
    skip_space();
    ++i;  // ':'
    skip_space();
    if (i >= object.size()) return found;
    const size_t value_end = skip_value(object, i);
    if (value_end == npos) return found;
    if (json_string_is(literal, key)) {
      *value = object.substr(i, value_end - i);
      found = true;
    }
    i = value_end;
    skip_space();
    if (i >= object.size() || object[i] != ',') return found;
    ++i;
  }
}

// One call object `{"name": ..., "arguments"|"parameters": ...}` (surrounding whitespace allowed).
bool parse_call(std::string_view text, ParsedToolCall* call) {
  const std::string_view t = trim_space(text);
  if (t.empty() || t.front() != '{') return false;
  // Nested too deep to dump or copy safely: text, not a call (common/json_nesting.hpp).
  if (!json_nesting_within(t)) return false;
  try {
    const auto j = nlohmann::json::parse(t.begin(), t.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) return false;
    const auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
    const char* key = j.contains("arguments") ? "arguments" : "parameters";
    const auto args = j.find(key);
    if (args == j.end()) return false;
    std::string arguments;
    if (args->is_object()) {
      std::string_view raw;
      if (!member_text(t, key, &raw)) return false;
      arguments = raw;
    } else if (args->is_string()) {
      // Arguments written as a JSON string: the string's value, when that is a JSON object.
      const std::string& inner = args->get_ref<const std::string&>();
      const auto parsed = nlohmann::json::parse(inner, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object()) return false;
      arguments = inner;
    } else {
      return false;
    }
    call->name = name->get<std::string>();
    call->arguments = std::move(arguments);
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// LLAMA3_JSON: the whole body as calls; false (calls untouched) when it is not only calls.
// *looks_like_call tells whether a failure counts: the text started with '{'.
bool parse_llama_calls(std::string_view body, std::vector<ParsedToolCall>* calls, bool* looks_like_call) {
  std::string_view t = trim_space(body);
  if (t.starts_with(kPythonTag)) t = trim_space(t.substr(kPythonTag.size()));
  *looks_like_call = !t.empty() && t.front() == '{';
  if (!*looks_like_call) return false;
  std::vector<ParsedToolCall> found;
  size_t i = 0;
  while (true) {
    if (t[i] != '{') return false;
    const size_t end = skip_bracketed(t, i);
    if (end == npos) return false;
    ParsedToolCall call;
    if (!parse_call(t.substr(i, end - i), &call)) return false;
    found.push_back(std::move(call));
    i = end;
    while (i < t.size() && is_space(t[i])) ++i;
    if (i == t.size()) break;
    if (t[i] != ';') return false;
    ++i;
    while (i < t.size() && is_space(t[i])) ++i;
    if (i == t.size()) break;  // a trailing ';'
  }
  *calls = std::move(found);
  return true;
}

// Splits off the reasoning (see the header for the rules). *body is the text left for tools.
std::optional<std::string> split_reasoning(std::string_view text, ReasoningStart start,
                                           std::string_view* body) {
  std::string_view reasoning;
  if (start == ReasoningStart::IN_REASONING) {
    const size_t close = text.find(kThinkClose);
    reasoning = text.substr(0, close);
    *body = close == npos ? std::string_view() : lstrip_newlines(text.substr(close + kThinkClose.size()));
  } else {
    const size_t first = first_non_space(text);
    if (first != npos && text.substr(first).starts_with(kThinkOpen)) {
      const std::string_view inside = text.substr(first + kThinkOpen.size());
      const size_t close = inside.find(kThinkClose);
      reasoning = inside.substr(0, close);
      // Unterminated (cut off while thinking): all of it is reasoning, the content is empty.
      *body = close == npos ? std::string_view() : lstrip_newlines(inside.substr(close + kThinkClose.size()));
    } else {
      const size_t close = text.find(kThinkClose);
      if (close == npos) {
        *body = text;
        return std::nullopt;
      }
      reasoning = text.substr(0, close);
      *body = lstrip_newlines(text.substr(close + kThinkClose.size()));
    }
  }
  reasoning = strip_newlines(reasoning);
  if (reasoning.empty()) return std::nullopt;
  return std::string(reasoning);
}

// HERMES over the text after the reasoning.
void parse_hermes(std::string_view body, ParsedAssistant* out) {
  // Split into segments of text (failed blocks included) separated by parsed calls.
  std::vector<std::string> segments(1);
  std::vector<ParsedToolCall> calls;
  size_t pos = 0;
  while (true) {
    const size_t open = body.find(kToolCallOpen, pos);
    if (open == npos) {
      segments.back().append(body.substr(pos));
      break;
    }
    segments.back().append(body.substr(pos, open - pos));
    const size_t close = body.find(kToolCallClose, open + kToolCallOpen.size());
    if (close == npos) {  // cut off inside a call
      segments.back().append(body.substr(open));
      ++out->parse_failures;
      break;
    }
    const size_t end = close + kToolCallClose.size();
    ParsedToolCall call;
    if (parse_call(body.substr(open + kToolCallOpen.size(), close - open - kToolCallOpen.size()), &call)) {
      calls.push_back(std::move(call));
      segments.emplace_back();
    } else {
      segments.back().append(body.substr(open, end - open));
      ++out->parse_failures;
    }
    pos = end;
  }
  if (calls.empty()) {
    out->content = std::move(segments.front());
    return;
  }
  std::string content(rtrim_space(segments.front()));
  for (size_t i = 1; i < segments.size(); ++i)
    if (!all_space(segments[i])) content += segments[i];
  if (!content.empty()) out->content = std::move(content);
  out->tool_calls = std::move(calls);
}

template <class Json>
std::string content_text(const Json& content) {
  if (content.is_string()) return content.template get<std::string>();
  if (!content.is_array()) return "";
  std::string text;
  for (const auto& part : content) {
    if (part.is_string()) {
      text += part.template get_ref<const std::string&>();
    } else if (part.is_object()) {
      const auto it = part.find("text");
      if (it != part.end() && it->is_string()) text += it->template get_ref<const std::string&>();
    }
  }
  return text;
}

}  // namespace

bool parse_tool_call_format(const std::string& name, ToolCallFormat* out) {
  if (name == "none") {
    *out = ToolCallFormat::NONE;
  } else if (name == "hermes") {
    *out = ToolCallFormat::HERMES;
  } else if (name == "llama3_json") {
    *out = ToolCallFormat::LLAMA3_JSON;
  } else {
    return false;
  }
  return true;
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::NONE:
      return "none";
    case ToolCallFormat::HERMES:
      return "hermes";
    case ToolCallFormat::LLAMA3_JSON:
      return "llama3_json";
  }
  return "none";
}

ToolCallFormat detect_tool_call_format(std::string_view chat_template) {
  if (chat_template.find(kToolCallOpen) != npos) return ToolCallFormat::HERMES;
  // Llama 3.1+ renders earlier calls as {"name": ..., "parameters": ...} and built-in tool
  // calls after <|python_tag|>; Llama 3.0 has the headers but neither.
  if (chat_template.find("<|start_header_id|>") != npos &&
      (chat_template.find(kPythonTag) != npos || chat_template.find("\"parameters\"") != npos))
    return ToolCallFormat::LLAMA3_JSON;
  return ToolCallFormat::NONE;
}

namespace {

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_space_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

ToolArgumentsForm detect_tool_arguments_form(std::string_view chat_template) {
  const std::string_view t = chat_template;
  static constexpr std::string_view kName = "arguments";
  bool joined = false, type_tested = false;
  for (size_t at = t.find(kName); at != npos; at = t.find(kName, at + 1)) {
    // A reference to the value: `x.arguments` or `x['arguments']` / `x["arguments"]`, not text
    // inside a string literal such as '", "arguments": '.
    size_t end = at + kName.size();
    if (at >= 1 && t[at - 1] == '.') {
      if (end < t.size() && is_word_char(t[end])) continue;
    } else if (at >= 2 && (t[at - 1] == '\'' || t[at - 1] == '"') && t[at - 2] == '[' && end + 1 < t.size() &&
               t[end] == t[at - 1] && t[end + 1] == ']') {
      end += 2;
    } else {
      continue;
    }
    size_t after = end;
    while (after < t.size() && is_space_char(t[after])) ++after;
    if (after < t.size() && (t[after] == '+' || t[after] == '~')) joined = true;
    if (t.substr(after).starts_with("is")) {
      size_t p = after + 2;
      while (p < t.size() && is_space_char(t[p])) ++p;
      if (t.substr(p).starts_with("not")) {
        p += 3;
        while (p < t.size() && is_space_char(t[p])) ++p;
      }
      if (t.substr(p).starts_with("string") || t.substr(p).starts_with("mapping")) type_tested = true;
    }
    // Back over the expression the reference ends (`tool['function']`), then to an operator.
    size_t before = at;
    while (before > 0 &&
           (is_word_char(t[before - 1]) || std::string_view(".[]'\"").find(t[before - 1]) != npos))
      --before;
    while (before > 0 && is_space_char(t[before - 1])) --before;
    if (before > 0 && (t[before - 1] == '+' || t[before - 1] == '~')) joined = true;
  }
  return joined && !type_tested ? ToolArgumentsForm::STRING : ToolArgumentsForm::OBJECT;
}

void normalize_tool_calls(nlohmann::ordered_json& messages, ToolArgumentsForm form) {
  using ojson = nlohmann::ordered_json;
  static constexpr int kMaxArgumentsDepth = 64;
  if (!messages.is_array()) return;
  for (auto& m : messages) {
    if (!m.is_object()) continue;
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string() || *role != "assistant") continue;
    const auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    if (calls->empty()) {
      m.erase(calls);
      continue;
    }
    if (form != ToolArgumentsForm::OBJECT) continue;
    for (auto& call : *calls) {
      if (!call.is_object()) continue;
      const auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) continue;
      const auto args = fn->find("arguments");
      if (args == fn->end() || args->is_null() ||
          (args->is_string() && args->get_ref<const std::string&>().empty())) {
        (*fn)["arguments"] = ojson::object();
        continue;
      }
      if (!args->is_string()) continue;
      const std::string& text = args->get_ref<const std::string&>();
      if (!json_nesting_within(text, kMaxArgumentsDepth)) continue;
      ojson parsed = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object()) *args = std::move(parsed);
    }
  }
}

bool parse_reasoning_format(const std::string& name, ReasoningFormat* out) {
  if (name == "none") {
    *out = ReasoningFormat::NONE;
  } else if (name == "think") {
    *out = ReasoningFormat::THINK;
  } else {
    return false;
  }
  return true;
}

const char* reasoning_format_name(ReasoningFormat format) {
  return format == ReasoningFormat::THINK ? "think" : "none";
}

ReasoningFormat detect_reasoning_format(std::string_view chat_template) {
  // "</think>" contains "think>" but not "<think>": check both.
  if (chat_template.find(kThinkOpen) != npos || chat_template.find(kThinkClose) != npos)
    return ReasoningFormat::THINK;
  return ReasoningFormat::NONE;
}

ReasoningStart reasoning_start_from_prompt(std::string_view prompt) {
  const std::string_view tail = rtrim_space(prompt);
  if (tail.ends_with(kThinkClose)) return ReasoningStart::AFTER_REASONING;
  if (tail.ends_with(kThinkOpen)) return ReasoningStart::IN_REASONING;
  return ReasoningStart::AUTO;
}

ParsedAssistant parse_assistant_output(std::string_view text, ToolCallFormat tools, ReasoningFormat reasoning,
                                       bool parallel_tool_calls, ReasoningStart start) {
  ParsedAssistant out;
  std::string_view body = text;
  if (reasoning == ReasoningFormat::THINK && start != ReasoningStart::AFTER_REASONING)
    out.reasoning = split_reasoning(text, start, &body);

  switch (tools) {
    case ToolCallFormat::NONE:
      out.content = std::string(body);
      break;
    case ToolCallFormat::HERMES:
      parse_hermes(body, &out);
      break;
    case ToolCallFormat::LLAMA3_JSON: {
      bool looks_like_call = false;
      if (!parse_llama_calls(body, &out.tool_calls, &looks_like_call)) {
        out.content = std::string(body);
        if (looks_like_call) ++out.parse_failures;
      }
      break;
    }
  }
  if (!parallel_tool_calls && out.tool_calls.size() > 1) out.tool_calls.resize(1);
  return out;
}

// --- StreamingAssistantParser ------------------------------------------------------------------
// Three stages, each holding back only what the next text may still change:
//   reasoning split (phase_) → tool-call blocks (tool_phase_) → content whitespace (HERMES).

StreamingAssistantParser::StreamingAssistantParser(ToolCallFormat tools, ReasoningFormat reasoning,
                                                   bool parallel_tool_calls, ReasoningStart start)
    : tools_(tools), parallel_tool_calls_(parallel_tool_calls) {
  if (reasoning == ReasoningFormat::THINK && start == ReasoningStart::AUTO) phase_ = Phase::START;
  if (reasoning == ReasoningFormat::THINK && start == ReasoningStart::IN_REASONING) phase_ = Phase::REASONING;
  if (tools_ == ToolCallFormat::LLAMA3_JSON) tool_phase_ = ToolPhase::LLAMA_START;
}

std::vector<StreamEvent> StreamingAssistantParser::feed(std::string_view delta) {
  if (finished_ || delta.empty()) return {};
  feed_reasoning(delta);
  return take();
}

std::vector<StreamEvent> StreamingAssistantParser::finish() {
  if (finished_) return {};
  finished_ = true;
  switch (phase_) {
    case Phase::START:
    case Phase::IMPLICIT: {  // no "</think>" came: all of it is content
      std::string text = std::move(held_);
      held_.clear();
      enter_body(text, false);
      break;
    }
    case Phase::REASONING:  // cut off while thinking
      emit_reasoning(rstrip_newlines(held_));
      held_.clear();
      break;
    case Phase::BODY:
      break;
  }
  switch (tool_phase_) {
    case ToolPhase::TEXT:
      content_piece(tool_buf_);
      break;
    case ToolPhase::BLOCK:  // an unclosed call
      ++parse_failures_;
      content_piece(tool_buf_);
      break;
    case ToolPhase::LLAMA_START:
    case ToolPhase::LLAMA_PASS:
      emit(StreamEvent::CONTENT, tool_buf_);
      break;
    case ToolPhase::LLAMA_HOLD: {
      std::vector<ParsedToolCall> calls;
      bool looks_like_call = false;
      if (parse_llama_calls(tool_buf_, &calls, &looks_like_call)) {
        for (auto& call : calls) tool_call(std::move(call));
      } else {
        if (looks_like_call) ++parse_failures_;
        emit(StreamEvent::CONTENT, tool_buf_);
      }
      break;
    }
  }
  tool_buf_.clear();
  // Whitespace before the end: kept only when no call came (then nothing was trimmed).
  if (calls_seen_ == 0) emit(StreamEvent::CONTENT, pending_space_);
  pending_space_.clear();
  return take();
}

void StreamingAssistantParser::feed_reasoning(std::string_view delta) {
  switch (phase_) {
    case Phase::BODY:
      feed_body(delta);
      return;
    case Phase::REASONING:
      feed_reasoning_text(delta);
      return;
    case Phase::IMPLICIT:
      held_.append(delta);
      scan_implicit();
      return;
    case Phase::START: {
      held_.append(delta);
      const size_t first = first_non_space(held_);
      if (first == npos) return;
      const std::string_view rest = std::string_view(held_).substr(first);
      if (rest.size() < kThinkOpen.size() && kThinkOpen.starts_with(rest)) return;  // may become "<think>"
      if (rest.starts_with(kThinkOpen)) {
        const std::string after(rest.substr(kThinkOpen.size()));
        held_.clear();
        phase_ = Phase::REASONING;
        feed_reasoning_text(after);
        return;
      }
      phase_ = Phase::IMPLICIT;
      implicit_searched_ = 0;
      scan_implicit();
      return;
    }
  }
}

// IMPLICIT: everything so far is reasoning if a "</think>" comes, content if none does.
void StreamingAssistantParser::scan_implicit() {
  const size_t close = held_.find(kThinkClose, implicit_searched_);
  if (close == npos) {
    implicit_searched_ = held_.size() > kThinkClose.size() ? held_.size() - kThinkClose.size() : 0;
    return;
  }
  emit_reasoning(strip_newlines(std::string_view(held_).substr(0, close)));
  const std::string rest = held_.substr(close + kThinkClose.size());
  held_.clear();
  enter_body(rest, true);
}

// REASONING: held_ is only the tail that may still turn into "</think>" ('\n' run included,
// since trailing newlines before "</think>" are stripped).
void StreamingAssistantParser::feed_reasoning_text(std::string_view delta) {
  held_.append(delta);
  const size_t close = held_.find(kThinkClose);
  if (close != npos) {
    emit_reasoning(rstrip_newlines(std::string_view(held_).substr(0, close)));
    const std::string rest = held_.substr(close + kThinkClose.size());
    held_.clear();
    enter_body(rest, true);
    return;
  }
  size_t keep_from = held_.size() - partial_tag_length(held_, kThinkClose);
  while (keep_from > 0 && held_[keep_from - 1] == '\n') --keep_from;
  emit_reasoning(std::string_view(held_).substr(0, keep_from));
  held_.erase(0, keep_from);
}

void StreamingAssistantParser::emit_reasoning(std::string_view text) {
  if (!reasoning_started_) text = lstrip_newlines(text);
  if (text.empty()) return;
  reasoning_started_ = true;
  emit(StreamEvent::REASONING, text);
}

void StreamingAssistantParser::enter_body(std::string_view rest, bool strip_newlines) {
  phase_ = Phase::BODY;
  strip_body_newlines_ = strip_newlines;
  feed_body(rest);
}

void StreamingAssistantParser::feed_body(std::string_view delta) {
  if (strip_body_newlines_) {
    delta = lstrip_newlines(delta);
    if (delta.empty()) return;
    strip_body_newlines_ = false;
  }
  switch (tools_) {
    case ToolCallFormat::NONE:
      emit(StreamEvent::CONTENT, delta);
      break;
    case ToolCallFormat::HERMES:
      feed_hermes(delta);
      break;
    case ToolCallFormat::LLAMA3_JSON:
      feed_llama(delta);
      break;
  }
}

void StreamingAssistantParser::feed_hermes(std::string_view delta) {
  tool_buf_.append(delta);
  while (true) {
    if (tool_phase_ == ToolPhase::TEXT) {
      const size_t open = tool_buf_.find(kToolCallOpen);
      if (open == npos) {
        const size_t keep = partial_tag_length(tool_buf_, kToolCallOpen);
        content_piece(std::string_view(tool_buf_).substr(0, tool_buf_.size() - keep));
        tool_buf_.erase(0, tool_buf_.size() - keep);
        return;
      }
      content_piece(std::string_view(tool_buf_).substr(0, open));
      tool_buf_.erase(0, open);
      tool_phase_ = ToolPhase::BLOCK;
      block_searched_ = kToolCallOpen.size();
    }
    // BLOCK: tool_buf_ starts with "<tool_call>".
    const size_t close = tool_buf_.find(kToolCallClose, block_searched_);
    if (close == npos) {
      block_searched_ = std::max(kToolCallOpen.size(),
                                 tool_buf_.size() - std::min(tool_buf_.size(), kToolCallClose.size()));
      return;
    }
    const size_t end = close + kToolCallClose.size();
    ParsedToolCall call;
    if (parse_call(std::string_view(tool_buf_).substr(kToolCallOpen.size(), close - kToolCallOpen.size()),
                   &call)) {
      tool_call(std::move(call));
    } else {
      ++parse_failures_;
      content_piece(std::string_view(tool_buf_).substr(0, end));
    }
    tool_buf_.erase(0, end);
    tool_phase_ = ToolPhase::TEXT;
  }
}

// LLAMA3_JSON: the calls are the whole output, so output that starts like one is held to the end.
void StreamingAssistantParser::feed_llama(std::string_view delta) {
  if (tool_phase_ == ToolPhase::LLAMA_PASS) {
    emit(StreamEvent::CONTENT, delta);
    return;
  }
  tool_buf_.append(delta);
  if (tool_phase_ == ToolPhase::LLAMA_HOLD) return;
  const size_t first = first_non_space(tool_buf_);
  if (first == npos) return;
  const std::string_view rest = std::string_view(tool_buf_).substr(first);
  if (rest.front() == '{' || rest.starts_with(kPythonTag)) {
    tool_phase_ = ToolPhase::LLAMA_HOLD;
    return;
  }
  if (rest.size() < kPythonTag.size() && kPythonTag.starts_with(rest)) return;
  tool_phase_ = ToolPhase::LLAMA_PASS;
  emit(StreamEvent::CONTENT, tool_buf_);
  tool_buf_.clear();
}

// HERMES content: text before the first call is right-trimmed, so trailing whitespace waits
// for the next non-whitespace; after a call, a segment is held while it is whitespace only.
void StreamingAssistantParser::content_piece(std::string_view text) {
  if (text.empty()) return;
  if (calls_seen_ == 0) {
    const std::string_view kept = rtrim_space(text);
    if (kept.empty()) {
      pending_space_.append(text);
      return;
    }
    emit(StreamEvent::CONTENT, pending_space_);
    emit(StreamEvent::CONTENT, kept);
    pending_space_.assign(text.substr(kept.size()));
    return;
  }
  if (segment_has_text_) {
    emit(StreamEvent::CONTENT, text);
    return;
  }
  pending_space_.append(text);
  if (all_space(text)) return;
  segment_has_text_ = true;
  emit(StreamEvent::CONTENT, pending_space_);
  pending_space_.clear();
}

void StreamingAssistantParser::tool_call(ParsedToolCall call) {
  ++calls_seen_;
  pending_space_.clear();  // trailing whitespace before a call, or a whitespace-only segment
  segment_has_text_ = false;
  if (!parallel_tool_calls_ && calls_emitted_ > 0) return;
  StreamEvent start{StreamEvent::TOOL_CALL_START, "", calls_emitted_, std::move(call.name)};
  out_.push_back(std::move(start));
  StreamEvent arguments{StreamEvent::TOOL_CALL_ARGUMENTS, std::move(call.arguments), calls_emitted_, ""};
  out_.push_back(std::move(arguments));
  ++calls_emitted_;
}

void StreamingAssistantParser::emit(StreamEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out_.empty() && out_.back().kind == kind) {
    out_.back().text.append(text);
    return;
  }
  StreamEvent event;
  event.kind = kind;
  event.text = std::string(text);
  out_.push_back(std::move(event));
}

std::vector<StreamEvent> StreamingAssistantParser::take() {
  std::vector<StreamEvent> events = std::move(out_);
  out_.clear();
  return events;
}

std::string message_content_text(const nlohmann::json& content) { return content_text(content); }

std::string message_content_text(const nlohmann::ordered_json& content) { return content_text(content); }

}  // namespace swarm
