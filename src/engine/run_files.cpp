#include "engine/run_files.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "swarm/job.hpp"

namespace swarm {
namespace fs = std::filesystem;
using json = nlohmann::json;

void write_file_atomically(const fs::path& path, const std::string& text) {
  std::error_code ec;
  if (!path.parent_path().empty()) fs::create_directories(path.parent_path(), ec);
  SWARM_REQUIRE(!ec, ErrorKind::INTERNAL, "cannot create " + path.parent_path().string() + ": " + ec.message());
  const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    SWARM_REQUIRE(out.good(), ErrorKind::INTERNAL, "cannot write " + tmp.string());
  }
  fs::rename(tmp, path, ec);
  SWARM_REQUIRE(!ec, ErrorKind::INTERNAL, "cannot write " + path.string() + ": " + ec.message());
}

fs::path experiment_path(const Job& job) {
  return fs::path(job.experiment_dir) / job.project_name / job.experiment_name;
}

void append_step_metrics(const fs::path& file, const TrainStepReport& report, int64_t policy_version) {
  json line = {{"step", report.global_step},
               {"policy_version", policy_version},
               {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
               {"episodes", report.episodes},
               {"samples", report.samples},
               {"tasks", report.tasks},
               {"tokens", report.tokens},
               {"trained_tokens_in_batch", report.trained_tokens},
               {"reward_mean", report.reward_mean},
               {"reward_std", report.reward_std},
               {"reward_min", report.reward_min},
               {"reward_max", report.reward_max},
               {"step_seconds", report.seconds}};
  for (const auto& [k, v] : report.metrics) line[k] = std::isfinite(v) ? json(v) : json(nullptr);
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  std::ofstream out(file, std::ios::app);
  out << line.dump() << '\n';
  out.flush();
  SWARM_REQUIRE(out.good(), ErrorKind::INTERNAL, "cannot append to " + file.string());
}

void append_samples(const fs::path& file, const TrainBatch& batch, int64_t step) {
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  std::ofstream out(file, std::ios::app);
  for (const auto& e : batch.episodes)
    for (const auto& s : e.samples) {
      json logprobs = json::array();
      for (float lp : s.rollout_logprobs) logprobs.push_back(std::isfinite(lp) ? json(lp) : json(nullptr));
      out << json{{"step", step},
                  {"task_id", s.task_id},
                  {"episode_uuid", s.episode_uuid},
                  {"reward", std::isfinite(s.reward) ? json(s.reward) : json(nullptr)},
                  {"num_calls", s.num_calls},
                  {"token_ids", s.token_ids},
                  {"loss_mask", s.loss_mask},
                  {"rollout_logprobs", std::move(logprobs)},
                  {"policy_versions", s.policy_versions}}
                 .dump(-1, ' ', false, json::error_handler_t::replace)
          << '\n';
    }
  out.flush();
  SWARM_REQUIRE(out.good(), ErrorKind::INTERNAL, "cannot append to " + file.string());
}

fs::path write_checkpoint(const fs::path& checkpoints_dir, const EngineCheckpointState& state,
                          const std::function<void(const fs::path&)>& write_into) {
  fs::create_directories(checkpoints_dir);
  const std::string name = "step-" + std::to_string(state.global_step);
  const fs::path final_dir = checkpoints_dir / name;
  const fs::path tmp = checkpoints_dir / ("." + name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write_into(tmp);
    const json st = {{"global_step", state.global_step},
                     {"policy_version", state.policy_version},
                     {"pool_counters", state.counters.to_json()},
                     {"job_yaml", state.job_yaml}};
    std::ofstream(tmp / "engine_state.json") << st.dump(2) << '\n';
    // Replacing an older checkpoint of the same step: move it aside first (rename cannot
    // replace a non-empty directory), then drop it once the new one is in place.
    fs::path old;
    if (fs::exists(final_dir)) {
      old = checkpoints_dir / ("." + name + ".old-" + std::to_string(::getpid()));
      fs::remove_all(old);
      fs::rename(final_dir, old);
    }
    fs::rename(tmp, final_dir);
    if (!old.empty()) fs::remove_all(old);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  write_file_atomically(checkpoints_dir / "latest", name + "\n");
  return final_dir;
}

fs::path resolve_checkpoint(const fs::path& dir) {
  SWARM_REQUIRE(fs::is_directory(dir), ErrorKind::INVALID_ARGUMENT, "--resume: '" + dir.string() + "' is not a directory");
  if (fs::exists(dir / "engine_state.json")) return dir;
  for (const fs::path& base : {dir, dir / "checkpoints"}) {
    const fs::path latest = base / "latest";
    if (!fs::exists(latest)) continue;
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    const fs::path cp = base / name;
    SWARM_REQUIRE(!name.empty() && fs::exists(cp / "engine_state.json"), ErrorKind::INVALID_ARGUMENT,
                  "--resume: " + latest.string() + " names '" + name + "', which is not a checkpoint");
    return cp;
  }
  throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                   "--resume: '" + dir.string() +
                       "' is neither a checkpoint (engine_state.json) nor a directory with a 'latest' checkpoint");
}

EngineCheckpointState read_checkpoint_state(const fs::path& checkpoint) {
  const fs::path file = checkpoint / "engine_state.json";
  std::ifstream in(file);
  SWARM_REQUIRE(in.good(), ErrorKind::INVALID_ARGUMENT, "checkpoint has no readable " + file.string());
  try {
    const json j = json::parse(in);
    EngineCheckpointState st;
    st.global_step = j.at("global_step").get<int64_t>();
    st.policy_version = j.at("policy_version").get<int64_t>();
    st.counters = PoolCounters::from_json(j.at("pool_counters"));
    st.job_yaml = j.value("job_yaml", std::string());
    return st;
  } catch (const json::exception& e) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "malformed " + file.string() + ": " + e.what());
  }
}

}  // namespace swarm
