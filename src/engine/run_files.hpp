// What a run leaves in its experiment directory: the per-step metrics log and checkpoints
// (written atomically), and finding a checkpoint to resume from. No torch; control thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.hpp"
#include "rollout_pool/rollout_pool.hpp"

namespace swarm {

struct Job;

/// Writes `text` to `path` through a temporary file and a rename, creating the directory.
/// SwarmError(INTERNAL) on I/O errors.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

/// <experiment_dir>/<project_name>/<experiment_name>
std::filesystem::path experiment_path(const Job& job);

/// Appends the step's report as one JSON line ({"step", "policy_version", "run_id", "time",
/// "episodes", "reward_mean", ..., every metric, "log_metrics": {name: {mean, min, max,
/// episodes}}}) to `file`, creating its directory. A metric that is NaN is written as null, and
/// `loss` and `entropy` are always present (null when the step trained nothing).
/// SwarmError(INTERNAL) on I/O errors.
void append_step_metrics(const std::filesystem::path& file, const TrainStepReport& report,
                         int64_t policy_version, const std::string& run_id);

// ---- runs: one experiment directory holds the current run; earlier ones are kept under runs/

/// The entries of an experiment directory that belong to one run: metrics.jsonl (and
/// metrics.superseded.jsonl), samples.jsonl, checkpoints/, the episode store (episodes.sqlite
/// and its -wal/-shm), agentjet_code.zip and run.json. node_id (the node's identity in a swarm)
/// and runs/ are not.
const std::vector<std::string>& run_entry_names();

/// run.json: which run the experiment directory holds.
struct RunRecord {
  std::string run_id;        // "20261207-050241" (UTC start time), "-2", "-3" ... when taken
  double started_unix = 0;   // when this run first started
  std::string resumed_from;  // the checkpoint it was last resumed from, "" for none
};
std::optional<RunRecord> read_run_record(const std::filesystem::path& experiment_dir);
/// Writes <experiment_dir>/run.json atomically. SwarmError(INTERNAL) on I/O errors.
void write_run_record(const std::filesystem::path& experiment_dir, const RunRecord& record);
/// A run id for a run starting at `t`: its UTC time, "YYYYMMDD-HHMMSS".
std::string run_id_at(std::chrono::system_clock::time_point t);

/// Moves the run entries of `experiment_dir` into <experiment_dir>/runs/<run id>/ (the id of
/// its run.json; for a directory written before run.json existed, the time of its
/// metrics.jsonl or checkpoints), so that a fresh run starts in an empty place and the earlier
/// one stays whole. Returns the directory it made, or "" when there was nothing to move.
/// SwarmError(INTERNAL) when a move fails (what moved stays in runs/<id>).
std::filesystem::path archive_run(const std::filesystem::path& experiment_dir);

/// Resuming at checkpoint step `step`: the lines of `metrics_file` for later steps (trained
/// after the checkpoint; those weights are gone and the steps are trained again) move to
/// metrics.superseded.jsonl beside it, so metrics.jsonl holds each step once. Returns how many
/// moved. SwarmError(INTERNAL) on I/O errors.
size_t supersede_metrics_after(const std::filesystem::path& metrics_file, int64_t step);

/// Appends every sample of `batch` as one JSON line ({"step", "task_id", "episode_uuid",
/// "reward", "num_calls", "token_ids", "loss_mask", "rollout_logprobs", "policy_versions"}) to
/// `file` (job key record_samples). SwarmError(INTERNAL) on I/O errors.
void append_samples(const std::filesystem::path& file, const TrainBatch& batch, int64_t step);

/// The engine's part of a checkpoint (engine_state.json).
struct EngineCheckpointState {
  std::string run_id;  // the run that wrote it ("" in checkpoints older than run ids)
  int64_t global_step = 0;
  int64_t policy_version = 0;
  PoolCounters counters;
  std::string job_yaml;
};

/// Writes checkpoint step-<global_step> under `checkpoints_dir` atomically: `write_into` fills a
/// fresh temporary directory beside it, engine_state.json is added, then one rename makes it
/// visible, and `latest` (a text file naming it) is replaced by rename too. A crash at any point
/// leaves the previous checkpoints and `latest` intact. Returns the checkpoint's path.
std::filesystem::path write_checkpoint(const std::filesystem::path& checkpoints_dir,
                                       const EngineCheckpointState& state,
                                       const std::function<void(const std::filesystem::path&)>& write_into);

/// `dir` as given to --resume: a checkpoint (has engine_state.json), a checkpoints directory
/// (has `latest`) or an experiment directory (has checkpoints/latest). INVALID_ARGUMENT otherwise.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& dir);
/// Whether resolve_checkpoint(dir) finds a checkpoint (never throws).
bool has_checkpoint(const std::filesystem::path& dir);
/// Reads engine_state.json of a checkpoint. INVALID_ARGUMENT when missing or malformed.
EngineCheckpointState read_checkpoint_state(const std::filesystem::path& checkpoint);

}  // namespace swarm
