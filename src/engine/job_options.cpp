#include "engine/job_options.hpp"

#include <algorithm>
#include <sstream>
#include <utility>

#include "common/error.hpp"

namespace swarm {

PoolConfig pool_config_from(const Job& job) {
  PoolConfig c;
  c.max_parallel_episodes = job.effective_max_parallel_episodes();
  c.batch_size = job.batch_size;
  c.num_repeat = job.num_repeat;
  c.max_cached_episodes = job.effective_max_cached_episodes();
  c.max_llm_calls_per_episode = job.max_llm_calls_per_episode;
  c.max_claimed_per_client = job.max_claimed_per_client;
  if (!parse_collection_method(job.sample_collection_method, &c.method))
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "unknown sample_collection_method");
  return c;
}

ExchangeConfig exchange_config_from(const Job& job, std::string node_id) {
  ExchangeConfig c;
  c.url = job.exchange_url;
  c.credentials_file = job.exchange_credentials;
  c.swarm_name = job.swarm_name;
  c.node_id = std::move(node_id);
  c.publish = job.exchange_publish;
  c.consume = job.exchange_consume;
  c.max_age_seconds = job.exchange_max_age_seconds;
  c.buffer_groups = job.exchange_buffer_groups;
  std::stringstream trusted(job.exchange_trusted_nodes);
  for (std::string id; std::getline(trusted, id, ',');)
    if (!id.empty()) c.trusted_nodes.push_back(id);
  c.max_message_bytes = job.exchange_max_message_bytes;
  return c;
}

TrainerOptions trainer_options_from(const Job& job) {
  TrainerOptions o;
  o.learning_rate = job.learning_rate;
  o.lr_schedule = job.lr_schedule;
  o.lr_warmup_steps = job.lr_warmup_steps;
  o.total_training_steps = job.total_training_steps;
  o.weight_decay = job.weight_decay;
  o.grad_clip = job.grad_clip;
  o.advantage_estimator = parse_advantage_estimator(job.advantage_estimator);
  o.group_by = parse_group_by(job.group_by);
  o.clip_ratio_low = job.clip_ratio_low;
  o.clip_ratio_high = job.clip_ratio_high;
  o.loss_aggregation = parse_loss_aggregation(job.loss_agg_mode);
  o.use_kl_loss = job.use_kl_loss;
  o.kl_coef = job.kl_coef;
  o.kl_estimator = parse_kl_estimator(job.kl_estimator);
  o.ppo_epochs = job.ppo_epochs;
  o.ppo_mini_batch_size = job.ppo_mini_batch_size;
  o.micro_batch_max_tokens = job.micro_batch_max_tokens;
  o.sequence_packing = job.sequence_packing;
  o.sharding.zero_stage = static_cast<int>(job.zero_stage);
  o.sharding.bucket_elements =
      std::max<int64_t>(1, static_cast<int64_t>(job.reduce_bucket_mb * (1 << 20) / 4));
  o.forward.attention = parse_training_attention(job.training_attention);
  // "auto" is resolved where the device is known (the torch backend): false here.
  o.forward.checkpoint_layers = job.gradient_checkpointing == "true";
  o.ppo = job.algorithm == "ppo";
  o.gamma = job.gamma;
  o.lam = job.lam;
  o.critic_learning_rate = job.critic_learning_rate;
  o.cliprange_value = job.cliprange_value;
  o.critic_warmup = job.critic_warmup;
  o.off_policy = parse_off_policy_correction(job.effective_off_policy_correction());
  o.is_cap = job.is_cap;
  return o;
}

ServingConfig serving_config_from(const Job& job, const ServingModelFacts& model) {
  ServingConfig sc;
  sc.block_size = job.kv_block_size;
  sc.max_batch_sequences = job.max_batch_sequences;
  sc.max_step_tokens = job.max_step_tokens;
  sc.prefix_caching = job.prefix_caching;
  sc.max_context = model.max_context;
  sc.eos_token_ids = model.stop_token_ids;
  if (model.tokenizer_eos && std::find(sc.eos_token_ids.begin(), sc.eos_token_ids.end(),
                                       *model.tokenizer_eos) == sc.eos_token_ids.end())
    sc.eos_token_ids.push_back(*model.tokenizer_eos);
  if (job.kv_cache_tokens > 0) {
    sc.kv_cache_tokens = job.kv_cache_tokens;
  } else if (model.device_free_bytes > 0) {
    // A GPU: a share of the memory left once the model and the trainer are in.
    const auto budget =
        static_cast<int64_t>(job.kv_cache_memory_fraction * static_cast<double>(model.device_free_bytes));
    sc.kv_cache_tokens = std::max(model.max_context, budget / std::max<int64_t>(1, model.kv_bytes_per_token));
  } else {
    const int64_t seqs = std::min(job.max_batch_sequences, job.effective_max_parallel_episodes());
    sc.kv_cache_tokens = std::max(
        model.max_context, std::min(seqs * model.max_context,
                                    kAutoKvCacheBytes / std::max<int64_t>(1, model.kv_bytes_per_token)));
  }
  return sc;
}

}  // namespace swarm
