#include "engine/run_files.hpp"
#include "common/env.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_nesting.hpp"
#include "swarm/job.hpp"

namespace swarm {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Flushes a file's or a directory's contents to the disk (a checkpoint must survive a power
// cut once `latest` names it). SwarmError(INTERNAL) when the disk refuses.
void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  SWARM_REQUIRE(fd >= 0, ErrorKind::INTERNAL,
                "cannot open " + p.string() + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  SWARM_REQUIRE(rc == 0, ErrorKind::INTERNAL,
                "cannot sync " + p.string() + " to disk: " + std::strerror(err));
}

// Temporary directories of checkpoints whose writer died (kill -9, power cut): `.<name>.tmp-<pid>`
// and `.<name>.old-<pid>` of a process that no longer runs.
void remove_abandoned_temporaries(const fs::path& checkpoints_dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] != '.') continue;
    size_t at = name.rfind(".tmp-");
    if (at == std::string::npos) at = name.rfind(".old-");
    if (at == std::string::npos) continue;
    const std::string pid = name.substr(at + 5);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    long pid_number = 0;
    const auto [end, err] = std::from_chars(pid.data(), pid.data() + pid.size(), pid_number);
    if (err != std::errc() || end != pid.data() + pid.size())
      continue;  // not a pid (e.g. too long): not ours
    if (pid_number == ::getpid() || fs::exists("/proc/" + pid)) continue;
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
  }
}

}  // namespace

void write_file_atomically(const fs::path& path, const std::string& text) {
  std::error_code ec;
  if (!path.parent_path().empty()) fs::create_directories(path.parent_path(), ec);
  SWARM_REQUIRE(!ec, ErrorKind::INTERNAL,
                "cannot create " + path.parent_path().string() + ": " + ec.message());
  const fs::path tmp =
      path.parent_path() / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
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

void append_step_metrics(const fs::path& file, const TrainStepReport& report, int64_t policy_version,
                         const std::string& run_id) {
  json line = {
      {"step", report.global_step},
      {"policy_version", policy_version},
      {"run_id", run_id},
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
      {"step_seconds", report.seconds},
      // Every line has them: null when the step trained nothing (docs/concepts.md, Metrics).
      {"loss", nullptr},
      {"entropy", nullptr}};
  for (const auto& [k, v] : report.metrics) line[k] = std::isfinite(v) ? json(v) : json(nullptr);
  if (!report.log_metrics.empty()) line["log_metrics"] = log_metrics_json(report.log_metrics);
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  std::ofstream out(file, std::ios::app);
  out << line.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  out.flush();
  SWARM_REQUIRE(out.good(), ErrorKind::INTERNAL, "cannot append to " + file.string());
}

// ------------------------------------------------------------------ runs

const std::vector<std::string>& run_entry_names() {
  static const std::vector<std::string> names = {
      "metrics.jsonl",       "metrics.superseded.jsonl", "samples.jsonl",
      "checkpoints",         "episodes.sqlite",          "episodes.sqlite-wal",
      "episodes.sqlite-shm", "agentjet_code.zip",        "run.json"};
  return names;
}

std::optional<RunRecord> read_run_record(const fs::path& experiment_dir) {
  std::ifstream in(experiment_dir / "run.json");
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    require_json_nesting(text, "run.json");
    const json j = json::parse(text);
    RunRecord r;
    r.run_id = j.at("run_id").get<std::string>();
    r.started_unix = j.value("started", 0.0);
    r.resumed_from = j.value("resumed_from", std::string());
    // The id names a directory under runs/: nothing but the characters run_id_at writes.
    if (r.run_id.empty() || r.run_id.size() > 64 ||
        r.run_id.find_first_not_of("0123456789-") != std::string::npos)
      return std::nullopt;
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void write_run_record(const fs::path& experiment_dir, const RunRecord& record) {
  json j = {{"run_id", record.run_id}, {"started", record.started_unix}};
  if (!record.resumed_from.empty()) j["resumed_from"] = record.resumed_from;
  write_file_atomically(experiment_dir / "run.json", j.dump(2) + "\n");
}

std::string run_id_at(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm utc{};
  ::gmtime_r(&secs, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &utc);
  return buf;
}

fs::path archive_run(const fs::path& experiment_dir) {
  std::vector<fs::path> present;
  std::error_code ec;
  for (const std::string& name : run_entry_names())
    if (fs::exists(experiment_dir / name, ec)) present.push_back(experiment_dir / name);
  // A run that left nothing but its run.json (its boot failed) is not worth keeping.
  if (present.empty() || (present.size() == 1 && present[0].filename() == "run.json")) return {};
  std::string id;
  if (const auto record = read_run_record(experiment_dir)) {
    id = record->run_id;
  } else {  // written before run.json: named by when it was last written
    fs::file_time_type when = fs::file_time_type::clock::now();
    for (const char* name : {"metrics.jsonl", "checkpoints"})
      if (const auto t = fs::last_write_time(experiment_dir / name, ec); !ec) {
        when = t;
        break;
      }
    const auto sys = std::chrono::time_point_cast<std::chrono::system_clock::duration>(
        when - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
    id = run_id_at(sys);
  }
  const fs::path runs = experiment_dir / "runs";
  fs::path target = runs / id;
  for (int n = 2; fs::exists(target, ec); ++n) target = runs / (id + "-" + std::to_string(n));
  fs::create_directories(target, ec);
  SWARM_REQUIRE(!ec, ErrorKind::INTERNAL, "cannot create " + target.string() + ": " + ec.message());
  size_t moved = 0;
  for (const fs::path& from : present) {
    fs::rename(from, target / from.filename(), ec);
    if (ec == std::errc::no_such_file_or_directory)
      continue;  // gone meanwhile (SQLite drops its -wal on close)
    SWARM_REQUIRE(!ec, ErrorKind::INTERNAL,
                  "cannot move " + from.string() + " into " + target.string() + ": " + ec.message());
    ++moved;
  }
  if (moved == 0) {
    fs::remove(target, ec);
    return {};
  }
  return target;
}

size_t supersede_metrics_after(const fs::path& metrics_file, int64_t step) {
  std::ifstream in(metrics_file);
  if (!in) return 0;
  std::string kept, later;
  size_t moved = 0;
  for (std::string line; std::getline(in, line);) {
    int64_t line_step = 0;
    try {
      const json j = json::parse(line);
      line_step = j.value("step", int64_t{0});
    } catch (const std::exception&) {  // a torn last line of a crash: kept as it is
    }
    if (line_step > step) {
      later += line + '\n';
      ++moved;
    } else {
      kept += line + '\n';
    }
  }
  in.close();
  if (moved == 0) return 0;
  const fs::path superseded = metrics_file.parent_path() / "metrics.superseded.jsonl";
  {
    std::ofstream out(superseded, std::ios::app);
    out << later;
    out.flush();
    SWARM_REQUIRE(out.good(), ErrorKind::INTERNAL, "cannot append to " + superseded.string());
  }
  write_file_atomically(metrics_file, kept);
  return moved;
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
  remove_abandoned_temporaries(checkpoints_dir);
  const std::string name = "step-" + std::to_string(state.global_step);
  fs::path final_dir = checkpoints_dir / name;
  const fs::path tmp = checkpoints_dir / ("." + name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write_into(tmp);
    // Fault injection for the chaos tests (tests/chaos): die by SIGKILL in the middle of saving
    // this step, after the weights were written and before anything is renamed into place.
    if (const auto kill_at = env_value("SWARM_TEST_KILL_DURING_CHECKPOINT");
        kill_at && std::to_string(state.global_step) == *kill_at)
      ::kill(::getpid(), SIGKILL);
    const json st = {{"run_id", state.run_id},
                     {"global_step", state.global_step},
                     {"policy_version", state.policy_version},
                     {"pool_counters", state.counters.to_json()},
                     {"job_yaml", state.job_yaml}};
    {
      std::ofstream out(tmp / "engine_state.json", std::ios::binary | std::ios::trunc);
      out << st.dump(2) << '\n';
      out.flush();
      SWARM_REQUIRE(out.good(), ErrorKind::INTERNAL, "cannot write " + (tmp / "engine_state.json").string());
    }
    for (const auto& entry : fs::recursive_directory_iterator(tmp))
      if (entry.is_regular_file()) fsync_path(entry.path());
    fsync_path(tmp);
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
    fsync_path(checkpoints_dir);
    write_file_atomically(checkpoints_dir / "latest", name + "\n");
    fsync_path(checkpoints_dir);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    std::string last = "there is no earlier checkpoint";
    {
      std::ifstream in(checkpoints_dir / "latest");
      std::string latest;
      if (std::getline(in, latest) && !latest.empty() && latest != name)
        last =
            "the last good checkpoint, " + (checkpoints_dir / latest).string() + ", is intact and loadable";
    }
    throw SwarmError(ErrorKind::INTERNAL,
                     "checkpoint " + name + " could not be written (" + e.what() + "); " + last);
  }
  return final_dir;
}

fs::path resolve_checkpoint(const fs::path& dir) {
  SWARM_REQUIRE(fs::is_directory(dir), ErrorKind::INVALID_ARGUMENT,
                "--resume: '" + dir.string() + "' is not a directory");
  if (fs::exists(dir / "engine_state.json")) return dir;
  for (const fs::path& base : {dir, dir / "checkpoints"}) {
    const fs::path latest = base / "latest";
    if (!fs::exists(latest)) continue;
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    fs::path cp = base / name;
    SWARM_REQUIRE(!name.empty() && fs::exists(cp / "engine_state.json"), ErrorKind::INVALID_ARGUMENT,
                  "--resume: " + latest.string() + " names '" + name + "', which is not a checkpoint");
    return cp;
  }
  throw SwarmError(
      ErrorKind::INVALID_ARGUMENT,
      "--resume: '" + dir.string() +
          "' is neither a checkpoint (engine_state.json) nor a directory with a 'latest' checkpoint");
}

bool has_checkpoint(const fs::path& dir) {
  try {
    resolve_checkpoint(dir);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

EngineCheckpointState read_checkpoint_state(const fs::path& checkpoint) {
  const fs::path file = checkpoint / "engine_state.json";
  std::ifstream in(file);
  SWARM_REQUIRE(in.good(), ErrorKind::INVALID_ARGUMENT, "checkpoint has no readable " + file.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  require_json_nesting(text, file.string());
  try {
    const json j = json::parse(text);
    EngineCheckpointState st;
    st.run_id = j.value("run_id", std::string());
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
