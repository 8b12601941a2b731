#include "engine/engine.hpp"

#include <future>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/job_options.hpp"
#include "engine/run_files.hpp"
#include "engine/sapo.hpp"
#include "swarm/errors.hpp"

namespace swarm {
namespace {

const char* short_name(EngineState s) { return engine_state_wire(s) + 7; }  // after "ENGINE."

// How old what a step trains is: per trained token, the lag between the weights the trainer
// starts from (`trainer_version`) and the weights that sampled it. Synchronous runs have lag 0
// except for task groups carried over from an earlier batch; asynchronous runs stay within η.
void add_staleness_metrics(const TrainBatch& batch, int64_t trainer_version,
                           std::map<std::string, double>& m) {
  constexpr int64_t kLastBucket = 8;  // lags 0..7 each, then "8 or more"
  std::array<int64_t, kLastBucket + 1> count{};
  int64_t tokens = 0, max_lag = 0, off_policy = 0;
  double sum = 0.0;
  for (const FinishedEpisode& e : batch.episodes) {
    bool off = false;
    for (const Sample& s : e.samples)
      for (size_t t = 0; t < s.policy_versions.size(); ++t) {
        if (!s.loss_mask[t] || s.policy_versions[t] < 0) continue;
        const int64_t lag = std::max<int64_t>(0, trainer_version - s.policy_versions[t]);
        ++count[static_cast<size_t>(std::min(lag, kLastBucket))];
        ++tokens;
        sum += static_cast<double>(lag);
        max_lag = std::max(max_lag, lag);
        off = off || lag > 0;
      }
    off_policy += off ? 1 : 0;
  }
  m["staleness_max"] = static_cast<double>(max_lag);
  m["staleness_mean"] = tokens > 0 ? sum / static_cast<double>(tokens) : 0.0;
  for (int64_t k = 0; k <= std::min(max_lag, kLastBucket); ++k)
    m[k == kLastBucket ? "staleness_lag8plus_share" : "staleness_lag" + std::to_string(k) + "_share"] =
        tokens > 0 ? static_cast<double>(count[static_cast<size_t>(k)]) / static_cast<double>(tokens) : 0.0;
  m["episodes_off_policy"] = static_cast<double>(off_policy);
  m["stale_dropped_episodes"] = static_cast<double>(batch.stale_dropped);
}

}  // namespace

const char* engine_state_wire(EngineState s) {
  switch (s) {
    case EngineState::OFFLINE:
      return "ENGINE.OFFLINE";
    case EngineState::BOOTING:
      return "ENGINE.BOOTING";
    case EngineState::ROLLING:
      return "ENGINE.ROLLING";
    case EngineState::ROLLING_POST:
      return "ENGINE.ROLLING_POST";
    case EngineState::WEIGHT_SYNCING:
      return "ENGINE.WEIGHT_SYNCING";
  }
  return "ENGINE.UNKNOWN";
}

Engine::Engine(EngineOptions options) : options_(std::move(options)) {
  clock_ = options_.clock ? options_.clock : SteadyClock::shared();
  state_since_ = clock_->now();
  if (!options_.factory) {
    std::string name = options_.backend;
    make_backend(name).reset();  // fail now, not at first boot, for an unknown engine name
    options_.factory = [name] { return make_backend(name); };
  }
  control_thread_ = std::thread([this] { control_loop(); });
  if (options_.janitor_interval_seconds > 0)
    janitor_thread_ = std::jthread([this](std::stop_token st) { janitor_loop(st); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  std::lock_guard once(shutdown_mu_);
  {
    std::lock_guard lk(mu_);
    closed_ = true;
  }
  if (janitor_thread_.joinable()) {
    janitor_thread_.request_stop();
    janitor_thread_.join();
  }
  stop_engine("server shutting down");
  {
    std::lock_guard lk(task_mu_);
    shutting_down_ = true;
  }
  task_cv_.notify_all();
  if (control_thread_.joinable()) control_thread_.join();
}

// ------------------------------------------------------------------ state machine

void Engine::enter_locked(EngineState next, const std::string& detail) {
  const EngineState prev = state_;
  const double seconds = seconds_between(state_since_, clock_->now());
  state_ = next;
  state_since_ = clock_->now();
  // (Asynchronous runs leave ROLLING only for the swap: their collection time runs from batch to batch.)
  if (next == EngineState::ROLLING && (max_staleness_ == 0 || prev == EngineState::BOOTING))
    rolling_since_ = state_since_;
  if (prev == EngineState::ROLLING) rolling_left_ = state_since_;
  if (next == EngineState::BOOTING)
    booting_since_unix_ =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  else
    booting_since_unix_.reset();
  detail_ = detail;
  ++transitions_[std::string(short_name(prev)) + "->" + short_name(next)];
  spdlog::info("engine: {} -> {} after {:.2f}s (step {}){}{}", short_name(prev), short_name(next), seconds,
               global_step_, detail.empty() ? "" : ": ", detail);
  state_cv_.notify_all();
}

// Applies the transitions that follow from the pool's state: batch complete → ROLLING_POST,
// drained → WEIGHT_SYNCING (which hands the batch to the control thread).
void Engine::maybe_advance_locked() {
  if (!pool_) return;
  if (max_staleness_ > 0) return advance_async_locked();
  if (state_ == EngineState::ROLLING && pool_->batch_ready()) {
    pool_->set_accepting_claims(false);
    enter_locked(EngineState::ROLLING_POST,
                 "batch complete; waiting for " + std::to_string(pool_->running()) + " in-flight episode(s)");
  }
  if (state_ == EngineState::ROLLING_POST && pool_->running() == 0) {
    auto batch = std::make_shared<TrainBatch>(pool_->take_batch());
    const int64_t next_step = global_step_ + 1;
    enter_locked(EngineState::WEIGHT_SYNCING, "policy update for step " + std::to_string(next_step) + " on " +
                                                  std::to_string(batch->episodes.size()) + " episodes");
    trainer_step_ = next_step;
    const uint64_t epoch = epoch_;
    std::stop_token stop = run_stop_.get_token();
    const double rollout_seconds = seconds_between(rolling_since_, clock_->now());
    post([this, epoch, batch, next_step, rollout_seconds, stop] {
      run_train(epoch, batch, next_step, rollout_seconds, stop);
    });
  }
}

// Asynchronous training. A batch taken now trains on the weights of version w = global_step_
// (the trainer is idle, so they are the ones serving), and no token of it may be older than
// w - η: older cached episodes are dropped first. Then collection goes on while the trainer works.
void Engine::advance_async_locked() {
  if (state_ != EngineState::ROLLING && state_ != EngineState::WEIGHT_SYNCING) return;
  if (trainer_step_ == 0) {
    const int64_t min_version = global_step_ - max_staleness_;
    stale_dropped_since_step_ += pool_->drop_stale(min_version);
    if (pool_->batch_ready()) {
      int64_t dropped = 0;
      auto batch = std::make_shared<TrainBatch>(pool_->take_batch_fresh(min_version, &dropped));
      batch->stale_dropped = stale_dropped_since_step_ + dropped;
      stale_dropped_since_step_ = 0;
      if (batch->stale_dropped > 0)
        spdlog::warn(
            "engine: {} episode(s) dropped as too stale for step {} (a token older than version {}, "
            "max_staleness {})",
            batch->stale_dropped, global_step_ + 1, min_version, max_staleness_);
      const int64_t next_step = global_step_ + 1;
      trainer_step_ = next_step;
      const uint64_t epoch = epoch_;
      std::stop_token stop = run_stop_.get_token();
      const double rollout_seconds = seconds_between(rolling_since_, clock_->now());
      rolling_since_ = clock_->now();
      if (config_ && config_->total_training_steps > 0 && next_step >= config_->total_training_steps) {
        // The last step: nothing more will train, so no new episodes.
        pool_->set_accepting_claims(false);
        enter_locked(EngineState::ROLLING_POST, "training the last step (" + std::to_string(next_step) +
                                                    ", total_training_steps) on " +
                                                    std::to_string(batch->episodes.size()) + " episodes");
      } else {
        detail_ = "trainer on step " + std::to_string(next_step) + " (" +
                  std::to_string(batch->episodes.size()) + " episodes); collecting episodes for step " +
                  std::to_string(next_step + 1);
        state_cv_.notify_all();
      }
      post([this, epoch, batch, next_step, rollout_seconds, stop] {
        run_train(epoch, batch, next_step, rollout_seconds, stop);
      });
    }
  }
  update_admission_locked();
}

// The pool's admission bound: an episode claimed now (version w) trains in batch T+1 or later,
// T the batches taken (w, or w + 1 while the trainer works), at a lag of T - w plus one per batch
// queued before it. Unconsumed episodes (running + cached) beyond (η + 1 - (T - w)) batches would
// be trained too stale, so new claims wait; the take-time drop above is the guarantee.
void Engine::update_admission_locked() {
  if (!pool_ || max_staleness_ == 0) return;
  const int64_t ahead = trainer_step_ != 0 ? 1 : 0;
  pool_->set_train_admission_limit((max_staleness_ + 1 - ahead) * episodes_per_batch_);
}

// The backend swaps weights inside train_step; asynchronous runs show that moment (only it) as
// WEIGHT_SYNCING. Claims, ends and calls go on meanwhile; generation waits for the copy.
void Engine::on_weight_swap(uint64_t epoch, bool swapping) {
  std::lock_guard lk(mu_);
  if (epoch != epoch_ || max_staleness_ == 0) return;
  if (swapping && state_ == EngineState::ROLLING) {
    enter_locked(EngineState::WEIGHT_SYNCING,
                 "swapping in the weights of step " + std::to_string(trainer_step_) + " (generation paused)");
  } else if (!swapping && state_ == EngineState::WEIGHT_SYNCING) {
    enter_locked(EngineState::ROLLING, "collecting episodes for step " + std::to_string(trainer_step_ + 1) +
                                           " (step " + std::to_string(trainer_step_) + " finishing)");
  }
}

JobConfigReport Engine::sync_train_config(const std::string& yaml) {
  Job job;
  JobConfigReport report;
  try {
    job = Job::from_yaml(yaml, &report);
  } catch (const ConfigError& e) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, e.what());
  }
  std::lock_guard lk(mu_);
  SWARM_REQUIRE(state_ == EngineState::OFFLINE, ErrorKind::CONFLICT,
                std::string("sync_train_config is only allowed in ENGINE.OFFLINE (engine is ") +
                    engine_state_wire(state_) + "); call stop_engine first");
  config_ = std::move(job);
  detail_ = "config synced (model " + config_->model + "); waiting for start_engine";
  spdlog::info("engine: config synced (model={}, batch_size={}, num_repeat={}, method={})", config_->model,
               config_->batch_size, config_->num_repeat, config_->sample_collection_method);
  if (report.format == "agentjet") {
    spdlog::info("engine: AgentJet config: {} keys mapped, {} ignored (docs/agentjet.md)",
                 report.mapped.size(), report.ignored.size());
    for (const auto& m : report.mapped) spdlog::debug("engine: config {} -> {} = {}", m.from, m.to, m.value);
    std::string ignored;
    for (const auto& path : report.ignored) ignored += (ignored.empty() ? "" : ", ") + path;
    spdlog::debug("engine: config ignored: {}", ignored);
    for (const auto& w : report.warnings) spdlog::warn("engine: config: {}", w);
  }
  return report;
}

std::string Engine::store_train_code(const std::string& zip_bytes) {
  std::lock_guard lk(mu_);
  SWARM_REQUIRE(state_ == EngineState::OFFLINE, ErrorKind::CONFLICT,
                std::string("sync_train_code is only allowed in ENGINE.OFFLINE (engine is ") +
                    engine_state_wire(state_) + "); call stop_engine first");
  // AgentJet's client usually uploads before it syncs the config, so the run's directory is
  // not known yet: the archive waits under the experiments root and start_engine copies it in.
  const Job& job = config_ ? *config_ : Job{};
  const std::filesystem::path file =
      std::filesystem::absolute(std::filesystem::path(job.experiment_dir) / "agentjet_code.zip")
          .lexically_normal();
  write_file_atomically(file, zip_bytes);
  pending_code_ = file;
  spdlog::info(
      "engine: code archive of {} bytes stored as {}; it is copied into the experiment directory at "
      "start_engine (kept, never run: swarm-server runs no Python)",
      zip_bytes.size(), file.string());
  return file.string();
}

void Engine::start_engine(bool resume) {
  std::lock_guard lk(mu_);
  SWARM_REQUIRE(!closed_, ErrorKind::UNAVAILABLE, "the server is shutting down");
  SWARM_REQUIRE(state_ == EngineState::OFFLINE, ErrorKind::CONFLICT,
                std::string("start_engine is only allowed in ENGINE.OFFLINE (engine is ") +
                    engine_state_wire(state_) + ")");
  SWARM_REQUIRE(config_.has_value(), ErrorKind::CONFLICT,
                "no config: call sync_train_config before start_engine");
  ++epoch_;
  run_stop_ = std::stop_source();
  std::error_code ec;
  const auto dir = std::filesystem::absolute(experiment_path(*config_), ec);
  experiment_dir_ = (ec ? experiment_path(*config_) : dir).lexically_normal().string();
  enter_locked(EngineState::BOOTING, "loading " + config_->model);
  BootPlan plan;
  plan.epoch = epoch_;
  plan.resume_from = options_.resume_from;  // swarm-server start --resume: the first start only
  plan.resume_latest = plan.resume_from.empty() && (resume || config_->resume);
  plan.code = std::exchange(pending_code_, {});
  Job job = *config_;
  std::stop_token stop = run_stop_.get_token();
  post([this, plan = std::move(plan), job = std::move(job), stop] { run_boot(plan, job, stop); });
}

void Engine::stop_engine(const std::string& reason) {
  std::lock_guard lk(mu_);
  end_run_locked(reason);
}

void Engine::end_run_locked(const std::string& reason, bool save) {
  run_stop_.request_stop();
  ++epoch_;
  trainer_step_ = 0;
  if (pool_) {
    pool_->cancel_all();
    accumulate_counters_locked();
    pool_.reset();
  }
  if (state_ != EngineState::OFFLINE) enter_locked(EngineState::OFFLINE, reason);
  if (sharing_) post([x = std::move(sharing_)]() mutable { x.reset(); });  // joins its thread
  // The store closes on the control thread after the last checkpoint of the run has pruned it.
  // What the cancelled pool held stays stored: the next start of this experiment trains on it.
  std::shared_ptr<EpisodeStore> store = std::move(store_);
  if (backend_) {
    // Released on the control thread, after any boot/train of the old run has returned;
    // generations still in flight keep their own reference until they finish. Steps trained
    // since the last checkpoint are saved first (backend_step_ is read there, after any
    // policy step still running has finished).
    std::optional<Job> job = save && options_.write_run_files ? config_ : std::nullopt;
    post([this, b = std::move(backend_), job, counters = past_counters_, run_id = run_.run_id,
          store]() mutable {
      if (job && backend_step_ > checkpointed_step_) {
        try {
          checkpoint(*b, *job, backend_step_, run_id, counters, store.get());
        } catch (const std::exception& e) {
          spdlog::error("engine: no checkpoint on stop: {}", e.what());
        }
      }
      b->release();
      b.reset();
      store.reset();  // commits what is queued and closes the database
    });
  } else if (store) {
    post([store = std::move(store)]() mutable { store.reset(); });
  }
}

double Engine::checkpoint(Backend& backend, const Job& job, int64_t step, const std::string& run_id,
                          const PoolCounters& counters, EpisodeStore* store) {
  const auto t0 = std::chrono::steady_clock::now();
  EngineCheckpointState st;
  st.run_id = run_id;
  st.global_step = step;
  st.policy_version = step;
  st.counters = counters;
  st.job_yaml = job.to_yaml();
  // The steps' mark-trained operations are committed first (retried if a transaction failed):
  // a crash right after the checkpoint must not reload, and train again, what it holds.
  if (store) store->flush();
  const auto dir = write_checkpoint(experiment_path(job) / "checkpoints", st,
                                    [&](const std::filesystem::path& tmp) { backend.save_checkpoint(tmp); });
  checkpointed_step_ = step;
  if (store) store->prune_trained_through(step);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("engine: checkpoint of step {} written to {} in {:.2f}s", step, dir.string(), seconds);
  return seconds;
}

void Engine::accumulate_counters_locked() {
  if (pool_) past_counters_ += pool_->counters();
}

// ------------------------------------------------------------------ control thread

void Engine::post(std::function<void()> task) {
  {
    std::lock_guard lk(task_mu_);
    tasks_.push_back(std::move(task));
  }
  task_cv_.notify_one();
}

void Engine::control_loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lk(task_mu_);
      task_cv_.wait(lk, [&] { return shutting_down_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // shutting down and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      task();
    } catch (const std::exception& e) {
      spdlog::error("engine: control task failed: {}", e.what());
    }
  }
}

namespace {
// A step whose update trained no sequence says so (docs/concepts.md, Metrics): trained_nothing
// 1 and a warning naming why; 0 on the other steps of a backend that reports what it trained.
void note_trained_nothing(TrainStepReport& report) {
  const auto metric = [&](const char* name) {
    const auto it = report.metrics.find(name);
    return it == report.metrics.end() ? -1.0 : it->second;
  };
  const double trained = metric("sequences_trained");
  if (trained < 0) return;  // a backend that does not say
  report.metrics["trained_nothing"] = trained > 0 ? 0.0 : 1.0;
  if (trained > 0) return;
  const double groups = metric("groups"), equal = metric("groups_zero_variance");
  if (groups > 0 && equal == groups) {
    spdlog::warn(
        "engine: step {} trained nothing: every group's rewards were equal ({:.0f} group(s) of num_repeat "
        "episodes; group-relative advantages are then 0). Rewards that differ within a task's group are "
        "what trains: a harder or more graded reward, or a larger num_repeat",
        report.global_step, groups);
  } else {
    spdlog::warn(
        "engine: step {} trained nothing: no sample had a generated token with an advantage "
        "({:.0f} group(s), {:.0f} without reward variance)",
        report.global_step, std::max(0.0, groups), std::max(0.0, equal));
  }
}

// Whether checkpoint `cp` (or, for a store-only resume, directory `from`) belongs to the run
// in `experiment`: its checkpoints/ or the directory itself.
bool same_run_directory(const std::filesystem::path& experiment, const std::filesystem::path& cp) {
  std::error_code ec;
  const auto exp = std::filesystem::weakly_canonical(experiment, ec);
  if (ec) return false;
  const auto at = std::filesystem::weakly_canonical(cp, ec);
  if (ec) return false;
  return at == exp || at.parent_path() == exp / "checkpoints";
}
}  // namespace

RunRecord Engine::prepare_run_directory(const Job& job, const std::filesystem::path& code,
                                        const std::string& resume_from,
                                        const std::filesystem::path& checkpoint,
                                        const std::optional<EngineCheckpointState>& resumed) {
  const std::filesystem::path exp = experiment_path(job);
  const auto now = std::chrono::system_clock::now();
  const double now_unix = std::chrono::duration<double>(now.time_since_epoch()).count();
  const bool continues =
      !resume_from.empty() &&
      same_run_directory(exp, checkpoint.empty() ? std::filesystem::path(resume_from) : checkpoint);
  RunRecord run;
  if (continues) {
    // The same run goes on: its id, and each step once in metrics.jsonl.
    run = read_run_record(exp).value_or(
        RunRecord{resumed && !resumed->run_id.empty() ? resumed->run_id : run_id_at(now), now_unix, ""});
    if (options_.write_run_files) {
      const size_t moved = supersede_metrics_after(exp / "metrics.jsonl", resumed ? resumed->global_step : 0);
      if (moved > 0)
        spdlog::info("engine: {} line(s) of metrics.jsonl after step {} (trained again now) moved to {}",
                     moved, resumed ? resumed->global_step : 0, (exp / "metrics.superseded.jsonl").string());
    }
  } else {
    // A fresh run (or one resumed from elsewhere): the earlier run of this directory is kept whole.
    if (options_.write_run_files) {
      const std::filesystem::path kept = archive_run(exp);
      if (!kept.empty())
        spdlog::info("engine: the earlier run of {} is kept in {}", exp.string(), kept.string());
    }
    // An id no run of this directory has (two starts within a second share a clock time).
    const std::string base = resumed && !resumed->run_id.empty() ? resumed->run_id : run_id_at(now);
    run.run_id = base;
    for (int n = 2; std::filesystem::exists(exp / "runs" / run.run_id); ++n)
      run.run_id = base + "-" + std::to_string(n);
    run.started_unix = now_unix;
    if (!resume_from.empty() && options_.write_run_files) {
      // Resumed from another directory (an earlier run under runs/): the episodes it stored and
      // had not trained come along (copied: that run stays whole).
      const std::filesystem::path from_run =
          checkpoint.empty() ? std::filesystem::path(resume_from) : checkpoint.parent_path().parent_path();
      std::error_code ec;
      std::filesystem::create_directories(exp, ec);
      for (const char* name : {"episodes.sqlite", "episodes.sqlite-wal"})
        if (std::filesystem::exists(from_run / name, ec))
          std::filesystem::copy_file(from_run / name, exp / name,
                                     std::filesystem::copy_options::overwrite_existing, ec);
    }
  }
  run.resumed_from = checkpoint.empty() ? resume_from : checkpoint.string();
  if (!options_.write_run_files) return run;
  std::error_code ec;
  std::filesystem::create_directories(exp, ec);
  write_run_record(exp, run);
  if (!code.empty()) {
    std::filesystem::copy_file(code, exp / "agentjet_code.zip",
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) spdlog::warn("engine: could not copy {} into {}: {}", code.string(), exp.string(), ec.message());
  }
  return run;
}

void Engine::run_boot(const BootPlan& plan, const Job& job, std::stop_token stop) {
  const uint64_t epoch = plan.epoch;
  std::shared_ptr<Backend> backend;
  std::shared_ptr<ExperienceSharing> sharing;
  std::shared_ptr<EpisodeStore> store;
  StoredEpisodes stored;
  std::optional<EngineCheckpointState> resumed;
  RunRecord run;
  std::string error;
  try {
    std::string resume_from = plan.resume_from;
    if (plan.resume_latest) {  // start_engine {"resume": true} or the job's resume key
      const std::filesystem::path exp = experiment_path(job);
      if (has_checkpoint(exp) || std::filesystem::exists(exp / "episodes.sqlite")) {
        resume_from = exp.string();
      } else {
        spdlog::info("engine: resume asked for, but {} holds no checkpoint or stored episodes: a fresh run",
                     exp.string());
      }
    }
    backend = std::shared_ptr<Backend>(options_.factory());
    // An experiment that crashed before its first checkpoint: nothing to load but its stored
    // episodes (the weights are the job's model, which generated them).
    const bool store_only = !resume_from.empty() && !has_checkpoint(resume_from) &&
                            std::filesystem::exists(std::filesystem::path(resume_from) / "episodes.sqlite");
    std::filesystem::path checkpoint;
    if (store_only) {
      spdlog::info(
          "engine: resuming {}: no checkpoint yet, so the job's model at step 0, with the episodes it stored",
          resume_from);
    } else if (!resume_from.empty()) {
      checkpoint = resolve_checkpoint(resume_from);
      resumed = read_checkpoint_state(checkpoint);
      backend->set_resume_checkpoint(checkpoint);
      spdlog::info("engine: resuming from {} (step {})", checkpoint.string(), resumed->global_step);
    }
    run = prepare_run_directory(job, plan.code, resume_from, checkpoint, resumed);
    spdlog::info("engine: run {} in {}", run.run_id, experiment_path(job).string());
    backend->set_swap_listener([this, epoch](bool swapping) { on_weight_swap(epoch, swapping); });
    backend->boot(job, stop);
    if (!job.exchange_url.empty()) {
      // The draw of external groups is seeded by the job and the step the run starts at.
      const int64_t start_step = resumed ? resumed->global_step : 0;
      sharing = std::make_shared<ExperienceSharing>(
          job, backend->model_id(), options_.write_run_files ? experiment_path(job) / "node_id" : "",
          static_cast<uint64_t>(job.seed) * 7919u + static_cast<uint64_t>(start_step));
    }
    if (job.durable_episodes && options_.write_run_files) {
      EpisodeStoreOptions so;
      so.fsync_every_commit = job.durable_fsync;
      store = std::make_shared<EpisodeStore>(experiment_path(job) / "episodes.sqlite", so);
      if (!resume_from.empty()) {
        // Resuming: what was collected and not trained into the checkpoint trains now.
        stored = store->pending_for_restart(resumed ? resumed->global_step : 0);
        spdlog::info(
            "engine: {} finished episode(s) collected before the restart are back in the pool ({} of them "
            "trained by steps after the checkpoint, {} unreadable and dropped) from {}",
            stored.episodes.size(), stored.retrained, stored.discarded, store->file().string());
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  {
    std::lock_guard lk(mu_);
    if (epoch == epoch_) {
      if (!error.empty()) {
        enter_locked(EngineState::OFFLINE, "boot failed: " + error);
        return;
      }
      backend_ = std::move(backend);
      global_step_ = resumed ? resumed->global_step : 0;
      backend_step_ = checkpointed_step_ = global_step_;
      backend_->set_policy_version(global_step_);
      // The step history and the counters are the run's: they restart with it (a resumed run
      // continues the counters its checkpoint holds).
      run_ = run;
      steps_.clear();
      past_counters_ = resumed ? resumed->counters : PoolCounters{};
      options_.resume_from.clear();  // later starts of this process: fresh, or start_engine's resume
      pool_ = std::make_shared<RolloutPool>(pool_config_from(job), clock_);
      if (store) {
        pool_->set_journal(store);
        pool_->restore_finished(std::move(stored.episodes));
      }
      store_ = std::move(store);
      sharing_ = std::move(sharing);
      max_staleness_ = job.max_staleness;
      trainer_step_ = 0;
      episodes_per_batch_ = job.batch_size * job.num_repeat;
      stale_dropped_since_step_ = 0;
      update_admission_locked();
      pool_->set_accepting_claims(true);
      enter_locked(EngineState::ROLLING, "collecting episodes for step " + std::to_string(global_step_ + 1));
      maybe_advance_locked();  // restored episodes may complete a batch already
      return;
    }
  }
  // stop_engine came while booting: this backend belongs to a cancelled run.
  sharing.reset();
  store.reset();
  if (backend) backend->release();
}

// ------------------------------------------------------------------ swarm experience sharing

// One policy step on the control thread, in phases: share experience (SAPO), record the
// batch's samples, train and sync the weights, the step's metrics and checkpoint, the agree
// methods' hold, then the state machine moves on (finish_step_locked).
void Engine::run_train(uint64_t epoch, const std::shared_ptr<TrainBatch>& batch, int64_t next_step,
                       double rollout_seconds, std::stop_token stop) {
  std::shared_ptr<Backend> backend;
  std::shared_ptr<ExperienceSharing> sharing;
  std::shared_ptr<EpisodeStore> store;
  std::optional<Job> job;
  TimePoint rolling_left;
  {
    std::lock_guard lk(mu_);
    if (epoch != epoch_) return;
    backend = backend_;
    sharing = sharing_;
    store = store_;
    job = config_;
    rolling_left = rolling_left_;
  }
  std::map<std::string, double> sapo_metrics;
  if (sharing) sapo_metrics = sharing->share(*backend, *batch, next_step - 1);
  if (job && job->record_samples && options_.write_run_files) {
    try {
      append_samples(experiment_path(*job) / "samples.jsonl", *batch, next_step);
    } catch (const std::exception& e) {
      spdlog::error("engine: {}", e.what());
    }
  }
  TrainStepReport report;
  std::string error;
  try {
    report = train_and_sync(*backend, *batch, next_step, store.get(), stop);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (error.empty() && job) {
    report.metrics["rollout_seconds"] = rollout_seconds;
    int64_t split = 0;
    for (const auto& e : batch->episodes) split += e.samples.size() > 1 ? 1 : 0;
    report.metrics["episodes_split_by_drift"] = static_cast<double>(split);
    add_staleness_metrics(*batch, next_step - 1, report.metrics);
    report.metrics.insert(sapo_metrics.begin(), sapo_metrics.end());
    save_step(*backend, *job, next_step, store.get(), report);
    if (is_agree_job(*job)) hold_for_agree_sync(*job, rolling_left, stop);
  }
  std::lock_guard lk(mu_);
  if (epoch != epoch_) return;
  if (!error.empty()) {
    // A failed update leaves the weights in an unknown state: stop loudly, and no checkpoint.
    end_run_locked("training step " + std::to_string(next_step) + " failed: " + error, /*save=*/false);
    return;
  }
  finish_step_locked(next_step, std::move(report));
}

TrainStepReport Engine::train_and_sync(Backend& backend, const TrainBatch& batch, int64_t next_step,
                                       EpisodeStore* store, std::stop_token stop) {
  TrainStepReport report = backend.train_step(batch, next_step, stop);
  report.global_step = next_step;
  // The share of prompt tokens the prefix cache served since the last step (null: none looked
  // up); counters that went down belong to a new boot of the backend.
  const std::map<std::string, double> inference = backend.inference_metrics();
  const auto queries = inference.find("prefix_cache_queries_tokens_total");
  const auto hits = inference.find("prefix_cache_hit_tokens_total");
  if (queries != inference.end() && hits != inference.end()) {
    if (queries->second < prefix_queries_seen_ || hits->second < prefix_hits_seen_)
      prefix_queries_seen_ = prefix_hits_seen_ = 0.0;
    const double asked = queries->second - prefix_queries_seen_;
    report.metrics["prefix_cache_hit_rate"] =
        asked > 0 ? (hits->second - prefix_hits_seen_) / asked : std::numeric_limits<double>::quiet_NaN();
    prefix_queries_seen_ = queries->second;
    prefix_hits_seen_ = hits->second;
  }
  backend.set_policy_version(next_step);  // in-process weight sync: new weights now serve
  backend_step_ = next_step;
  if (store) {  // never trained twice: a restart from a later checkpoint does not reload them
    std::vector<std::string> trained;
    for (const FinishedEpisode& e : batch.episodes)
      if (e.from_node.empty()) trained.push_back(e.episode_uuid);
    store->mark_trained(std::move(trained), next_step);
  }
  return report;
}

void Engine::save_step(Backend& backend, const Job& job, int64_t step, EpisodeStore* store,
                       TrainStepReport& report) {
  note_trained_nothing(report);
  if (!options_.write_run_files) return;
  PoolCounters counters;
  std::string run_id;
  {
    std::lock_guard lk(mu_);
    counters = past_counters_;
    if (pool_) counters += pool_->counters();
    run_id = run_.run_id;
  }
  if (job.save_freq > 0 && step % job.save_freq == 0) {
    try {
      report.metrics["checkpoint_seconds"] = checkpoint(backend, job, step, run_id, counters, store);
    } catch (const std::exception& e) {
      spdlog::error("engine: checkpoint of step {} failed: {}", step, e.what());
    }
  }
  try {
    append_step_metrics(experiment_path(job) / "metrics.jsonl", report, step, run_id);
  } catch (const std::exception& e) {
    spdlog::error("engine: {}", e.what());
  }
}

bool Engine::is_agree_job(const Job& job) {
  CollectionMethod method{};
  return job.agree_sync_min_seconds > 0 && parse_collection_method(job.sample_collection_method, &method) &&
         is_agree_method(method);
}

// Agree methods: AgentJet's client waits for ROLLING_POST / WEIGHT_SYNCING by sampling the
// state every 5 s after its agreement; a sync shorter than that would leave it waiting.
void Engine::hold_for_agree_sync(const Job& job, TimePoint rolling_left, std::stop_token stop) {
  const double left = job.agree_sync_min_seconds - seconds_between(rolling_left, clock_->now());
  if (left <= 0) return;
  std::mutex m;
  std::condition_variable_any cv;
  std::unique_lock lk(m);
  cv.wait_for(lk, stop, std::chrono::duration<double>(left), [] { return false; });
}

void Engine::finish_step_locked(int64_t step, TrainStepReport report) {
  global_step_ = step;
  trainer_step_ = 0;
  spdlog::info("engine: step {} done in {:.2f}s: {} episodes, {} samples, {} tokens, reward mean {:.4f}",
               step, report.seconds, report.episodes, report.samples, report.tokens, report.reward_mean);
  steps_.push_back(std::move(report));
  while (steps_.size() > options_.step_history) steps_.pop_front();
  if (config_ && config_->total_training_steps > 0 && global_step_ >= config_->total_training_steps) {
    end_run_locked("finished: reached total_training_steps = " +
                   std::to_string(config_->total_training_steps));
    return;
  }
  if (max_staleness_ > 0) {  // collection never stopped: hand over the next batch if it is ready
    if (state_ == EngineState::ROLLING) {
      detail_ = "collecting episodes for step " + std::to_string(global_step_ + 1);
      state_cv_.notify_all();
    }
    maybe_advance_locked();
    return;
  }
  pool_->set_accepting_claims(true);
  enter_locked(EngineState::ROLLING, "collecting episodes for step " + std::to_string(global_step_ + 1));
  maybe_advance_locked();
}

void Engine::janitor_loop(std::stop_token stop) {
  const auto interval = std::chrono::duration<double>(options_.janitor_interval_seconds);
  std::mutex m;
  std::condition_variable_any cv;
  while (!stop.stop_requested()) {
    {
      std::unique_lock lk(m);
      cv.wait_for(lk, stop, interval, [] { return false; });
    }
    if (stop.stop_requested()) break;
    try {
      tick();
    } catch (const std::exception& e) {
      spdlog::error("engine: janitor failed: {}", e.what());
    }
  }
}

void Engine::tick() {
  std::lock_guard lk(mu_);
  if (!pool_) return;
  auto reaped = pool_->reap_idle();
  for (const auto& uuid : reaped)
    spdlog::warn("engine: episode {} timed out (idle); its slot was reclaimed", uuid);
  maybe_advance_locked();
}

// ------------------------------------------------------------------ episodes
namespace {

// Why a claim is refused outside ROLLING. AgentJet's Python client branches on these words:
// it retries in 15 s on "Engine is syncing weights" / "Engine is in post-rolling phase", so
// they are kept verbatim (docs/protocol.md).
std::string claim_refused_cause(EngineState state) {
  std::string advice;
  switch (state) {
    case EngineState::OFFLINE:
      advice = "Please start the engine first (sync_train_config, then start_engine).";
      break;
    case EngineState::BOOTING:
      advice = "Please wait until the engine is fully booted. Try again later.";
      break;
    case EngineState::ROLLING_POST:
      advice = "Engine is in post-rolling phase. Try again later.";
      break;
    case EngineState::WEIGHT_SYNCING:
      advice = "Engine is syncing weights. Try again later.";
      break;
    case EngineState::ROLLING:
      advice = "Try again later.";
      break;
  }
  return std::string("Engine not ready. Current status: [") + engine_state_wire(state) + "]. " + advice;
}

}  // namespace

ClaimResult Engine::claim_episode(const ClaimRequest& request) {
  std::lock_guard lk(mu_);
  const bool collecting =
      state_ == EngineState::ROLLING || (max_staleness_ > 0 && state_ == EngineState::WEIGHT_SYNCING);
  if (!collecting || !pool_) {
    ClaimResult r;
    r.fail_cause = claim_refused_cause(state_);
    // Validate anyway so a bad request is reported as such in every state.
    SWARM_REQUIRE(!request.client_uuid.empty(), ErrorKind::INVALID_ARGUMENT, "client_uuid must not be empty");
    SWARM_REQUIRE(request.discard_episode_timeout > 0, ErrorKind::INVALID_ARGUMENT,
                  "discard_episode_timeout must be > 0 seconds");
    return r;
  }
  return pool_->claim(request);
}

EndOutcome Engine::end_episode(const std::string& client_uuid, const std::string& episode_uuid,
                               const std::string& task_id, const WorkflowOutput& output,
                               bool declare_client_active) {
  return RolloutPool::wait_for_end([&](const RolloutPool::EndDone& done) {
    end_episode_async(client_uuid, episode_uuid, task_id, output, declare_client_active, done);
  });
}

void Engine::end_episode_async(const std::string& client_uuid, const std::string& episode_uuid,
                               const std::string& task_id, const WorkflowOutput& output,
                               bool declare_client_active, const RolloutPool::EndDone& done) {
  std::shared_ptr<RolloutPool> pool;
  try {
    std::lock_guard lk(mu_);
    SWARM_REQUIRE(pool_, ErrorKind::NOT_FOUND,
                  "episode " + episode_uuid + " not found: the engine is " + engine_state_wire(state_));
    // No episode runs while the weights sync (ROLLING_POST drained them), so an end now is late.
    // A 400 naming the state: AgentJet's client discards the episode quietly on exactly that.
    // (Asynchronous training's WEIGHT_SYNCING is only the swap: episodes run through it.) A retry
    // of an end that was accepted (its answer lost) gets that answer again, whatever the state.
    SWARM_REQUIRE(
        state_ != EngineState::WEIGHT_SYNCING || max_staleness_ > 0 || pool_->remembers_end(episode_uuid),
        ErrorKind::INVALID_ARGUMENT,
        "episode " + episode_uuid +
            " is not running: the engine is ENGINE.WEIGHT_SYNCING (it ended, was "
            "aborted or timed out before the weight sync); its output is discarded");
    pool = pool_;
  } catch (...) {
    return done(EndOutcome{}, std::current_exception());
  }
  // Without the engine's lock: merging the calls and the episode store's commit take time, and
  // concurrent ends must wait together (one commit), not in turn. The episode counts as running
  // until the pool has cached it, so the state cannot move past ROLLING_POST meanwhile. The
  // completion holds the pool (it runs on the store's thread, after the commit).
  auto finish = [this, pool, done](EndOutcome o, std::exception_ptr e) {
    if (!e) {
      std::lock_guard lk(mu_);
      if (pool_ == pool) maybe_advance_locked();
    }
    done(std::move(o), e);
  };
  try {
    pool->end_episode_async(client_uuid, episode_uuid, task_id, output, declare_client_active, finish);
  } catch (...) {
    done(EndOutcome{}, std::current_exception());  // refused before anything was stored
  }
}

bool Engine::abort_episode(const std::string& client_uuid, const std::string& episode_uuid,
                           bool declare_client_active) {
  std::lock_guard lk(mu_);
  if (!pool_) return false;  // no episodes run in this state
  // In ROLLING the slot goes back to the pool; in ROLLING_POST the record is deleted so
  // zombies never block weight sync.
  const bool collecting =
      state_ == EngineState::ROLLING || (max_staleness_ > 0 && state_ == EngineState::WEIGHT_SYNCING);
  const bool aborted = pool_->abort_episode(client_uuid, episode_uuid, !collecting, declare_client_active);
  if (aborted) maybe_advance_locked();
  return aborted;
}

AgreeResult Engine::agree_sync_weight(const std::string& client_uuid) {
  SWARM_REQUIRE(!client_uuid.empty(), ErrorKind::INVALID_ARGUMENT, "client_uuid must not be empty");
  std::lock_guard lk(mu_);
  SWARM_REQUIRE(config_, ErrorKind::CONFLICT, "agree_sync_weight: no config has been synced");
  CollectionMethod method{};
  SWARM_REQUIRE(
      parse_collection_method(config_->sample_collection_method, &method) && is_agree_method(method),
      ErrorKind::CONFLICT,
      "agree_sync_weight needs sample_collection_method rollout_until_any_client_agree_sync_weight or "
      "rollout_until_all_clients_agree_sync_weight; the synced config uses " +
          config_->sample_collection_method);
  AgreeResult result;
  if ((state_ != EngineState::ROLLING && state_ != EngineState::ROLLING_POST) || !pool_) {
    result.failure_reason = std::string("The engine is ") + engine_state_wire(state_) +
                            "; agreements count only while ENGINE.ROLLING or ENGINE.ROLLING_POST.";
    return result;
  }
  result = pool_->agree_sync_weight(client_uuid);
  if (result.success) maybe_advance_locked();
  return result;
}

bool Engine::can_continue_episode(const std::string& client_uuid, const std::string& episode_uuid) const {
  std::lock_guard lk(mu_);
  return pool_ &&
         (state_ == EngineState::ROLLING || state_ == EngineState::ROLLING_POST ||
          (max_staleness_ > 0 && state_ == EngineState::WEIGHT_SYNCING)) &&
         pool_->can_continue(client_uuid, episode_uuid);
}

GenerationLease Engine::begin_generation(const std::string& api_key) {
  std::shared_ptr<RolloutPool> pool;
  GenerationLease lease;
  {
    std::lock_guard lk(mu_);
    SWARM_REQUIRE(pool_ && backend_, ErrorKind::UNAUTHORIZED,
                  std::string("invalid API key: no episodes are running (engine is ") +
                      engine_state_wire(state_) + ")");
    pool = pool_;
    lease.backend = backend_;
    lease.job = *config_;
  }
  lease.ticket = pool->begin_call(api_key);
  lease.pool = std::move(pool);
  return lease;
}

void Engine::finish_generation(const GenerationLease& lease, LlmCall call) {
  lease.pool->finish_call(lease.ticket.episode_uuid, std::move(call));
}

void Engine::cancel_generation(const GenerationLease& lease) {
  lease.pool->cancel_call(lease.ticket.episode_uuid);
}

std::shared_ptr<Backend> Engine::backend() const {
  std::lock_guard lk(mu_);
  return backend_;
}

// ------------------------------------------------------------------ observation

EngineSnapshot Engine::status() const {
  std::lock_guard lk(mu_);
  EngineSnapshot s;
  s.state = state_;
  s.detail = detail_;
  s.global_step = global_step_;
  s.policy_version = global_step_;
  s.seconds_in_state = seconds_between(state_since_, clock_->now());
  s.config_synced = config_.has_value();
  s.backend = backend_ ? backend_->name() : options_.backend;
  s.model = config_ ? config_->model : "";
  s.transitions = transitions_;
  s.booting_since_unix = booting_since_unix_;
  s.experiment_dir = experiment_dir_;
  s.max_staleness = max_staleness_;
  s.trainer_step = trainer_step_;
  s.run = run_;
  if (backend_) {
    s.memory = backend_->memory();
    s.serving = backend_->rank_serving();
  }
  s.counters = past_counters_;
  if (pool_) s.counters += pool_->counters();
  if (store_) {
    s.store = store_->stats();
    s.store_file = store_->file().string();
  }
  if (sharing_) {
    s.exchange = sharing_->exchange()->status();
    if (!s.exchange->ready)
      s.detail += std::string(s.detail.empty() ? "" : "; ") + "exchange " +
                  (s.exchange->connected ? "not ready" : "unreachable") + " (" + s.exchange->url + ")" +
                  (s.exchange->last_error.empty() ? "" : ": " + s.exchange->last_error) +
                  "; training on local groups";
  }
  return s;
}

PoolSnapshot Engine::pool_snapshot() const {
  std::shared_ptr<RolloutPool> pool;
  PoolSnapshot empty;
  {
    std::lock_guard lk(mu_);
    pool = pool_;
    if (!pool && config_) {
      try {
        empty.config = pool_config_from(*config_);
      } catch (const std::exception&) {}
      empty.target_tasks = empty.config.batch_size;
      empty.target_episodes = empty.config.batch_size * empty.config.num_repeat;
    }
  }
  return pool ? pool->snapshot() : empty;
}

std::vector<TrainStepReport> Engine::step_history() const {
  std::lock_guard lk(mu_);
  return {steps_.begin(), steps_.end()};
}

std::optional<Job> Engine::config() const {
  std::lock_guard lk(mu_);
  return config_;
}

bool Engine::wait_for_state(EngineState s, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(mu_);
  return state_cv_.wait_for(lk, timeout, [&] { return state_ == s; });
}

bool Engine::wait_for_step(int64_t step, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(mu_);
  return state_cv_.wait_for(lk, timeout, [&] { return global_step_ >= step; });
}

}  // namespace swarm
