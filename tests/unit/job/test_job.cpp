// Job: the training configuration (docs/design.md) — YAML load/dump and validation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>

#include "swarm/errors.hpp"
#include "swarm/job.hpp"

namespace swarm {
namespace {

const char* kMinimal = R"(
algorithm: grpo
model: /path/to/hf/model      # with the mock engine any name will do
batch_size: 32                # tasks per policy step
num_repeat: 4                 # episodes per task (the GRPO group size)
)";

// Expects `yaml` to be rejected with a ConfigError whose message contains every needle.
void expect_config_error(const std::string& yaml, std::initializer_list<std::string> needles) {
  try {
    Job::from_yaml(yaml);
    ADD_FAILURE() << "expected ConfigError for:\n" << yaml;
  } catch (const ConfigError& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
  }
}

Job non_default_job() {
  Job j;
  j.algorithm = "grpo";
  j.project_name = "proj: with colon";
  j.experiment_name = "exp #1 'quoted' \"double\"";
  j.experiment_dir = "/tmp/some dir/x";
  j.model = "/models/Qwen3-0.6B";
  j.batch_size = 7;
  j.num_repeat = 3;
  j.sample_collection_method = "rollout_until_finish_enough_non_dummy_tasks";
  j.max_parallel_episodes = 100;
  j.max_cached_episodes = 500;
  j.max_llm_calls_per_episode = 9;
  j.max_prompt_length = 4096;
  j.max_response_length = 333;
  j.temperature = 0.7;
  j.top_p = 0.95;
  j.top_k = 50;
  j.learning_rate = 3.5e-7;
  j.lr_schedule = "cosine";
  j.lr_warmup_steps = 10;
  j.weight_decay = 0.0;
  j.grad_clip = 0.5;
  j.advantage_estimator = "grpo_no_std";
  j.clip_ratio_low = 0.1;
  j.clip_ratio_high = 0.3;
  j.loss_agg_mode = "seq-mean-token-mean";
  j.use_kl_loss = true;
  j.kl_coef = 0.05;
  j.kl_estimator = "k1";
  j.ppo_epochs = 2;
  j.ppo_mini_batch_size = 4;
  j.micro_batch_max_tokens = 1234;
  j.dtype = "bf16";
  j.seed = -5;
  j.total_training_steps = 100;
  j.save_freq = 10;
  j.mock_boot_seconds = 0.25;
  j.mock_train_seconds = 1e-3;
  return j;
}

void expect_equal(const Job& a, const Job& b) {
  // Every key's YAML text must match: covers every field without listing them twice.
  EXPECT_EQ(a.to_yaml(), b.to_yaml());
  EXPECT_EQ(a.project_name, b.project_name);
  EXPECT_EQ(a.experiment_name, b.experiment_name);
  EXPECT_EQ(a.use_kl_loss, b.use_kl_loss);
  EXPECT_DOUBLE_EQ(a.learning_rate, b.learning_rate);
  EXPECT_DOUBLE_EQ(a.temperature, b.temperature);
  EXPECT_DOUBLE_EQ(a.mock_train_seconds, b.mock_train_seconds);
  EXPECT_EQ(a.seed, b.seed);
}

TEST(JobTest, YamlRoundTripKeepsEveryValue) {
  const Job original = non_default_job();
  ASSERT_NO_THROW(original.validate());
  const Job loaded = Job::from_yaml(original.to_yaml());
  expect_equal(original, loaded);
  EXPECT_EQ(loaded.experiment_name, "exp #1 'quoted' \"double\"");
  EXPECT_EQ(loaded.experiment_dir, "/tmp/some dir/x");
  EXPECT_EQ(loaded.top_k, 50);
  EXPECT_EQ(loaded.dtype, "bf16");
  EXPECT_TRUE(loaded.use_kl_loss);
  EXPECT_EQ(loaded.learning_rate, 3.5e-7);  // exact: 17 significant digits
  EXPECT_EQ(loaded.top_p, 0.95);
}

TEST(JobTest, DefaultsRoundTrip) {
  Job j;
  j.model = "m";
  const Job loaded = Job::from_yaml(j.to_yaml());
  expect_equal(j, loaded);
  EXPECT_EQ(loaded.max_parallel_episodes, 0);
  EXPECT_EQ(loaded.weight_decay, 0.01);
}

TEST(JobTest, MinimalConfigOfTheDesignLoads) {
  const Job j = Job::from_yaml(kMinimal);
  EXPECT_EQ(j.algorithm, "grpo");
  EXPECT_EQ(j.model, "/path/to/hf/model");
  EXPECT_EQ(j.batch_size, 32);
  EXPECT_EQ(j.num_repeat, 4);
  // Everything else keeps its documented default.
  const Job d;
  EXPECT_EQ(j.sample_collection_method, "rollout_until_finish_enough_tasks");
  EXPECT_EQ(j.learning_rate, d.learning_rate);
  EXPECT_EQ(j.clip_ratio_low, 0.2);
  EXPECT_EQ(j.clip_ratio_high, 0.28);
  EXPECT_FALSE(j.use_kl_loss);
}

TEST(JobTest, EffectiveDefaults) {
  Job j = Job::from_yaml(kMinimal);
  EXPECT_EQ(j.effective_max_parallel_episodes(), 2 * 32 * 4);
  EXPECT_EQ(j.effective_max_cached_episodes(), 4 * 32 * 4);
  j.max_parallel_episodes = 10;
  j.max_cached_episodes = 200;
  EXPECT_EQ(j.effective_max_parallel_episodes(), 10);
  EXPECT_EQ(j.effective_max_cached_episodes(), 200);
}

TEST(JobTest, UnknownKeyIsNamedWithTheNearestValidKey) {
  expect_config_error(std::string(kMinimal) + "learning_rat: 0.1\n",
                      {"learning_rat", "unknown key; did you mean 'learning_rate'?"});
  expect_config_error(std::string(kMinimal) + "num_repaet: 4\n", {"did you mean 'num_repeat'?"});
  try {
    Job::from_yaml(std::string(kMinimal) + "frobnicate: 1\n");
    FAIL() << "an unknown key was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos)
        << "nothing is near: " << e.what();
  }
}

TEST(JobTest, TheReadmeDemoJobLoads) {
  const Job job = Job::load_layer(SWARM_SOURCE_DIR "/examples/configs/tiny-char.yaml");
  EXPECT_EQ(job.model, "build/models/tiny-char-2x192");
  EXPECT_DOUBLE_EQ(job.learning_rate, 5e-4);
  EXPECT_NO_THROW(job.validate());
}

TEST(JobTest, WrongTypeNamesKey) {
  expect_config_error("model: m\nbatch_size: lots\n", {"batch_size", "integer", "lots"});
  expect_config_error("model: m\nbatch_size: 2.5\n", {"batch_size", "integer"});
  expect_config_error("model: m\nlearning_rate: fast\n", {"learning_rate", "number"});
  expect_config_error("model: m\nuse_kl_loss: maybe\n", {"use_kl_loss", "true or false"});
  expect_config_error("model: m\nbatch_size: [1, 2]\n", {"batch_size"});
  expect_config_error("model: m\nproject_name: {a: 1}\n", {"project_name"});
  expect_config_error("model: m\ntemperature: .nan\n", {"temperature"});
  expect_config_error("model: m\ntemperature: 3\n", {"temperature", "[0, 2]"});
}

// Untrusted YAML (sync_train_config's body) is bounded like JSON: nesting past 128 levels is a
// ConfigError before anything walks the tree (yaml-cpp's own parser stops at 2000).
TEST(JobTest, DeepNestingIsAConfigError) {
  const auto nested = [](int n) {
    return std::string(static_cast<size_t>(n), '[') + std::string(static_cast<size_t>(n), ']');
  };
  expect_config_error("model: m\nbatch_size: " + nested(200) + "\n", {"nested deeper than 128 levels"});
  expect_config_error("model: m\nbatch_size: " + nested(100000) + "\n", {"config"});
  std::string block = "model: m\nextra:\n";
  for (int i = 1; i < 200; ++i) block += std::string(static_cast<size_t>(2 * i), ' ') + "- \n";
  expect_config_error(block, {"nested deeper than 128 levels"});
  // 128 levels of flow sequences (the top-level mapping is the first) is not refused for depth.
  expect_config_error("model: m\nbatch_size: " + nested(127) + "\n", {"batch_size"});
}

TEST(JobTest, InvalidEnumNamesKeyAndOptions) {
  expect_config_error("model: m\nsample_collection_method: whenever\n",
                      {"sample_collection_method", "whenever", "rollout_until_finish_enough_episodes",
                       "rollout_until_finish_enough_tasks", "rollout_until_finish_enough_non_dummy_tasks"});
  expect_config_error("model: m\nalgorithm: sac\n", {"algorithm", "sac", "grpo", "ppo"});
  // PPO's keys go together: its critic is GAE's baseline, and GRPO's groups are not its credit.
  expect_config_error("model: m\nalgorithm: ppo\n", {"advantage_estimator", "gae", "algorithm: ppo"});
  expect_config_error("model: m\nadvantage_estimator: gae\n", {"advantage_estimator", "algorithm: ppo"});
  expect_config_error("model: m\nalgorithm: ppo\nadvantage_estimator: gae\ngroup_by: task_agent_turn\n",
                      {"group_by"});
  expect_config_error("model: m\nalgorithm: ppo\nadvantage_estimator: gae\nlam: 1.5\n", {"lam", "[0, 1]"});
  expect_config_error("model: m\nalgorithm: ppo\nadvantage_estimator: gae\ncliprange_value: 0\n",
                      {"cliprange_value"});
  EXPECT_NO_THROW(
      swarm::Job::from_yaml("model: m\nalgorithm: ppo\nadvantage_estimator: gae\ngamma: 0.99\nlam: 0.95\n"));
  expect_config_error("model: m\ndtype: fp8\n", {"dtype", "fp32", "bf16"});
  expect_config_error("model: m\nzero_stage: 3\n", {"zero_stage", "1 or 2"});
  expect_config_error("model: m\nfree_kv_cache_during_training: yes please\n",
                      {"free_kv_cache_during_training", "auto", "true", "false"});
  // Generation goes on during the step when training is asynchronous: the cache cannot go.
  expect_config_error("model: m\nfree_kv_cache_during_training: true\nmax_staleness: 1\n",
                      {"free_kv_cache_during_training", "max_staleness: 0"});
  EXPECT_NO_THROW(swarm::Job::from_yaml("model: m\nfree_kv_cache_during_training: auto\nmax_staleness: 1\n"));
  expect_config_error("model: m\nkv_cache_memory_fraction: 0\n", {"kv_cache_memory_fraction", "(0, 0.95]"});
  expect_config_error("model: m\nkv_cache_memory_fraction: 1.5\n", {"kv_cache_memory_fraction"});
  expect_config_error("model: m\nprefix_caching: maybe\n", {"prefix_caching"});
  const swarm::Job j =
      swarm::Job::from_yaml("model: m\nprefix_caching: false\nkv_cache_memory_fraction: 0.5\n");
  EXPECT_FALSE(j.prefix_caching);
  EXPECT_DOUBLE_EQ(j.kv_cache_memory_fraction, 0.5);
  EXPECT_TRUE(swarm::Job::from_yaml("model: m\n").prefix_caching);
}

TEST(JobTest, InvalidRangesNameKey) {
  expect_config_error("model: m\nbatch_size: 0\n", {"batch_size"});
  expect_config_error("model: m\nreduce_bucket_mb: 0\n", {"reduce_bucket_mb"});
  expect_config_error("model: m\ntop_p: 1.5\n", {"top_p"});
  expect_config_error("model: m\ntop_k: 0\n", {"top_k"});
  expect_config_error("model: m\nbatch_size: 4\nnum_repeat: 4\nmax_cached_episodes: 3\n",
                      {"max_cached_episodes"});
}

TEST(JobTest, NonFiniteValuesBuiltInCodeAreRejected) {
  Job j;
  j.model = "m";
  j.temperature = std::numeric_limits<double>::quiet_NaN();
  try {
    j.validate();
    FAIL() << "NaN temperature accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("temperature"), std::string::npos);
  }
  j.temperature = 1.0;
  j.learning_rate = std::numeric_limits<double>::infinity();
  EXPECT_THROW(j.validate(), ConfigError);
}

TEST(JobTest, MissingModel) {
  expect_config_error("algorithm: grpo\nbatch_size: 4\n", {"model"});
  expect_config_error("", {"model"});
  Job j;
  EXPECT_THROW(j.validate(), ConfigError);
}

TEST(JobTest, DuplicateKey) {
  expect_config_error("model: a\nbatch_size: 2\nmodel: b\n", {"model", "twice"});
}

TEST(JobTest, NonMappingYaml) {
  expect_config_error("- model\n- batch_size\n", {"mapping"});
  expect_config_error("just a string", {"mapping"});
  expect_config_error("model: [unclosed\n", {"YAML"});
}

TEST(JobTest, FieldsCoverEveryKey) {
  const auto fields = Job::fields();
  Job j;
  j.model = "m";
  const std::string yaml = j.to_yaml();
  std::set<std::string> keys;
  size_t pos = 0;
  for (const auto& f : fields) {
    EXPECT_TRUE(keys.insert(f.key).second) << "duplicate " << f.key;
    EXPECT_FALSE(f.doc.empty()) << f.key;
    EXPECT_TRUE(f.type == "int" || f.type == "float" || f.type == "string" || f.type == "bool") << f.type;
    // to_yaml writes the keys in fields() order.
    const auto at = yaml.find(f.key + ":", pos);
    ASSERT_NE(at, std::string::npos) << f.key << " missing from to_yaml()";
    pos = at;
    // Each key alone loads (with the default value as YAML text).
    if (f.key != "model") {
      const std::string one =
          "model: m\n" + f.key + ": " + (f.default_value.empty() ? "\"\"" : f.default_value);
      if (f.type != "string" || !f.default_value.empty()) {
        EXPECT_NO_THROW(Job::from_yaml(one)) << one;
      }
    }
  }
  // Every line of to_yaml() is a key from fields().
  size_t lines = 0;
  for (size_t start = 0; start < yaml.size();) {
    const auto end = yaml.find('\n', start);
    const std::string line = yaml.substr(start, end - start);
    if (!line.empty()) {
      ++lines;
      EXPECT_TRUE(keys.count(line.substr(0, line.find(':')))) << line;
    }
    start = end == std::string::npos ? yaml.size() : end + 1;
  }
  EXPECT_EQ(lines, fields.size());
  EXPECT_TRUE(keys.count("algorithm") && keys.count("model") && keys.count("batch_size") &&
              keys.count("num_repeat") && keys.count("experiment_name"));
  EXPECT_FALSE(keys.count("n_gpu"));  // the ranks are the server's (--nproc), not the job's
}

TEST(JobTest, DumpAndLoadFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("swarm_test_job_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "job.yaml").string();
  const Job original = non_default_job();
  original.dump(path);
  const Job loaded = Job::load(path);
  expect_equal(original, loaded);

  {
    std::ofstream bad(dir / "bad.yaml");
    bad << "model: m\nwhat: 1\n";
  }
  try {
    Job::load((dir / "bad.yaml").string());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("what"), std::string::npos);
  }
  EXPECT_THROW(Job::load((dir / "missing.yaml").string()), ConfigError);
  EXPECT_THROW(original.dump((dir / "no/such/dir/x.yaml").string()), ConfigError);
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------- AgentJet's nested config

// The shape AgentJetJob sends (yaml.safe_dump of its config): an `ajet:` tree, verl sections
// whose values AgentJet itself overwrites, `defaults` and `hydra`. Trimmed; the full-size
// one is tests/agentjet/agentjet_config.py.
const char* kAgentJet = R"(ajet:
  project_name: demo_project
  experiment_name: read_yaml_name
  experiment_dir: auto
  backbone: verl
  model:
    path: /models/qwen
  data:
    max_prompt_length: 3000
    max_response_length: 15000
    train_batch_size: 8
  rollout:
    max_env_worker: 20
    max_response_length_in_one_turn: 4096
    max_model_len: 18000
    num_repeat: 4
    temperature: 0.9
    top_p: 1.0
    top_k: -1
    compute_madness_checklist:
    - nonsense
  trainer_common:
    save_freq: 20
    total_training_steps: null
    total_epochs: 50
    nnodes: 1
    n_gpus_per_node: 8
    algorithm:
      adv_estimator: grpo
    use_kl_in_reward: false
    mini_batch_num: 3
    optim:
      lr: 1.0e-06
      lr_warmup_steps: -1
      lr_warmup_steps_ratio: 0.0
      weight_decay: 0.01
      grad_clip: 20.0
      lr_scheduler_type: constant
      betas:
      - 0.9
      - 0.999
    use_kl_loss: true
    kl_loss_coef: 0.002
    kl_loss_type: low_var_kl
    ppo_epochs: 1
  lora:
    lora_rank: 0
    target_modules: all-linear
  swarm_mode_sample_collection_method: rollout_until_finish_enough_tasks
  swarm_mode_sample_collection_max_cached_episodes: 9999
  interchange_server:
    interchange_server_port: 10086
  trainer_verl: {}
actor_rollout_ref:
  rollout:
    multi_turn:
      tool_config_path: ${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path,null}
  actor:
    checkpoint:
      save_contents: ['model', 'optimizer']
data:
  train_batch_size: 1024
trainer:
  n_gpus_per_node: 8
defaults:
- verl_default
- ajet_default
- _self_
hydra:
  searchpath:
  - file://ajet/default_config
)";

// kAgentJet with one line replaced (`from` must occur once).
std::string agentjet_with(const std::string& from, const std::string& to) {
  std::string y = kAgentJet;
  const auto at = y.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) y.replace(at, from.size(), to);
  return y;
}

const JobConfigReport::Mapped* mapped_to(const JobConfigReport& r, const std::string& key) {
  for (const auto& m : r.mapped)
    if (m.to == key) return &m;
  return nullptr;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST(AgentJetConfig, MapsTheKeysThatMeanSomethingHere) {
  JobConfigReport report;
  const Job job = Job::from_yaml(kAgentJet, &report);
  EXPECT_EQ(report.format, "agentjet");
  EXPECT_EQ(job.model, "/models/qwen");
  EXPECT_EQ(job.project_name, "demo_project");
  EXPECT_EQ(job.experiment_name.rfind("agentjet_", 0), 0u)
      << job.experiment_name;                           // read_yaml_name: generated
  EXPECT_EQ(job.experiment_dir, Job{}.experiment_dir);  // auto: our default
  EXPECT_EQ(job.batch_size, 8);
  EXPECT_EQ(job.num_repeat, 4);
  EXPECT_EQ(job.max_parallel_episodes, 20);  // min(8, ceil(20 / 4)) x 4
  EXPECT_EQ(job.max_cached_episodes, 9999);
  EXPECT_EQ(job.max_prompt_length, 18000 - 4096);  // every turn's prompt: max_model_len - one turn's response
  EXPECT_EQ(job.max_response_length, 4096);        // per completion: max_response_length_in_one_turn
  EXPECT_DOUBLE_EQ(job.temperature, 0.9);
  EXPECT_EQ(job.top_k, -1);
  EXPECT_DOUBLE_EQ(job.learning_rate, 1e-6);
  EXPECT_DOUBLE_EQ(job.grad_clip, 20.0);
  EXPECT_EQ(job.lr_warmup_steps, 0);  // -1 with ratio 0: no warm-up
  EXPECT_TRUE(job.use_kl_loss);
  EXPECT_DOUBLE_EQ(job.kl_coef, 0.002);
  EXPECT_EQ(job.kl_estimator, "k3");      // low_var_kl
  EXPECT_EQ(job.ppo_mini_batch_size, 3);  // 8 tasks in 3 optimizer steps: ceil(8 / 3) per step
  EXPECT_EQ(job.total_training_steps, 0);
  EXPECT_EQ(job.save_freq, 20);
  EXPECT_EQ(mapped_to(report, "n_gpu"), nullptr);  // 8 GPUs do not choose the hardware: warned
  EXPECT_TRUE(std::any_of(report.warnings.begin(), report.warnings.end(), [](const std::string& w) {
    return w.find("n_gpus_per_node x nnodes = 8 GPUs does not choose the hardware") != std::string::npos;
  }));
  const auto* m = mapped_to(report, "batch_size");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->from, "ajet.data.train_batch_size");
  EXPECT_EQ(m->value, "8");
  EXPECT_EQ(m->type, "int");
  // verl's sections are read by nobody (AgentJet overwrites them from ajet.* itself).
  for (const char* section : {"actor_rollout_ref", "data", "trainer", "defaults", "hydra"})
    EXPECT_TRUE(contains(report.ignored, section)) << section;
  EXPECT_EQ(mapped_to(report, "max_prompt_length")->from, "ajet.rollout.max_model_len");
  EXPECT_FALSE(contains(report.ignored, "ajet.data.max_prompt_length"));
  EXPECT_TRUE(contains(report.ignored, "ajet.interchange_server.interchange_server_port"));
  EXPECT_FALSE(contains(report.ignored, "ajet.data.train_batch_size"));
  // Honoured differently, so said: the GPU count, the epochs, the whole-sample budget.
  auto warned = [&](const std::string& needle) {
    return std::any_of(report.warnings.begin(), report.warnings.end(),
                       [&](const std::string& w) { return w.find(needle) != std::string::npos; });
  };
  EXPECT_TRUE(warned("n_gpus_per_node"));
  EXPECT_TRUE(warned("total_epochs"));
  EXPECT_TRUE(warned("ajet.data.max_response_length"));
}

TEST(AgentJetConfig, RefusesWhatItCannotHonourNamingTheKey) {
  expect_config_error(agentjet_with("lora_rank: 0", "lora_rank: 8"), {"ajet.lora.lora_rank", "LoRA"});
  expect_config_error(agentjet_with("adv_estimator: grpo", "adv_estimator: rloo"),
                      {"ajet.trainer_common.algorithm.adv_estimator", "rloo"});
  // gae is verl's PPO: a critic beside the policy.
  const Job ppo = Job::from_yaml(agentjet_with("adv_estimator: grpo", "adv_estimator: gae"));
  EXPECT_EQ(ppo.algorithm, "ppo");
  EXPECT_EQ(ppo.advantage_estimator, "gae");
  expect_config_error(agentjet_with("use_kl_in_reward: false", "use_kl_in_reward: true"),
                      {"ajet.trainer_common.use_kl_in_reward"});
  expect_config_error(agentjet_with("kl_loss_type: low_var_kl", "kl_loss_type: mse"),
                      {"ajet.trainer_common.kl_loss_type"});
  expect_config_error(agentjet_with("train_batch_size: 8", "train_batch_size: eight"),
                      {"ajet.data.train_batch_size", "integer"});
  // A value our validation refuses is reported under the path it was written at.
  expect_config_error(agentjet_with("train_batch_size: 8", "train_batch_size: 0"),
                      {"ajet.data.train_batch_size", "batch_size", ">= 1"});
  expect_config_error(agentjet_with("swarm_mode_sample_collection_method: rollout_until_finish_enough_tasks",
                                    "swarm_mode_sample_collection_method: rollout_until_bored"),
                      {"ajet.swarm_mode_sample_collection_method", "rollout_until_bored"});
  expect_config_error(agentjet_with("    path: /models/qwen", "    path: null"),
                      {"ajet.model.path", "required"});
  expect_config_error(agentjet_with("max_model_len: 18000", "max_model_len: 4000"),
                      {"ajet.rollout.max_model_len", "max_response_length_in_one_turn"});
  // Without max_model_len the first-prompt budget is the best there is.
  EXPECT_EQ(Job::from_yaml(agentjet_with("    max_model_len: 18000\n", "")).max_prompt_length, 3000);
}

TEST(AgentJetConfig, OurOwnKeysGoUnderSwarm) {
  JobConfigReport report;
  const Job job =
      Job::from_yaml(std::string(kAgentJet) + "swarm:\n  dtype: bf16\n  batch_size: 2\n", &report);
  EXPECT_EQ(job.dtype, "bf16");
  EXPECT_EQ(job.batch_size, 2);  // overrides ajet.data.train_batch_size
  ASSERT_NE(mapped_to(report, "batch_size"), nullptr);
  EXPECT_EQ(mapped_to(report, "batch_size")->from, "swarm.batch_size");
  EXPECT_FALSE(contains(report.ignored, "swarm"));
  expect_config_error(std::string(kAgentJet) + "swarm:\n  batch_sise: 2\n",
                      {"swarm.batch_sise", "unknown key; did you mean 'batch_size'?"});
  expect_config_error(std::string(kAgentJet) + "swarm: 3\n", {"swarm", "mapping"});
}

TEST(AgentJetConfig, AgreeMethodsAndConversions) {
  const Job job = Job::from_yaml(
      agentjet_with("swarm_mode_sample_collection_method: rollout_until_finish_enough_tasks\n",
                    "swarm_mode_sample_collection_method: rollout_until_all_clients_agree_sync_weight\n"));
  EXPECT_EQ(job.sample_collection_method, "rollout_until_all_clients_agree_sync_weight");
  // mini_batch_num 1 is the whole batch; a tiny cache limit falls back to our default with a warning.
  JobConfigReport report;
  const Job j2 = Job::from_yaml(agentjet_with("mini_batch_num: 3", "mini_batch_num: 1")
                                    .replace(std::string(kAgentJet).find("9999"), 4, "3"),
                                &report);
  EXPECT_EQ(j2.ppo_mini_batch_size, 0);
  EXPECT_EQ(j2.max_cached_episodes, 0);
  EXPECT_FALSE(report.warnings.empty());
  // A named experiment keeps its name (path separators made safe); a warm-up ratio needs a step count.
  EXPECT_EQ(Job::from_yaml(agentjet_with("experiment_name: read_yaml_name", "experiment_name: a|b/c"))
                .experiment_name,
            "a-b-c");
  // AgentJet parses tool calls unless told not to.
  EXPECT_EQ(Job::from_yaml(kAgentJet).tool_call_parser, "auto");
  EXPECT_EQ(
      Job::from_yaml(agentjet_with("    top_k: -1\n", "    top_k: -1\n    force_disable_toolcalls: true\n"))
          .tool_call_parser,
      "none");
  expect_config_error(agentjet_with("lr_warmup_steps_ratio: 0.0", "lr_warmup_steps_ratio: 0.1"),
                      {"ajet.trainer_common.optim.lr_warmup_steps_ratio", "total_training_steps"});
  const Job j3 = Job::from_yaml(agentjet_with("lr_warmup_steps_ratio: 0.0", "lr_warmup_steps_ratio: 0.1")
                                    .replace(std::string(kAgentJet).find("total_training_steps: null"),
                                             std::string("total_training_steps: null").size(),
                                             "total_training_steps: 50"));
  EXPECT_EQ(j3.total_training_steps, 50);
  EXPECT_EQ(j3.lr_warmup_steps, 5);
}

TEST(AgentJetConfig, FlatConfigsReportTheirFormat) {
  JobConfigReport report;
  report.mapped.push_back({"x", "y", "z", "int"});  // cleared by the load
  Job::from_yaml(kMinimal, &report);
  EXPECT_EQ(report.format, "swarm");
  EXPECT_TRUE(report.mapped.empty());
  // `ajet` that is not a mapping is not AgentJet's config: an unknown flat key.
  expect_config_error("model: m\najet: 3\n", {"ajet", "unknown key"});
}

// n_gpu was a key that chose nothing: older files (and run directories' job.yaml) still load,
// with a warning naming what does choose the ranks.
TEST(Job, FormerRanksKeyLoadsWithAWarning) {
  JobConfigReport report;
  const Job job = Job::from_yaml("model: m\nn_gpu: 8\nbatch_size: 3\n", &report);
  EXPECT_EQ(job.batch_size, 3);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("n_gpu is ignored"), std::string::npos);
  EXPECT_NE(report.warnings[0].find("--nproc"), std::string::npos);
  EXPECT_EQ(Job().to_yaml().find("n_gpu"), std::string::npos);
}

}  // namespace
}  // namespace swarm
