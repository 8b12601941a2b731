// The training job configuration: what a client syncs to the server as YAML.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace swarm {

/// What loading a config did (Job::from_yaml's optional report): its format and, for
/// AgentJet's nested config, how each key was treated (docs/agentjet.md).
struct JobConfigReport {
  std::string format = "swarm";  // "swarm" (our flat keys) or "agentjet" (an `ajet:` tree)
  struct Mapped {
    std::string from;   // where the value was read, e.g. "ajet.data.train_batch_size"
    std::string to;     // our key, e.g. "batch_size"
    std::string value;  // the value set, as YAML text
    std::string type;   // our key's type: "int", "float", "string" or "bool"
  };
  std::vector<Mapped> mapped;
  std::vector<std::string> ignored;   // paths read and not used (whole sections by name)
  std::vector<std::string> warnings;  // values not honoured, or honoured differently
};

/// A training job (docs/design.md). Field names are the YAML keys; every field has a default
/// except `model`. Build one in code, dump it to YAML, or load it from YAML.
/// Plain value type; not synchronised.
struct Job {
  // --- identity
  std::string algorithm = "grpo";
  std::string project_name = "swarm";
  std::string experiment_name = "default";
  std::string experiment_dir = "./experiments";
  std::string model;  // HF model directory (any name with the mock engine)
  // --- batch and rollout pool
  int64_t batch_size = 32;
  int64_t num_repeat = 4;
  std::string sample_collection_method = "rollout_until_finish_enough_tasks";
  double agree_sync_min_seconds = 6.0;  // agree methods: least time out of ROLLING per sync
  int64_t max_parallel_episodes = 0;    // 0 = 2 × batch_size × num_repeat
  int64_t max_cached_episodes = 0;      // 0 = 4 × batch_size × num_repeat
  int64_t max_llm_calls_per_episode = 256;
  int64_t max_claimed_per_client = 0;  // unfinished episodes one client_uuid may hold; 0 = no bound
  // --- lengths and sampling defaults
  int64_t max_prompt_length = 2048;
  int64_t max_response_length = 1024;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = -1;
  // --- chat output parsing (docs/openai_api.md)
  std::string tool_call_parser = "auto";  // auto | hermes | llama3_json | none
  std::string reasoning_parser = "auto";  // auto | think | none
  bool exact_history_tokens = true;       // splice a conversation's generated ids (docs/openai_api.md)
  bool record_samples = false;            // append every trained sample to <experiment>/samples.jsonl
  // --- optimisation
  double learning_rate = 1e-6;
  std::string lr_schedule = "constant";
  int64_t lr_warmup_steps = 0;
  double weight_decay = 0.01;
  double grad_clip = 1.0;
  std::string advantage_estimator = "grpo";
  std::string group_by = "task";  // task | task_agent_turn (AT-GRPO)
  double clip_ratio_low = 0.2;
  double clip_ratio_high = 0.28;
  std::string loss_agg_mode = "token-mean";
  bool use_kl_loss = false;
  double kl_coef = 0.001;
  std::string kl_estimator = "k3";
  // --- PPO with a critic (algorithm: ppo, advantage_estimator: gae; docs/concepts.md)
  double gamma = 1.0;  // GAE discount
  double lam = 1.0;    // GAE lambda
  double critic_learning_rate = 1e-5;
  double cliprange_value = 0.5;  // clipped value loss
  int64_t critic_warmup = 0;     // policy steps that train only the critic
  std::string critic_model;      // "" = a value head on a copy of the policy's trunk
  int64_t ppo_epochs = 1;
  int64_t ppo_mini_batch_size = 0;  // tasks per mini-batch; 0 = the whole batch
  int64_t micro_batch_max_tokens = 8192;
  bool sequence_packing = true;
  std::string training_attention = "auto";             // auto | blockwise | eager
  std::string gradient_checkpointing = "auto";         // auto (true on a GPU) | true | false
  int64_t zero_stage = 2;                              // 1: fp32 gradients whole per rank; 2: sharded
  double reduce_bucket_mb = 64.0;                      // fp32 MiB of one gradient bucket (zero_stage 2)
  std::string free_kv_cache_during_training = "auto";  // auto (on a GPU at max_staleness 0) | true | false
  std::string dtype = "fp32";
  int64_t seed = 42;
  int64_t total_training_steps = 0;  // 0 = until stopped
  // --- asynchronous training (docs/concepts.md "Asynchronous training")
  int64_t max_staleness = 0;                   // η: 0 = synchronous (stop the world per step)
  std::string off_policy_correction = "auto";  // auto | none | tis | decoupled
  double is_cap = 2.0;                         // importance-weight cap (tis, decoupled)
  std::string kv_cache_on_swap = "keep";       // keep | recompute (in-flight sequences at a swap)
  int64_t save_freq = 0;                       // 0 = checkpoint only on stop
  bool resume = false;                         // start_engine continues the experiment's latest checkpoint
  // --- durability (docs/reliability.md)
  bool durable_episodes =
      true;                   // finished episodes in <experiment>/episodes.sqlite before end_episode answers
  bool durable_fsync = true;  // fsync every commit (survives a power cut); false: survives a crash only
  // --- swarm experience sharing over NATS JetStream (SAPO; docs/sapo.md)
  std::string exchange_url;                      // "" = off; nats://host:4222 (tls://, user:pass@ in the URL)
  std::string exchange_credentials;              // NATS .creds file (JWT + nkey seed); "" = none
  std::string swarm_name = "default";            // namespaces the subjects and names the stream
  std::string node_id;                           // "" = a random id kept in the experiment directory
  bool exchange_publish = true;                  // publish this node's train groups
  bool exchange_consume = true;                  // receive the other nodes' groups
  int64_t sapo_external_groups = 0;              // J: external groups added to each policy step
  double exchange_max_age_seconds = 600.0;       // older groups are neither kept nor trained
  int64_t exchange_buffer_groups = 256;          // received groups held at most (oldest dropped)
  std::string exchange_trusted_nodes;            // comma-separated node ids; "" = every node
  int64_t exchange_max_message_bytes = 1048576;  // larger groups are neither published nor accepted
  // --- torch inference engine (ignored by the mock engine)
  int64_t engine_threads = 0;             // intra-op compute threads; 0 = every online CPU
  std::string device = "auto";            // auto | cpu | cuda (torch engine)
  int64_t kv_cache_tokens = 0;            // KV cache size in tokens; 0 = automatic
  int64_t kv_block_size = 16;             // tokens per KV cache block
  bool prefix_caching = true;             // share KV blocks of equal prefixes (docs/concepts.md)
  double kv_cache_memory_fraction = 0.3;  // on a GPU, kv_cache_tokens 0: this share of free memory
  int64_t max_batch_sequences = 64;       // sequences in one forward step
  int64_t max_step_tokens = 512;          // tokens in one forward step (decode + prefill chunks)
  // --- mock engine (ignored by the torch engine)
  double mock_boot_seconds = 0.0;
  double mock_train_seconds = 0.0;

  /// Loads a job from YAML text: our flat keys, or AgentJet's nested config (a top-level
  /// `ajet:` mapping; see docs/agentjet.md). Unknown flat keys, wrong types, invalid values
  /// and AgentJet settings that cannot be honoured throw swarm::ConfigError naming the key.
  /// Missing keys keep their defaults. `report`, when given, says what was mapped/ignored.
  static Job from_yaml(const std::string& yaml_text, JobConfigReport* report = nullptr);
  /// Loads from a YAML file (ConfigError if unreadable or invalid).
  static Job load(const std::string& path);
  /// Loads a file that is one layer of a job (a program's flags go on top of it): every key is
  /// read and type-checked as load() does, but the job as a whole is not validated (a missing
  /// `model`, limits that only hold with the flags): call validate() once everything is merged.
  /// An AgentJet config is validated as a whole all the same.
  static Job load_layer(const std::string& path);
  /// Every key with its value, in a stable order.
  std::string to_yaml() const;
  /// Writes to_yaml() to a file (ConfigError on I/O failure).
  void dump(const std::string& path) const;
  /// Throws ConfigError naming the first invalid key.
  void validate() const;

  /// `max_parallel_episodes` with its default applied.
  int64_t effective_max_parallel_episodes() const;
  /// `max_cached_episodes` with its default applied.
  int64_t effective_max_cached_episodes() const;
  /// off_policy_correction with `auto` resolved: none when synchronous, tis otherwise.
  std::string effective_off_policy_correction() const;

  /// Description of one configuration key, for docs and `--help`.
  struct FieldInfo {
    std::string key;
    std::string type;           // "int", "float", "string", "bool"
    std::string default_value;  // as YAML text
    std::string doc;
  };
  /// All keys, in the order to_yaml() writes them.
  static std::vector<FieldInfo> fields();
};

}  // namespace swarm
