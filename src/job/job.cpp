#include "swarm/job.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "common/json_nesting.hpp"
#include "job/agentjet_config.hpp"
#include "job/job_keys.hpp"
#include "swarm/errors.hpp"

#include <spdlog/spdlog.h>

namespace swarm {
namespace {

using Member = std::variant<std::string Job::*, int64_t Job::*, double Job::*, bool Job::*>;

struct Field {
  const char* key;
  Member member;
  const char* doc;
};

// The single source of truth for every key: load, dump, validation and docs use it.
const std::vector<Field>& field_table() {
  static const std::vector<Field> table = {
      {"project_name", &Job::project_name, "Project name (names the experiment directory)."},
      {"experiment_name", &Job::experiment_name, "Experiment name (names the experiment directory)."},
      {"experiment_dir", &Job::experiment_dir,
       "Root directory for metrics, checkpoints and logs: "
       "<experiment_dir>/<project_name>/<experiment_name>."},
      {"model", &Job::model, "Hugging Face model directory (required; any name with the mock engine)."},
      {"batch_size", &Job::batch_size, "Tasks per policy step."},
      {"num_repeat", &Job::num_repeat, "Episodes per task: the GRPO group size."},
      {"sample_collection_method", &Job::sample_collection_method,
       "When the batch is complete: rollout_until_finish_enough_episodes, "
       "rollout_until_finish_enough_tasks, rollout_until_finish_enough_non_dummy_tasks, "
       "rollout_until_any_client_agree_sync_weight, rollout_until_all_clients_agree_sync_weight "
       "(the agree methods train every finished episode once one / every active client has "
       "called agree_sync_weight; batch_size is then only a display target)."},
      {"agree_sync_min_seconds", &Job::agree_sync_min_seconds,
       "Agree methods only: after an agreement the engine stays out of ROLLING at least this "
       "long, so that clients sampling the state every few seconds (AgentJet's waits every 5 s) "
       "see ROLLING_POST or WEIGHT_SYNCING."},
      {"max_parallel_episodes", &Job::max_parallel_episodes,
       "Claimable episode slots; 0 means 2 x batch_size x num_repeat."},
      {"max_cached_episodes", &Job::max_cached_episodes,
       "Safety valve: finished episodes cached before the oldest incomplete task groups are "
       "dropped; 0 means 4 x batch_size x num_repeat."},
      {"max_claimed_per_client", &Job::max_claimed_per_client,
       "Unfinished episodes one client (client_uuid) may hold at once; a claim beyond it is refused with a "
       "fail_cause saying so, so one client cannot hoard the slots. 0 = no bound (a client with many workers "
       "under one client_uuid, like train_agent, holds many)."},
      {"max_llm_calls_per_episode", &Job::max_llm_calls_per_episode,
       "LLM requests one episode may make (bounds memory)."},
      {"max_prompt_length", &Job::max_prompt_length, "Longest prompt in tokens; longer requests get 400."},
      {"max_response_length", &Job::max_response_length, "Default and maximum max_tokens of a completion."},
      {"temperature", &Job::temperature, "Default sampling temperature when a request gives none."},
      {"top_p", &Job::top_p, "Default nucleus sampling threshold."},
      {"top_k", &Job::top_k, "Default top-k; -1 disables."},
      {"tool_call_parser", &Job::tool_call_parser,
       "How tool calls are read from generated chat text: hermes (<tool_call>{json}</tool_call>, "
       "Qwen), llama3_json (Llama 3 JSON calls), none (left in content), or auto (from the chat "
       "template)."},
      {"reasoning_parser", &Job::reasoning_parser,
       "How reasoning is split from chat answers: think (<think>...</think> into "
       "reasoning_content), none, or auto (think when the chat template uses it)."},
      {"exact_history_tokens", &Job::exact_history_tokens,
       "Chat requests whose history holds assistant turns this episode generated continue from "
       "the exact ids generated (only what the agent added after them is rendered), so a "
       "conversation trains as one sample whatever its SDK re-serialized; false renders every "
       "request afresh from its messages."},
      {"record_samples", &Job::record_samples,
       "Append every sample a policy step trains on (token ids, loss mask, log-probs, reward) to "
       "<experiment dir>/samples.jsonl, to inspect what is trained."},
      {"learning_rate", &Job::learning_rate,
       "AdamW learning rate. The default (1e-6) suits fine-tuning a pretrained model; a tiny model trained "
       "from random weights needs about 5e-4 (examples/configs/tiny-char.yaml)."},
      {"lr_schedule", &Job::lr_schedule, "constant, or cosine (after lr_warmup_steps of linear warm-up)."},
      {"lr_warmup_steps", &Job::lr_warmup_steps, "Linear warm-up steps."},
      {"weight_decay", &Job::weight_decay, "AdamW weight decay."},
      {"grad_clip", &Job::grad_clip, "Gradient norm clipping; 0 disables."},
      {"advantage_estimator", &Job::advantage_estimator,
       "grpo, grpo_no_std (Dr.GRPO), reinforce_baseline, or gae (per-token generalised advantage estimation "
       "from "
       "the critic; algorithm: ppo)."},
      {"group_by", &Job::group_by,
       "What a GRPO group is: task (every sample of a task, on the episode reward) or task_agent_turn "
       "(AT-GRPO: "
       "the calls of one task, one agent, one turn index, on workflow_output.turn_rewards)."},
      {"clip_ratio_low", &Job::clip_ratio_low, "PPO clip epsilon below 1."},
      {"clip_ratio_high", &Job::clip_ratio_high, "PPO clip epsilon above 1."},
      {"loss_agg_mode", &Job::loss_agg_mode, "token-mean or seq-mean-token-mean."},
      {"use_kl_loss", &Job::use_kl_loss, "Add a KL penalty to a frozen reference model."},
      {"kl_coef", &Job::kl_coef, "KL penalty coefficient (when use_kl_loss)."},
      {"kl_estimator", &Job::kl_estimator, "k1 or k3."},
      {"algorithm", &Job::algorithm,
       "grpo (group-relative advantages, no critic) or ppo (a value model trained beside the policy; needs "
       "advantage_estimator: gae)."},
      {"gamma", &Job::gamma, "PPO: GAE discount over generated tokens, in [0, 1]."},
      {"lam", &Job::lam, "PPO: GAE lambda, in [0, 1]."},
      {"critic_learning_rate", &Job::critic_learning_rate, "PPO: the critic's AdamW learning rate."},
      {"cliprange_value", &Job::cliprange_value,
       "PPO: how far a value may move from the value at rollout time before its loss is clipped."},
      {"critic_warmup", &Job::critic_warmup, "PPO: the first N policy steps train the critic only."},
      {"critic_model", &Job::critic_model,
       "PPO: the critic's trunk, a Hugging Face model directory with the policy's vocabulary; empty means a "
       "copy "
       "of the policy's own trunk. A value head (zero at the start) reads its last hidden state."},
      {"ppo_epochs", &Job::ppo_epochs, "Passes over each batch."},
      {"ppo_mini_batch_size", &Job::ppo_mini_batch_size,
       "Tasks per optimizer step within a batch; 0 means the whole batch."},
      {"micro_batch_max_tokens", &Job::micro_batch_max_tokens,
       "Token budget of one forward/backward micro-batch (bounds memory)."},
      {"sequence_packing", &Job::sequence_packing,
       "Pack a micro-batch's samples end to end into one row of at most micro_batch_max_tokens tokens "
       "(no padding; attention and positions stay within each sample; the step's padding_fraction is "
       "then 0); false pads each micro-batch's rows to its longest sample."},
      {"training_attention", &Job::training_attention,
       "Attention of the training forward: auto (scaled_dot_product_attention on a GPU with libtorch "
       "2.x, the blockwise kernel elsewhere and for windowed layers), blockwise (online softmax over "
       "blocks of 512 tokens: memory grows with the sequence, not its square), or eager (the plain "
       "formula: [heads, T, T] scores and probabilities per layer)."},
      {"gradient_checkpointing", &Job::gradient_checkpointing,
       "Keep only each decoder layer's input in the forward and recompute its activations in the "
       "backward (activation memory: about one layer's worth plus the layers' inputs, for about a "
       "third more compute): auto (true on a GPU, false on the CPU), true or false."},
      {"zero_stage", &Job::zero_stage,
       "How the trainer shards over ranks (--nproc/--nnodes): 1 splits the fp32 master weights and AdamW "
       "moments, each rank keeping a whole fp32 gradient buffer reduce-scattered at the optimizer step; 2 "
       "(default) also splits the gradients, reduce-scattered bucket by bucket while the backward runs (a "
       "rank holds 1/N of them plus one bucket). The same on one rank."},
      {"reduce_bucket_mb", &Job::reduce_bucket_mb,
       "zero_stage 2: fp32 MiB of gradient per bucket (all ranks' pieces together); smaller buckets hold "
       "less memory and cost more collectives. A checkpoint resumes under other zero_stage and "
       "reduce_bucket_mb values (its optimizer state is re-cut at boot)."},
      {"free_kv_cache_during_training", &Job::free_kv_cache_during_training,
       "Free the serving KV cache's memory for each training step and allocate it again after the weight "
       "sync (synchronous training only: generation waits meanwhile, and sequences running then are "
       "prefilled again): auto (true on a GPU when max_staleness is 0), true (needs max_staleness: 0) "
       "or false."},
      {"dtype", &Job::dtype,
       "Compute precision: fp32, bf16, or auto (bf16 on a GPU and on CPUs with AVX512_BF16, fp32 on other "
       "CPUs; the engine log says what it chose and why). bf16 keeps fp32 master weights for training."},
      {"seed", &Job::seed, "Random seed for sampling and initialisation."},
      {"total_training_steps", &Job::total_training_steps, "Stop after this many policy steps; 0 = never."},
      {"save_freq", &Job::save_freq, "Checkpoint every N steps; 0 = only on stop_engine."},
      {"resume", &Job::resume,
       "start_engine continues the experiment's latest checkpoint (weights, optimizer, step, counters, "
       "stored episodes) when it has one; false starts a fresh run from model, and the experiment "
       "directory's earlier run is kept in <experiment dir>/runs/<run id>/. start_engine {\"resume\": true} "
       "asks for the same once."},
      {"durable_episodes", &Job::durable_episodes,
       "Store every finished train episode in <experiment dir>/episodes.sqlite (SQLite, WAL) before "
       "end_episode "
       "answers success; a restart of the experiment (swarm-server start --resume) trains on those not yet "
       "trained, so a crash loses nothing acknowledged. Records go once a checkpoint holds their step."},
      {"durable_fsync", &Job::durable_fsync,
       "With durable_episodes: fsync every commit, so acknowledged episodes survive a power cut; false keeps "
       "them through a crash or kill -9 of the server only (faster on slow disks). Concurrent end_episode "
       "calls share a commit."},
      {"max_staleness", &Job::max_staleness,
       "Asynchronous training: 0 trains synchronously (collection stops while the trainer updates); N >= 1 "
       "keeps "
       "agents generating while the trainer works, and no token trains in step v+1 that weights older than v "
       "- N "
       "generated (new episodes wait when they could not meet that; one that finishes too stale anyway is "
       "dropped and counted). Needs a task or episode collection method."},
      {"off_policy_correction", &Job::off_policy_correction,
       "How tokens sampled by older weights are corrected: none, tis (truncated importance sampling: each "
       "token's loss times min(pi_old / pi_behaviour, is_cap)), decoupled (AReaL's decoupled PPO: clipped "
       "around "
       "the recomputed proximal policy, weighted by pi_prox / pi_behaviour, tokens above is_cap left out), "
       "or auto "
       "(none when max_staleness is 0, tis otherwise: the best of the three in the learning runs, "
       "docs/concepts.md)."},
      {"is_cap", &Job::is_cap, "The importance-weight cap of tis and decoupled (>= 1)."},
      {"kv_cache_on_swap", &Job::kv_cache_on_swap,
       "Asynchronous training, torch engine: what happens to a sequence generating when new weights go in: "
       "keep "
       "(its KV cache stays; later tokens attend to keys the old weights computed) or recompute (its tokens "
       "so "
       "far are prefilled again with the new weights)."},
      {"exchange_url", &Job::exchange_url,
       "Swarm experience sharing (SAPO, docs/sapo.md): the NATS server of the swarm, e.g. "
       "nats://127.0.0.1:4222 "
       "(nats://user:password@host:4222 or tls://host:4222 for a public broker); empty turns sharing off."},
      {"exchange_credentials", &Job::exchange_credentials,
       "A NATS credentials file (.creds: user JWT and nkey seed) for the exchange; empty = none (or what the "
       "URL "
       "holds)."},
      {"swarm_name", &Job::swarm_name,
       "The swarm this node joins: its subjects are swarm.<swarm_name>.groups.<node_id> in stream "
       "SWARM_<swarm_name> (letters, digits, - and _)."},
      {"node_id", &Job::node_id,
       "This node's name in the swarm (letters, digits, - and _); empty = a random id kept in the experiment "
       "directory (file node_id)."},
      {"exchange_publish", &Job::exchange_publish,
       "Publish each trained task group of this node to the swarm."},
      {"exchange_consume", &Job::exchange_consume, "Receive the other nodes' groups into the local buffer."},
      {"sapo_external_groups", &Job::sapo_external_groups,
       "J: external task groups drawn uniformly from the buffer and trained in each policy step beside the "
       "batch_size local ones (I). 0 = share without training on others."},
      {"exchange_max_age_seconds", &Job::exchange_max_age_seconds,
       "Groups older than this are dropped on receipt and on draw; also the stream's retention (max age) "
       "when "
       "this node creates it."},
      {"exchange_buffer_groups", &Job::exchange_buffer_groups,
       "External groups kept locally for drawing (bounded; the oldest is dropped when full)."},
      {"exchange_trusted_nodes", &Job::exchange_trusted_nodes,
       "Comma-separated node ids whose groups are accepted; empty accepts every node that can publish to the "
       "stream (the broker's credentials are the other trust control)."},
      {"exchange_max_message_bytes", &Job::exchange_max_message_bytes,
       "Largest group message published or accepted (bytes); larger ones are dropped and counted."},
      {"device", &Job::device,
       "Where the torch engine runs: auto (the GPU when its libtorch has CUDA and sees one, else the CPU), "
       "cpu, or "
       "cuda (an error at boot when there is no GPU to use). docs/gpu.md."},
      {"engine_threads", &Job::engine_threads,
       "Torch engine: compute threads for inference and training; 0 means every online CPU."},
      {"kv_cache_tokens", &Job::kv_cache_tokens,
       "Torch engine: KV cache capacity in tokens, allocated at boot; 0 means enough for "
       "min(max_batch_sequences, max_parallel_episodes) full contexts, capped at 4 GiB "
       "(never below one full context). A request that does not fit waits."},
      {"kv_block_size", &Job::kv_block_size, "Torch engine: tokens per KV cache block."},
      {"prefix_caching", &Job::prefix_caching,
       "Torch engine: share the KV cache's full blocks between sequences whose tokens begin alike (a "
       "GRPO group's prompt is prefilled once, a conversation's next turn prefills only what is new); a "
       "block is reused only under the weights version that computed it. docs/concepts.md."},
      {"kv_cache_memory_fraction", &Job::kv_cache_memory_fraction,
       "Torch engine on a GPU, kv_cache_tokens 0: the KV cache takes this fraction of the device memory "
       "free after the model and trainer are loaded (at least one full context). In (0, 0.95]."},
      {"max_batch_sequences", &Job::max_batch_sequences,
       "Torch engine: most sequences decoded together in one forward step."},
      {"max_step_tokens", &Job::max_step_tokens,
       "Torch engine: most tokens in one forward step; long prompts are prefilled in chunks "
       "of what is left after the decoding sequences, so they never stall the others."},
      {"mock_boot_seconds", &Job::mock_boot_seconds, "Mock engine only: simulated boot time."},
      {"mock_train_seconds", &Job::mock_train_seconds, "Mock engine only: simulated training step time."},
  };
  return table;
}

const char* type_name(const Member& m) {
  switch (m.index()) {
    case 0:
      return "string";
    case 1:
      return "int";
    case 2:
      return "float";
    default:
      return "bool";
  }
}

std::string format_double(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  std::string s = os.str();
  // Keep floats recognisable as floats in YAML.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string value_text(const Job& job, const Member& m) {
  return std::visit(
      [&](auto ptr) -> std::string {
        using T = std::decay_t<decltype(job.*ptr)>;
        const T& v = job.*ptr;
        if constexpr (std::is_same_v<T, std::string>)
          return v;
        else if constexpr (std::is_same_v<T, bool>)
          return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>)
          return format_double(v);
        else
          return std::to_string(v);
      },
      m);
}

[[noreturn]] void bad(const std::string& key, const std::string& why) {
  throw ConfigError("config key '" + key + "': " + why);
}

const Field* find_field(const std::string& key) {
  const auto& table = field_table();
  auto it = std::find_if(table.begin(), table.end(), [&](const Field& f) { return key == f.key; });
  return it == table.end() ? nullptr : &*it;
}

// Optimal string alignment distance (edits, adjacent swaps counted as one).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// `key` is the name errors use: the flat key, or the path the user wrote it under.
void assign(Job& job, const Field& f, const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) bad(key, std::string("expected a ") + type_name(f.member) + " scalar");
  const std::string& text = node.Scalar();
  std::visit(
      [&](auto ptr) {
        using T = std::decay_t<decltype(job.*ptr)>;
        if constexpr (std::is_same_v<T, std::string>) {
          job.*ptr = text;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text == "true" || text == "True" || text == "TRUE")
            job.*ptr = true;
          else if (text == "false" || text == "False" || text == "FALSE")
            job.*ptr = false;
          else
            bad(key, "expected true or false, got '" + text + "'");
        } else if constexpr (std::is_same_v<T, int64_t>) {
          size_t pos = 0;
          long long v = 0;
          try {
            v = std::stoll(text, &pos);
          } catch (const std::exception&) {
            bad(key, "expected an integer, got '" + text + "'");
          }
          if (pos != text.size()) bad(key, "expected an integer, got '" + text + "'");
          job.*ptr = v;
        } else {
          size_t pos = 0;
          double v = 0;
          try {
            v = std::stod(text, &pos);
          } catch (const std::exception&) {
            bad(key, "expected a number, got '" + text + "'");
          }
          if (pos != text.size()) bad(key, "expected a number, got '" + text + "'");
          if (!std::isfinite(v)) bad(key, "must be finite");
          job.*ptr = v;
        }
      },
      f.member);
}

void require_one_of(const std::string& key, const std::string& value,
                    std::initializer_list<const char*> options) {
  std::string list;
  for (const char* o : options) {
    if (value == o) return;
    if (!list.empty()) list += ", ";
    list += o;
  }
  bad(key, "'" + value + "' is not one of: " + list);
}

}  // namespace

namespace job_keys {

YAML::Node load_bounded(const std::string& yaml_text, const std::string& what) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);  // yaml-cpp's own parser stops at 2000 levels
  } catch (const YAML::Exception& e) {
    throw ConfigError(what + " is not valid YAML: " + e.what());
  }
  // Depth first with an explicit stack: nothing here recurses however deep the document is.
  std::vector<std::pair<YAML::Node, int>> stack;
  stack.emplace_back(root, 1);
  while (!stack.empty()) {
    auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node.IsSequence() && !node.IsMap()) continue;
    if (depth > kMaxJsonNesting)
      throw ConfigError(what + " is nested deeper than " + std::to_string(kMaxJsonNesting) + " levels");
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (node.IsMap()) {
        stack.emplace_back(it->first, depth + 1);
        stack.emplace_back(it->second, depth + 1);
      } else {
        stack.emplace_back(*it, depth + 1);
      }
    }
  }
  return root;
}

std::string key_text(const YAML::Node& key) {
  try {
    return key.as<std::string>();
  } catch (const YAML::Exception&) {
    throw ConfigError("config has a non-string key");
  }
}

bool known(const std::string& key) { return find_field(key) != nullptr; }

std::string unknown_key(const std::string& key) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, key.size() / 4) + 1;  // a typo, not another word
  if (key.size() <= 256)
    for (const Field& f : field_table()) {
      const size_t d = edit_distance(key, f.key);
      if (d < best_distance) best = f.key, best_distance = d;
    }
  return "unknown key" + (best.empty() ? std::string() : "; did you mean '" + best + "'?") +
         " (see docs/configuration.md for the valid keys)";
}

void set(Job& job, const std::string& key, const YAML::Node& value, const std::string& shown_as) {
  const Field* field = find_field(key);
  if (!field) bad(shown_as, unknown_key(key));
  assign(job, *field, value, shown_as);
}

std::string type_of(const std::string& key) {
  const Field* field = find_field(key);
  if (!field) bad(key, "unknown key");
  return type_name(field->member);
}

std::string text(const Job& job, const std::string& key) {
  const Field* field = find_field(key);
  if (!field) bad(key, "unknown key");
  return value_text(job, field->member);
}

}  // namespace job_keys

namespace {

// from_yaml, and load_layer without the whole-job validation.
Job parse_yaml(const std::string& yaml_text, JobConfigReport* report, bool validate) {
  const YAML::Node root = job_keys::load_bounded(yaml_text, "config");
  Job job;
  if (root.IsNull()) {
    if (validate) job.validate();  // reports the missing model
    return job;
  }
  if (!root.IsMap()) throw ConfigError("config must be a YAML mapping of key: value");
  // AgentJet's config (AgentJetJob): a nested `ajet:` tree beside verl's sections.
  if (root["ajet"] && root["ajet"].IsMap()) {
    JobConfigReport local;
    return load_agentjet_config(root, report ? *report : local);
  }
  if (report) *report = JobConfigReport{};
  std::set<std::string> seen;
  for (const auto& kv : root) {
    const std::string key = job_keys::key_text(kv.first);
    if (!seen.insert(key).second) bad(key, "appears twice");
    if (key == job_keys::kRemovedRanksKey) {
      // Older configs (and run directories' job.yaml) carry it; it never chose the hardware.
      const std::string why =
          std::string(job_keys::kRemovedRanksKey) + " is ignored: " + job_keys::kRanksAreTheServers;
      if (report) report->warnings.push_back(why);
      spdlog::warn("job config: {}", why);
      continue;
    }
    const Field* field = find_field(key);
    if (!field) bad(key, job_keys::unknown_key(key));
    assign(job, *field, kv.second, key);
  }
  if (validate) job.validate();
  return job;
}

Job load_file(const std::string& path, bool validate) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_yaml(ss.str(), nullptr, validate);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

}  // namespace

Job Job::from_yaml(const std::string& yaml_text, JobConfigReport* report) {
  return parse_yaml(yaml_text, report, true);
}

Job Job::load(const std::string& path) { return load_file(path, true); }

Job Job::load_layer(const std::string& path) { return load_file(path, false); }

std::string Job::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& f : field_table()) {
    out << YAML::Key << f.key << YAML::Value;
    if (std::holds_alternative<std::string Job::*>(f.member)) {
      out << YAML::DoubleQuoted << value_text(*this, f.member);
    } else {
      out << value_text(*this, f.member);
    }
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

void Job::dump(const std::string& path) const {
  std::ofstream out(path);
  if (!out) throw ConfigError("cannot write config file '" + path + "'");
  out << to_yaml();
  if (!out) throw ConfigError("failed writing config file '" + path + "'");
}

void Job::validate() const {
  // A Job built in code can hold NaN/inf, which from_yaml() rejects and which every
  // range check below would let through (comparisons with NaN are false).
  for (const auto& f : field_table()) {
    if (const auto* p = std::get_if<double Job::*>(&f.member); p && !std::isfinite(this->**p))
      bad(f.key, "must be finite");
  }
  if (model.empty()) bad("model", "is required (a Hugging Face model directory)");
  if (project_name.empty()) bad("project_name", "must not be empty");
  if (experiment_name.empty()) bad("experiment_name", "must not be empty");
  if (batch_size < 1) bad("batch_size", "must be >= 1");
  if (num_repeat < 1) bad("num_repeat", "must be >= 1");
  require_one_of("sample_collection_method", sample_collection_method,
                 {"rollout_until_finish_enough_episodes", "rollout_until_finish_enough_tasks",
                  "rollout_until_finish_enough_non_dummy_tasks", "rollout_until_any_client_agree_sync_weight",
                  "rollout_until_all_clients_agree_sync_weight"});
  if (agree_sync_min_seconds < 0 || agree_sync_min_seconds > 600)
    bad("agree_sync_min_seconds", "must be in [0, 600]");
  if (max_parallel_episodes < 0) bad("max_parallel_episodes", "must be >= 0");
  if (max_cached_episodes < 0) bad("max_cached_episodes", "must be >= 0");
  if (max_cached_episodes > 0 && max_cached_episodes < batch_size * num_repeat)
    bad("max_cached_episodes",
        "must be 0 or at least batch_size x num_repeat (" + std::to_string(batch_size * num_repeat) + ")");
  if (max_llm_calls_per_episode < 1) bad("max_llm_calls_per_episode", "must be >= 1");
  if (max_claimed_per_client < 0) bad("max_claimed_per_client", "must be >= 0 (0 = no bound)");
  if (max_prompt_length < 1) bad("max_prompt_length", "must be >= 1");
  if (max_response_length < 1) bad("max_response_length", "must be >= 1");
  if (temperature < 0 || temperature > 2)
    bad("temperature", "must be in [0, 2] (the range the OpenAI routes accept)");
  if (top_p <= 0 || top_p > 1) bad("top_p", "must be in (0, 1]");
  if (top_k < -1 || top_k == 0) bad("top_k", "must be -1 (off) or >= 1");
  if (learning_rate <= 0) bad("learning_rate", "must be > 0");
  require_one_of("lr_schedule", lr_schedule, {"constant", "cosine"});
  require_one_of("tool_call_parser", tool_call_parser, {"auto", "hermes", "llama3_json", "none"});
  require_one_of("reasoning_parser", reasoning_parser, {"auto", "think", "none"});
  if (lr_warmup_steps < 0) bad("lr_warmup_steps", "must be >= 0");
  if (weight_decay < 0) bad("weight_decay", "must be >= 0");
  if (grad_clip < 0) bad("grad_clip", "must be >= 0");
  require_one_of("advantage_estimator", advantage_estimator,
                 {"grpo", "grpo_no_std", "reinforce_baseline", "gae"});
  require_one_of("group_by", group_by, {"task", "task_agent_turn"});
  if (clip_ratio_low < 0 || clip_ratio_low >= 1) bad("clip_ratio_low", "must be in [0, 1)");
  if (clip_ratio_high < 0) bad("clip_ratio_high", "must be >= 0");
  require_one_of("loss_agg_mode", loss_agg_mode, {"token-mean", "seq-mean-token-mean"});
  if (kl_coef < 0) bad("kl_coef", "must be >= 0");
  require_one_of("kl_estimator", kl_estimator, {"k1", "k3"});
  require_one_of("algorithm", algorithm, {"grpo", "ppo"});
  if (algorithm == "ppo" && advantage_estimator != "gae")
    bad("advantage_estimator", "must be gae with algorithm: ppo (the critic's values are its baseline)");
  if (algorithm != "ppo" && advantage_estimator == "gae")
    bad("advantage_estimator", "gae needs algorithm: ppo (a critic to supply the values)");
  if (algorithm == "ppo" && group_by != "task")
    bad("group_by", "must be task with algorithm: ppo (groups are GRPO's; GAE credits each token)");
  if (gamma < 0 || gamma > 1) bad("gamma", "must be in [0, 1]");
  if (lam < 0 || lam > 1) bad("lam", "must be in [0, 1]");
  if (critic_learning_rate <= 0) bad("critic_learning_rate", "must be > 0");
  if (cliprange_value <= 0) bad("cliprange_value", "must be > 0");
  if (critic_warmup < 0) bad("critic_warmup", "must be >= 0");
  if (ppo_epochs < 1) bad("ppo_epochs", "must be >= 1");
  if (ppo_mini_batch_size < 0) bad("ppo_mini_batch_size", "must be >= 0");
  if (micro_batch_max_tokens < 1) bad("micro_batch_max_tokens", "must be >= 1");
  require_one_of("dtype", dtype, {"fp32", "bf16", "auto"});
  require_one_of("training_attention", training_attention, {"auto", "blockwise", "eager"});
  require_one_of("gradient_checkpointing", gradient_checkpointing, {"auto", "true", "false"});
  if (zero_stage != 1 && zero_stage != 2) bad("zero_stage", "must be 1 or 2");
  require_one_of("free_kv_cache_during_training", free_kv_cache_during_training, {"auto", "true", "false"});
  if (free_kv_cache_during_training == "true" && max_staleness > 0)
    bad("free_kv_cache_during_training",
        "true needs max_staleness: 0 (with max_staleness >= 1 generation goes on while the trainer works)");
  if (!(reduce_bucket_mb > 0) || reduce_bucket_mb > 1 << 20)
    bad("reduce_bucket_mb", "must be > 0 and <= 1048576");
  if (total_training_steps < 0) bad("total_training_steps", "must be >= 0");
  if (save_freq < 0) bad("save_freq", "must be >= 0");
  if (max_staleness < 0) bad("max_staleness", "must be >= 0");
  require_one_of("off_policy_correction", off_policy_correction, {"auto", "none", "tis", "decoupled"});
  if (!(is_cap >= 1.0) || !std::isfinite(is_cap)) bad("is_cap", "must be a finite number >= 1");
  require_one_of("kv_cache_on_swap", kv_cache_on_swap, {"keep", "recompute"});
  const auto name_ok = [](const std::string& v) {
    return !v.empty() && v.size() <= 64 && std::all_of(v.begin(), v.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
    });
  };
  if (!exchange_url.empty() && exchange_url.rfind("nats://", 0) != 0 && exchange_url.rfind("tls://", 0) != 0)
    bad("exchange_url", "must start with nats:// or tls:// (or be empty to turn sharing off)");
  if (!name_ok(swarm_name)) bad("swarm_name", "must be 1-64 letters, digits, - or _");
  if (!node_id.empty() && !name_ok(node_id))
    bad("node_id", "must be 1-64 letters, digits, - or _ (or empty)");
  if (sapo_external_groups < 0) bad("sapo_external_groups", "must be >= 0");
  if (sapo_external_groups > 0 && exchange_url.empty())
    bad("sapo_external_groups", "needs exchange_url (the swarm to draw external groups from)");
  if (sapo_external_groups > 0 && !exchange_consume)
    bad("sapo_external_groups", "needs exchange_consume: true");
  if (!(exchange_max_age_seconds > 0) || !std::isfinite(exchange_max_age_seconds))
    bad("exchange_max_age_seconds", "must be a finite number > 0");
  if (exchange_buffer_groups < 1) bad("exchange_buffer_groups", "must be >= 1");
  if (exchange_buffer_groups < sapo_external_groups)
    bad("exchange_buffer_groups", "must be >= sapo_external_groups (the groups one step draws)");
  {
    std::stringstream ss(exchange_trusted_nodes);
    for (std::string id; std::getline(ss, id, ',');)
      if (!name_ok(id))
        bad("exchange_trusted_nodes", "must be comma-separated node ids (letters, digits, - or _)");
  }
  if (exchange_max_message_bytes < 1024 || exchange_max_message_bytes > (int64_t{64} << 20))
    bad("exchange_max_message_bytes", "must be in [1024, 67108864]");
  if (max_staleness > 0 && (sample_collection_method == "rollout_until_any_client_agree_sync_weight" ||
                            sample_collection_method == "rollout_until_all_clients_agree_sync_weight"))
    bad("max_staleness",
        "must be 0 with the agree collection methods (their clients hold every weight sync "
        "themselves); use a task or episode method for asynchronous training");
  if (lr_schedule == "cosine" && total_training_steps <= lr_warmup_steps)
    bad("lr_schedule",
        "cosine needs total_training_steps > lr_warmup_steps (the decay ends at the last step)");
  if (engine_threads < 0) bad("engine_threads", "must be >= 0");
  require_one_of("device", device, {"auto", "cpu", "cuda"});
  if (kv_cache_tokens < 0) bad("kv_cache_tokens", "must be >= 0");
  if (kv_block_size < 1 || kv_block_size > 1024) bad("kv_block_size", "must be in [1, 1024]");
  if (!(kv_cache_memory_fraction > 0.0 && kv_cache_memory_fraction <= 0.95))
    bad("kv_cache_memory_fraction", "must be in (0, 0.95]");
  if (max_batch_sequences < 1) bad("max_batch_sequences", "must be >= 1");
  if (max_step_tokens < 1) bad("max_step_tokens", "must be >= 1");
  if (mock_boot_seconds < 0) bad("mock_boot_seconds", "must be >= 0");
  if (mock_train_seconds < 0) bad("mock_train_seconds", "must be >= 0");
}

int64_t Job::effective_max_parallel_episodes() const {
  return max_parallel_episodes > 0 ? max_parallel_episodes : 2 * batch_size * num_repeat;
}

int64_t Job::effective_max_cached_episodes() const {
  return max_cached_episodes > 0 ? max_cached_episodes : 4 * batch_size * num_repeat;
}

std::string Job::effective_off_policy_correction() const {
  if (off_policy_correction != "auto") return off_policy_correction;
  return max_staleness > 0 ? "tis" : "none";
}

std::vector<Job::FieldInfo> Job::fields() {
  const Job defaults;
  std::vector<FieldInfo> out;
  for (const auto& f : field_table())
    out.push_back({f.key, type_name(f.member), value_text(defaults, f.member), f.doc});
  return out;
}

}  // namespace swarm
