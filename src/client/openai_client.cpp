#include "swarm/openai.hpp"

#include <exception>

#include "http/http_client.hpp"
#include "client/sse_parser.hpp"
#include "client/wire.hpp"
#include "common/json_nesting.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxErrorBody = size_t{64} * 1024;

void add_params(json& req, const ChatParams& p) {
  req["model"] = p.model;
  if (p.temperature) req["temperature"] = *p.temperature;
  if (p.top_p) req["top_p"] = *p.top_p;
  if (p.max_tokens) req["max_tokens"] = *p.max_tokens;
  if (p.top_k) req["top_k"] = *p.top_k;
  if (p.n) req["n"] = *p.n;
  if (p.seed) req["seed"] = *p.seed;
  if (!p.stop.empty()) req["stop"] = p.stop;
  if (p.logprobs) req["logprobs"] = true;
  if (p.top_logprobs) req["top_logprobs"] = *p.top_logprobs;
  if (!p.tools.is_null()) {
    if (!p.tools.is_array()) throw ConfigError("ChatParams.tools must be a JSON array");
    req["tools"] = p.tools;
  }
  if (p.tool_choice) req["tool_choice"] = *p.tool_choice;
  if (p.parallel_tool_calls) req["parallel_tool_calls"] = *p.parallel_tool_calls;
  if (p.extra.is_object()) {
    for (auto it = p.extra.begin(); it != p.extra.end(); ++it) req[it.key()] = it.value();
  } else if (!p.extra.is_null()) {
    throw ConfigError("ChatParams.extra must be a JSON object");
  }
}

Usage parse_usage(const json& u) {
  Usage usage;
  if (!u.is_object()) return usage;
  auto get = [&](const char* k) {
    auto it = u.find(k);
    return (it != u.end() && it->is_number_integer()) ? it->get<int>() : 0;
  };
  usage.prompt_tokens = get("prompt_tokens");
  usage.completion_tokens = get("completion_tokens");
  usage.total_tokens = get("total_tokens");
  return usage;
}

std::string string_or_empty(const json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

// Reads choices[0] of a (non-streaming) response; `content_of` picks the text field.
ChatResult parse_result(json raw, const std::string& what, bool chat) {
  ChatResult result;
  const auto choices = raw.is_object() ? raw.find("choices") : raw.end();
  if (!raw.is_object() || choices == raw.end() || !choices->is_array() || choices->empty() ||
      !(*choices)[0].is_object())
    throw ClientError(what + ": response has no choices");
  const json& c0 = (*choices)[0];
  if (chat) {
    auto msg = c0.find("message");
    if (msg == c0.end() || !msg->is_object()) throw ClientError(what + ": choices[0] has no message");
    result.content = string_or_empty(*msg, "content");  // null content (tool calls) -> ""
    result.reasoning = string_or_empty(*msg, "reasoning_content");
    if (result.reasoning.empty()) result.reasoning = string_or_empty(*msg, "reasoning");
    if (auto calls = msg->find("tool_calls"); calls != msg->end() && calls->is_array()) {
      for (const json& c : *calls) {
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
          throw ClientError(what + ": a tool call has no function");
        result.tool_calls.push_back({string_or_empty(c, "id"), string_or_empty(c["function"], "name"),
                                     string_or_empty(c["function"], "arguments")});
      }
    }
  } else {
    result.content = string_or_empty(c0, "text");
  }
  result.finish_reason = string_or_empty(c0, "finish_reason");
  if (auto u = raw.find("usage"); u != raw.end()) result.usage = parse_usage(*u);
  result.raw = std::move(raw);
  return result;
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const auto& c : calls)
    out.push_back(
        {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

}  // namespace

json ChatResult::assistant_message() const {
  json m{{"role", "assistant"},
         {"content", tool_calls.empty() || !content.empty() ? json(content) : json(nullptr)}};
  if (!tool_calls.empty()) m["tool_calls"] = tool_calls_json(tool_calls);
  return m;
}

json ChatResult::tool_message(const ToolCall& call, const std::string& output) {
  return {{"role", "tool"}, {"tool_call_id", call.id}, {"content", output}};
}

struct OpenAIClient::Impl {
  std::string base_url;
  std::string api_key;
  HttpClient http;
  wire::Headers headers;

  Impl(std::string url, std::string key, std::chrono::milliseconds timeout, const std::string& ca_file)
      : base_url(wire::trim_url(std::move(url))),
        api_key(std::move(key)),
        http(wire::make_http_client(base_url, timeout, ca_file)),
        headers{{"Authorization", "Bearer " + api_key}} {}

  json post(const std::string& path, const json& body) {
    return wire::call_json(http, "POST", path, &body, headers);
  }
};

OpenAIClient::OpenAIClient(std::string base_url, std::string api_key, std::chrono::milliseconds timeout,
                           const std::string& ca_file)
    : impl_(std::make_unique<Impl>(std::move(base_url), std::move(api_key), timeout, ca_file)) {}

OpenAIClient::OpenAIClient(const OpenAIEndpoint& endpoint, std::chrono::milliseconds timeout)
    : OpenAIClient(endpoint.base_url, endpoint.api_key, timeout, endpoint.ca_file) {}

OpenAIClient::~OpenAIClient() = default;
OpenAIClient::OpenAIClient(OpenAIClient&&) noexcept = default;
OpenAIClient& OpenAIClient::operator=(OpenAIClient&&) noexcept = default;

const std::string& OpenAIClient::base_url() const { return impl_->base_url; }

ChatResult OpenAIClient::chat(const nlohmann::json& messages, const ChatParams& params) {
  if (!messages.is_array()) throw ConfigError("chat: messages must be a JSON array");
  json req{{"messages", messages}};
  add_params(req, params);
  return parse_result(impl_->post("/chat/completions", req), "chat/completions", true);
}

ChatResult OpenAIClient::chat(const std::vector<std::pair<std::string, std::string>>& role_content,
                              const ChatParams& params) {
  json messages = json::array();
  for (const auto& [role, content] : role_content) messages.push_back({{"role", role}, {"content", content}});
  return chat(messages, params);
}

ChatResult OpenAIClient::chat(std::initializer_list<ChatMessage> messages, const ChatParams& params) {
  json array = json::array();
  for (const auto& m : messages) array.push_back({{"role", m.role}, {"content", m.content}});
  return chat(array, params);
}

ChatResult OpenAIClient::complete(const std::string& prompt, const ChatParams& params) {
  json req{{"prompt", prompt}};
  add_params(req, params);
  return parse_result(impl_->post("/completions", req), "completions", false);
}

std::vector<std::string> OpenAIClient::models() {
  const json r = wire::call_json(impl_->http, "GET", "/models", nullptr, impl_->headers);
  std::vector<std::string> ids;
  const auto data = r.is_object() ? r.find("data") : r.end();
  if (!r.is_object() || data == r.end() || !data->is_array())
    throw ClientError("models: response has no data array");
  for (const auto& m : *data) {
    std::string id = string_or_empty(m, "id");
    if (!id.empty()) ids.push_back(std::move(id));
  }
  return ids;
}

ChatResult OpenAIClient::chat_stream(const nlohmann::json& messages,
                                     const std::function<void(std::string_view delta)>& on_delta,
                                     const ChatParams& params) {
  if (!messages.is_array()) throw ConfigError("chat_stream: messages must be a JSON array");
  json req{{"messages", messages}};
  add_params(req, params);
  req["stream"] = true;
  if (!req.contains("stream_options")) req["stream_options"] = {{"include_usage", true}};

  ChatResult result;
  json first_chunk;            // id / model / created of the stream, for `raw`
  std::string raw_prefix;      // the first bytes, to report a non-2xx error body
  std::exception_ptr failure;  // from on_delta or a malformed chunk
  std::string stream_error;    // an {"error": ...} event
  bool done = false;
  bool saw_finish = false;

  SseParser parser([&](const std::string& data) -> bool {
    if (data == "[DONE]") {
      done = true;
      return false;
    }
    json chunk;
    if (!json_nesting_within(data)) {
      failure = std::make_exception_ptr(ClientError("chat_stream: malformed chunk: nested deeper than " +
                                                    std::to_string(kMaxJsonNesting) + " levels"));
      return false;
    }
    try {
      chunk = json::parse(data);
    } catch (const std::exception& e) {
      failure =
          std::make_exception_ptr(ClientError(std::string("chat_stream: malformed chunk: ") + e.what()));
      return false;
    }
    if (!chunk.is_object()) return true;
    if (auto err = chunk.find("error"); err != chunk.end()) {
      stream_error = err->is_object() ? string_or_empty(*err, "message") : err->dump();
      if (stream_error.empty()) stream_error = err->dump();
      return false;
    }
    if (first_chunk.is_null()) first_chunk = chunk;
    if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) result.usage = parse_usage(*u);
    auto choices = chunk.find("choices");
    if (choices == chunk.end() || !choices->is_array() || choices->empty()) return true;
    const json& c0 = (*choices)[0];
    if (!c0.is_object()) return true;
    // chat_stream returns one text: with n > 1 it follows choice 0 (chunks carry one choice each).
    if (c0.value("index", 0) != 0) return true;
    if (auto fr = c0.find("finish_reason"); fr != c0.end() && fr->is_string()) {
      result.finish_reason = fr->get<std::string>();
      saw_finish = true;
    }
    auto delta = c0.find("delta");
    if (delta == c0.end() || !delta->is_object()) return true;
    result.reasoning += string_or_empty(*delta, "reasoning_content");
    // A call's first delta has its index, id and name; later ones add argument pieces.
    if (auto calls = delta->find("tool_calls"); calls != delta->end() && calls->is_array()) {
      for (const json& c : *calls) {
        if (!c.is_object()) continue;
        const size_t index = c.value("index", 0);
        if (index > 1024) continue;  // bounded: a hostile stream cannot make us allocate
        if (result.tool_calls.size() <= index) result.tool_calls.resize(index + 1);
        ToolCall& call = result.tool_calls[index];
        if (std::string id = string_or_empty(c, "id"); !id.empty()) call.id = std::move(id);
        if (auto fn = c.find("function"); fn != c.end() && fn->is_object()) {
          if (std::string name = string_or_empty(*fn, "name"); !name.empty()) call.name = std::move(name);
          call.arguments += string_or_empty(*fn, "arguments");
        }
      }
    }
    auto content = delta->find("content");
    if (content == delta->end() || !content->is_string()) return true;
    const auto& piece = content->get_ref<const std::string&>();
    if (piece.empty()) return true;
    result.content += piece;
    try {
      if (on_delta) on_delta(piece);
    } catch (...) {
      failure = std::current_exception();
      return false;
    }
    return true;
  });

  HttpClientResponse resp;
  try {
    resp = impl_->http.request_stream(
        "POST", "/chat/completions", wire::dump_json(req), impl_->headers,
        [&](std::string_view bytes) -> bool {
          if (raw_prefix.size() < kMaxErrorBody)
            raw_prefix.append(bytes.substr(0, std::min(bytes.size(), kMaxErrorBody - raw_prefix.size())));
          parser.feed(bytes);
          // Keep reading after [DONE] so the keep-alive connection stays usable.
          return !failure && stream_error.empty();
        });
  } catch (const Error&) {
    if (failure) std::rethrow_exception(failure);
    throw;
  } catch (const std::exception& e) {
    impl_->http.close();
    if (failure) std::rethrow_exception(failure);
    throw TransportError(std::string("POST /chat/completions (stream): ") + e.what());
  }
  wire::throw_if_error_status(resp.status, raw_prefix);
  if (failure) std::rethrow_exception(failure);
  if (!done) parser.finish();  // a last event without the closing blank line
  if (failure) std::rethrow_exception(failure);
  if (!stream_error.empty()) throw ServerError(resp.status, "stream_error", stream_error);
  if (!done && !saw_finish) throw TransportError("chat_stream: the stream ended before [DONE]");

  json message = result.assistant_message();
  if (!result.reasoning.empty()) message["reasoning_content"] = result.reasoning;
  result.raw = {
      {"id", string_or_empty(first_chunk, "id")},
      {"object", "chat.completion"},
      {"model", string_or_empty(first_chunk, "model")},
      {"choices",
       json::array(
           {{{"index", 0},
             {"message", message},
             {"finish_reason", result.finish_reason.empty() ? json(nullptr) : json(result.finish_reason)}}})},
      {"usage",
       {{"prompt_tokens", result.usage.prompt_tokens},
        {"completion_tokens", result.usage.completion_tokens},
        {"total_tokens", result.usage.total_tokens}}}};
  if (first_chunk.is_object() && first_chunk.contains("created"))
    result.raw["created"] = first_chunk["created"];
  return result;
}

}  // namespace swarm
