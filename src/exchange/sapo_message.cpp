#include "exchange/sapo_message.hpp"

#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "common/json_nesting.hpp"

namespace swarm {

const char* sapo_drop_name(SapoDrop d) {
  switch (d) {
    case SapoDrop::MALFORMED:
      return "malformed";
    case SapoDrop::SCHEMA:
      return "schema";
    case SapoDrop::TOO_LARGE:
      return "too_large";
    case SapoDrop::NON_FINITE:
      return "non_finite_reward";
    case SapoDrop::OWN:
      return "own";
    case SapoDrop::UNTRUSTED:
      return "untrusted";
    case SapoDrop::SPOOFED:
      return "spoofed";
    case SapoDrop::STALE:
      return "stale";
    case SapoDrop::ZERO_ADVANTAGE:
      return "zero_advantage";
    case SapoDrop::NO_ID:
      return "no_id";
    case SapoDrop::ID_MISMATCH:
      return "id_mismatch";
    case SapoDrop::DUPLICATE:
      return "duplicate";
    case SapoDrop::EVICTED:
      return "evicted";
    case SapoDrop::REENCODE:
      return "reencode_failed";
  }
  return "unknown";
}

bool valid_swarm_token(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::string sapo_message_id(const SapoGroup& group) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : group.task_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016" PRIx64, h);
  return group.node_id + ":" + group.run + ":" + std::to_string(group.policy_step) + ":" + hash;
}

std::string encode_sapo_group(const SapoGroup& group) {
  nlohmann::ordered_json episodes = nlohmann::ordered_json::array();
  for (const SapoEpisode& e : group.episodes)
    episodes.push_back({{"reward", e.reward}, {"metadata", e.metadata}, {"calls", e.calls}});
  const nlohmann::ordered_json j = {{"schema", kSapoSchemaVersion},
                                    {"kind", "swarm.sapo.group"},
                                    {"node_id", group.node_id},
                                    {"run", group.run},
                                    {"model", group.model},
                                    {"policy_step", group.policy_step},
                                    {"created", group.created},
                                    {"task_id", group.task_id},
                                    {"task_metadata", group.task_metadata},
                                    {"episodes", std::move(episodes)}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

using OJson = nlohmann::ordered_json;

struct Invalid {
  SapoDrop drop;
  std::string reason;
};

[[noreturn]] void invalid(SapoDrop drop, std::string reason) { throw Invalid{drop, std::move(reason)}; }

const OJson& field(const OJson& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) invalid(SapoDrop::SCHEMA, where + " has no '" + key + "'");
  return *it;
}

std::string string_field(const OJson& obj, const char* key, const std::string& where, size_t max_len) {
  const OJson& v = field(obj, key, where);
  if (!v.is_string()) invalid(SapoDrop::SCHEMA, where + "." + key + " must be a string");
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > max_len)
    invalid(SapoDrop::SCHEMA, where + "." + key + " is longer than " + std::to_string(max_len));
  return s;
}

void check_content(const OJson& content, const std::string& where) {
  if (content.is_null() || content.is_string()) return;
  if (!content.is_array())
    invalid(SapoDrop::SCHEMA, where + ".content must be a string, an array of parts or null");
  for (const auto& part : content)
    if (!part.is_object() && !part.is_string())
      invalid(SapoDrop::SCHEMA, where + ".content parts must be objects");
}

void check_message(const OJson& m, const std::string& where, bool completion) {
  if (!m.is_object()) invalid(SapoDrop::SCHEMA, where + " must be an object");
  const std::string role = string_field(m, "role", where, 32);
  if (completion ? role != "assistant"
                 : role != "system" && role != "user" && role != "assistant" && role != "tool" &&
                       role != "developer")
    invalid(SapoDrop::SCHEMA, where + ".role '" + role + "' is not allowed");
  if (auto c = m.find("content"); c != m.end()) check_content(*c, where);
  if (auto t = m.find("tool_calls"); t != m.end() && !t->is_null()) {
    if (!t->is_array()) invalid(SapoDrop::SCHEMA, where + ".tool_calls must be an array");
    for (const auto& call : *t) {
      if (!call.is_object()) invalid(SapoDrop::SCHEMA, where + ".tool_calls entries must be objects");
      const OJson& fn = field(call, "function", where + ".tool_calls[]");
      if (!fn.is_object()) invalid(SapoDrop::SCHEMA, where + ".tool_calls[].function must be an object");
      string_field(fn, "name", where + ".tool_calls[].function", 256);
      const OJson& args = field(fn, "arguments", where + ".tool_calls[].function");
      if (!args.is_string() && !args.is_object())
        invalid(SapoDrop::SCHEMA, where + ".tool_calls[].function.arguments must be a string");
    }
  }
  for (const char* key : {"reasoning_content", "reasoning", "name", "tool_call_id"})
    if (auto r = m.find(key); r != m.end() && !r->is_null() && !r->is_string())
      invalid(SapoDrop::SCHEMA, where + "." + key + " must be a string");
}

// A call's sampling temperature: the OpenAI routes' range, less what samples greedily (a greedy
// call records 1; src/inference/generation.hpp).
constexpr double kMinSapoTemperature = 1e-5, kMaxSapoTemperature = 2.0;

void check_call(const OJson& call, const std::string& where, const SapoLimits& limits) {
  if (!call.is_object()) invalid(SapoDrop::SCHEMA, where + " must be an object");
  string_field(call, "text", where, static_cast<size_t>(limits.max_bytes));
  if (auto f = call.find("finish_reason"); f != call.end() && !f->is_string())
    invalid(SapoDrop::SCHEMA, where + ".finish_reason must be a string");
  if (auto t = call.find("temperature"); t != call.end() && !t->is_null() &&
                                         (!t->is_number() || !(t->get<double>() >= kMinSapoTemperature) ||
                                          t->get<double>() > kMaxSapoTemperature))
    invalid(SapoDrop::SCHEMA, where + ".temperature must be a number in [1e-5, 2]");
  if (call.contains("messages")) {
    const OJson& messages = call["messages"];
    if (!messages.is_array() || messages.empty())
      invalid(SapoDrop::SCHEMA, where + ".messages must be a non-empty array");
    if (static_cast<int64_t>(messages.size()) > limits.max_messages)
      invalid(SapoDrop::SCHEMA,
              where + ".messages has more than " + std::to_string(limits.max_messages) + " messages");
    for (size_t i = 0; i < messages.size(); ++i)
      check_message(messages[i], where + ".messages[" + std::to_string(i) + "]", false);
    check_message(field(call, "completion", where), where + ".completion", true);
    if (auto t = call.find("tools"); t != call.end() && !t->is_null()) {
      if (!t->is_array()) invalid(SapoDrop::SCHEMA, where + ".tools must be an array");
      for (const auto& tool : *t)
        if (!tool.is_object()) invalid(SapoDrop::SCHEMA, where + ".tools entries must be objects");
    }
  } else {
    string_field(call, "prompt", where, static_cast<size_t>(limits.max_bytes));
  }
}

}  // namespace

SapoParse parse_sapo_group(std::string_view payload, const SapoLimits& limits) {
  SapoParse out;
  if (static_cast<int64_t>(payload.size()) > limits.max_bytes) {
    out.drop = SapoDrop::TOO_LARGE;
    out.reason = std::to_string(payload.size()) + " bytes is over " + std::to_string(limits.max_bytes);
    return out;
  }
  if (json_nesting_depth(payload, kSapoMaxNesting) > kSapoMaxNesting) {  // before anything recurses on it
    out.drop = SapoDrop::MALFORMED;
    out.reason = "nested deeper than " + std::to_string(kSapoMaxNesting) + " levels";
    return out;
  }
  OJson j;
  try {
    j = OJson::parse(payload.begin(), payload.end());  // rejects invalid UTF-8
  } catch (const std::exception& e) {
    out.drop = SapoDrop::MALFORMED;
    out.reason = e.what();
    return out;
  }
  try {
    if (!j.is_object()) invalid(SapoDrop::MALFORMED, "the message is not a JSON object");
    const OJson& schema = field(j, "schema", "message");
    if (!schema.is_number_integer() || schema.get<int64_t>() != kSapoSchemaVersion)
      invalid(SapoDrop::SCHEMA,
              "schema version " + schema.dump() + " is not " + std::to_string(kSapoSchemaVersion));
    SapoGroup g;
    g.node_id = string_field(j, "node_id", "message", 64);
    if (!valid_swarm_token(g.node_id))
      invalid(SapoDrop::SCHEMA, "node_id '" + g.node_id + "' is not a valid id");
    g.run = string_field(j, "run", "message", 64);
    if (!valid_swarm_token(g.run)) invalid(SapoDrop::SCHEMA, "run '" + g.run + "' is not a valid id");
    g.model = string_field(j, "model", "message", 512);
    g.task_id = string_field(j, "task_id", "message", 1024);
    if (auto tm = j.find("task_metadata"); tm != j.end() && !tm->is_null()) {
      if (!tm->is_object()) invalid(SapoDrop::SCHEMA, "task_metadata must be an object");
      g.task_metadata = *tm;
    }
    const OJson& step = field(j, "policy_step", "message");
    if (!step.is_number_integer() || step.get<int64_t>() < 0)
      invalid(SapoDrop::SCHEMA, "policy_step must be an integer >= 0");
    g.policy_step = step.get<int64_t>();
    const OJson& created = field(j, "created", "message");
    if (!created.is_number() || !std::isfinite(created.get<double>()))
      invalid(SapoDrop::SCHEMA, "created must be a finite number (unix seconds)");
    g.created = created.get<double>();
    if (limits.now && g.created - *limits.now > kSapoMaxClockSkewSeconds) {
      char ahead[96];
      std::snprintf(ahead, sizeof ahead, "created is %.0f s ahead of this node's clock (at most %.0f s)",
                    g.created - *limits.now, kSapoMaxClockSkewSeconds);
      invalid(SapoDrop::SCHEMA, ahead);
    }
    const OJson& episodes = field(j, "episodes", "message");
    if (!episodes.is_array() || episodes.empty())
      invalid(SapoDrop::SCHEMA, "episodes must be a non-empty array");
    if (static_cast<int64_t>(episodes.size()) > limits.max_episodes)
      invalid(SapoDrop::SCHEMA, "more than " + std::to_string(limits.max_episodes) + " episodes");
    for (size_t e = 0; e < episodes.size(); ++e) {
      const std::string where = "episodes[" + std::to_string(e) + "]";
      const OJson& ep = episodes[e];
      if (!ep.is_object()) invalid(SapoDrop::SCHEMA, where + " must be an object");
      SapoEpisode out_ep;
      const OJson& reward = field(ep, "reward", where);
      if (!reward.is_number()) invalid(SapoDrop::SCHEMA, where + ".reward must be a number");
      out_ep.reward = reward.get<double>();
      if (!std::isfinite(out_ep.reward) || std::fabs(out_ep.reward) > limits.max_abs_reward)
        invalid(SapoDrop::NON_FINITE,
                where + ".reward is not a finite number within +-" + std::to_string(limits.max_abs_reward));
      const OJson& calls = field(ep, "calls", where);
      if (!calls.is_array() || calls.empty())
        invalid(SapoDrop::SCHEMA, where + ".calls must be a non-empty array");
      if (static_cast<int64_t>(calls.size()) > limits.max_calls)
        invalid(SapoDrop::SCHEMA, where + " has more than " + std::to_string(limits.max_calls) + " calls");
      for (size_t c = 0; c < calls.size(); ++c)
        check_call(calls[c], where + ".calls[" + std::to_string(c) + "]", limits);
      out_ep.calls = calls;
      if (auto m = ep.find("metadata"); m != ep.end() && !m->is_null()) {
        if (!m->is_object()) invalid(SapoDrop::SCHEMA, where + ".metadata must be an object");
        out_ep.metadata = *m;
      }
      g.episodes.push_back(std::move(out_ep));
    }
    out.group = std::move(g);
  } catch (const Invalid& bad) {
    out.drop = bad.drop;
    out.reason = bad.reason;
  } catch (const std::exception& e) {  // a type error nlohmann raises on an unexpected shape
    out.drop = SapoDrop::SCHEMA;
    out.reason = e.what();
  }
  return out;
}

bool sapo_zero_advantage(const SapoGroup& group) {
  for (const SapoEpisode& e : group.episodes)
    if (e.reward != group.episodes.front().reward) return false;
  return true;
}

nlohmann::ordered_json sapo_chat_request(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools) {
  nlohmann::ordered_json request = nlohmann::ordered_json::object();
  request["messages"] = messages;
  if (tools.is_array() && !tools.empty()) request["tools"] = tools;
  return request;
}

nlohmann::ordered_json sapo_prompt_request(std::string prompt_text) {
  nlohmann::ordered_json request = nlohmann::ordered_json::object();
  request["prompt"] = std::move(prompt_text);
  return request;
}

std::string sapo_call_record(nlohmann::ordered_json request, const nlohmann::json& message, std::string text,
                             const std::string& finish_reason, double temperature) {
  if (message.is_object()) {
    nlohmann::ordered_json completion = {{"role", "assistant"}, {"content", message.at("content")}};
    if (message.contains("reasoning_content"))
      completion["reasoning_content"] = message.at("reasoning_content");
    if (message.contains("tool_calls")) completion["tool_calls"] = message.at("tool_calls");
    request["completion"] = std::move(completion);
  }
  request["text"] = std::move(text);
  request["finish_reason"] = finish_reason;
  request["temperature"] = temperature;
  return request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace swarm
