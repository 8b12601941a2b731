// JSON of GET /get_current_batch_rollout_pool_information (what swarm-overwatch shows).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.hpp"

namespace swarm {

nlohmann::json pool_information_json(const EngineSnapshot& status, const PoolSnapshot& pool,
                                     const std::vector<TrainStepReport>& steps);

}  // namespace swarm
