// JSON of GET /get_current_batch_rollout_pool_information (what swarm-overwatch shows).
#pragma once

#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.hpp"

namespace swarm {

/// Our fields plus AgentJet's flat ones (CurrentBatchRolloutPoolInformation: the numbers its
/// client throttles on and its overwatch shows). `config` gives training_model_path.
nlohmann::json pool_information_json(const EngineSnapshot& status, const PoolSnapshot& pool,
                                     const std::vector<TrainStepReport>& steps, const std::optional<Job>& config = {});

}  // namespace swarm
