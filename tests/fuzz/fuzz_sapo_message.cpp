// libFuzzer target: a message from another swarm node (SAPO) as arbitrary bytes. The parser
// must never throw (every bad message is a drop with a reason), and what it accepts must keep
// its promises: a valid node id, finite rewards within the bound, at least one episode with at
// least one call, and the same group again after encoding and parsing it back.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "exchange/sapo_message.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  swarm::SapoLimits limits;
  limits.max_bytes = 1 << 20;  // the default exchange_max_message_bytes
  limits.max_episodes = 16;
  limits.max_calls = 8;
  limits.max_messages = 16;
  const std::string_view payload(reinterpret_cast<const char*>(data), size);
  swarm::SapoParse parsed;
  try {
    parsed = swarm::parse_sapo_group(payload, limits);
  } catch (...) {
    std::abort();  // a hostile message must never escape as an exception
  }
  if (!parsed.group) {
    if (parsed.reason.empty()) std::abort();  // every drop says why
    return 0;
  }
  const swarm::SapoGroup& g = *parsed.group;
  if (!swarm::valid_swarm_token(g.node_id) || g.episodes.empty() || g.policy_step < 0) std::abort();
  for (const auto& e : g.episodes) {
    if (!std::isfinite(e.reward) || std::fabs(e.reward) > limits.max_abs_reward) std::abort();
    if (!e.calls.is_array() || e.calls.empty()) std::abort();
  }
  swarm::SapoLimits roomy = limits;
  roomy.max_bytes = 1 << 22;  // re-encoding may escape characters and grow
  const swarm::SapoParse again = swarm::parse_sapo_group(swarm::encode_sapo_group(g), roomy);
  if (!again.group || again.group->node_id != g.node_id || again.group->task_id != g.task_id ||
      again.group->episodes.size() != g.episodes.size())
    std::abort();
  for (size_t i = 0; i < g.episodes.size(); ++i)
    if (again.group->episodes[i].reward != g.episodes[i].reward ||
        again.group->episodes[i].calls != g.episodes[i].calls)
      std::abort();
  return 0;
}
