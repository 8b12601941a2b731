// The OpenAI Responses API (POST /v1/responses) as a chat dialect (chat_dialect.hpp).
#include <ctime>

#include "api/chat_dialect.hpp"
#include "common/random_id.hpp"
#include "http/json_body.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

using dialect_detail::bad;
using dialect_detail::blank;

// The text of a message content: a string, or parts (input_text / output_text / text /
// refusal); images and files are refused (text-only models).
std::string parts_text(const ojson& content, const std::string& where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad("field '" + where + "' must be a string or an array of content parts");
  std::string out;
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& p = content[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (p.is_string()) {
      out += p.get<std::string>();
      continue;
    }
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      bad("field '" + at + "' must be a content part with a 'type'");
    const std::string type = p["type"].get<std::string>();
    if (type == "input_image" || type == "input_file" || type == "input_audio")
      bad("field '" + at + "' is an " + type + " part: the models served here are text-only");
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal")
      bad("field '" + at + "' has type '" + type + "' (input_text, output_text)");
    if (!p.contains(key) || !p[key].is_string()) bad("field '" + at + "." + key + "' must be a string");
    out += p[key].get<std::string>();
  }
  return out;
}

std::string string_field(const ojson& item, const char* key, const std::string& where) {
  auto it = item.find(key);
  if (it == item.end() || !it->is_string()) bad("field '" + where + "." + key + "' must be a string");
  return it->get<std::string>();
}

// Converts input items into chat messages. An assistant turn is assembled from the reasoning,
// message and function_call items that follow each other (the order the API returns them).
class InputConverter {
 public:
  void item(const ojson& it, const std::string& where) {
    if (!it.is_object()) bad("field '" + where + "' must be an object");
    std::string type = it.contains("type") && it["type"].is_string() ? it["type"].get<std::string>() : "";
    if (type.empty() && it.contains("role")) type = "message";
    if (type == "message") {
      const std::string role = string_field(it, "role", where);
      // The content of a message: a string (the API's easy input message) or content parts.
      if (!it.contains("content") || it["content"].is_null())
        bad("missing required field '" + where + ".content'");
      const std::string text = parts_text(it["content"], where + ".content");
      if (role == "assistant") {
        if (has_assistant_ && (!assistant_["tool_calls"].empty())) flush();
        start_assistant();
        assistant_["content"] = assistant_["content"].get<std::string>() + text;
        return;
      }
      flush();
      if (role == "user")
        messages_.push_back({{"role", "user"}, {"content", text}});
      else if (role == "system" || role == "developer")
        messages_.push_back({{"role", "system"}, {"content", text}});
      else
        bad("field '" + where + ".role' must be \"user\", \"assistant\", \"system\" or \"developer\"");
    } else if (type == "function_call" || type == "custom_tool_call") {
      start_assistant();
      const std::string call_id = string_field(it, "call_id", where);
      const std::string name = string_field(it, "name", where);
      // A custom (free-form) tool's input travels as {"input": "..."} (how its tool is offered).
      std::string arguments = type == "function_call"
                                  ? string_field(it, "arguments", where)
                                  : json({{"input", string_field(it, "input", where)}}).dump();
      assistant_["tool_calls"].push_back(
          {{"id", call_id},
           {"type", "function"},
           {"function", {{"name", name}, {"arguments", std::move(arguments)}}}});
    } else if (type == "function_call_output" || type == "custom_tool_call_output") {
      flush();
      const std::string call_id = string_field(it, "call_id", where);
      if (!it.contains("output") || it["output"].is_null())
        bad("missing required field '" + where + ".output'");
      messages_.push_back({{"role", "tool"},
                           {"tool_call_id", call_id},
                           {"content", parts_text(it["output"], where + ".output")}});
    } else if (type == "reasoning") {
      if (has_assistant_) flush();  // reasoning opens a new assistant turn
      // content (reasoning_text parts) is optional and may be null; summary (summary_text parts)
      // is an array, possibly empty.
      std::string text = parts_text_of_reasoning(it, "content", where);
      if (text.empty()) text = parts_text_of_reasoning(it, "summary", where);
      start_assistant();
      if (!text.empty()) assistant_["reasoning_content"] = text;
    } else if (type == "item_reference") {
      bad("field '" + where +
          "' is an item_reference: nothing is stored across requests here (send the items)");
    } else {
      bad("field '" + where + ".type' '" + type +
          "' is not supported (message, function_call, function_call_output, reasoning)");
    }
  }

  ojson finish() {
    flush();
    return std::move(messages_);
  }

 private:
  static std::string parts_text_of_reasoning(const ojson& item, const char* key, const std::string& where) {
    auto parts = item.find(key);
    if (parts == item.end() || parts->is_null()) return "";
    if (!parts->is_array()) bad("field '" + where + "." + key + "' must be an array of parts");
    std::string out;
    for (size_t j = 0; j < parts->size(); ++j) {
      const ojson& p = (*parts)[j];
      if (!p.is_object() || !p.contains("text") || !p["text"].is_string())
        bad("field '" + where + "." + key + "[" + std::to_string(j) + "].text' must be a string");
      if (!out.empty()) out += "\n\n";
      out += p["text"].get<std::string>();
    }
    return out;
  }
  void start_assistant() {
    if (has_assistant_) return;
    assistant_ = {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array()}};
    has_assistant_ = true;
  }
  void flush() {
    if (!has_assistant_) return;
    if (assistant_["tool_calls"].empty()) assistant_.erase("tool_calls");
    messages_.push_back(std::move(assistant_));
    has_assistant_ = false;
  }
  ojson messages_ = ojson::array();
  ojson assistant_;
  bool has_assistant_ = false;
};

void add_function_tool(const ojson& t, const std::string& at, ojson& tools) {
  if (!t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
    bad("field '" + at + ".name' must be a non-empty string");
  ojson fn = {{"name", t["name"]}};
  if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
  const ojson params =
      t.contains("parameters") && !t["parameters"].is_null() ? t["parameters"] : ojson({{"type", "object"}});
  if (!params.is_object()) bad("field '" + at + ".parameters' must be an object");
  fn["parameters"] = params;
  tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
}

}  // namespace

ojson responses_to_chat(const ojson& body, std::vector<std::string>& notes) {
  if (auto it = body.find("previous_response_id"); it != body.end() && !it->is_null())
    bad("field 'previous_response_id' is not supported: nothing is stored across requests here; send the "
        "whole "
        "conversation in 'input' (store: false)");
  if (auto it = body.find("conversation"); it != body.end() && !it->is_null())
    bad("field 'conversation' is not supported: send the whole conversation in 'input'");
  ojson messages = ojson::array();
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) bad("field 'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", *it}});
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) bad("missing required field 'input'");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    if (input->empty()) bad("field 'input' must hold at least one item");
    InputConverter conv;
    for (size_t i = 0; i < input->size(); ++i) conv.item((*input)[i], "input[" + std::to_string(i) + "]");
    for (auto& m : conv.finish()) messages.push_back(std::move(m));
  } else {
    bad("field 'input' must be a string or an array of items");
  }
  ojson chat = {{"messages", std::move(messages)}};
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) bad("field 'tools' must be an array");
    ojson tools = ojson::array();
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& t = (*it)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
        bad("field '" + at + "' must be an object with a string 'type'");
      const std::string type = t["type"].get<std::string>();
      if (type == "function") {
        add_function_tool(t, at, tools);
      } else if (type == "namespace") {  // a group of functions: flattened into them
        const ojson inner = t.value("tools", ojson::array());
        if (!inner.is_array()) bad("field '" + at + ".tools' must be an array");
        for (size_t j = 0; j < inner.size(); ++j) {
          const std::string at2 = at + ".tools[" + std::to_string(j) + "]";
          if (inner[j].is_object() && inner[j].value("type", std::string("function")) == "function")
            add_function_tool(inner[j], at2, tools);
          else
            notes.push_back("dropped tool " + at2 + " (only functions are served)");
        }
      } else if (type == "custom") {  // free-form input: offered as a function of one string
        if (!t.contains("name") || !t["name"].is_string()) bad("field '" + at + ".name' must be a string");
        ojson fn = {{"name", t["name"]},
                    {"parameters",
                     {{"type", "object"},
                      {"properties", {{"input", {{"type", "string"}}}}},
                      {"required", {"input"}}}}};
        if (t.contains("description") && t["description"].is_string()) fn["description"] = t["description"];
        tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
      } else {
        notes.push_back("dropped built-in tool '" + type + "' (" + at + "): only function tools are served");
      }
    }
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      chat["tool_choice"] = *it;
    } else if (it->is_object() && it->contains("type") && (*it)["type"] == "function") {
      if (!it->contains("name") || !(*it)["name"].is_string())
        bad("field 'tool_choice.name' must be a string");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*it)["name"]}}}};
    } else {
      bad("field 'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
          "\"name\": ...}");
    }
    if (chat["tool_choice"] != "auto" && chat["tool_choice"] != "none" && !chat.contains("tools"))
      bad("field 'tool_choice' asks for a tool call but the request offers no function 'tools'");
  }
  if (auto it = body.find("max_output_tokens"); it != body.end() && !it->is_null()) chat["max_tokens"] = *it;
  for (const char* key : {"temperature", "top_p", "parallel_tool_calls", "stream", "swarm"})
    if (auto it = body.find(key); it != body.end() && !it->is_null()) chat[key] = *it;
  if (const auto text = body.find("text");
      text != body.end() && text->is_object() && text->contains("format")) {
    const ojson& f = (*text)["format"];
    if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
      bad("field 'text.format' must be an object with a string 'type'");
    if (f["type"] == "json_schema") {
      ojson js = {{"name", f.value("name", std::string("output"))},
                  {"schema", f.value("schema", ojson::object())}};
      if (f.contains("strict")) js["strict"] = f["strict"];
      chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
    } else if (f["type"] == "json_object") {
      chat["response_format"] = {{"type", "json_object"}};
    } else if (f["type"] != "text") {
      bad("field 'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  return chat;
}

namespace {

class ResponsesDialect final : public ChatDialect {
 public:
  ResponsesDialect(std::string model, const ojson& request, std::vector<std::string> notes)
      : model_(std::move(model)),
        id_("resp_" + random_hex(12)),
        created_(std::time(nullptr)),
        notes_(std::move(notes)) {
    for (const char* key : {"instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature",
                            "top_p", "max_output_tokens", "metadata", "store", "text", "reasoning"})
      if (auto it = request.find(key); it != request.end()) echo_[key] = json::parse(it->dump());
  }

  json answer(const DialectAnswer& a) override {
    json output = json::array();
    if (a.first().parsed.reasoning) output.push_back(reasoning_item(*a.first().parsed.reasoning));
    if (a.first().parsed.content && !blank(*a.first().parsed.content))
      output.push_back(message_item(*a.first().parsed.content, "completed"));
    for (const auto& call : a.first().parsed.tool_calls)
      output.push_back(call_item("call_" + random_hex(12), call.name, call.arguments, "completed"));
    return response_json(final_status(a), std::move(output), &a);
  }

  std::string stream_start(int64_t prompt_tokens) override {
    (void)prompt_tokens;
    json r = response_json("in_progress", json::array(), nullptr);
    std::string out = event("response.created", {{"response", r}});  // in this order: sequence numbers
    out += event("response.in_progress", {{"response", r}});
    return out;
  }

  std::string stream_events(size_t, const std::vector<StreamEvent>& events) override {
    std::string out;
    for (const StreamEvent& e : events) {
      switch (e.kind) {
        case StreamEvent::REASONING:
          if (open_ != Item::REASONING) {
            out += close_item();
            out += open_item(Item::REASONING, reasoning_item(""));
            out += event("response.reasoning_summary_part.added",
                         {{"item_id", item_id()},
                          {"output_index", index_},
                          {"summary_index", 0},
                          {"part", {{"type", "summary_text"}, {"text", ""}}}});
          }
          text_ += e.text;
          out += event(
              "response.reasoning_summary_text.delta",
              {{"item_id", item_id()}, {"output_index", index_}, {"summary_index", 0}, {"delta", e.text}});
          break;
        case StreamEvent::CONTENT:
          if (open_ != Item::MESSAGE) {
            pending_ws_ += e.text;
            if (blank(pending_ws_)) break;
            out += close_item();
            out += open_item(Item::MESSAGE, message_item("", "in_progress"));
            out += event("response.content_part.added", {{"item_id", item_id()},
                                                         {"output_index", index_},
                                                         {"content_index", 0},
                                                         {"part", text_part("")}});
            out += text_delta(pending_ws_);
            pending_ws_.clear();
            break;
          }
          out += text_delta(e.text);
          break;
        case StreamEvent::TOOL_CALL_START:
          out += close_item();
          pending_ws_.clear();
          out += open_item(Item::CALL, call_item("call_" + random_hex(12), e.name, "", "in_progress"));
          break;
        case StreamEvent::TOOL_CALL_ARGUMENTS:
          text_ += e.text;
          out += event("response.function_call_arguments.delta",
                       {{"item_id", item_id()}, {"output_index", index_}, {"delta", e.text}});
          break;
      }
    }
    return out;
  }

  std::string stream_finish(const DialectAnswer& a) override {
    std::string out = stream_events(0, a.first().final_events);
    out += close_item();
    const std::string status = final_status(a);
    json r = response_json(status, output_, &a);
    out += event(status == "completed" ? "response.completed" : "response.incomplete",
                 {{"response", std::move(r)}});
    return out;
  }

  std::string stream_error(ErrorKind kind, const std::string& message) override {
    json r = response_json("failed", output_, nullptr);
    r["error"] = {{"code", kind == ErrorKind::UNAVAILABLE ? "server_is_overloaded" : "server_error"},
                  {"message", message}};
    std::string out =
        event("error", {{"code", error_type_for(kind)}, {"message", message}, {"param", nullptr}});
    out += event("response.failed", {{"response", std::move(r)}});
    return out;
  }

  const char* api() const override { return "responses"; }
  bool needs_a_choice() const override { return true; }

 private:
  enum class Item { NONE, REASONING, MESSAGE, CALL };

  static json text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
  }

  static std::string final_status(const DialectAnswer& a) {
    return a.first().finish_reason == "length" && a.first().parsed.tool_calls.empty() ? "incomplete"
                                                                                      : "completed";
  }

  json reasoning_item(const std::string& text) const {
    json summary = json::array();
    if (!text.empty()) summary.push_back({{"type", "summary_text"}, {"text", text}});
    return {{"id", "rs_" + random_hex(12)},
            {"type", "reasoning"},
            {"summary", std::move(summary)},
            {"encrypted_content", nullptr}};
  }
  json message_item(const std::string& text, const char* status) const {
    json content = json::array();
    if (std::string(status) == "completed") content.push_back(text_part(text));
    return {{"id", "msg_" + random_hex(12)},
            {"type", "message"},
            {"status", status},
            {"role", "assistant"},
            {"content", std::move(content)}};
  }
  json call_item(const std::string& call_id, const std::string& name, const std::string& arguments,
                 const char* status) const {
    return {{"id", "fc_" + random_hex(12)},
            {"type", "function_call"},
            {"status", status},
            {"call_id", call_id},
            {"name", name},
            {"arguments", arguments}};
  }

  json response_json(const std::string& status, json output, const DialectAnswer* a) const {
    json r = {{"id", id_},
              {"object", "response"},
              {"created_at", created_},
              {"status", status},
              {"error", nullptr},
              {"incomplete_details",
               status == "incomplete" ? json({{"reason", "max_output_tokens"}}) : json(nullptr)},
              {"model", model_},
              {"output", std::move(output)},
              {"previous_response_id", nullptr},
              {"usage", nullptr}};
    for (auto it = echo_.begin(); it != echo_.end(); ++it) r[it.key()] = it.value();
    if (!r.contains("tools")) r["tools"] = json::array();
    if (!r.contains("parallel_tool_calls")) r["parallel_tool_calls"] = true;
    if (!r.contains("tool_choice")) r["tool_choice"] = "auto";
    r["store"] = false;
    if (a) {
      r["usage"] = {{"input_tokens", a->prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", 0}}},
                    {"output_tokens", a->completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", 0}}},
                    {"total_tokens", a->prompt_tokens + a->completion_tokens}};
    }
    if (!notes_.empty()) r["swarm_notes"] = notes_;
    return r;
  }

  std::string event(const char* type, json data) {
    data["type"] = type;
    data["sequence_number"] = sequence_++;
    return std::string("event: ") + type + "\ndata: " + dump_json(data) + "\n\n";
  }

  std::string item_id() const { return current_["id"].get<std::string>(); }

  std::string text_delta(const std::string& delta) {
    text_ += delta;
    return event("response.output_text.delta",
                 {{"item_id", item_id()}, {"output_index", index_}, {"content_index", 0}, {"delta", delta}});
  }

  std::string open_item(Item kind, json item) {
    open_ = kind;
    ++index_;
    current_ = std::move(item);
    text_.clear();
    return event("response.output_item.added", {{"output_index", index_}, {"item", current_}});
  }

  std::string close_item() {
    if (open_ == Item::NONE) return "";
    std::string out;
    const std::string id = item_id();
    if (open_ == Item::REASONING) {
      out += event("response.reasoning_summary_text.done",
                   {{"item_id", id}, {"output_index", index_}, {"summary_index", 0}, {"text", text_}});
      out += event("response.reasoning_summary_part.done",
                   {{"item_id", id},
                    {"output_index", index_},
                    {"summary_index", 0},
                    {"part", {{"type", "summary_text"}, {"text", text_}}}});
      current_["summary"] = json::array({{{"type", "summary_text"}, {"text", text_}}});
    } else if (open_ == Item::MESSAGE) {
      out += event("response.output_text.done",
                   {{"item_id", id}, {"output_index", index_}, {"content_index", 0}, {"text", text_}});
      out += event(
          "response.content_part.done",
          {{"item_id", id}, {"output_index", index_}, {"content_index", 0}, {"part", text_part(text_)}});
      current_["content"] = json::array({text_part(text_)});
      current_["status"] = "completed";
    } else {
      out += event("response.function_call_arguments.done",
                   {{"item_id", id}, {"output_index", index_}, {"arguments", text_}});
      current_["arguments"] = text_;
      current_["status"] = "completed";
    }
    out += event("response.output_item.done", {{"output_index", index_}, {"item", current_}});
    output_.push_back(std::move(current_));
    current_ = json();
    open_ = Item::NONE;
    return out;
  }

  std::string model_, id_;
  int64_t created_;
  std::vector<std::string> notes_;
  json echo_ = json::object();
  int64_t sequence_ = 0;
  Item open_ = Item::NONE;
  int index_ = -1;
  json current_;      // the open item
  std::string text_;  // its text so far (summary, output text or arguments)
  std::string pending_ws_;
  json output_ = json::array();  // closed items
};

}  // namespace

std::unique_ptr<ChatDialect> make_responses_dialect(std::string model, const ojson& request,
                                                    std::vector<std::string> notes) {
  return std::make_unique<ResponsesDialect>(std::move(model), request, std::move(notes));
}

}  // namespace swarm
