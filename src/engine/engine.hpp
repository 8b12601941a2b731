// The engine: owns the backend and the rollout pool and drives the state machine
// OFFLINE → BOOTING → ROLLING → ROLLING_POST → WEIGHT_SYNCING → ROLLING (docs/design.md).
#pragma once

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.hpp"
#include "engine/backend.hpp"
#include "engine/run_files.hpp"
#include "engine/sapo.hpp"
#include "exchange/exchange.hpp"
#include "rollout_pool/rollout_pool.hpp"
#include "store/episode_store.hpp"
#include "swarm/job.hpp"

namespace swarm {

enum class EngineState { OFFLINE, BOOTING, ROLLING, ROLLING_POST, WEIGHT_SYNCING };
constexpr int kNumEngineStates = 5;

/// Wire string, e.g. "ENGINE.ROLLING".
const char* engine_state_wire(EngineState s);

using BackendFactory = std::function<std::unique_ptr<Backend>()>;

struct EngineOptions {
  std::string backend = "mock";            // used when `factory` is empty
  BackendFactory factory;                  // tests inject fakes here
  std::shared_ptr<Clock> clock;            // default: steady clock
  double janitor_interval_seconds = 0.25;  // idle-timeout sweep; <= 0 disables the thread
  size_t step_history = 512;               // step reports kept for the monitor
  /// A checkpoint to resume from at the first start_engine (`swarm-server start --resume`): a
  /// checkpoint directory, or one holding `latest` (checkpoints/ or the experiment directory).
  std::string resume_from;
  /// Write metrics.jsonl and checkpoints under the job's experiment directory (tests of the
  /// state machine alone may turn this off).
  bool write_run_files = true;
};

struct EngineSnapshot {
  EngineState state = EngineState::OFFLINE;
  std::string detail;
  int64_t global_step = 0;
  int64_t policy_version = 0;
  double seconds_in_state = 0.0;
  bool config_synced = false;
  std::string backend;
  std::string model;
  std::map<std::string, int64_t> transitions;  // "FROM->TO" → count
  std::optional<double> booting_since_unix;    // wall-clock seconds BOOTING began (while BOOTING)
  std::string experiment_dir;                  // absolute; of the current or last run ("" before one)
  int64_t max_staleness = 0;                   // of the current run: 0 = synchronous
  int64_t trainer_step = 0;                    // the policy step the trainer is computing; 0 = idle
  std::optional<ExchangeStatus> exchange;      // swarm experience sharing of the current run, when on
  std::optional<EpisodeStoreStats> store;      // the episode store of the current run (durable_episodes)
  std::string store_file;                      // its database
  RunRecord run;                               // the current or last run ("" id before one)
  std::vector<RankMemory> memory;              // what each rank holds (the loaded backend's report)
  std::vector<RankServing> serving;            // what each rank served (the loaded backend's router)
  PoolCounters counters;                       // of that run (a resumed run continues its checkpoint's)
};

/// What an OpenAI request needs to generate for an episode (see begin_generation).
struct GenerationLease {
  CallTicket ticket;
  std::shared_ptr<Backend> backend;
  std::shared_ptr<RolloutPool> pool;
  Job job;  // sampling defaults and limits
};

/// The engine. Thread-safe: HTTP threads call the commands concurrently; model work
/// (boot, train) runs on the engine's own control thread, never on the caller's.
/// One mutex guards state; it is never held across backend calls.
class Engine {
 public:
  explicit Engine(EngineOptions options);
  ~Engine();  // shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- command API (docs/design.md). Errors are SwarmError with a fitting kind.
  /// Validates and stores a config (our flat keys or AgentJet's `ajet:` tree); only in
  /// OFFLINE (CONFLICT otherwise); last one wins. Returns what was mapped and ignored.
  JobConfigReport sync_train_config(const std::string& yaml);
  /// OFFLINE → BOOTING; boot runs on the control thread. CONFLICT without a config or
  /// when not OFFLINE.
  /// `resume`: continue the experiment's latest checkpoint (with its stored episodes) instead of
  /// a fresh run, as the job's `resume` key does; a fresh run moves the experiment directory's
  /// earlier run to runs/<run id>/ (docs/concepts.md, Runs).
  void start_engine(bool resume = false);
  /// Any state → OFFLINE: in-flight episodes cancelled, backend released.
  void stop_engine(const std::string& reason = "stopped by a client");
  /// The end of the process's engine: stop_engine, then waits until the control thread has
  /// done all it was given (the stop-time checkpoint, the backend's release, which ends its
  /// generations) and joins its threads. Afterwards the commands fail or find nothing to do;
  /// idempotent. What serves requests stops first (SwarmServer::stop).
  void shutdown();

  /// Stores an uploaded code archive (AgentJet's sync_train_code; never run) as
  /// <experiment_dir>/agentjet_code.zip (the experiments root of the synced config, or the
  /// default root), replacing the previous one; the next start_engine copies it into the
  /// run's experiment directory. Only in OFFLINE (CONFLICT otherwise). Returns its path.
  std::string store_train_code(const std::string& zip_bytes);

  ClaimResult claim_episode(const ClaimRequest& request);
  EndOutcome end_episode(const std::string& client_uuid, const std::string& episode_uuid,
                         const std::string& task_id, const WorkflowOutput& output,
                         bool declare_client_active = true);
  /// end_episode that does not wait for the episode store: `done` is called exactly once with
  /// the outcome or the error (a SwarmError), here or later from the store's thread.
  void end_episode_async(const std::string& client_uuid, const std::string& episode_uuid,
                         const std::string& task_id, const WorkflowOutput& output, bool declare_client_active,
                         const RolloutPool::EndDone& done);
  /// False when there was nothing to abort (no such running episode, or no episodes at all in
  /// this state); FORBIDDEN for another client's running episode.
  bool abort_episode(const std::string& client_uuid, const std::string& episode_uuid,
                     bool declare_client_active = true);
  /// An active client agrees to a weight sync (the agree collection methods). CONFLICT when
  /// the synced config uses another method; a refusal with its reason outside
  /// ROLLING/ROLLING_POST and for clients not on the active list.
  AgreeResult agree_sync_weight(const std::string& client_uuid);
  bool can_continue_episode(const std::string& client_uuid, const std::string& episode_uuid) const;

  // ---- OpenAI path
  /// Authenticates `api_key`, marks a call in flight and returns what generation needs.
  /// UNAUTHORIZED for an unknown key; CONFLICT when no model is loaded.
  GenerationLease begin_generation(const std::string& api_key);
  /// Records the finished call (or drops it if the episode is gone). Needs only the lease
  /// (its pool), so a generation that ends while the engine shuts down touches nothing else.
  static void finish_generation(const GenerationLease& lease, LlmCall call);
  /// Ends a call that failed (only the lease, as finish_generation).
  static void cancel_generation(const GenerationLease& lease);
  /// The loaded backend (for /v1/models), or null.
  std::shared_ptr<Backend> backend() const;

  // ---- observation
  EngineSnapshot status() const;
  /// Pool snapshot of the current run (empty pool when OFFLINE).
  PoolSnapshot pool_snapshot() const;
  /// Recent policy-step reports, oldest first.
  std::vector<TrainStepReport> step_history() const;
  /// The synced config, if any.
  std::optional<Job> config() const;

  /// Reaps idle episodes and applies the resulting transitions (the janitor calls this
  /// periodically; tests call it directly with a fake clock).
  void tick();
  /// Blocks until the state is `s` or the timeout passes; returns whether it got there.
  bool wait_for_state(EngineState s, std::chrono::milliseconds timeout) const;
  /// Blocks until global_step >= step or the timeout passes.
  bool wait_for_step(int64_t step, std::chrono::milliseconds timeout) const;

 private:
  void enter_locked(EngineState next, const std::string& detail);
  void maybe_advance_locked();
  // Asynchronous training (max_staleness >= 1): hands a complete batch to the trainer while
  // collection goes on, and keeps the pool's admission bound in step with it.
  void advance_async_locked();
  void update_admission_locked();
  void on_weight_swap(uint64_t epoch, bool swapping);
  void post(std::function<void()> task);
  void control_loop();
  void janitor_loop(std::stop_token stop);
  // What start_engine hands the boot: the run's epoch, where to resume from (an explicit path,
  // or the experiment's latest checkpoint when there is one), the code archive to copy in.
  struct BootPlan {
    uint64_t epoch = 0;
    std::string resume_from;
    bool resume_latest = false;
    std::filesystem::path code;
  };
  void run_boot(const BootPlan& plan, const Job& job, std::stop_token stop);
  // Control thread, at boot: the run's identity, and its directory made ready — a fresh run
  // moves the earlier run's files to runs/<id>/, a continued one drops metrics.jsonl lines
  // after its checkpoint; run.json and the code archive are written.
  RunRecord prepare_run_directory(const Job& job, const std::filesystem::path& code,
                                  const std::string& resume_from, const std::filesystem::path& checkpoint,
                                  const std::optional<EngineCheckpointState>& resumed);
  void run_train(uint64_t epoch, const std::shared_ptr<TrainBatch>& batch, int64_t next_step,
                 double rollout_seconds, std::stop_token stop);
  // run_train's phases (control thread). train_and_sync: the update, the new weights serving,
  // the store told what trained. save_step: the checkpoint when due and metrics.jsonl.
  // hold_for_agree_sync: the agree methods' least sync time. finish_step_locked: the step
  // counts, then ROLLING again (or the run ends at total_training_steps).
  TrainStepReport train_and_sync(Backend& backend, const TrainBatch& batch, int64_t next_step,
                                 EpisodeStore* store, std::stop_token stop);
  void save_step(Backend& backend, const Job& job, int64_t step, EpisodeStore* store,
                 TrainStepReport& report);
  static bool is_agree_job(const Job& job);
  void hold_for_agree_sync(const Job& job, TimePoint rolling_left, std::stop_token stop);
  void finish_step_locked(int64_t step, TrainStepReport report);
  /// Control thread: writes checkpoint step-<step> of `backend` (atomically) and returns its seconds.
  /// Then the episode store (when given) forgets what the checkpoint holds.
  double checkpoint(Backend& backend, const Job& job, int64_t step, const std::string& run_id,
                    const PoolCounters& counters, EpisodeStore* store);
  void accumulate_counters_locked();
  /// Ends the current run (any state → OFFLINE): cancels episodes, releases the backend, and
  /// (when `save`) first saves a checkpoint of steps trained since the last one.
  void end_run_locked(const std::string& reason, bool save = true);

  EngineOptions options_;
  std::shared_ptr<Clock> clock_;

  mutable std::mutex mu_;
  mutable std::condition_variable state_cv_;
  EngineState state_ = EngineState::OFFLINE;
  TimePoint state_since_;
  TimePoint rolling_since_;  // when collection for the current step began
  TimePoint rolling_left_;   // when the current step's collection ended (ROLLING_POST)
  std::optional<double> booting_since_unix_;
  std::string experiment_dir_;
  std::filesystem::path pending_code_;  // an uploaded code archive the next start copies in
  std::string detail_ = "waiting for a config (sync_train_config) and start_engine";
  std::optional<Job> config_;
  // The counters of a run. Steps count policy updates: step N is the update that turns the
  // weights of version N-1 into version N, and the weights that serve are always version
  // global_step_ (the policy version on the wire and in every recorded call is this number).
  //
  //   counter             | means                                              | written by
  //   --------------------|----------------------------------------------------|--------------------
  //   epoch_              | the run: bumped by start / stop / end; control-    | any thread, under mu_
  //                       | thread work of an older epoch is discarded         |
  //   global_step_        | steps finished and serving (the policy version)    | control thread, mu_
  //   trainer_step_       | the step being computed now; 0 = the trainer idle  | under mu_
  //                       | (asynchronous training collects meanwhile)         |
  //   backend_step_       | the step the backend's weights are at: ahead of    | control thread
  //                       | global_step_ when a stop discarded a finished step |
  //   checkpointed_step_  | the last step saved to checkpoints/                | control thread
  uint64_t epoch_ = 0;
  std::stop_source run_stop_;
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<RolloutPool> pool_;
  int64_t global_step_ = 0;
  std::map<std::string, int64_t> transitions_;
  RunRecord run_;               // the current or last run
  PoolCounters past_counters_;  // of the run, from its earlier pools (a resumed run: the checkpoint's)
  std::deque<TrainStepReport> steps_;
  int64_t backend_step_ = 0;
  int64_t checkpointed_step_ = 0;
  // The prefix cache's counters (backend inference_metrics) at the last step, for each step's
  // prefix_cache_hit_rate (control thread).
  double prefix_queries_seen_ = 0.0;
  double prefix_hits_seen_ = 0.0;
  // Asynchronous training (under mu_): η of the run, trainer_step_ (above), the episodes per
  // batch the admission bound counts in, and stale drops since the last step.
  int64_t max_staleness_ = 0;
  int64_t trainer_step_ = 0;
  int64_t episodes_per_batch_ = 0;
  int64_t stale_dropped_since_step_ = 0;
  // Swarm experience sharing (SAPO) of the current run; null when exchange_url is empty.
  std::shared_ptr<ExperienceSharing> sharing_;
  std::shared_ptr<EpisodeStore> store_;  // durable_episodes: finished episodes of the current run

  // control thread: boot, train, release run here in order
  std::mutex task_mu_;
  std::condition_variable task_cv_;
  std::deque<std::function<void()>> tasks_;
  bool shutting_down_ = false;
  std::mutex shutdown_mu_;  // shutdown() runs once at a time
  bool closed_ = false;     // under mu_: shutdown() began; start_engine refuses
  std::thread control_thread_;
  std::jthread janitor_thread_;
};

}  // namespace swarm
