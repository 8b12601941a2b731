// The message a node publishes to the swarm for one trained task group (SAPO, docs/sapo.md):
// every episode as text — the messages the agent sent and the completions (tool calls and
// reasoning included) — so that a node with another tokenizer or chat template can train on it.
// Building, validating and parsing; no NATS, no torch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_nesting.hpp"

namespace swarm {

inline constexpr int kSapoSchemaVersion = 1;

/// One episode of a shared group.
struct SapoEpisode {
  double reward = 0.0;
  /// The calls in order, each an object: chat calls {"messages", "tools"?, "completion",
  /// "text", "finish_reason"}; completion calls {"prompt", "text", "finish_reason"}. `text` is
  /// the generated tokens' text as generated (special tokens spelled out).
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();  // workflow_output.metadata
};

/// The parts of one entry of SapoEpisode::calls, built as the call is answered on the
/// generation path. A chat call's request: {"messages", "tools" (when a non-empty array)}.
nlohmann::ordered_json sapo_chat_request(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools);
/// A completion call's request: {"prompt": the prompt's text}.
nlohmann::ordered_json sapo_prompt_request(std::string prompt_text);
/// The whole entry as JSON text: `request` plus, for chat calls, "completion" (the assistant
/// message the client saw: role, content, reasoning_content, tool_calls; `message` null for
/// completion calls), "text" (the generated tokens' text as generated), "finish_reason" and
/// "temperature" (the distribution the tokens were drawn from, so a receiving node trains
/// them as sampled). Invalid UTF-8 is replaced.
std::string sapo_call_record(nlohmann::ordered_json request, const nlohmann::json& message, std::string text,
                             const std::string& finish_reason, double temperature);

/// One task group as published.
struct SapoGroup {
  std::string node_id;
  std::string run;  // the sender's run: a token drawn when its exchange starts (set by Exchange::publish)
  std::string model;
  int64_t policy_step = 0;  // the weights version that generated it
  double created = 0.0;     // unix seconds when published
  std::string task_id;
  nlohmann::ordered_json task_metadata =
      nlohmann::ordered_json::object();  // the task's metadata, as its client sent it
  std::vector<SapoEpisode> episodes;
};

/// Why a received message was not kept (counted per reason).
enum class SapoDrop {
  MALFORMED,       // not a JSON object, invalid UTF-8, nested deeper than kSapoMaxNesting
  SCHEMA,          // wrong schema version, missing or mistyped field, out-of-range value
  TOO_LARGE,       // over exchange_max_message_bytes
  NON_FINITE,      // a reward that is NaN, infinite or absurdly large
  OWN,             // this node's own group (not an error)
  UNTRUSTED,       // a node outside exchange_trusted_nodes
  SPOOFED,         // node_id differs from the subject it was published on
  STALE,           // older than exchange_max_age_seconds
  ZERO_ADVANTAGE,  // every reward equal: nothing to learn (SAPO's filter)
  NO_ID,           // no Nats-Msg-Id header
  ID_MISMATCH,     // a Nats-Msg-Id other than sapo_message_id() of its own fields
  DUPLICATE,       // a group (node, run, step, task) already accepted, whatever its header
  EVICTED,         // the buffer was full and it was the oldest
  REENCODE,        // this node's template / tokenizer could not encode it, or it is too long
};
inline constexpr int kNumSapoDrops = 14;
const char* sapo_drop_name(SapoDrop d);

/// The deepest nesting a message may have (checked before it is parsed): a request body's
/// bound (common/json_nesting.hpp) plus the levels a message wraps around an episode's calls.
inline constexpr int kSapoMaxNesting = kMaxJsonNesting + 16;

/// How far a message's `created` may be ahead of the receiver's clock (unix seconds): more is
/// dropped as SCHEMA, so a sender cannot dodge exchange_max_age_seconds by dating its groups in
/// the future. Allows for clocks kept by NTP, with a wide margin.
inline constexpr double kSapoMaxClockSkewSeconds = 300.0;

/// Limits a received message must meet.
struct SapoLimits {
  int64_t max_bytes = 1 << 20;
  int64_t max_episodes = 1024;
  int64_t max_calls = 256;      // per episode
  int64_t max_messages = 4096;  // per call
  double max_abs_reward = 1e9;
  /// The receiver's clock (unix seconds): `created` may be at most kSapoMaxClockSkewSeconds
  /// ahead of it. Unset: not checked.
  std::optional<double> now;
};

/// The JSON text of a group (schema kSapoSchemaVersion).
std::string encode_sapo_group(const SapoGroup& group);

/// A parsed message, or why not.
struct SapoParse {
  std::optional<SapoGroup> group;
  SapoDrop drop = SapoDrop::MALFORMED;
  std::string reason;  // human-readable, for the debug log
};
/// Validates everything (sizes, schema, types, finite rewards, UTF-8); never throws.
SapoParse parse_sapo_group(std::string_view payload, const SapoLimits& limits);

/// The group's Nats-Msg-Id, "<node_id>:<run>:<policy_step>:<FNV-1a of task_id, 16 hex digits>":
/// what the sender publishes it under and what a receiver requires (it names the group's
/// identity, so a receiver de-duplicates on it whatever header a copy came with).
std::string sapo_message_id(const SapoGroup& group);

/// Whether every episode has the same reward (no GRPO signal within the group).
bool sapo_zero_advantage(const SapoGroup& group);

/// Valid as a node id or swarm name: 1-64 of [A-Za-z0-9_-].
bool valid_swarm_token(std::string_view s);

}  // namespace swarm
