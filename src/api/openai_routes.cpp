#include "api/openai_routes.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/json_nesting.hpp"
#include "api/chat_dialect.hpp"
#include "api/chat_splice.hpp"
#include "http/http_error.hpp"
#include "http/json_body.hpp"
#include "api/structured_output.hpp"
#include "exchange/sapo_message.hpp"
#include "text/tool_calls.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxChoices = 16;
constexpr int64_t kMaxTopLogprobs = 20;
constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopTokenIds = 64;

// The text of the last `last` ids (all of them by default) as the model spelled them, special
// tokens included.
std::string spelled(const Backend& backend, const std::vector<TokenId>& ids, size_t last = SIZE_MAX) {
  std::string text;
  for (size_t i = ids.size() > last ? ids.size() - last : 0; i < ids.size(); ++i)
    text += backend.token_text(ids[i]);
  return text;
}

std::string bearer_key(const HttpRequest& request) {
  const std::string& auth = request.header("authorization");
  SWARM_REQUIRE(
      !auth.empty(), ErrorKind::UNAUTHORIZED,
      "missing API key: send 'Authorization: Bearer <openai_api_key>' as returned by claim_episode");
  const std::string prefix = "bearer ";
  SWARM_REQUIRE(
      auth.size() > prefix.size() &&
          std::equal(prefix.begin(), prefix.end(), auth.begin(),
                     [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); }),
      ErrorKind::UNAUTHORIZED, "malformed Authorization header: expected 'Bearer <openai_api_key>'");
  return auth.substr(prefix.size());
}

struct RequestOptions {
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;
  bool return_token_ids = false;
  // chat only
  bool tool_choice_none = false;  // tool_choice "none": tools are rendered, calls not parsed
  bool has_tools = false;         // the request offers tools (calls are parsed only then)
  // How the generated text is split into the message's fields (resolved per request;
  // output.parallel_tool_calls is the request's parallel_tool_calls).
  OutputFormat output;
  // Chat: the conversation's keys; each answer is recorded under its turn key (chat_splice.hpp).
  std::optional<ChatKeys> chat_keys;
  // Structured outputs (structured_output.hpp): tool_choice "required" / a named function, and
  // the grammar every completion must follow.
  bool tool_required = false;
  std::string forced_tool;
  std::shared_ptr<const grammar::Grammar> grammar;
  // The agent that makes the call (AT-GRPO grouping): `swarm.agent` in the body, else the
  // `x-swarm-agent` header; "" = unnamed.
  std::string agent;
  // Swarm experience sharing (exchange_publish): what the agent sent, as text for other nodes
  // ({"messages", "tools"} or {"prompt"}); each choice adds its completion (LlmCall::exchange_record).
  std::shared_ptr<const nlohmann::ordered_json> exchange_request;
};

constexpr size_t kMaxAgentName = 64;

std::string agent_of(const json& body, const HttpRequest& request) {
  std::string agent = request.header("x-swarm-agent");
  if (auto it = body.find("swarm"); it != body.end() && !it->is_null()) {
    SWARM_REQUIRE(it->is_object(), ErrorKind::INVALID_ARGUMENT, "field 'swarm' must be an object");
    if (auto a = it->find("agent"); a != it->end() && !a->is_null()) {
      SWARM_REQUIRE(a->is_string(), ErrorKind::INVALID_ARGUMENT, "field 'swarm.agent' must be a string");
      agent = a->get<std::string>();
    }
  }
  SWARM_REQUIRE(agent.size() <= kMaxAgentName, ErrorKind::INVALID_ARGUMENT,
                "the agent name (swarm.agent / x-swarm-agent) may have at most " +
                    std::to_string(kMaxAgentName) + " bytes");
  return agent;
}

// The tool fields of a chat request, validated as strictly as the rest: every
// error names the field.
void parse_tool_options(const json& body, RequestOptions& o) {
  std::vector<std::string> names;
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    SWARM_REQUIRE(it->is_array(), ErrorKind::INVALID_ARGUMENT, "field 'tools' must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      SWARM_REQUIRE(t.is_object(), ErrorKind::INVALID_ARGUMENT, "field '" + at + "' must be an object");
      auto type = t.find("type");
      SWARM_REQUIRE(type == t.end() || (type->is_string() && *type == "function"),
                    ErrorKind::INVALID_ARGUMENT, "field '" + at + ".type' must be \"function\"");
      auto fn = t.find("function");
      SWARM_REQUIRE(fn != t.end() && fn->is_object(), ErrorKind::INVALID_ARGUMENT,
                    "field '" + at + ".function' must be an object");
      auto name = fn->find("name");
      SWARM_REQUIRE(name != fn->end() && name->is_string() && !name->get<std::string>().empty(),
                    ErrorKind::INVALID_ARGUMENT,
                    "field '" + at + ".function.name' must be a non-empty string");
      names.push_back(name->get<std::string>());
    }
    o.has_tools = !it->empty();
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      SWARM_REQUIRE(c == "auto" || c == "none" || c == "required", ErrorKind::INVALID_ARGUMENT,
                    "field 'tool_choice' must be \"auto\", \"none\", \"required\" or a function");
      o.tool_choice_none = c == "none";
      o.tool_required = c == "required";
      SWARM_REQUIRE(!o.tool_required || !names.empty(), ErrorKind::INVALID_ARGUMENT,
                    "field 'tool_choice' is \"required\" but the request offers no 'tools'");
    } else {
      SWARM_REQUIRE(it->is_object(), ErrorKind::INVALID_ARGUMENT,
                    "field 'tool_choice' must be \"auto\", \"none\", \"required\" or a function");
      auto fn = it->find("function");
      SWARM_REQUIRE(fn != it->end() && fn->is_object() && fn->contains("name") && (*fn)["name"].is_string(),
                    ErrorKind::INVALID_ARGUMENT, "field 'tool_choice.function.name' must be a string");
      const std::string name = (*fn)["name"].get<std::string>();
      SWARM_REQUIRE(std::find(names.begin(), names.end(), name) != names.end(), ErrorKind::INVALID_ARGUMENT,
                    "field 'tool_choice' names function '" + name + "', which is not in 'tools'");
      o.forced_tool = name;
    }
  }
  o.output.parallel_tool_calls = optional_bool(body, "parallel_tool_calls").value_or(true);
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    SWARM_REQUIRE(it->is_object() && it->contains("type") && (*it)["type"].is_string(),
                  ErrorKind::INVALID_ARGUMENT,
                  "field 'response_format' must be an object with a string 'type'");
    const std::string type = (*it)["type"].get<std::string>();
    SWARM_REQUIRE(type == "text" || type == "json_object" || type == "json_schema",
                  ErrorKind::INVALID_ARGUMENT,
                  "field 'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  }
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null())
    SWARM_REQUIRE(it->is_object(), ErrorKind::INVALID_ARGUMENT,
                  "field 'chat_template_kwargs' must be an object");
}

// What the chat completions API requires of `messages`: at least one; each an object with a
// role it knows and a content (a string or parts), which only an assistant turn that calls
// tools may leave out or set to null; a tool message names the call it answers.
void require_chat_messages(const json& messages) {
  SWARM_REQUIRE(!messages.empty(), ErrorKind::INVALID_ARGUMENT,
                "field 'messages' must hold at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    SWARM_REQUIRE(m.is_object(), ErrorKind::INVALID_ARGUMENT, "field '" + where + "' must be an object");
    auto role = m.find("role");
    SWARM_REQUIRE(role != m.end() && role->is_string(), ErrorKind::INVALID_ARGUMENT,
                  role == m.end() ? "missing required field '" + where + ".role'"
                                  : "field '" + where + ".role' must be a string");
    const std::string r = role->get<std::string>();
    SWARM_REQUIRE(r != "function", ErrorKind::INVALID_ARGUMENT,
                  "field '" + where +
                      ".role' is the deprecated \"function\": answer a tool call with a \"tool\" "
                      "message");
    SWARM_REQUIRE(
        r == "system" || r == "developer" || r == "user" || r == "assistant" || r == "tool",
        ErrorKind::INVALID_ARGUMENT,
        "field '" + where + ".role' must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\"");
    auto content = m.find("content");
    const bool has_content = content != m.end() && !content->is_null();
    if (has_content)
      SWARM_REQUIRE(content->is_string() || content->is_array(), ErrorKind::INVALID_ARGUMENT,
                    "field '" + where + ".content' must be a string or an array of content parts");
    auto calls = m.find("tool_calls");
    const bool calls_tools = calls != m.end() && calls->is_array() && !calls->empty();
    SWARM_REQUIRE(has_content || (r == "assistant" && calls_tools), ErrorKind::INVALID_ARGUMENT,
                  r == "assistant"
                      ? "field '" + where + ".content' is required unless the message has 'tool_calls'"
                      : "missing required field '" + where + ".content'");
    if (r == "tool") {
      auto id = m.find("tool_call_id");
      SWARM_REQUIRE(
          id != m.end() && id->is_string(), ErrorKind::INVALID_ARGUMENT,
          "field '" + where + ".tool_call_id' must be a string (a tool message answers a tool call)");
    }
  }
}

// As vLLM and SGLang do before rendering: a null (or missing) content becomes "" — an
// assistant turn that only calls tools has content null, and templates test
// `'</think>' in message.content` — and a list of parts becomes its text. Tool-call arguments,
// sent as JSON strings, become objects for templates that print them with `tojson`
// (normalize_tool_calls in src/text/tool_calls.hpp; docs/openai_api.md).
void normalize_messages(nlohmann::ordered_json& messages, const std::string& chat_template) {
  for (auto& m : messages) {
    if (!m.is_object()) continue;
    auto it = m.find("content");
    if (it == m.end() || it->is_null() || it->is_array())
      m["content"] = message_content_text(it == m.end() ? nlohmann::ordered_json() : *it);
  }
  normalize_tool_calls(messages, detect_tool_arguments_form(chat_template));
}

RequestOptions parse_options(const json& body, ApiKind kind, const Job& job) {
  RequestOptions o;
  SamplingParams& p = o.params;
  p.temperature = optional_number(body, "temperature").value_or(job.temperature);
  SWARM_REQUIRE(p.temperature >= 0 && p.temperature <= 2, ErrorKind::INVALID_ARGUMENT,
                "field 'temperature' must be between 0 and 2");
  if (is_greedy_temperature(p.temperature)) p.temperature = 0;  // e.g. 1e-50: greedy, never logits / 0
  p.top_p = optional_number(body, "top_p").value_or(job.top_p);
  SWARM_REQUIRE(p.top_p > 0 && p.top_p <= 1, ErrorKind::INVALID_ARGUMENT, "field 'top_p' must be in (0, 1]");
  p.top_k = optional_int(body, "top_k").value_or(job.top_k);
  SWARM_REQUIRE(p.top_k == -1 || p.top_k >= 1, ErrorKind::INVALID_ARGUMENT,
                "field 'top_k' must be -1 or >= 1");
  auto max_tokens = optional_int(body, "max_completion_tokens");
  if (!max_tokens) max_tokens = optional_int(body, "max_tokens");
  p.max_tokens = max_tokens.value_or(job.max_response_length);
  SWARM_REQUIRE(p.max_tokens >= 1, ErrorKind::INVALID_ARGUMENT, "field 'max_tokens' must be >= 1");
  p.max_tokens = std::min(p.max_tokens, job.max_response_length);
  p.n = optional_int(body, "n").value_or(1);
  SWARM_REQUIRE(p.n >= 1 && p.n <= kMaxChoices, ErrorKind::INVALID_ARGUMENT,
                "field 'n' must be between 1 and " + std::to_string(kMaxChoices));
  if (auto seed = optional_int(body, "seed")) p.seed = static_cast<uint64_t>(*seed);
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      SWARM_REQUIRE(it->size() <= kMaxStopStrings, ErrorKind::INVALID_ARGUMENT,
                    "field 'stop' may hold at most " + std::to_string(kMaxStopStrings) + " strings");
      for (const auto& s : *it) {
        SWARM_REQUIRE(s.is_string(), ErrorKind::INVALID_ARGUMENT,
                      "field 'stop' must be a string or an array of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, "field 'stop' must be a string or an array of strings");
    }
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    SWARM_REQUIRE(it->is_array() && it->size() <= kMaxStopTokenIds, ErrorKind::INVALID_ARGUMENT,
                  "field 'stop_token_ids' must be an array of at most " + std::to_string(kMaxStopTokenIds) +
                      " token ids");
    for (const auto& id : *it) {
      SWARM_REQUIRE(
          id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 31),
          ErrorKind::INVALID_ARGUMENT, "field 'stop_token_ids' must hold non-negative token ids");
      p.stop_token_ids.push_back(static_cast<TokenId>(id.get<int64_t>()));
    }
  }
  if (kind == ApiKind::CHAT_COMPLETIONS) {
    p.logprobs = optional_bool(body, "logprobs").value_or(false);
    p.top_logprobs = optional_int(body, "top_logprobs").value_or(0);
    SWARM_REQUIRE(p.top_logprobs >= 0 && p.top_logprobs <= kMaxTopLogprobs, ErrorKind::INVALID_ARGUMENT,
                  "field 'top_logprobs' must be between 0 and " + std::to_string(kMaxTopLogprobs));
    SWARM_REQUIRE(p.top_logprobs == 0 || p.logprobs, ErrorKind::INVALID_ARGUMENT,
                  "field 'top_logprobs' requires 'logprobs': true");
  } else {
    auto lp = optional_int(body, "logprobs");
    SWARM_REQUIRE(!lp || (*lp >= 0 && *lp <= 5), ErrorKind::INVALID_ARGUMENT,
                  "field 'logprobs' must be an integer between 0 and 5");
    p.logprobs = lp.has_value();
    p.top_logprobs = lp.value_or(0);
  }
  o.stream = optional_bool(body, "stream").value_or(false);
  if (const json* so = optional_object(body, "stream_options"))
    o.include_usage = optional_bool(*so, "include_usage").value_or(false);
  o.return_token_ids = optional_bool(body, "return_token_ids").value_or(false);
  return o;
}

// tool_call_parser / reasoning_parser: `auto` reads the chat template. Tool calls are parsed
// only when the request offers tools and tool_choice is not "none". Where reasoning starts
// comes from the end of the rendered prompt (a template may open or close <think> itself).
void resolve_output_formats(const Job& job, const Backend& backend, const std::vector<TokenId>& prompt,
                            RequestOptions& o) {
  const std::string tmpl = backend.chat_template_source();
  ToolCallFormat tools = ToolCallFormat::NONE;
  if (job.tool_call_parser == "auto")
    tools = detect_tool_call_format(tmpl);
  else
    parse_tool_call_format(job.tool_call_parser, &tools);
  o.output.tools = o.has_tools && !o.tool_choice_none ? tools : ToolCallFormat::NONE;
  ReasoningFormat reasoning = ReasoningFormat::NONE;
  if (job.reasoning_parser == "auto")
    reasoning = detect_reasoning_format(tmpl);
  else
    parse_reasoning_format(job.reasoning_parser, &reasoning);
  o.output.reasoning = reasoning;
  if (reasoning != ReasoningFormat::NONE) {
    o.output.reasoning_start = reasoning_start_from_prompt(spelled(backend, prompt, 8));
  }
}

std::vector<TokenId> completion_prompt(const json& body, const Backend& backend) {
  auto it = body.find("prompt");
  SWARM_REQUIRE(it != body.end() && !it->is_null(), ErrorKind::INVALID_ARGUMENT,
                "missing required field 'prompt'");
  if (it->is_string()) return backend.encode(it->get<std::string>());
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string())
    return backend.encode((*it)[0].get<std::string>());
  if (it->is_array() && !it->empty()) {
    std::vector<TokenId> ids;
    for (const auto& v : *it) {
      SWARM_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t{1} << 31),
                    ErrorKind::INVALID_ARGUMENT, "field 'prompt' must be a string or an array of token ids");
      ids.push_back(static_cast<TokenId>(v.get<int64_t>()));
    }
    return ids;
  }
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "field 'prompt' must be a string or an array of token ids");
}

// Serves one request from the moment generation is handed to the backend: records every
// choice as a call, counts tokens, and writes what the request's dialect makes of the answer.
// Nothing API-specific happens here (chat_dialect.hpp). Thread-safe: a backend may report from
// more than one thread; one mutex orders the dialect and the writes.
class GenerationHandler final : public GenerationObserver,
                                public SseStream,
                                public std::enable_shared_from_this<GenerationHandler> {
 public:
  GenerationHandler(std::shared_ptr<Metrics> metrics, GenerationLease lease,
                    std::shared_ptr<ResponseSink> sink, RequestOptions options, std::vector<TokenId> prompt,
                    OpenAIContext context, std::string request_body, std::unique_ptr<ChatDialect> dialect)
      : metrics_(std::move(metrics)),
        lease_(std::move(lease)),
        sink_(std::move(sink)),
        options_(std::move(options)),
        prompt_(std::move(prompt)),
        context_(std::move(context)),
        request_body_(std::move(request_body)),
        dialect_(std::move(dialect)) {}

  void start() {
    if (options_.stream) {
      // Opened at once; the heartbeat keeps it alive while the first token is not ready.
      sink_->start_stream(200, "text/event-stream");
      {
        std::lock_guard lk(mu_);
        write(dialect_->stream_start(static_cast<int64_t>(prompt_.size())));
      }
      if (context_.heartbeat) context_.heartbeat->add(std::weak_ptr<SseStream>(shared_from_this()));
    }
    GenerationRequest req{prompt_, options_.params, options_.grammar, lease_.ticket.episode_uuid};
    lease_.backend->generate(std::move(req), shared_from_this());
  }

  void on_text(int64_t choice, const std::string& delta) override {
    if (!options_.stream || delta.empty()) return;
    lease_.pool->touch(lease_.ticket.episode_uuid);
    const size_t c = static_cast<size_t>(choice);
    std::lock_guard lk(mu_);
    write(dialect_->splits_text() ? dialect_->stream_events(c, parser(c).feed(delta))
                                  : dialect_->stream_text(c, delta));
  }

  void on_complete(GenerationResult result) override {
    // Record before answering, so the agent's next call (e.g. end_episode) sees it.
    DialectAnswer a;
    a.prompt_tokens = static_cast<int64_t>(prompt_.size());
    a.policy_version = result.policy_version;
    for (const GenerationChoice& choice : result.choices) {
      a.completion_tokens += static_cast<int64_t>(choice.ids.size());
      DialectChoice& d = a.choices.emplace_back();
      d.generated = &choice;
      d.finish_reason = choice.finish_reason;
      d.stop_sequence = matched_stop_string(choice);
      if (dialect_->splits_text()) d.parsed = options_.output.parse(choice.text);
      Engine::finish_generation(lease_, recorded_call(choice, d.parsed, result.policy_version));
    }
    for (size_t i = result.choices.size(); i < static_cast<size_t>(options_.params.n); ++i)
      Engine::cancel_generation(lease_);
    metrics_->observe_tokens(a.prompt_tokens * options_.params.n, a.completion_tokens);
    if (a.choices.empty() && dialect_->needs_a_choice())
      return on_error(ErrorKind::INTERNAL, "no choice was generated");
    std::lock_guard lk(mu_);
    if (!options_.stream) {
      int64_t failures = 0;
      for (const DialectChoice& d : a.choices) failures += d.parsed.parse_failures;
      metrics_->observe_tool_call_parse_failures(failures);
      const json body = dialect_->answer(a);
      record_last_call(a, &body);
      HttpResponse r;
      r.body = dump_json(body);
      sink_->respond(std::move(r));
      return;
    }
    if (dialect_->splits_text()) {
      for (size_t c = 0; c < a.choices.size(); ++c) {
        StreamingAssistantParser& p = parser(c);
        a.choices[c].final_events = p.finish();
        metrics_->observe_tool_call_parse_failures(p.parse_failures());
      }
    }
    record_last_call(a, nullptr);
    write(dialect_->stream_finish(a));
    end_stream();
  }

  void on_error(ErrorKind kind, const std::string& message) override {
    for (int64_t i = 0; i < options_.params.n; ++i) Engine::cancel_generation(lease_);
    std::lock_guard lk(mu_);
    if (options_.stream) {
      write(dialect_->stream_error(kind, message));
      end_stream();
    } else {
      sink_->respond(error_response(dialect_->error_style(), kind, message));
    }
  }

  // The client hung up, or its episode was aborted / timed out / ended meanwhile: the engine
  // then stops generating and frees the KV cache.
  bool cancelled() const override {
    return !sink_->client_connected() ||
           !lease_.pool->can_continue(lease_.ticket.client_uuid, lease_.ticket.episode_uuid);
  }

 private:
  // One choice as the call the episode records.
  LlmCall recorded_call(const GenerationChoice& choice, const ParsedAssistant& parsed,
                        int64_t policy_version) const {
    LlmCall call;
    call.prompt_ids = prompt_;
    call.completion_ids = choice.ids;
    call.completion_logprobs = choice.logprobs;
    call.policy_version = choice.versions.empty() ? policy_version : choice.versions.front();
    if (!choice.versions.empty() && choice.versions.back() != choice.versions.front())
      call.completion_versions = choice.versions;  // it ran across a weight swap
    call.finish_reason = choice.finish_reason;
    const double temperature = logprob_temperature(options_.params.temperature);
    call.temperature = static_cast<float>(temperature);
    call.agent = options_.agent;
    if (options_.exchange_request) {
      std::string finish = choice.finish_reason;
      const json message = dialect_->splits_text() ? chat_assistant_message(parsed, finish) : json();
      call.exchange_record =
          sapo_call_record(*options_.exchange_request, message, spelled(*lease_.backend, choice.ids),
                           choice.finish_reason, temperature);
    }
    if (options_.chat_keys)
      call.turn_key = answer_turn_key(*options_.chat_keys, answer_key(parsed.content, parsed.tool_calls));
    return call;
  }

  // replay_latest_llm_call (AgentJet's overwatch): the request and the answer in its API.
  void record_last_call(const DialectAnswer& a, const json* sent) {
    if (!context_.last_chat) return;
    if (auto answer = dialect_->recorded(a, sent))
      context_.last_chat->record(std::move(request_body_), std::move(*answer), dialect_->api());
  }

  // The stop string that ended a choice ("" when it ended otherwise): generation stops on the
  // token that completes it, so it lies in the last tokens' text.
  std::string matched_stop_string(const GenerationChoice& ch) const {
    if (ch.finish_reason != "stop" || options_.params.stop.empty()) return "";
    const std::string tail = spelled(*lease_.backend, ch.ids, 16);
    std::string best;
    size_t best_pos = std::string::npos;
    for (const std::string& stop : options_.params.stop) {
      const size_t pos = stop.empty() ? std::string::npos : tail.rfind(stop);
      if (pos != std::string::npos && (best_pos == std::string::npos || pos < best_pos))
        best_pos = pos, best = stop;
    }
    return best;
  }

  // Under mu_.
  StreamingAssistantParser& parser(size_t choice) {
    while (parsers_.size() <= choice) parsers_.push_back(options_.output.stream_parser());
    return *parsers_[choice];
  }

  bool keep_alive(std::chrono::steady_clock::time_point now, std::chrono::milliseconds silence) override {
    std::lock_guard lk(mu_);
    if (ended_) return false;
    if (now - last_write_ >= silence) {
      sink_->write(dialect_->keep_alive());
      last_write_ = now;
    }
    return true;
  }

  // Under mu_.
  void write(std::string text) {
    if (ended_ || text.empty()) return;
    sink_->write(std::move(text));
    last_write_ = std::chrono::steady_clock::now();
  }

  // Under mu_.
  void end_stream() {
    if (ended_) return;
    write(dialect_->stream_trailer());
    ended_ = true;
    sink_->end_stream();
  }

  // Owned or shared, never borrowed: the backend may end a generation while the server stops,
  // after the service that started it is gone (docs/reliability.md, "Shutdown").
  std::shared_ptr<Metrics> metrics_;
  GenerationLease lease_;
  std::shared_ptr<ResponseSink> sink_;
  RequestOptions options_;
  std::vector<TokenId> prompt_;
  OpenAIContext context_;
  std::string request_body_;  // kept for LastChatCall (chat-like APIs only)
  std::unique_ptr<ChatDialect> dialect_;
  std::mutex mu_;  // the dialect's stream state, the parsers, the writes
  bool ended_ = false;
  std::vector<std::unique_ptr<StreamingAssistantParser>> parsers_;  // one per choice (streamed chat-like)
  std::chrono::steady_clock::time_point last_write_ = std::chrono::steady_clock::now();
};

}  // namespace

void LastChatCall::record(std::string request_body, std::string response, std::string api) {
  std::lock_guard lk(mu_);
  call_ = Call{std::move(request_body), std::move(response), std::move(api)};
}

std::optional<LastChatCall::Call> LastChatCall::get() const {
  std::lock_guard lk(mu_);
  return call_;
}

SseHeartbeat::SseHeartbeat(std::chrono::milliseconds interval)
    : interval_(interval), thread_([this](std::stop_token st) { run(st); }) {}

SseHeartbeat::~SseHeartbeat() {
  thread_.request_stop();
  cv_.notify_all();
}

void SseHeartbeat::add(std::weak_ptr<SseStream> stream) {
  std::lock_guard lk(mu_);
  streams_.push_back(std::move(stream));
}

void SseHeartbeat::run(std::stop_token stop) {
  const auto tick = std::max(std::chrono::milliseconds(50), interval_ / 4);
  while (!stop.stop_requested()) {
    std::vector<std::weak_ptr<SseStream>> streams;
    {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, stop, tick, [] { return false; });
      if (stop.stop_requested()) return;
      streams = streams_;
    }
    const auto now = std::chrono::steady_clock::now();
    std::vector<bool> alive(streams.size(), false);
    for (size_t i = 0; i < streams.size(); ++i)
      if (auto s = streams[i].lock()) alive[i] = s->keep_alive(now, interval_);
    std::lock_guard lk(mu_);
    // Streams added meanwhile sit past the copied prefix; keep them.
    std::vector<std::weak_ptr<SseStream>> kept;
    for (size_t i = 0; i < streams_.size(); ++i)
      if (i >= alive.size() || alive[i]) kept.push_back(std::move(streams_[i]));
    streams_ = std::move(kept);
  }
}

HttpResponse openai_models(Engine& engine) {
  json data = json::array();
  if (auto backend = engine.backend())
    data.push_back({{"id", backend->model_id()}, {"object", "model"}, {"created", 0}, {"owned_by", "swarm"}});
  HttpResponse r;
  r.body = dump_json({{"object", "list"}, {"data", data}});
  return r;
}

namespace {

// The chat path shared by every chat-like API: tool options, the prompt (exact ids spliced
// after the turns this episode generated, else a fresh render), output formats and structured
// outputs. `ordered` is the body with key order kept (templates print tools and tool-call
// arguments with `tojson`, and Python keeps the order the agent sent).
std::vector<TokenId> chat_prompt(const json& body, nlohmann::ordered_json& ordered, RequestOptions& options,
                                 const GenerationLease& lease) {
  auto messages = body.find("messages");
  SWARM_REQUIRE(
      messages != body.end() && messages->is_array(), ErrorKind::INVALID_ARGUMENT,
      messages == body.end() ? "missing required field 'messages'" : "field 'messages' must be an array");
  require_chat_messages(*messages);
  parse_tool_options(body, options);
  normalize_messages(ordered["messages"], lease.backend->chat_template_source());
  const nlohmann::ordered_json tools =
      ordered.contains("tools") ? ordered["tools"] : nlohmann::ordered_json();
  const nlohmann::ordered_json kwargs =
      ordered.contains("chat_template_kwargs") && ordered["chat_template_kwargs"].is_object()
          ? ordered["chat_template_kwargs"]
          : nlohmann::ordered_json::object();
  options.chat_keys = chat_keys(ordered["messages"], tools, kwargs);
  std::optional<std::vector<TokenId>> spliced;
  if (lease.job.exact_history_tokens)
    spliced = splice_chat_prompt(
        *lease.backend, ordered["messages"], tools, kwargs, *options.chat_keys,
        [&lease](const std::string& key) { return lease.pool->turn_ids(lease.ticket.episode_uuid, key); });
  std::vector<TokenId> prompt = spliced
                                    ? std::move(*spliced)
                                    : lease.backend->render_chat_with_kwargs(
                                          ordered["messages"], tools, /*add_generation_prompt=*/true, kwargs);
  resolve_output_formats(lease.job, *lease.backend, prompt, options);
  // Structured outputs: a forced tool call wins over response_format.
  if (options.tool_required || !options.forced_tool.empty())
    options.grammar = tool_choice_grammar(tools, options.forced_tool, options.output.tools,
                                          options.output.parallel_tool_calls, *lease.backend);
  else if (ordered.contains("response_format"))
    options.grammar = response_format_grammar(ordered["response_format"]);
  return prompt;
}

// An Anthropic / Responses body in the internal chat form (both key orders), with the notes of
// what was dropped.
struct ConvertedRequest {
  nlohmann::ordered_json original, chat;
  json body;
  std::vector<std::string> notes;
};

// JSON held in string fields of the (chat-form) request: tool-call arguments, which the chat
// splice and the chat template parse. Bounded like the body itself (common/json_nesting.hpp).
void require_json_field_nesting(const json& body) {
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) return;
  for (size_t m = 0; m < messages->size(); ++m) {
    const json& message = (*messages)[m];
    const auto calls = message.is_object() ? message.find("tool_calls") : message.end();
    if (!message.is_object() || calls == message.end() || !calls->is_array()) continue;
    for (size_t c = 0; c < calls->size(); ++c) {
      const json& call = (*calls)[c];
      const auto fn = call.is_object() ? call.find("function") : call.end();
      if (!call.is_object() || fn == call.end() || !fn->is_object()) continue;
      const auto args = fn->find("arguments");
      if (args == fn->end() || !args->is_string()) continue;
      require_json_nesting(
          args->get_ref<const std::string&>(),
          "messages[" + std::to_string(m) + "].tool_calls[" + std::to_string(c) + "].function.arguments");
    }
  }
}

ConvertedRequest convert_request(ApiKind kind, const std::string& text,
                                 AnthropicRoute route = AnthropicRoute::MESSAGES) {
  ConvertedRequest c;
  (void)parse_json_object(text);  // the same checks (size, object) and messages as every route
  c.original = nlohmann::ordered_json::parse(text);
  c.chat = kind == ApiKind::ANTHROPIC_MESSAGES ? anthropic_to_chat(c.original, c.notes, route)
                                               : responses_to_chat(c.original, c.notes);
  c.body = c.chat;  // the same value without key order (no re-parse)
  for (const std::string& note : c.notes)
    spdlog::debug("{}: {}", kind == ApiKind::RESPONSES ? "/v1/responses" : "/v1/messages", note);
  return c;
}

// The request's dialect, made once its options and prompt are known. `c`: the converted
// request of the harness APIs (Responses echoes its fields and notes).
std::unique_ptr<ChatDialect> make_dialect(ApiKind kind, const GenerationLease& lease,
                                          const RequestOptions& options, const std::vector<TokenId>& prompt,
                                          std::optional<ConvertedRequest>& c) {
  const std::string model = lease.backend->model_id();
  if (kind == ApiKind::ANTHROPIC_MESSAGES) return make_anthropic_dialect(model);
  if (kind == ApiKind::RESPONSES) return make_responses_dialect(model, c->original, std::move(c->notes));
  OpenAIDialectOptions o;
  o.model = model;
  o.n = options.params.n;
  o.logprobs = options.params.logprobs;
  o.include_usage = options.include_usage;
  o.return_token_ids = options.return_token_ids;
  if (o.return_token_ids) o.prompt = prompt;
  o.episode_uuid = lease.ticket.episode_uuid;
  o.token_text = [backend = lease.backend](TokenId id) { return backend->token_text(id); };
  return kind == ApiKind::CHAT_COMPLETIONS ? make_chat_completions_dialect(std::move(o))
                                           : make_completions_dialect(std::move(o));
}

// Harnesses ask for 32k-128k max_tokens on every call: the clamp to the job's
// max_response_length is said once at info, then at debug.
void note_clamped_max_tokens(const char* api, const json& body, const RequestOptions& options) {
  const auto asked = optional_int(body, "max_tokens");
  if (!asked || *asked <= options.params.max_tokens) return;
  static std::atomic<bool> told{false};
  if (!told.exchange(true))
    spdlog::info("{}: max_tokens {} clamped to {} (the job's max_response_length; said once)", api, *asked,
                 options.params.max_tokens);
  else
    spdlog::debug("{}: max_tokens {} clamped to {}", api, *asked, options.params.max_tokens);
}

}  // namespace

std::string anthropic_api_key(const HttpRequest& request) {
  const std::string& key = request.header("x-api-key");
  if (!key.empty()) return key;
  SWARM_REQUIRE(
      !request.header("authorization").empty(), ErrorKind::UNAUTHORIZED,
      "missing API key: send 'x-api-key: <openai_api_key>' (or 'Authorization: Bearer ...') as returned by "
      "claim_episode");
  return bearer_key(request);
}

HttpResponse anthropic_count_tokens(Engine& engine, const HttpRequest& request) {
  const std::string api_key = anthropic_api_key(request);
  GenerationLease lease = engine.begin_generation(api_key);
  struct Release {  // counting records no call
    Engine& engine;
    const GenerationLease& lease;
    ~Release() { engine.cancel_generation(lease); }
  } release{engine, lease};
  ConvertedRequest c =
      convert_request(ApiKind::ANTHROPIC_MESSAGES, request.body, AnthropicRoute::COUNT_TOKENS);
  RequestOptions options = parse_options(c.body, ApiKind::CHAT_COMPLETIONS, lease.job);
  const std::vector<TokenId> prompt = chat_prompt(c.body, c.chat, options, lease);
  HttpResponse r;
  r.body = dump_json({{"input_tokens", static_cast<int64_t>(prompt.size())}});
  return r;
}

void serve_generation(Engine& engine, std::shared_ptr<Metrics> metrics, ApiKind kind,
                      const HttpRequest& request, std::shared_ptr<ResponseSink> sink,
                      const OpenAIContext& context) {
  const bool converted = kind == ApiKind::ANTHROPIC_MESSAGES || kind == ApiKind::RESPONSES;
  const bool chat_like = kind != ApiKind::COMPLETIONS;
  const std::string api_key =
      kind == ApiKind::ANTHROPIC_MESSAGES ? anthropic_api_key(request) : bearer_key(request);
  GenerationLease lease = engine.begin_generation(api_key);
  int64_t reserved = 1;
  try {
    // The request in the chat form (chat-like APIs) or as sent (completions).
    json body;
    nlohmann::ordered_json ordered;
    std::optional<ConvertedRequest> c;
    if (converted) {
      c = convert_request(kind, request.body);
      body = std::move(c->body);
      ordered = std::move(c->chat);
    } else {
      body = parse_json_object(request.body);
      if (chat_like) ordered = nlohmann::ordered_json::parse(request.body);
    }
    require_json_field_nesting(body);
    RequestOptions options =
        parse_options(body, chat_like ? ApiKind::CHAT_COMPLETIONS : ApiKind::COMPLETIONS, lease.job);
    options.agent = agent_of(body, request);
    std::vector<TokenId> prompt =
        chat_like ? chat_prompt(body, ordered, options, lease) : completion_prompt(body, *lease.backend);
    if (!lease.job.exchange_url.empty() && lease.job.exchange_publish) {
      if (chat_like) {
        const nlohmann::ordered_json tools =
            ordered.contains("tools") ? ordered["tools"] : nlohmann::ordered_json();
        options.exchange_request =
            std::make_shared<nlohmann::ordered_json>(sapo_chat_request(ordered["messages"], tools));
      } else {
        options.exchange_request =
            std::make_shared<nlohmann::ordered_json>(sapo_prompt_request(spelled(*lease.backend, prompt)));
      }
    }
    SWARM_REQUIRE(static_cast<int64_t>(prompt.size()) <= lease.job.max_prompt_length,
                  ErrorKind::INVALID_ARGUMENT,
                  "prompt is " + std::to_string(prompt.size()) + " tokens; max_prompt_length is " +
                      std::to_string(lease.job.max_prompt_length));
    std::unique_ptr<ChatDialect> dialect = make_dialect(kind, lease, options, prompt, c);
    if (converted) note_clamped_max_tokens(dialect->api(), body, options);
    // Every choice is recorded as its own call: reserve the extra ones now.
    for (; reserved < options.params.n; ++reserved) lease.pool->begin_call(api_key);
    auto handler = std::make_shared<GenerationHandler>(
        std::move(metrics), lease, std::move(sink), std::move(options), std::move(prompt), context,
        chat_like && context.last_chat ? request.body : std::string(), std::move(dialect));
    reserved = 0;  // the handler owns the reservations now
    handler->start();
  } catch (...) {
    for (int64_t i = 0; i < reserved; ++i) engine.cancel_generation(lease);
    throw;
  }
}

}  // namespace swarm
