// JSON of GET /get_current_batch_rollout_pool_information (what swarm-overwatch shows).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.hpp"

namespace swarm {

/// How a client_uuid is shown (the route is open: with a client token configured, non-admin
/// callers see a keyed hash; see SwarmService).
using ClientIdView = std::function<std::string(const std::string&)>;

/// Our fields plus AgentJet's flat ones (CurrentBatchRolloutPoolInformation: the numbers its
/// client throttles on and its overwatch shows). `config` gives training_model_path. Every
/// client_uuid goes through `show_client` (as is when empty).
nlohmann::json pool_information_json(const EngineSnapshot& status, const PoolSnapshot& pool,
                                     const std::vector<TrainStepReport>& steps,
                                     const std::optional<Job>& config = {},
                                     const ClientIdView& show_client = {});

}  // namespace swarm
