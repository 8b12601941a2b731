// Episodes, their API keys, idle timeouts, finished-episode cache and batch readiness.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/clock.hpp"
#include "common/random_id.hpp"
#include "rollout_pool/journal.hpp"
#include "rollout_pool/types.hpp"

namespace swarm {

struct PoolConfig {
  int64_t max_parallel_episodes = 64;  // claimable slots
  int64_t batch_size = 32;             // tasks (or episodes/num_repeat) per policy step
  int64_t num_repeat = 4;              // episodes per task (GRPO group size)
  CollectionMethod method = CollectionMethod::ENOUGH_TASKS;
  int64_t max_cached_episodes = 512;        // safety valve threshold (finished train episodes)
  int64_t max_llm_calls_per_episode = 256;  // bounded memory per episode
  int64_t max_claimed_per_client = 0;       // unfinished episodes one client_uuid may hold; 0 = no bound
  size_t reward_history = 256;              // recent rewards kept for the monitor
  double client_active_seconds = 600.0;     // an active client expires after this long idle
  size_t max_active_clients = 4096;         // bounded: the least recently active go first
  size_t turn_reward_history = 64;          // per-turn-reward episodes kept for the pool information
  size_t max_turn_rewards = 1024;           // values kept per such episode
};

struct ClaimRequest {
  std::string client_uuid;
  EpisodeType episode_type = EpisodeType::TRAIN;
  double discard_episode_timeout = 600.0;  // seconds of idleness before reclaim
  std::string
      optional_task_id{};  // the task the client means to run (AgentJet's throttle_policy.current_task_id)
};

struct ClaimedEpisode {
  std::string episode_uuid;
  std::string api_key;
};

/// Result of a claim attempt: either an episode or a reason why not (retryable).
struct ClaimResult {
  std::optional<ClaimedEpisode> episode;
  std::string fail_cause;  // empty on success
};

/// Identity of the episode an API key belongs to (returned by begin_call).
struct CallTicket {
  std::string episode_uuid;
  std::string client_uuid;
  EpisodeType episode_type = EpisodeType::TRAIN;
};

/// What end_episode did.
struct EndOutcome {
  bool accepted = true;      // false when the reward was null and the episode dropped
  std::string note;          // explanation when not accepted
  bool batch_ready = false;  // the collection method's stop condition now holds
};

/// A running (claimed) episode, for the monitor.
struct RunningEpisodeInfo {
  std::string episode_uuid;
  std::string client_uuid;
  EpisodeType episode_type = EpisodeType::TRAIN;
  int64_t llm_calls = 0;
  int64_t in_flight_calls = 0;
  double seconds_idle = 0.0;
  double discard_episode_timeout = 0.0;
  double seconds_since_claim = 0.0;
  std::string optional_task_id;  // as given at claim time ("" when none)
};

struct TaskGroupInfo {
  std::string task_id;
  int64_t episodes = 0;
  std::vector<std::string> episode_uuids;           // in order of arrival
  std::vector<double> rewards;                      // same order
  std::vector<std::string> throttled_client_uuids;  // owners of episodes claimed for a task id
  double reward_mean = 0.0;
  double reward_std = 0.0;
  bool complete = false;  // episodes >= num_repeat
  bool dummy = false;     // all rewards equal (only meaningful when complete)
};

/// A client that recently ended or aborted an episode (AgentJet's active-client list; the
/// agree methods wait for these clients).
struct ActiveClientInfo {
  std::string client_uuid;
  double seconds_idle = 0.0;
  bool allowed_sync_weight = false;
};

/// The answer to agree_sync_weight.
struct AgreeResult {
  bool success = false;
  std::string failure_reason;  // empty on success
};

/// A train episode that sent one reward per LLM call (turn_rewards, or AgentJet's list reward).
struct TurnRewardEpisode {
  std::string episode_uuid;
  std::string client_uuid;
  std::string task_id;
  std::vector<double> turn_rewards;
};

/// Monotonic counters since the pool was created.
struct PoolCounters {
  int64_t claimed = 0;
  int64_t ended = 0;  // accepted end_episode (train + eval)
  int64_t ended_eval = 0;
  int64_t ended_without_reward = 0;
  int64_t ended_with_turn_rewards = 0;  // train episodes that sent turn_rewards (or a list reward)
  int64_t episodes_split_by_drift = 0;  // train episodes whose calls made more than one sample
  int64_t aborted = 0;
  int64_t timed_out = 0;
  int64_t cancelled = 0;  // by cancel_all (stop_engine)
  int64_t llm_calls = 0;
  int64_t late_calls_dropped = 0;  // calls finishing after their episode was gone
  int64_t valve_dropped_groups = 0;
  int64_t valve_dropped_episodes = 0;
  int64_t batches_taken = 0;
  int64_t stale_dropped_episodes = 0;    // asynchronous training: too old to train (max_staleness)
  int64_t claims_held_by_staleness = 0;  // train claims refused by the admission bound
  int64_t restored = 0;                  // finished episodes reloaded from the episode store at a restart
  int64_t store_failures = 0;            // end_episode refused because the episode could not be stored
  int64_t end_replayed = 0;              // end_episode retries answered with the recorded outcome
  int64_t end_failed = 0;  // ends that failed half-way (merge, allocation): the episode was dropped

  /// Field-by-field sum (the counters of several runs or pools).
  PoolCounters& operator+=(const PoolCounters& other);
  /// {"claimed": N, ...}, every field by name: the pool-information and checkpoint form.
  nlohmann::json to_json() const;
  /// The inverse of to_json; a missing field reads as 0 (files written by older versions).
  static PoolCounters from_json(const nlohmann::json& j);
};

/// Everything the monitor / metrics need, taken under one lock.
struct PoolSnapshot {
  PoolConfig config;
  bool accepting_claims = false;
  int64_t unclaimed = 0;          // registered, claimable slots
  int64_t running = 0;            // claimed and not yet ended
  int64_t finished_episodes = 0;  // cached finished train episodes
  int64_t complete_tasks = 0;     // groups with >= num_repeat finished
  int64_t complete_non_dummy_tasks = 0;
  int64_t target_episodes = 0;  // batch_size * num_repeat
  int64_t target_tasks = 0;     // batch_size
  std::vector<RunningEpisodeInfo> running_episodes;
  std::vector<TaskGroupInfo> tasks;
  std::vector<ActiveClientInfo> active_clients;         // most recently active first
  std::vector<TurnRewardEpisode> turn_reward_episodes;  // the latest ones, oldest first
  std::vector<double> recent_rewards;                   // train rewards, oldest first
  std::map<std::string, double> eval_metrics;           // eval reward mean etc. since last batch
  PoolCounters counters;
};

/// The rollout pool. Thread-safe: every public method takes the pool's one mutex
/// briefly (no I/O, no model calls under it). Time comes from the injected clock.
///
/// Slots: the pool keeps `max_parallel_episodes` registered episodes. Unclaimed ones
/// sit in a FIFO; a claim takes the oldest. When a claimed episode ends, aborts or times
/// out, a fresh episode (new uuid) is registered in its place while claims are
/// accepted; otherwise the record is simply deleted.
class RolloutPool {
 public:
  RolloutPool(PoolConfig config, std::shared_ptr<Clock> clock);

  /// While false, claims fail with a cause and freed slots are not re-registered.
  void set_accepting_claims(bool accepting);

  /// Makes finished train episodes durable (the episode store): end_episode records each one
  /// before it answers success, and dropped episodes are forgotten. Null (the default) = none.
  /// The pool keeps a weak reference: the caller keeps the journal alive for the run.
  void set_journal(const std::shared_ptr<EpisodeJournal>& journal);
  /// Caches finished episodes reloaded after a restart (they keep their order); returns how
  /// many. The safety valve applies as for new ones.
  int64_t restore_finished(std::vector<FinishedEpisode> episodes);

  /// Asynchronous training's admission bound: while train episodes running plus finished ones
  /// cached reach `limit`, train claims are refused (retryably) unless refusing could never end
  /// (no batch ready and nothing running). -1 (the default) = no bound.
  void set_train_admission_limit(int64_t limit);

  /// Claims the oldest unclaimed episode. Never throws for "not now" conditions.
  ClaimResult claim(const ClaimRequest& request);

  /// Authenticates an OpenAI API key and marks the start of an LLM call: the episode
  /// counts as active while a call is in flight. Throws SwarmError UNAUTHORIZED for an
  /// unknown key, CONFLICT when the episode's call budget is exhausted.
  CallTicket begin_call(const std::string& api_key);
  /// Records a finished call. Returns false (and counts it) if the episode is gone.
  bool finish_call(const std::string& episode_uuid, LlmCall call);
  /// The ids (prompt + completion) of the episode's latest recorded call whose turn_key is
  /// `turn_key`; nullopt when none (or the episode is gone).
  std::optional<std::vector<TokenId>> turn_ids(const std::string& episode_uuid,
                                               const std::string& turn_key) const;
  /// Ends an in-flight call that failed (nothing recorded).
  void cancel_call(const std::string& episode_uuid);
  /// Marks activity without a call (e.g. while a long generation is running).
  void touch(const std::string& episode_uuid);

  /// Finishes an episode with the client's verdict and turns its calls into samples.
  /// Throws NOT_FOUND (unknown / timed out / aborted), FORBIDDEN (other client's),
  /// INVALID_ARGUMENT (empty task_id).
  /// Retries: an end repeated by the same client (its first answer was lost) gets the first
  /// end's outcome again — for the last kRememberedEnds ends, or, while the first end is still
  /// being stored, once it is (at most kMaxEndWaiters such retries wait; more are CONFLICT).
  /// An end that fails half-way drops the episode and answers UNAVAILABLE.
  /// `declare_client_active` (train episodes) puts the client on the active-client list.
  EndOutcome end_episode(const std::string& client_uuid, const std::string& episode_uuid,
                         const std::string& task_id, const WorkflowOutput& output,
                         bool declare_client_active = true);
  /// The outcome of end_episode_async: the outcome, or the error (then the outcome is empty).
  using EndDone = std::function<void(EndOutcome, std::exception_ptr)>;
  /// end_episode without waiting for the journal: validation errors are thrown at once (and
  /// `done` is not called); otherwise `done` is called exactly once, from the journal's thread
  /// once the episode is durable (or could not be stored), or here when there is no journal or
  /// nothing to store. The episode counts as running until then. end_episode waits for it.
  void end_episode_async(const std::string& client_uuid, const std::string& episode_uuid,
                         const std::string& task_id, const WorkflowOutput& output, bool declare_client_active,
                         EndDone done);
  /// Whether a retry of episode_uuid's end would be answered with its recorded outcome.
  bool remembers_end(const std::string& episode_uuid) const;
  /// Runs an asynchronous end (`start` is given the completion) and waits for its outcome,
  /// rethrowing its error: the blocking form of every end_episode_async.
  static EndOutcome wait_for_end(const std::function<void(EndDone)>& start);

  /// Drops a claimed episode and its context. `delete_record` (ROLLING_POST) deletes it;
  /// otherwise its slot is re-registered (if accepting). Returns false, and changes nothing,
  /// when the episode is not running (unknown, already ended, aborted or timed out): an
  /// abort is idempotent, as AgentJet's server makes it. Throws FORBIDDEN for another
  /// client's running episode.
  bool abort_episode(const std::string& client_uuid, const std::string& episode_uuid, bool delete_record,
                     bool declare_client_active = true);

  /// An active client agrees to sync weights now (agree methods only; CONFLICT otherwise).
  /// Refused, with the reason, for a client not on the active list and while no finished
  /// train episode is cached (there would be nothing to train on).
  AgreeResult agree_sync_weight(const std::string& client_uuid);

  /// True while the episode is claimed by this client and not timed out.
  bool can_continue(const std::string& client_uuid, const std::string& episode_uuid) const;

  /// Reclaims episodes idle longer than their timeout (and expires idle active clients).
  /// Returns the reclaimed episodes' uuids.
  std::vector<std::string> reap_idle();

  /// The collection method's stop condition.
  bool batch_ready() const;
  /// Claimed episodes not yet ended/aborted/timed out.
  int64_t running() const;

  /// Removes and returns what the next policy update trains on: for the task methods
  /// all complete groups (incomplete ones stay cached), for the episode and agree methods
  /// every cached finished train episode. Eval metrics and the active-client list are reset.
  TrainBatch take_batch();
  /// take_batch for asynchronous training: first every cached episode with a token older than
  /// `min_version` is dropped (counted in stale_dropped_episodes; versions only grow, so it
  /// could never train), then the batch is taken as take_batch does. Returns the drops too.
  TrainBatch take_batch_fresh(int64_t min_version, int64_t* dropped);
  /// Drops (and counts) every cached episode with a token older than `min_version`; returns how many.
  int64_t drop_stale(int64_t min_version);

  /// Cancels every claimed and unclaimed episode and clears the cache (stop_engine).
  void cancel_all();

  PoolSnapshot snapshot() const;
  PoolCounters counters() const;

 private:
  // Defined here (not in the .cpp) so the implicit destructor sees complete types.
  struct Episode {
    std::string uuid;
    bool claimed = false;
    std::vector<EndDone> end_waiters;  // retries of an end in progress, answered with its outcome
    // end_episode has taken the calls and merges them outside the lock: the episode still
    // counts as running (ROLLING_POST waits for it) but accepts nothing more.
    bool ending = false;
    std::string client_uuid;
    EpisodeType type = EpisodeType::TRAIN;
    std::string api_key;
    double timeout_s = 0.0;
    std::string optional_task_id;
    TimePoint claimed_at{};
    TimePoint last_activity{};
    int64_t claim_seq = 0;
    int64_t in_flight = 0;
    std::vector<LlmCall> calls;
  };
  struct Group {
    std::vector<FinishedEpisode> episodes;  // in order of arrival
    // Asynchronous training: members that arrived but were dropped as too stale. They still
    // count toward num_repeat, so the rest of the group trains without them (the agent will
    // not run the task again).
    int64_t stale_dropped = 0;
  };
  // Whether a group has its num_repeat arrivals (kept ones plus stale drops).
  bool complete_locked(const Group& g) const {
    return static_cast<int64_t>(g.episodes.size()) + g.stale_dropped >= config_.num_repeat;
  }
  friend class RolloutPoolTestPeer;  // tests inspect the unclaimed FIFO

  // All private helpers assume mu_ is held.
  void register_slots_locked();
  void free_slot_locked(const std::string& episode_uuid, bool reregister);
  bool batch_ready_locked() const;
  TrainBatch take_batch_locked();
  int64_t drop_stale_locked(int64_t min_version);
  void apply_safety_valve_locked();
  void drop_group_locked(const std::string& task_id);
  int64_t running_locked() const;
  // The claimed, not-yet-ending episode owned by client_uuid; throws NOT_FOUND / FORBIDDEN.
  Episode& owned_episode_locked(const std::string& client_uuid, const std::string& episode_uuid);
  void cache_finished_locked(FinishedEpisode episode);
  // The end of end_episode once the episode is durable: caches it and frees its slot.
  EndOutcome cache_ended_locked(FinishedEpisode finished, bool list_mismatch, size_t list_size,
                                size_t n_calls, bool stored);
  void register_active_client_locked(const std::string& client_uuid);
  void refresh_active_client_locked(const std::string& client_uuid);
  void expire_active_clients_locked();
  void record_eval_locked(const WorkflowOutput& output);

  PoolConfig config_;
  std::shared_ptr<Clock> clock_;
  mutable std::mutex mu_;
  bool accepting_ = false;
  std::unordered_map<std::string, std::unique_ptr<Episode>> episodes_;  // by uuid
  std::unordered_map<std::string, std::string> key_to_episode_;
  std::deque<std::string> unclaimed_;                     // FIFO of episode uuids
  std::map<std::string, std::unique_ptr<Group>> groups_;  // finished train episodes by task
  std::vector<std::string> group_order_;                  // task ids, by first arrival
  int64_t finished_cached_ = 0;
  int64_t train_admission_limit_ = -1;
  // Weak: the journal's pending completions hold the pool, so a strong reference back would be a
  // cycle (and the store could end up destroyed on its own thread). Its owner keeps it alive.
  std::weak_ptr<EpisodeJournal> journal_;
  int64_t finish_seq_ = 0;
  std::deque<double> recent_rewards_;
  // Eval stats since the last batch, as running sums so they stay bounded.
  struct MeanAccumulator {
    double sum = 0.0;
    int64_t count = 0;
  };
  MeanAccumulator eval_reward_;
  std::map<std::string, MeanAccumulator> eval_log_metrics_;
  int64_t eval_episodes_ = 0;  // with or without a reward
  int64_t claim_seq_ = 0;      // orders running episodes by claim time
  struct ActiveClient {
    TimePoint last_activity{};
    bool allowed_sync_weight = false;
  };
  std::map<std::string, ActiveClient> active_clients_;
  std::deque<TurnRewardEpisode> turn_reward_episodes_;  // bounded by turn_reward_history
  PoolCounters counters_;
  // Recently ended episodes (episode uuid -> client and outcome), for retried ends; FIFO-bounded.
  struct RememberedEnd {
    std::string client_uuid;
    EndOutcome outcome;
  };
  std::unordered_map<std::string, RememberedEnd> remembered_ends_;
  std::deque<std::string> remembered_order_;
  void remember_end_locked(const std::string& episode_uuid, const std::string& client_uuid,
                           const EndOutcome& outcome);
  // Ends an episode whose end failed half-way: frees its slot, returns the waiters to answer.
  std::vector<EndDone> fail_end_locked(const std::string& episode_uuid);
  // end_episode_async after the episode became "ending": merges its calls, stores and caches
  // it, and answers through `reply` (taken under mu_ by whoever answers). May throw.
  void finish_end(const std::string& client_uuid, const std::string& episode_uuid, const std::string& task_id,
                  const WorkflowOutput& output, std::vector<LlmCall> calls, std::string optional_task_id,
                  const std::shared_ptr<EndDone>& reply);

 public:
  static constexpr size_t kRememberedEnds = 4096;
  static constexpr double kMaxDiscardEpisodeTimeout = 86400.0;  // seconds
  static constexpr size_t kMaxEndWaiters = 16;
};

}  // namespace swarm
