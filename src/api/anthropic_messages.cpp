// The Anthropic Messages API (POST /v1/messages) as a chat dialect (chat_dialect.hpp).
#include <array>
#include <atomic>
#include <cstdio>
#include <random>
#include <set>

#include "api/chat_dialect.hpp"
#include "common/random_id.hpp"
#include "http/json_body.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

using dialect_detail::bad;
using dialect_detail::blank;

// The text of a content that is a string or a list of blocks; only text blocks are allowed
// (`where` names the field in errors).
std::string text_of(const ojson& content, const std::string& where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad("field '" + where + "' must be a string or an array of content blocks");
  std::string out;
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& b = content[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      bad("field '" + at + "' must be a content block with a 'type'");
    const std::string type = b["type"].get<std::string>();
    if (type == "image" || type == "document")
      bad("field '" + at + "' is an " + type + " block: the models served here are text-only");
    if (type != "text") bad("field '" + at + "' has type '" + type + "' where only text blocks are allowed");
    if (!b.contains("text") || !b["text"].is_string()) bad("field '" + at + ".text' must be a string");
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

const ojson& blocks_of(const ojson& m, const std::string& where) {
  const ojson& c = m.at("content");
  if (!c.is_array()) bad("field '" + where + "' must be a string or an array of content blocks");
  return c;
}

std::string block_type(const ojson& b, const std::string& at) {
  if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
    bad("field '" + at + "' must be a content block with a 'type'");
  return b["type"].get<std::string>();
}

// `tool_uses`: the ids of the tool_use blocks of earlier assistant turns (a tool_result answers one).
void convert_user(const ojson& m, const std::string& where, const std::set<std::string>& tool_uses,
                  ojson& messages) {
  if (m["content"].is_string()) {
    messages.push_back({{"role", "user"}, {"content", m["content"].get<std::string>()}});
    return;
  }
  // Tool results first (as tool messages, in order), then the user's own text.
  std::string text;
  bool has_text = false;
  const ojson& blocks = blocks_of(m, where + ".content");
  for (size_t j = 0; j < blocks.size(); ++j) {
    const ojson& b = blocks[j];
    const std::string at = where + ".content[" + std::to_string(j) + "]";
    const std::string type = block_type(b, at);
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) bad("field '" + at + ".text' must be a string");
      if (has_text) text += "\n";
      text += b["text"].get<std::string>();
      has_text = true;
    } else if (type == "tool_result") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
        bad("field '" + at + ".tool_use_id' must be a string");
      if (!tool_uses.count(b["tool_use_id"].get<std::string>()))
        bad("field '" + at + ".tool_use_id' is '" + b["tool_use_id"].get<std::string>() +
            "', which no earlier tool_use block has as its id");
      std::string result = text_of(b.value("content", ojson("")), at + ".content");
      messages.push_back(
          {{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", std::move(result)}});
    } else if (type == "image" || type == "document") {
      bad("field '" + at + "' is an " + type + " block: the models served here are text-only");
    } else {
      bad("field '" + at + "' has type '" + type +
          "', which a user turn cannot hold here (text, tool_result)");
    }
  }
  if (has_text) messages.push_back({{"role", "user"}, {"content", std::move(text)}});
}

void convert_assistant(const ojson& m, const std::string& where, std::set<std::string>& tool_uses,
                       ojson& messages) {
  if (m["content"].is_string()) {
    messages.push_back({{"role", "assistant"}, {"content", m["content"].get<std::string>()}});
    return;
  }
  std::string text, thinking;
  ojson calls = ojson::array();
  const ojson& blocks = blocks_of(m, where + ".content");
  for (size_t j = 0; j < blocks.size(); ++j) {
    const ojson& b = blocks[j];
    const std::string at = where + ".content[" + std::to_string(j) + "]";
    const std::string type = block_type(b, at);
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) bad("field '" + at + ".text' must be a string");
      text += b["text"].get<std::string>();
    } else if (type == "thinking") {
      if (!b.contains("thinking") || !b["thinking"].is_string())
        bad("field '" + at + ".thinking' must be a string");
      thinking += b["thinking"].get<std::string>();
    } else if (type == "redacted_thinking") {
      // Nothing to render: its data is opaque.
    } else if (type == "tool_use") {
      if (!b.contains("id") || !b["id"].is_string()) bad("field '" + at + ".id' must be a string");
      tool_uses.insert(b["id"].get<std::string>());
      if (!b.contains("name") || !b["name"].is_string()) bad("field '" + at + ".name' must be a string");
      const ojson input = b.value("input", ojson::object());
      if (!input.is_object()) bad("field '" + at + ".input' must be an object");
      calls.push_back({{"id", b["id"]},
                       {"type", "function"},
                       {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
    } else {
      bad("field '" + at + "' has type '" + type +
          "', which an assistant turn cannot hold here (text, thinking, tool_use)");
    }
  }
  ojson out = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) out["reasoning_content"] = thinking;
  if (!calls.empty()) out["tool_calls"] = std::move(calls);
  messages.push_back(std::move(out));
}

// A keyed hash: two FNV-1a lanes over key || text (128 bits as hex).
const std::array<uint64_t, 2>& signing_key() {
  static const std::array<uint64_t, 2> key = [] {
    std::random_device rd;
    return std::array<uint64_t, 2>{(uint64_t{rd()} << 32) ^ rd(), (uint64_t{rd()} << 32) ^ rd()};
  }();
  return key;
}

}  // namespace

std::string thinking_signature(const std::string& thinking) {
  std::string out;
  for (uint64_t k : signing_key()) {
    uint64_t h = 0xcbf29ce484222325ull ^ k;
    for (int i = 0; i < 8; ++i) h = (h ^ ((k >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (unsigned char c : thinking) h = (h ^ c) * 0x100000001b3ull;
    h ^= h >> 31;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out += buf;
  }
  return "swarm1." + out;
}

bool thinking_signature_valid(const std::string& thinking, const std::string& signature) {
  return signature == thinking_signature(thinking);
}

ojson anthropic_to_chat(const ojson& body, std::vector<std::string>& notes, AnthropicRoute route) {
  ojson messages = ojson::array();
  if (auto it = body.find("system"); it != body.end() && !it->is_null())
    messages.push_back({{"role", "system"}, {"content", text_of(*it, "system")}});
  auto ms = body.find("messages");
  if (ms == body.end()) bad("missing required field 'messages'");
  if (!ms->is_array()) bad("field 'messages' must be an array");
  if (ms->empty()) bad("field 'messages' must hold at least one message");
  std::set<std::string> tool_uses;
  for (size_t i = 0; i < ms->size(); ++i) {
    const ojson& m = (*ms)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("field '" + where + ".role' must be a string");
    if (!m.contains("content") || m["content"].is_null())
      bad("missing required field '" + where + ".content'");
    if (!m["content"].is_string() && !m["content"].is_array())
      bad("field '" + where + ".content' must be a string or an array of content blocks");
    const std::string role = m["role"].get<std::string>();
    if (role == "user")
      convert_user(m, where, tool_uses, messages);
    else if (role == "assistant")
      convert_assistant(m, where, tool_uses, messages);
    else if (role == "system")  // not the API's, but Claude Code sends one
      messages.push_back({{"role", "system"}, {"content", text_of(m["content"], where + ".content")}});
    else
      bad("field '" + where + ".role' must be \"user\" or \"assistant\"");
  }
  ojson chat = {{"messages", std::move(messages)}};
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) bad("field 'tools' must be an array");
    ojson tools = ojson::array();
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& t = (*it)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) bad("field '" + at + "' must be an object");
      if (t.contains("type") && t["type"].is_string() && t["type"] != "custom") {
        // A server tool (web_search_*, bash_*, text_editor_*, ...): run by Anthropic, not the model's.
        notes.push_back("dropped server tool '" + t["type"].get<std::string>() + "' (" + at + ")");
        continue;
      }
      if (!t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
        bad("field '" + at + ".name' must be a non-empty string");
      ojson fn = {{"name", t["name"]}};
      if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
      const ojson schema = t.value("input_schema", ojson({{"type", "object"}}));
      if (!schema.is_object()) bad("field '" + at + ".input_schema' must be an object");
      fn["parameters"] = schema;
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      bad("field 'tool_choice' must be an object with a string 'type'");
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "auto")
      chat["tool_choice"] = "auto";
    else if (type == "any")
      chat["tool_choice"] = "required";
    else if (type == "none")
      chat["tool_choice"] = "none";
    else if (type == "tool") {
      if (!it->contains("name") || !(*it)["name"].is_string())
        bad("field 'tool_choice.name' must be a string");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*it)["name"]}}}};
    } else {
      bad("field 'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"");
    }
    if (it->contains("disable_parallel_tool_use") && (*it)["disable_parallel_tool_use"].is_boolean())
      chat["parallel_tool_calls"] = !(*it)["disable_parallel_tool_use"].get<bool>();
    if (chat.contains("tool_choice") && chat["tool_choice"] != "auto" && chat["tool_choice"] != "none" &&
        !chat.contains("tools"))
      bad("field 'tool_choice' asks for a tool call but the request offers no 'tools'");
  }
  if (route == AnthropicRoute::MESSAGES) {  // count_tokens has no max_tokens
    auto it = body.find("max_tokens");
    if (it == body.end() || it->is_null()) bad("missing required field 'max_tokens'");
    if (!it->is_number_integer() || it->get<int64_t>() < 1) bad("field 'max_tokens' must be an integer >= 1");
  }
  for (const char* key : {"max_tokens", "temperature", "top_p", "top_k", "stream"})
    if (auto it = body.find(key); it != body.end() && !it->is_null()) chat[key] = *it;
  if (auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) chat["stop"] = *it;
  if (auto it = body.find("swarm"); it != body.end()) chat["swarm"] = *it;  // swarm.agent (AT-GRPO)
  return chat;
}

namespace {

std::string sse(const char* event, const json& data) {
  return std::string("event: ") + event + "\ndata: " + dump_json(data) + "\n\n";
}

class AnthropicDialect final : public ChatDialect {
 public:
  explicit AnthropicDialect(std::string model) : model_(std::move(model)), id_("msg_" + random_hex(12)) {}

  json answer(const DialectAnswer& a) override {
    json content = json::array();
    if (a.first().parsed.reasoning)
      content.push_back({{"type", "thinking"},
                         {"thinking", *a.first().parsed.reasoning},
                         {"signature", thinking_signature(*a.first().parsed.reasoning)}});
    if (a.first().parsed.content && !blank(*a.first().parsed.content))
      content.push_back({{"type", "text"}, {"text", *a.first().parsed.content}});
    for (const auto& call : a.first().parsed.tool_calls)
      content.push_back(tool_use_json(call.name, input_of(call.arguments)));
    json m = message_json(std::move(content), stop_reason(a, !a.first().parsed.tool_calls.empty()),
                          a.first().stop_sequence.empty() ? json(nullptr) : json(a.first().stop_sequence));
    m["usage"] = usage_json(a.prompt_tokens, a.completion_tokens);
    return m;
  }

  std::string stream_start(int64_t prompt_tokens) override {
    json m = message_json(json::array(), nullptr, nullptr);
    m["usage"] = usage_json(prompt_tokens, 0);
    return sse("message_start", {{"type", "message_start"}, {"message", m}}) + keep_alive();
  }

  std::string stream_events(size_t, const std::vector<StreamEvent>& events) override {
    std::string out;
    for (const StreamEvent& e : events) {
      switch (e.kind) {
        case StreamEvent::REASONING:
          if (open_ != Block::THINKING) {
            out += close_block();
            out += open_block(Block::THINKING, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
          }
          thinking_ += e.text;
          out += delta({{"type", "thinking_delta"}, {"thinking", e.text}});
          break;
        case StreamEvent::CONTENT:
          // Whitespace between blocks (after </think>, before a tool call) opens no text block.
          if (open_ != Block::TEXT) {
            pending_ws_ += e.text;
            if (blank(pending_ws_)) break;
            out += close_block();
            out += open_block(Block::TEXT, {{"type", "text"}, {"text", ""}});
            out += delta({{"type", "text_delta"}, {"text", pending_ws_}});
            pending_ws_.clear();
            break;
          }
          out += delta({{"type", "text_delta"}, {"text", e.text}});
          break;
        case StreamEvent::TOOL_CALL_START:
          out += close_block();
          pending_ws_.clear();
          called_ = true;
          out += open_block(Block::TOOL_USE, {{"type", "tool_use"},
                                              {"id", "toolu_" + random_hex(12)},
                                              {"name", e.name},
                                              {"input", json::object()}});
          break;
        case StreamEvent::TOOL_CALL_ARGUMENTS:
          out += delta({{"type", "input_json_delta"}, {"partial_json", e.text}});
          break;
      }
    }
    return out;
  }

  std::string stream_finish(const DialectAnswer& a) override {
    std::string out = stream_events(0, a.first().final_events);
    out += close_block();
    out += sse("message_delta",
               {{"type", "message_delta"},
                {"delta",
                 {{"stop_reason", stop_reason(a, called_)},
                  {"stop_sequence",
                   a.first().stop_sequence.empty() ? json(nullptr) : json(a.first().stop_sequence)}}},
                {"usage", {{"output_tokens", a.completion_tokens}}}});
    out += sse("message_stop", {{"type", "message_stop"}});
    return out;
  }

  std::string stream_error(ErrorKind kind, const std::string& message) override {
    return sse("error", anthropic_error_body(http_status_for(kind), message));
  }

  std::string keep_alive() const override { return "event: ping\ndata: {\"type\": \"ping\"}\n\n"; }
  const char* api() const override { return "anthropic_messages"; }
  ErrorStyle error_style() const override { return ErrorStyle::ANTHROPIC; }
  bool needs_a_choice() const override { return true; }

 private:
  enum class Block { NONE, THINKING, TEXT, TOOL_USE };

  static json input_of(const std::string& arguments) {
    json input = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
    return input.is_object() ? input : json::object();
  }

  static json tool_use_json(const std::string& name, json input) {
    return {
        {"type", "tool_use"}, {"id", "toolu_" + random_hex(12)}, {"name", name}, {"input", std::move(input)}};
  }

  static json usage_json(int64_t in, int64_t out) {
    return {{"input_tokens", in},
            {"output_tokens", out},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", 0}};
  }

  static const char* stop_reason(const DialectAnswer& a, bool called) {
    if (called) return "tool_use";
    if (a.first().finish_reason == "length") return "max_tokens";
    if (!a.first().stop_sequence.empty()) return "stop_sequence";
    return "end_turn";
  }

  json message_json(json content, json stop_reason, json stop_sequence) const {
    return {{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model_},
            {"content", std::move(content)},
            {"stop_reason", std::move(stop_reason)},
            {"stop_sequence", std::move(stop_sequence)}};
  }

  std::string open_block(Block kind, json block) {
    open_ = kind;
    ++index_;
    return sse("content_block_start",
               {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
  }

  std::string delta(json d) {
    return sse("content_block_delta",
               {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}});
  }

  std::string close_block() {
    if (open_ == Block::NONE) return "";
    std::string out;
    if (open_ == Block::THINKING) {
      out += delta({{"type", "signature_delta"}, {"signature", thinking_signature(thinking_)}});
      thinking_.clear();
    }
    out += sse("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    open_ = Block::NONE;
    return out;
  }

  std::string model_, id_;
  Block open_ = Block::NONE;
  int index_ = -1;
  std::string thinking_;    // the open thinking block's text (for its signature)
  std::string pending_ws_;  // whitespace held back until a text block is worth opening
  bool called_ = false;
};

}  // namespace

std::unique_ptr<ChatDialect> make_anthropic_dialect(std::string model) {
  return std::make_unique<AnthropicDialect>(std::move(model));
}

}  // namespace swarm
