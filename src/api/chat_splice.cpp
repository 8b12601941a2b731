#include "api/chat_splice.hpp"

#include <cstdint>
#include <cstdio>

#include "common/json_nesting.hpp"
#include "engine/backend.hpp"

namespace swarm {
namespace {

using ojson = nlohmann::ordered_json;

// Two independent 64-bit FNV-1a streams: a 128-bit key. Collisions only matter within one
// episode (keys are looked up among that episode's calls).
struct Hasher {
  uint64_t a = 0xcbf29ce484222325ull;
  uint64_t b = 0x84222325cbf29ce4ull;
  void bytes(std::string_view s) {
    for (unsigned char c : s) {
      a = (a ^ c) * 0x100000001b3ull;
      b = (b ^ c) * 0x00000100000001b3ull + 0x9e3779b97f4a7c15ull;
    }
  }
  // Length-prefixed, so that ("ab", "c") and ("a", "bc") differ.
  void field(std::string_view s) {
    const std::string n = std::to_string(s.size()) + ":";
    bytes(n);
    bytes(s);
  }
  std::string hex() const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                  static_cast<unsigned long long>(b));
    return buf;
  }
};

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Sorted-key JSON: key order and whitespace do not matter.
std::string canonical(const ojson& j) {
  return nlohmann::json::parse(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string message_key(const ojson& m) {
  if (!m.is_object()) return canonical(m);
  auto role = m.find("role");
  if (role == m.end() || !role->is_string() || *role != "assistant") return canonical(m);
  std::optional<std::string> content;
  if (auto c = m.find("content"); c != m.end() && c->is_string()) content = c->get<std::string>();
  std::vector<ParsedToolCall> calls;
  if (auto tc = m.find("tool_calls"); tc != m.end() && tc->is_array()) {
    for (const auto& call : *tc) {
      ParsedToolCall p;
      const ojson* fn = call.is_object() && call.contains("function") ? &call["function"] : nullptr;
      if (fn && fn->is_object()) {
        if (auto n = fn->find("name"); n != fn->end() && n->is_string()) p.name = n->get<std::string>();
        if (auto a = fn->find("arguments"); a != fn->end())
          p.arguments = a->is_string() ? a->get<std::string>() : a->dump();
      }
      calls.push_back(std::move(p));
    }
  }
  return answer_key(content, calls);
}

}  // namespace

std::string answer_key(const std::optional<std::string>& content,
                       const std::vector<ParsedToolCall>& tool_calls) {
  nlohmann::json calls = nlohmann::json::array();
  for (const auto& c : tool_calls) {
    // Too deep to dump safely (common/json_nesting.hpp): compared as text, like invalid JSON.
    nlohmann::json args = json_nesting_within(c.arguments)
                              ? nlohmann::json::parse(c.arguments, nullptr, /*allow_exceptions=*/false)
                              : nlohmann::json(nlohmann::json::value_t::discarded);
    if (args.is_discarded()) args = nlohmann::json{{"unparsed", c.arguments}};
    calls.push_back({c.name, std::move(args)});
  }
  nlohmann::json key = {
      {"role", "assistant"}, {"content", trim(content.value_or(""))}, {"tool_calls", calls}};
  return key.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {
std::string turn_key(const std::string& prefix, const std::string& answer) {
  Hasher h;
  h.field("turn");
  h.field(prefix);
  h.field(answer);
  return h.hex();
}
}  // namespace

ChatKeys chat_keys(const ojson& messages, const ojson& tools, const ojson& template_kwargs) {
  // The state after messages[0..k) stands for the conversation so far, tools and kwargs included.
  Hasher h;
  h.field(tools.is_null() ? "" : canonical(tools));
  h.field(template_kwargs.is_null() ? "" : canonical(template_kwargs));
  ChatKeys keys;
  if (messages.is_array()) {
    for (const auto& m : messages) {
      const std::string key = message_key(m);
      keys.turn_keys.push_back(turn_key(h.hex(), key));
      h.field(key);
    }
  }
  keys.request_prefix = h.hex();
  return keys;
}

std::string answer_turn_key(const ChatKeys& keys, const std::string& answer) {
  return turn_key(keys.request_prefix, answer);
}

std::optional<std::vector<TokenId>> splice_chat_prompt(const Backend& backend, const ojson& messages,
                                                       const ojson& tools, const ojson& template_kwargs,
                                                       const ChatKeys& keys, const TurnLookup& lookup) {
  // Stands in for the recognised turn's content; found again in the rendered text.
  static const std::string kMarker = "swarm7splice3turn9marker";
  if (!messages.is_array() || keys.turn_keys.size() != messages.size()) return std::nullopt;
  for (size_t k = messages.size(); k-- > 0;) {
    const ojson& m = messages[k];
    if (!m.is_object() || !m.contains("role") || m["role"] != "assistant") continue;
    std::optional<std::vector<TokenId>> ids = lookup(keys.turn_keys[k]);
    if (!ids || ids->empty()) continue;
    ojson probe = messages;
    probe[k] = ojson{{"role", "assistant"}, {"content", kMarker}};
    std::optional<std::string> text;
    try {
      text = backend.render_chat_text(probe, tools, /*add_generation_prompt=*/true, template_kwargs);
    } catch (const std::exception&) {
      return std::nullopt;  // the fresh render says what is wrong, if anything
    }
    if (!text) return std::nullopt;
    const size_t pos = text->find(kMarker);
    // A template that rewrote the content (or printed it twice) gives no place to cut.
    if (pos == std::string::npos || text->find(kMarker, pos + 1) != std::string::npos) return std::nullopt;
    std::string after = text->substr(pos + kMarker.size());
    // The end-of-turn text begins with the stop token the model generated (<|im_end|>,
    // <|eot_id|>): it is in the ids already. A special token is one decode() skips.
    const TokenId last = ids->back();
    const std::string stop = backend.token_text(last);
    if (!stop.empty() && after.compare(0, stop.size(), stop) == 0 && backend.decode({last}).empty())
      after.erase(0, stop.size());
    const std::vector<TokenId> tail = backend.encode_rendered(after);
    ids->insert(ids->end(), tail.begin(), tail.end());
    return ids;
  }
  return std::nullopt;
}

}  // namespace swarm
