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
  /// One reward per turn (AgentJet's list `reward`), kept with reward null: the episode is
  /// recorded in the pool information (`turn_reward_episodes`) but not trained on until
  /// per-turn rewards are.
  std::vector<double> turn_rewards;
};

}  // namespace swarm
