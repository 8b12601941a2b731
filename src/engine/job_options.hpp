// A job (swarm/job.hpp) as each component's options: the one place where job keys become the
// settings of the rollout pool, the exchange, the trainer and the serving engine. They live in
// the engine, the lowest layer that sees both the job and every component (src/job/ is below
// the components and is linked by the SDK). No torch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/token_id.hpp"
#include "exchange/exchange.hpp"
#include "inference/serving_engine.hpp"
#include "rollout_pool/rollout_pool.hpp"
#include "swarm/job.hpp"
#include "trainer/trainer_options.hpp"

namespace swarm {

/// The rollout pool: parallel and cached episode bounds, the batch, the collection method.
/// INVALID_ARGUMENT on an unknown sample_collection_method.
PoolConfig pool_config_from(const Job& job);

/// The exchange (exchange_* keys); `node_id` is the job's or one drawn for it.
ExchangeConfig exchange_config_from(const Job& job, std::string node_id);

/// The policy trainer: optimizer, loss, PPO and the off-policy correction (auto resolved by
/// the job), the training forward. gradient_checkpointing "auto" gives false here: the torch
/// backend, which knows the device, turns it on for a GPU. INVALID_ARGUMENT naming an unknown
/// enum value.
TrainerOptions trainer_options_from(const Job& job);

/// What a model and its tokenizer add to the job for the serving engine.
struct ServingModelFacts {
  int64_t max_context = 0;               // min(max_prompt + max_response, the model's positions)
  std::vector<TokenId> stop_token_ids;   // the model's generation config's stop ids
  std::optional<TokenId> tokenizer_eos;  // the tokenizer's end-of-sequence id
  int64_t kv_bytes_per_token = 0;        // KV cache bytes one token takes (all layers)
  int64_t device_free_bytes = 0;         // a GPU's free memory after loading; 0 on the CPU
};

/// The KV cache an automatic size (kv_cache_tokens 0) may take at most: 4 GiB.
inline constexpr int64_t kAutoKvCacheBytes = int64_t{4} << 30;

/// The serving engine: KV blocks, batch bounds, the context, the end-of-sequence ids (the
/// model's stop ids, then the tokenizer's eos when not among them), and the KV cache size
/// (kv_cache_tokens, or automatic: room for min(max_batch_sequences, parallel episodes) full
/// contexts within kAutoKvCacheBytes, never less than one context).
ServingConfig serving_config_from(const Job& job, const ServingModelFacts& model);

}  // namespace swarm
