// What a run leaves in its experiment directory: the per-step metrics log and checkpoints
// (written atomically), and finding a checkpoint to resume from. No torch; control thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "engine/backend.hpp"
#include "rollout_pool/rollout_pool.hpp"

namespace swarm {

struct Job;

/// Writes `text` to `path` through a temporary file and a rename, creating the directory.
/// SwarmError(INTERNAL) on I/O errors.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

/// <experiment_dir>/<project_name>/<experiment_name>
std::filesystem::path experiment_path(const Job& job);

/// Appends the step's report as one JSON line ({"step", "policy_version", "time", "episodes",
/// "reward_mean", ..., every metric}) to `file`, creating its directory. SwarmError(INTERNAL) on I/O errors.
void append_step_metrics(const std::filesystem::path& file, const TrainStepReport& report,
                         int64_t policy_version);

/// Appends every sample of `batch` as one JSON line ({"step", "task_id", "episode_uuid",
/// "reward", "num_calls", "token_ids", "loss_mask", "rollout_logprobs", "policy_versions"}) to
/// `file` (job key record_samples). SwarmError(INTERNAL) on I/O errors.
void append_samples(const std::filesystem::path& file, const TrainBatch& batch, int64_t step);

/// The engine's part of a checkpoint (engine_state.json).
struct EngineCheckpointState {
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
