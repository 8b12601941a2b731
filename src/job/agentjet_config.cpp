#include "job/agentjet_config.hpp"

#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "job/job_keys.hpp"
#include "swarm/errors.hpp"

namespace swarm {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw ConfigError("config key '" + path + "': " + why);
}

bool is_null(const YAML::Node& n) { return !n || n.IsNull(); }

std::string scalar_text(const YAML::Node& n) {
  return n.IsScalar() ? n.Scalar() : std::string("(not a scalar)");
}

// The leaves of AgentJet's `ajet:` tree by path relative to it ("data.train_batch_size"). A
// leaf is a scalar, a null, a list or an empty mapping.
void collect_leaves(const YAML::Node& node, const std::string& path, std::map<std::string, YAML::Node>& out) {
  if (node.IsMap() && node.size() > 0) {
    for (const auto& kv : node) {
      const std::string key = job_keys::key_text(kv.first);
      collect_leaves(kv.second, path.empty() ? key : path + "." + key, out);
    }
    return;
  }
  out[path] = node;
}

// The date-stamped experiment name AgentJet generates for `read_yaml_name`.
std::string generated_experiment_name() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d_%H%M%S", &tm);
  return std::string("agentjet_") + buf;
}

class Mapper {
 public:
  Mapper(const YAML::Node& ajet, JobConfigReport& report) : report_(report) {
    collect_leaves(ajet, "", leaves_);
  }

  Job run(const YAML::Node& root) {
    identity();
    batch_and_pool();
    lengths_and_sampling();
    optimisation();
    checks();
    for (const auto& [path, node] : leaves_)
      if (!used_.count(path)) report_.ignored.push_back("ajet." + path);
    overrides(root);
    try {
      job_.validate();
    } catch (const ConfigError& e) {
      throw ConfigError(name_ajet_path(e.what()));
    }
    return job_;
  }

 private:
  // ---- reading: every read marks the leaf as used, so it is not listed as ignored
  YAML::Node get(const std::string& path) {
    auto it = leaves_.find(path);
    if (it == leaves_.end()) return YAML::Node();
    used_.insert(path);
    return it->second;
  }
  int64_t as_int(const std::string& path, const YAML::Node& n) {
    try {
      const double d = n.as<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    } catch (const YAML::Exception&) {}
    bad("ajet." + path, "expected an integer, got '" + scalar_text(n) + "'");
  }
  double as_double(const std::string& path, const YAML::Node& n) {
    try {
      const double d = n.as<double>();
      if (std::isfinite(d)) return d;
    } catch (const YAML::Exception&) {}
    bad("ajet." + path, "expected a finite number, got '" + scalar_text(n) + "'");
  }
  bool as_bool(const std::string& path, const YAML::Node& n) {
    try {
      return n.as<bool>();
    } catch (const YAML::Exception&) {}
    bad("ajet." + path, "expected true or false, got '" + scalar_text(n) + "'");
  }
  std::string as_string(const std::string& path, const YAML::Node& n) {
    if (!n.IsScalar()) bad("ajet." + path, "expected a string");
    return n.Scalar();
  }

  // ---- writing
  void set(const std::string& key, const std::string& value_yaml, const std::string& from) {
    job_keys::set(job_, key, job_keys::load_bounded(value_yaml, key), from);
    record(key, from);
  }
  void record(const std::string& key, const std::string& from) {
    origin_[key] = from;
    for (auto& m : report_.mapped)
      if (m.to == key) {
        m.from = from;
        m.value = job_keys::text(job_, key);
        return;
      }
    report_.mapped.push_back({from, key, job_keys::text(job_, key), job_keys::type_of(key)});
  }
  // ajet.<path> → our <key>, same meaning and type; null keeps our default.
  void direct(const std::string& path, const std::string& key) {
    YAML::Node n = get(path);
    if (is_null(n)) return;
    job_keys::set(job_, key, n, "ajet." + path);
    record(key, "ajet." + path);
  }
  void warn(const std::string& text) { report_.warnings.push_back(text); }

  void identity() {
    direct("model.path", "model");
    direct("project_name", "project_name");
    YAML::Node name = get("experiment_name");
    std::string experiment = is_null(name) ? "" : as_string("experiment_name", name);
    if (experiment.empty() || experiment == "read_yaml_name") experiment = generated_experiment_name();
    for (char& c : experiment)
      if (c == '|' || c == '/' || c == '\\') c = '-';
    job_.experiment_name = experiment;
    record("experiment_name", "ajet.experiment_name");
    YAML::Node dir = get("experiment_dir");
    if (!is_null(dir)) {
      const std::string d = as_string("experiment_dir", dir);
      if (d != "auto" && !d.empty()) {
        job_.experiment_dir = d;
      }  // `auto`: our default root
      record("experiment_dir", "ajet.experiment_dir");
    }
  }

  void batch_and_pool() {
    direct("data.train_batch_size", "batch_size");
    direct("rollout.num_repeat", "num_repeat");
    direct("swarm_mode_sample_collection_method", "sample_collection_method");
    const int64_t b = std::max<int64_t>(job_.batch_size, 1), r = std::max<int64_t>(job_.num_repeat, 1);
    // AgentJet keeps min(batch, ceil(max_env_worker / num_repeat)) x num_repeat episodes live.
    YAML::Node workers = get("rollout.max_env_worker");
    if (!is_null(workers)) {
      const int64_t w = as_int("rollout.max_env_worker", workers);
      if (w < 1) bad("ajet.rollout.max_env_worker", "must be >= 1");
      job_.max_parallel_episodes = std::min(b, (w + r - 1) / r) * r;
      record("max_parallel_episodes", "ajet.rollout.max_env_worker");
    }
    YAML::Node cached = get("swarm_mode_sample_collection_max_cached_episodes");
    if (!is_null(cached)) {
      const int64_t c = as_int("swarm_mode_sample_collection_max_cached_episodes", cached);
      if (c < b * r) {
        warn("ajet.swarm_mode_sample_collection_max_cached_episodes = " + std::to_string(c) +
             " is below one batch (" + std::to_string(b * r) + " episodes); the default 4 x batch is used");
        job_.max_cached_episodes = 0;
      } else {
        job_.max_cached_episodes = c;
      }
      record("max_cached_episodes", "ajet.swarm_mode_sample_collection_max_cached_episodes");
    }
  }

  void lengths_and_sampling() {
    // AgentJet's per-completion cap; its data.max_response_length budgets a whole merged
    // multi-turn sample, which swarm does not cap.
    direct("rollout.max_response_length_in_one_turn", "max_response_length");
    // A request's prompt: AgentJet answers "context exceeded" from max_model_len - (per-turn
    // response) tokens on; data.max_prompt_length is verl's budget for the first prompt of a
    // sample only, and later turns of a multi-turn agent grow far beyond it.
    YAML::Node model_len = get("rollout.max_model_len");
    YAML::Node first_prompt = get("data.max_prompt_length");
    if (!is_null(model_len)) {
      const int64_t len = as_int("rollout.max_model_len", model_len);
      if (len <= job_.max_response_length)
        bad("ajet.rollout.max_model_len", "must exceed ajet.rollout.max_response_length_in_one_turn (" +
                                              std::to_string(job_.max_response_length) + ")");
      set("max_prompt_length", std::to_string(len - job_.max_response_length), "ajet.rollout.max_model_len");
      if (!is_null(first_prompt)) used_.insert("data.max_prompt_length");
    } else {
      direct("data.max_prompt_length", "max_prompt_length");
    }
    if (!is_null(get("data.max_response_length")))
      warn(
          "ajet.data.max_response_length (the token budget of a whole multi-turn sample) has no swarm "
          "counterpart and is not enforced; each completion is capped by max_response_length "
          "(from ajet.rollout.max_response_length_in_one_turn)");
    direct("rollout.temperature", "temperature");
    direct("rollout.top_p", "top_p");
    // AgentJet parses hermes tool calls unless this is set.
    YAML::Node no_tools = get("rollout.force_disable_toolcalls");
    if (!is_null(no_tools) && as_bool("rollout.force_disable_toolcalls", no_tools))
      set("tool_call_parser", "none", "ajet.rollout.force_disable_toolcalls");
    YAML::Node top_k = get("rollout.top_k");
    if (!is_null(top_k)) {
      const int64_t k = as_int("rollout.top_k", top_k);
      set("top_k", std::to_string(k <= 0 ? -1 : k), "ajet.rollout.top_k");
    }
  }

  void optimisation() {
    YAML::Node est = get("trainer_common.algorithm.adv_estimator");
    if (!is_null(est)) {
      const std::string e = as_string("trainer_common.algorithm.adv_estimator", est);
      if (e != "grpo" && e != "gae")
        bad("ajet.trainer_common.algorithm.adv_estimator",
            "'" + e +
                "' is not supported; swarm trains with grpo or gae (PPO with a critic; or, in its own keys, "
                "grpo_no_std or reinforce_baseline: set swarm.advantage_estimator)");
      if (e == "gae") {  // verl's PPO: a critic and GAE
        set("algorithm", "ppo", "ajet.trainer_common.algorithm.adv_estimator");
        direct("trainer_common.algorithm.gamma", "gamma");
        direct("trainer_common.algorithm.lam", "lam");
      }
      set("advantage_estimator", e, "ajet.trainer_common.algorithm.adv_estimator");
    }
    direct("trainer_common.optim.lr", "learning_rate");
    direct("trainer_common.optim.weight_decay", "weight_decay");
    direct("trainer_common.optim.grad_clip", "grad_clip");
    YAML::Node sched = get("trainer_common.optim.lr_scheduler_type");
    if (!is_null(sched)) {
      const std::string s = as_string("trainer_common.optim.lr_scheduler_type", sched);
      if (s != "constant" && s != "cosine")
        bad("ajet.trainer_common.optim.lr_scheduler_type",
            "'" + s + "' is not supported (constant or cosine)");
      set("lr_schedule", s, "ajet.trainer_common.optim.lr_scheduler_type");
    }
    YAML::Node total = get("trainer_common.total_training_steps");
    if (!is_null(total)) {
      const int64_t t = as_int("trainer_common.total_training_steps", total);
      set("total_training_steps", std::to_string(std::max<int64_t>(t, 0)),
          "ajet.trainer_common.total_training_steps");
    } else if (!is_null(get("trainer_common.total_epochs"))) {
      warn(
          "ajet.trainer_common.total_epochs is not used: swarm has no dataset of its own, so a run "
          "lasts until stop_engine or ajet.trainer_common.total_training_steps");
    }
    YAML::Node warmup = get("trainer_common.optim.lr_warmup_steps");
    YAML::Node ratio = get("trainer_common.optim.lr_warmup_steps_ratio");
    if (!is_null(warmup) && as_int("trainer_common.optim.lr_warmup_steps", warmup) >= 0) {
      set("lr_warmup_steps", std::to_string(as_int("trainer_common.optim.lr_warmup_steps", warmup)),
          "ajet.trainer_common.optim.lr_warmup_steps");
    } else if (!is_null(ratio) && as_double("trainer_common.optim.lr_warmup_steps_ratio", ratio) > 0) {
      // verl: a negative warm-up step count means "use the ratio of the total steps".
      const double rr = as_double("trainer_common.optim.lr_warmup_steps_ratio", ratio);
      if (job_.total_training_steps <= 0)
        bad("ajet.trainer_common.optim.lr_warmup_steps_ratio",
            "needs ajet.trainer_common.total_training_steps (swarm has no epochs to take a ratio of)");
      set("lr_warmup_steps",
          std::to_string(static_cast<int64_t>(rr * static_cast<double>(job_.total_training_steps))),
          "ajet.trainer_common.optim.lr_warmup_steps_ratio");
    } else if (!is_null(warmup)) {
      set("lr_warmup_steps", "0", "ajet.trainer_common.optim.lr_warmup_steps");
    }
    direct("trainer_common.use_kl_loss", "use_kl_loss");
    direct("trainer_common.kl_loss_coef", "kl_coef");
    YAML::Node kl_type = get("trainer_common.kl_loss_type");
    if (!is_null(kl_type)) {
      const std::string k = as_string("trainer_common.kl_loss_type", kl_type);
      std::string ours;
      if (k == "low_var_kl" || k == "k3")
        ours = "k3";
      else if (k == "kl" || k == "k1")
        ours = "k1";
      else
        bad("ajet.trainer_common.kl_loss_type", "'" + k + "' is not supported (low_var_kl / k3, or kl / k1)");
      set("kl_estimator", ours, "ajet.trainer_common.kl_loss_type");
    }
    direct("trainer_common.ppo_epochs", "ppo_epochs");
    YAML::Node mini = get("trainer_common.mini_batch_num");
    if (!is_null(mini)) {
      const int64_t n = as_int("trainer_common.mini_batch_num", mini);
      if (n < 1) bad("ajet.trainer_common.mini_batch_num", "must be >= 1");
      // Optimizer steps per batch → tasks per optimizer step.
      const int64_t b = std::max<int64_t>(job_.batch_size, 1);
      set("ppo_mini_batch_size", std::to_string(n == 1 ? 0 : (b + n - 1) / n),
          "ajet.trainer_common.mini_batch_num");
    }
    YAML::Node save = get("trainer_common.save_freq");
    if (!is_null(save)) {
      const int64_t f = as_int("trainer_common.save_freq", save);
      set("save_freq", std::to_string(std::max<int64_t>(f, 0)), "ajet.trainer_common.save_freq");
    }
  }

  // Settings with no swarm counterpart that change what is trained: refused when set to
  // something we cannot honour, warned about where ignoring them is harmless.
  void checks() {
    YAML::Node rank = get("lora.lora_rank");
    if (!is_null(rank) && as_int("lora.lora_rank", rank) > 0)
      bad("ajet.lora.lora_rank", "LoRA (rank " + scalar_text(rank) +
                                     ") is not supported: swarm fine-tunes every weight; set it to 0");
    YAML::Node kl_reward = get("trainer_common.use_kl_in_reward");
    if (!is_null(kl_reward) && as_bool("trainer_common.use_kl_in_reward", kl_reward))
      bad("ajet.trainer_common.use_kl_in_reward",
          "a KL penalty in the reward is not supported; use ajet.trainer_common.use_kl_loss instead");
    YAML::Node nodes = get("trainer_common.nnodes");
    YAML::Node per_node = get("trainer_common.n_gpus_per_node");
    if (!is_null(nodes) || !is_null(per_node)) {
      const int64_t nn = is_null(nodes) ? 1 : as_int("trainer_common.nnodes", nodes);
      const int64_t g = is_null(per_node) ? 1 : as_int("trainer_common.n_gpus_per_node", per_node);
      if (nn < 1 || g < 1)
        bad("ajet.trainer_common.n_gpus_per_node", "needs n_gpus_per_node >= 1 and nnodes >= 1");
      if (nn * g > 1)
        warn("ajet.trainer_common.n_gpus_per_node x nnodes = " + std::to_string(nn * g) +
             " GPUs does not choose the hardware: " + job_keys::kRanksAreTheServers);
    }
    for (const char* path : {"trainer_common.loss_weight_normalization_episode_level",
                             "trainer_common.advantage_estimation_episode_level"}) {
      YAML::Node n = get(path);
      if (!is_null(n) && as_bool(path, n))
        warn(std::string("ajet.") + path +
             " = true is not honoured: swarm gives every sample of an episode "
             "that episode's advantage and averages the loss over tokens");
    }
    YAML::Node backbone = get("backbone");
    if (!is_null(backbone) && as_string("backbone", backbone) == "trinity")
      warn("ajet.backbone = trinity is ignored: swarm-server trains in-process with its own trainer");
  }

  // A top-level `swarm:` mapping holds keys of our own format, applied last.
  void overrides(const YAML::Node& root) {
    YAML::Node own = root["swarm"];
    if (!own) return;
    if (!own.IsMap()) bad("swarm", "must be a mapping of swarm config keys (docs/configuration.md)");
    for (const auto& kv : own) {
      const std::string key = job_keys::key_text(kv.first);
      if (!job_keys::known(key)) bad("swarm." + key, job_keys::unknown_key(key));
      job_keys::set(job_, key, kv.second, "swarm." + key);
      record(key, "swarm." + key);
    }
  }

  // A validation error names our key; say which AgentJet path it came from.
  std::string name_ajet_path(const std::string& message) const {
    const std::string prefix = "config key '";
    if (message.rfind(prefix, 0) != 0) return message;
    const auto end = message.find('\'', prefix.size());
    if (end == std::string::npos) return message;
    const std::string key = message.substr(prefix.size(), end - prefix.size());
    auto it = origin_.find(key);
    if (it == origin_.end()) {
      if (key == "model") return "config key 'ajet.model.path': is required (a Hugging Face model directory)";
      return message;
    }
    return prefix + it->second + "' (swarm key '" + key + "')" + message.substr(end + 1);
  }

  JobConfigReport& report_;
  Job job_;
  std::map<std::string, YAML::Node> leaves_;
  std::set<std::string> used_;
  std::map<std::string, std::string> origin_;  // our key → where its value came from
};

}  // namespace

Job load_agentjet_config(const YAML::Node& root, JobConfigReport& report) {
  report = JobConfigReport{};
  report.format = "agentjet";
  for (const auto& kv : root) {
    const std::string key = job_keys::key_text(kv.first);
    // verl's sections (overwritten from ajet.* by AgentJet itself), `defaults`, `hydra`.
    if (key != "ajet" && key != "swarm") report.ignored.push_back(key);
  }
  Mapper mapper(root["ajet"], report);
  return mapper.run(root);
}

}  // namespace swarm
