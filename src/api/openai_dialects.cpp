// OpenAI chat completions and completions as ChatDialects (chat_dialect.hpp), and the defaults
// every dialect shares.
#include <ctime>
#include <nlohmann/json.hpp>

#include "api/chat_dialect.hpp"
#include "common/random_id.hpp"
#include "http/json_body.hpp"

namespace swarm {

using json = nlohmann::json;

std::optional<std::string> ChatDialect::recorded(const DialectAnswer& a, const json* sent) {
  return dump_json(sent ? *sent : answer(a));
}

std::string ChatDialect::stream_text(size_t choice, const std::string& delta) {
  (void)choice;
  (void)delta;
  throw SwarmError(ErrorKind::INTERNAL, std::string(api()) + " streams parser events, not raw text");
}

json chat_assistant_message(const ParsedAssistant& parsed, std::string& finish) {
  json m = {{"role", "assistant"}, {"content", parsed.content ? json(*parsed.content) : json(nullptr)}};
  if (parsed.reasoning) {
    m["reasoning_content"] = *parsed.reasoning;  // LangChain, SGLang
    m["reasoning"] = *parsed.reasoning;          // OpenAI Agents SDK, vLLM
  }
  if (!parsed.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& call : parsed.tool_calls)
      calls.push_back({{"id", "call_" + random_hex(12)},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    m["tool_calls"] = std::move(calls);
    finish = "tool_calls";
  }
  return m;
}

namespace {

json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

// What the two OpenAI dialects share: the object header, usage, the `swarm` field, the
// `data:` framing and the [DONE] trailer.
class OpenAIDialectBase : public ChatDialect {
 public:
  OpenAIDialectBase(OpenAIDialectOptions options, const char* id_prefix)
      : o_(std::move(options)), id_(id_prefix + random_hex(12)), created_(std::time(nullptr)) {}

  std::string stream_error(ErrorKind kind, const std::string& message) override {
    return "data: " + error_response(ErrorStyle::OPENAI, kind, message).body + "\n\n";
  }
  std::string stream_trailer() const override { return "data: [DONE]\n\n"; }

 protected:
  json base_object(const char* object) const {
    return {{"id", id_}, {"object", object}, {"created", created_}, {"model", o_.model}};
  }
  static json usage(const DialectAnswer& a) {
    return {{"prompt_tokens", a.prompt_tokens},
            {"completion_tokens", a.completion_tokens},
            {"total_tokens", a.prompt_tokens + a.completion_tokens}};
  }
  // The non-streamed body: `object`, its choices, usage, the swarm field, the prompt's ids.
  json whole(const char* object, json choices, const DialectAnswer& a) const {
    json body = base_object(object);
    body["choices"] = std::move(choices);
    body["usage"] = usage(a);
    body["swarm"] = {{"episode_uuid", o_.episode_uuid}, {"policy_version", a.policy_version}};
    if (o_.return_token_ids) body["prompt_token_ids"] = o_.prompt;
    return body;
  }
  // Streamed, stream_options.include_usage: the last chunk, with no choices.
  std::string usage_chunk(const char* object, const DialectAnswer& a) const {
    if (!o_.include_usage) return "";
    json last = base_object(object);
    last["choices"] = json::array();
    last["usage"] = usage(a);
    return chunk(last);
  }
  static std::string chunk(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

  OpenAIDialectOptions o_;
  std::string id_;
  int64_t created_;
};

class ChatCompletionsDialect final : public OpenAIDialectBase {
 public:
  explicit ChatCompletionsDialect(OpenAIDialectOptions options)
      : OpenAIDialectBase(std::move(options), "chatcmpl-"),
        calls_sent_(static_cast<size_t>(std::max<int64_t>(o_.n, 1)), 0) {}

  const char* api() const override { return "chat_completions"; }

  json answer(const DialectAnswer& a) override {
    json choices = json::array();
    for (size_t c = 0; c < a.choices.size(); ++c) {
      const DialectChoice& ch = a.choices[c];
      std::string finish = ch.finish_reason;
      json j = {{"index", c}, {"logprobs", logprobs(*ch.generated)}};
      j["message"] = chat_assistant_message(ch.parsed, finish);
      j["finish_reason"] = finish;
      if (o_.return_token_ids) j["token_ids"] = ch.generated->ids;
      choices.push_back(std::move(j));
    }
    return whole("chat.completion", std::move(choices), a);
  }

  // A streamed answer is recorded assembled into one chat.completion (no log-probs).
  std::optional<std::string> recorded(const DialectAnswer& a, const json* sent) override {
    if (sent) return dump_json(*sent);
    json assembled = base_object("chat.completion");
    json choices = json::array();
    for (size_t c = 0; c < a.choices.size(); ++c) {
      std::string finish = a.choices[c].finish_reason;
      choices.push_back({{"index", c},
                         {"message", chat_assistant_message(a.choices[c].parsed, finish)},
                         {"finish_reason", finish}});
    }
    assembled["choices"] = std::move(choices);
    assembled["usage"] = usage(a);
    return dump_json(assembled);
  }

  std::string stream_start(int64_t prompt_tokens) override {
    (void)prompt_tokens;
    std::string out;
    for (int64_t c = 0; c < o_.n; ++c)
      out += chunk(chunk_json(static_cast<size_t>(c), {{"role", "assistant"}, {"content", ""}}, nullptr));
    return out;
  }

  // One chunk per event: content / reasoning deltas; a tool call's first delta carries index,
  // id, type and name (the Vercel AI SDK requires both id and name there), then its arguments.
  std::string stream_events(size_t choice, const std::vector<StreamEvent>& events) override {
    std::string out;
    for (const StreamEvent& e : events) {
      switch (e.kind) {
        case StreamEvent::CONTENT:
          out += chunk(chunk_json(choice, {{"content", e.text}}, nullptr));
          break;
        case StreamEvent::REASONING:
          out += chunk(chunk_json(choice, {{"reasoning_content", e.text}, {"reasoning", e.text}}, nullptr));
          break;
        case StreamEvent::TOOL_CALL_START: {
          if (choice < calls_sent_.size()) ++calls_sent_[choice];
          json call = {{"index", e.index},
                       {"id", "call_" + random_hex(12)},
                       {"type", "function"},
                       {"function", {{"name", e.name}, {"arguments", ""}}}};
          out += chunk(chunk_json(choice, {{"tool_calls", json::array({call})}}, nullptr));
          break;
        }
        case StreamEvent::TOOL_CALL_ARGUMENTS:
          out += chunk(chunk_json(
              choice,
              {{"tool_calls", json::array({{{"index", e.index}, {"function", {{"arguments", e.text}}}}})}},
              nullptr));
          break;
      }
    }
    return out;
  }

  std::string stream_finish(const DialectAnswer& a) override {
    std::string out;
    for (size_t c = 0; c < a.choices.size(); ++c) {
      out += stream_events(c, a.choices[c].final_events);
      const bool called = c < calls_sent_.size() && calls_sent_[c] > 0;
      out += chunk(
          chunk_json(c, json::object(), called ? json("tool_calls") : json(a.choices[c].finish_reason)));
    }
    return out + usage_chunk("chat.completion.chunk", a);
  }

 private:
  json chunk_json(size_t choice, json delta, const json& finish_reason) const {
    json j = base_object("chat.completion.chunk");
    j["choices"] =
        json::array({{{"index", choice}, {"delta", std::move(delta)}, {"finish_reason", finish_reason}}});
    return j;
  }

  json logprobs(const GenerationChoice& ch) const {
    if (!o_.logprobs) return nullptr;
    json content = json::array();
    for (size_t i = 0; i < ch.ids.size(); ++i) {
      const std::string tok = o_.token_text(ch.ids[i]);
      json top = json::array();
      if (i < ch.top.size())
        for (const auto& alt : ch.top[i]) {
          const std::string t = o_.token_text(alt.id);
          top.push_back({{"token", t}, {"logprob", alt.logprob}, {"bytes", bytes_of(t)}});
        }
      content.push_back(
          {{"token", tok}, {"logprob", ch.logprobs[i]}, {"bytes", bytes_of(tok)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }

  std::vector<int> calls_sent_;  // tool calls streamed per choice (finish_reason "tool_calls")
};

class CompletionsDialect final : public OpenAIDialectBase {
 public:
  explicit CompletionsDialect(OpenAIDialectOptions options)
      : OpenAIDialectBase(std::move(options), "cmpl-") {}

  const char* api() const override { return "completions"; }
  bool splits_text() const override { return false; }

  json answer(const DialectAnswer& a) override {
    json choices = json::array();
    for (size_t c = 0; c < a.choices.size(); ++c) {
      const GenerationChoice& ch = *a.choices[c].generated;
      json j = {
          {"index", c}, {"logprobs", logprobs(ch)}, {"finish_reason", ch.finish_reason}, {"text", ch.text}};
      if (o_.return_token_ids) j["token_ids"] = ch.ids;
      choices.push_back(std::move(j));
    }
    return whole("text_completion", std::move(choices), a);
  }

  // replay_latest_llm_call shows chat-like calls only.
  std::optional<std::string> recorded(const DialectAnswer&, const json*) override { return std::nullopt; }

  std::string stream_start(int64_t) override { return ""; }
  std::string stream_events(size_t, const std::vector<StreamEvent>&) override { return ""; }
  std::string stream_text(size_t choice, const std::string& delta) override {
    return chunk(text_chunk_json(choice, delta, nullptr));
  }

  std::string stream_finish(const DialectAnswer& a) override {
    std::string out;
    for (size_t c = 0; c < a.choices.size(); ++c)
      out += chunk(text_chunk_json(c, "", a.choices[c].generated->finish_reason));
    return out + usage_chunk("text_completion", a);
  }

 private:
  json text_chunk_json(size_t choice, const std::string& text, const json& finish_reason) const {
    json j = base_object("text_completion");
    j["choices"] = json::array(
        {{{"index", choice}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish_reason}}});
    return j;
  }

  json logprobs(const GenerationChoice& ch) const {
    if (!o_.logprobs) return nullptr;
    json tokens = json::array(), token_logprobs = json::array(), top = json::array();
    for (size_t i = 0; i < ch.ids.size(); ++i) {
      tokens.push_back(o_.token_text(ch.ids[i]));
      token_logprobs.push_back(ch.logprobs[i]);
      json alts = json::object();
      if (i < ch.top.size())
        for (const auto& alt : ch.top[i]) alts[o_.token_text(alt.id)] = alt.logprob;
      top.push_back(alts);
    }
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}};
  }
};

}  // namespace

std::unique_ptr<ChatDialect> make_chat_completions_dialect(OpenAIDialectOptions options) {
  return std::make_unique<ChatCompletionsDialect>(std::move(options));
}

std::unique_ptr<ChatDialect> make_completions_dialect(OpenAIDialectOptions options) {
  return std::make_unique<CompletionsDialect>(std::move(options));
}

}  // namespace swarm
