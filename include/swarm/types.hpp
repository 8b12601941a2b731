// Plain data types shared by the client SDK and the server.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace swarm {

/// A task an agent works on (wire: `task`). Episodes of the same task_id form one GRPO
/// group. `init_messages_json` and `metadata_json` hold JSON text (array / object).
struct Task {
  std::string task_id;
  std::string main_query;
  std::string init_messages_json = "[]";
  std::string env_type;
  std::string metadata_json = "{}";
};

/// The agent's verdict on an episode (wire: `workflow_output`).
/// A train episode needs a reward; a null reward drops the episode from training.
struct WorkflowOutput {
  std::optional<double> reward;
  std::optional<bool> is_success;
  std::string metadata_json = "{}";           // a JSON object, kept as text
  std::map<std::string, double> log_metrics;  // reported as metrics
  /// One reward per LLM call of the episode, in call order (wire: `turn_rewards`, or
  /// AgentJet's list `reward`, whose sum is then the episode's reward). Trained with
  /// `group_by: task_agent_turn` (each call's group compares this number); checked against the
  /// episode's calls at end_episode.
  std::vector<double> turn_rewards;
  /// Optional, per call: one number per completion token of that call (wire: `token_rewards`),
  /// recorded on the samples' tokens (`Sample::token_rewards`) for dense-credit estimators.
  std::vector<std::vector<double>> token_rewards;
  /// Set by the server when turn_rewards came as AgentJet's list `reward`: a list whose length
  /// is not the number of calls then trains on its sum only (no 400, as AgentJet counts turns
  /// its own way).
  bool turn_rewards_from_list = false;
  /// Set by the server from end_episode's `task.metadata` (a JSON object as text; "" = none):
  /// shared with the episode's group over the swarm exchange (docs/sapo.md).
  std::string task_metadata_json;
};

}  // namespace swarm
