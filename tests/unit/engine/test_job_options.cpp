// The job as each component's options (engine/job_options.hpp): every key lands where it
// should, enum names are parsed (and refused by name), derived values follow their rules.
#include "engine/job_options.hpp"

#include <gtest/gtest.h>

#include "common/error.hpp"

namespace swarm {
namespace {

Job job_with_every_key_off_default() {
  Job j;
  j.model = "m";
  j.batch_size = 5;
  j.num_repeat = 3;
  j.max_parallel_episodes = 40;
  j.max_cached_episodes = 99;
  j.max_llm_calls_per_episode = 7;
  j.max_claimed_per_client = 2;
  j.sample_collection_method = "rollout_until_finish_enough_episodes";
  j.learning_rate = 3e-5;
  j.lr_schedule = "cosine";
  j.lr_warmup_steps = 4;
  j.total_training_steps = 50;
  j.weight_decay = 0.2;
  j.grad_clip = 0.5;
  j.advantage_estimator = "gae";
  j.algorithm = "ppo";
  j.group_by = "task_agent_turn";
  j.clip_ratio_low = 0.1;
  j.clip_ratio_high = 0.3;
  j.loss_agg_mode = "seq-mean-token-mean";
  j.use_kl_loss = true;
  j.kl_coef = 0.02;
  j.kl_estimator = "k1";
  j.ppo_epochs = 2;
  j.ppo_mini_batch_size = 3;
  j.micro_batch_max_tokens = 1024;
  j.gamma = 0.9;
  j.lam = 0.8;
  j.critic_learning_rate = 2e-4;
  j.cliprange_value = 0.3;
  j.critic_warmup = 1;
  j.off_policy_correction = "tis";
  j.is_cap = 3.0;
  j.kv_block_size = 32;
  j.max_batch_sequences = 8;
  j.max_step_tokens = 256;
  j.prefix_caching = false;
  j.kv_cache_memory_fraction = 0.5;
  return j;
}

TEST(JobOptions, PoolTakesTheBoundsTheBatchAndTheMethod) {
  const Job j = job_with_every_key_off_default();
  const PoolConfig c = pool_config_from(j);
  EXPECT_EQ(c.max_parallel_episodes, 40);
  EXPECT_EQ(c.batch_size, 5);
  EXPECT_EQ(c.num_repeat, 3);
  EXPECT_EQ(c.max_cached_episodes, 99);
  EXPECT_EQ(c.max_llm_calls_per_episode, 7);
  EXPECT_EQ(c.max_claimed_per_client, 2);
  EXPECT_EQ(c.method, CollectionMethod::ENOUGH_EPISODES);
  Job bad = j;
  bad.sample_collection_method = "whenever";
  EXPECT_THROW(pool_config_from(bad), SwarmError);
}

TEST(JobOptions, PoolDerivesUnsetBoundsAsTheJobSays) {
  Job j;
  j.model = "m";
  const PoolConfig c = pool_config_from(j);
  EXPECT_EQ(c.max_parallel_episodes, j.effective_max_parallel_episodes());
  EXPECT_EQ(c.max_cached_episodes, j.effective_max_cached_episodes());
}

TEST(JobOptions, ExchangeSplitsTrustedNodesAndKeepsTheNodeId) {
  Job j;
  j.exchange_url = "nats://127.0.0.1:4222";
  j.swarm_name = "s";
  j.exchange_trusted_nodes = "a,,b";
  j.exchange_publish = false;
  j.exchange_buffer_groups = 12;
  j.exchange_max_message_bytes = 4096;
  const ExchangeConfig c = exchange_config_from(j, "node-1");
  EXPECT_EQ(c.url, "nats://127.0.0.1:4222");
  EXPECT_EQ(c.swarm_name, "s");
  EXPECT_EQ(c.node_id, "node-1");
  EXPECT_EQ(c.trusted_nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(c.publish);
  EXPECT_EQ(c.buffer_groups, 12);
  EXPECT_EQ(c.max_message_bytes, 4096);
}

TEST(JobOptions, TrainerTakesEveryLossAndOptimizerKey) {
  const TrainerOptions o = trainer_options_from(job_with_every_key_off_default());
  EXPECT_DOUBLE_EQ(o.learning_rate, 3e-5);
  EXPECT_EQ(o.lr_schedule, "cosine");
  EXPECT_EQ(o.lr_warmup_steps, 4);
  EXPECT_EQ(o.total_training_steps, 50);
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.2);
  EXPECT_DOUBLE_EQ(o.grad_clip, 0.5);
  EXPECT_EQ(o.advantage_estimator, AdvantageEstimator::GAE);
  EXPECT_TRUE(o.ppo);
  EXPECT_EQ(o.group_by, GroupBy::TASK_AGENT_TURN);
  EXPECT_DOUBLE_EQ(o.clip_ratio_low, 0.1);
  EXPECT_DOUBLE_EQ(o.clip_ratio_high, 0.3);
  EXPECT_EQ(o.loss_aggregation, LossAggregation::SEQ_MEAN_TOKEN_MEAN);
  EXPECT_TRUE(o.use_kl_loss);
  EXPECT_DOUBLE_EQ(o.kl_coef, 0.02);
  EXPECT_EQ(o.kl_estimator, KlEstimator::K1);
  EXPECT_EQ(o.ppo_epochs, 2);
  EXPECT_EQ(o.ppo_mini_batch_size, 3);
  EXPECT_EQ(o.micro_batch_max_tokens, 1024);
  EXPECT_DOUBLE_EQ(o.gamma, 0.9);
  EXPECT_DOUBLE_EQ(o.lam, 0.8);
  EXPECT_DOUBLE_EQ(o.critic_learning_rate, 2e-4);
  EXPECT_DOUBLE_EQ(o.cliprange_value, 0.3);
  EXPECT_EQ(o.critic_warmup, 1);
  EXPECT_EQ(o.off_policy, OffPolicyCorrection::TIS);
  EXPECT_DOUBLE_EQ(o.is_cap, 3.0);
  const AdamWOptions a = o.adamw();
  EXPECT_DOUBLE_EQ(a.weight_decay, 0.2);
  EXPECT_DOUBLE_EQ(a.grad_clip, 0.5);
}

TEST(JobOptions, TrainerRefusesUnknownNamesByName) {
  Job j;
  j.model = "m";
  j.kl_estimator = "k9";
  try {
    trainer_options_from(j);
    FAIL() << "expected an error";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("k9"), std::string::npos) << e.what();
  }
}

TEST(JobOptions, ServingAddsTheTokenizersEosOnceAndSizesTheCache) {
  Job j = job_with_every_key_off_default();
  ServingModelFacts m;
  m.max_context = 1000;
  m.stop_token_ids = {2, 7};
  m.tokenizer_eos = 7;
  m.kv_bytes_per_token = 1024;
  ServingConfig c = serving_config_from(j, m);
  EXPECT_EQ(c.block_size, 32);
  EXPECT_EQ(c.max_batch_sequences, 8);
  EXPECT_EQ(c.max_step_tokens, 256);
  EXPECT_FALSE(c.prefix_caching);
  EXPECT_TRUE(serving_config_from(Job{}, m).prefix_caching);  // on by default
  EXPECT_EQ(c.max_context, 1000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<TokenId>{2, 7}));  // 7 is not added twice
  // Automatic: min(8 sequences, 40 parallel episodes) full contexts; 4 GiB allows far more.
  EXPECT_EQ(c.kv_cache_tokens, 8 * 1000);
  m.tokenizer_eos = 9;
  m.kv_bytes_per_token = kAutoKvCacheBytes / 2500;  // room for 2500 tokens only
  c = serving_config_from(j, m);
  EXPECT_EQ(c.eos_token_ids, (std::vector<TokenId>{2, 7, 9}));
  EXPECT_EQ(c.kv_cache_tokens, 2500);
  m.kv_bytes_per_token = kAutoKvCacheBytes / 10;  // less than one context: one context
  EXPECT_EQ(serving_config_from(j, m).kv_cache_tokens, 1000);
  j.kv_cache_tokens = 4096;  // set by the job: taken as it is
  EXPECT_EQ(serving_config_from(j, m).kv_cache_tokens, 4096);
}

// On a GPU (free device memory known) the automatic size is kv_cache_memory_fraction of it,
// at least one context, and no 4 GiB cap.
TEST(JobOptions, OnAGpuTheCacheTakesItsShareOfFreeMemory) {
  Job j = job_with_every_key_off_default();  // fraction 0.5
  ServingModelFacts m;
  m.max_context = 1000;
  m.kv_bytes_per_token = 1024;
  m.device_free_bytes = int64_t{40} << 30;
  EXPECT_EQ(serving_config_from(j, m).kv_cache_tokens, (int64_t{20} << 30) / 1024);
  m.device_free_bytes = 100 * 1024;  // room for 50 tokens: one context instead
  EXPECT_EQ(serving_config_from(j, m).kv_cache_tokens, 1000);
  j.kv_cache_tokens = 4096;
  EXPECT_EQ(serving_config_from(j, m).kv_cache_tokens, 4096);
}

}  // namespace
}  // namespace swarm
