// Data that flows from episodes to the trainer. No torch, no HTTP.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/token_id.hpp"
#include "swarm/types.hpp"  // WorkflowOutput

namespace swarm {

/// One LLM request of an episode exactly as the engine saw it: the prompt ids the chat
/// template produced and the completion ids/log-probs the engine sampled.
struct LlmCall {
  std::vector<TokenId> prompt_ids;
  std::vector<TokenId> completion_ids;
  std::vector<float> completion_logprobs;  // same length as completion_ids
  int64_t policy_version = 0;              // version of the weights that generated its first token
  std::string finish_reason;               // "stop" / "length"
  // Chat calls: which answer to which conversation this is (chat_splice.hpp), so that a later
  // request holding this answer continues from these exact ids. Empty otherwise.
  std::string turn_key{};
  // The agent that made the call (request field `swarm.agent` or header `x-swarm-agent`;
  // "" = unnamed), for AT-GRPO grouping (group_by: task_agent_turn).
  std::string agent{};
  // Per completion token, the weights version that sampled it, when they differ (a generation
  // that ran across a weight swap); empty otherwise (all policy_version).
  std::vector<int64_t> completion_versions{};
  // Swarm experience sharing (exchange_publish): the call as text for other nodes, a JSON object
  // (exchange/sapo_message.hpp: messages, tools, completion, text, finish_reason); "" otherwise.
  std::string exchange_record{};
  // The temperature whose distribution `completion_logprobs` were taken from (greedy calls: 1,
  // src/inference/sampler_torch.hpp): the trainer recomputes the log-probs of these tokens under
  // log_softmax(logits / temperature) (docs/concepts.md "Temperature").
  float temperature = 1.0f;
};

/// One LLM call merged into a sample.
struct SampleCall {
  int32_t index = 0;         // the call's position among all calls of its episode (turn_rewards index)
  std::string agent;         // LlmCall::agent
  int32_t turn = 0;          // how many calls of the same agent came before it in the episode
  float temperature = 1.0f;  // LlmCall::temperature: the trainer's log-probs of its tokens use it
};

/// One training sequence (a timeline of an episode).
struct Sample {
  std::string task_id;
  std::string episode_uuid;
  double reward = 0.0;
  std::vector<TokenId> token_ids;
  std::vector<uint8_t> loss_mask;        // 1 on model-generated tokens, 0 elsewhere
  std::vector<float> rollout_logprobs;   // log-prob at sampling time; 0 where mask is 0
  std::vector<int64_t> policy_versions;  // per token; -1 where mask is 0
  int num_calls = 0;                     // LLM calls merged into this timeline
  std::vector<SampleCall> calls;         // those calls, in order
  std::vector<int32_t> token_call;       // per token: index into `calls` where mask is 1, else -1
  std::vector<float> token_rewards;      // per token (workflow_output.token_rewards); empty when none
};

/// A finished episode waiting in the pool for a batch.
struct FinishedEpisode {
  std::string episode_uuid;
  std::string client_uuid;
  std::string task_id;
  double reward = 0.0;
  std::optional<bool> is_success;
  std::map<std::string, double> log_metrics;
  std::string optional_task_id;  // the task the client claimed it for (AgentJet's throttle policy)
  std::vector<Sample> samples;
  std::vector<double> turn_rewards;  // one per LLM call of the episode (call order), or empty
  int64_t finish_seq = 0;            // order of arrival, for the safety valve
  int64_t min_version = -1;          // the oldest weights version that sampled a token of it (-1: none)
  // Swarm experience sharing: LlmCall::exchange_record of each call in order (empty when not
  // publishing, or when a call has none), and workflow_output.metadata as JSON text.
  std::vector<std::string> exchange_calls;
  std::string metadata_json;
  std::string task_metadata_json;  // end_episode's task.metadata, when sharing
  std::string from_node;           // set on groups received from another swarm node ("" = local)
};

/// What WEIGHT_SYNCING trains on.
struct TrainBatch {
  std::vector<FinishedEpisode> episodes;  // grouped by task_id in order of first arrival
  int64_t num_tasks = 0;
  int64_t stale_dropped = 0;  // asynchronous training: episodes dropped as too stale since the last batch
  int64_t num_samples() const {
    int64_t n = 0;
    for (const auto& e : episodes) n += static_cast<int64_t>(e.samples.size());
    return n;
  }
};

/// How the pool decides the batch is complete (docs/design.md).
enum class CollectionMethod {
  ENOUGH_EPISODES,         // rollout_until_finish_enough_episodes
  ENOUGH_TASKS,            // rollout_until_finish_enough_tasks (default)
  ENOUGH_NON_DUMMY_TASKS,  // rollout_until_finish_enough_non_dummy_tasks
  ANY_CLIENT_AGREES,       // rollout_until_any_client_agree_sync_weight
  ALL_CLIENTS_AGREE,       // rollout_until_all_clients_agree_sync_weight
};

/// The agree methods: the batch is complete when active clients agree (agree_sync_weight),
/// and it is every cached finished train episode.
inline bool is_agree_method(CollectionMethod m) {
  return m == CollectionMethod::ANY_CLIENT_AGREES || m == CollectionMethod::ALL_CLIENTS_AGREE;
}

const char* collection_method_name(CollectionMethod m);
/// Parses the wire/config name; returns false if unknown.
bool parse_collection_method(const std::string& name, CollectionMethod* out);

enum class EpisodeType { TRAIN, EVAL };

}  // namespace swarm
