#include "rollout_pool/types.hpp"

namespace swarm {

const char* collection_method_name(CollectionMethod m) {
  switch (m) {
    case CollectionMethod::ENOUGH_EPISODES:
      return "rollout_until_finish_enough_episodes";
    case CollectionMethod::ENOUGH_TASKS:
      return "rollout_until_finish_enough_tasks";
    case CollectionMethod::ENOUGH_NON_DUMMY_TASKS:
      return "rollout_until_finish_enough_non_dummy_tasks";
    case CollectionMethod::ANY_CLIENT_AGREES:
      return "rollout_until_any_client_agree_sync_weight";
    case CollectionMethod::ALL_CLIENTS_AGREE:
      return "rollout_until_all_clients_agree_sync_weight";
  }
  return "unknown";
}

bool parse_collection_method(const std::string& name, CollectionMethod* out) {
  for (CollectionMethod m : {CollectionMethod::ENOUGH_EPISODES, CollectionMethod::ENOUGH_TASKS,
                             CollectionMethod::ENOUGH_NON_DUMMY_TASKS, CollectionMethod::ANY_CLIENT_AGREES,
                             CollectionMethod::ALL_CLIENTS_AGREE}) {
    if (name == collection_method_name(m)) {
      if (out != nullptr) *out = m;
      return true;
    }
  }
  return false;
}

}  // namespace swarm
