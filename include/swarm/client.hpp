// SwarmClient: the agent-side SDK of the swarm command API (docs/design.md).
// Mirrors AgentJet's Python SwarmClient: claim an episode, run the agent against the
// returned OpenAI endpoint, report the reward (or abort).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/errors.hpp"
#include "swarm/job.hpp"
#include "swarm/types.hpp"

namespace swarm {

/// Verbosity of the SDK's own log lines (written to stderr).
enum class ClientLogLevel { OFF, ERROR, WARN, INFO, DEBUG };

/// Settings of a SwarmClient. All fields have sensible defaults.
struct SwarmClientOptions {
  /// Limit for one HTTP request (connect + send + receive).
  std::chrono::milliseconds request_timeout = std::chrono::seconds(30);
  /// Identifies this client to the server; empty = a random UUID v4.
  std::string client_uuid;
  /// Exponential backoff used by every retrying/polling call: the first wait, the cap,
  /// and the growth factor. Each wait is jittered to between 50% and 100% of the step.
  std::chrono::milliseconds backoff_initial = std::chrono::milliseconds(200);
  std::chrono::milliseconds backoff_max = std::chrono::seconds(5);
  double backoff_multiplier = 2.0;
  /// Deadline of each begin_episode() made by run_episodes_until_all_complete(); when it
  /// passes, the attempt fails (and is retried up to max_retries). Empty = wait
  /// indefinitely (through weight syncs and server restarts).
  std::optional<std::chrono::milliseconds> run_claim_deadline;
  /// Most keep-alive connections kept open to the server; callers beyond it wait.
  size_t max_connections = 32;
  /// What the SDK logs (retries, late episodes, aborted attempts).
  ClientLogLevel log_level = ClientLogLevel::WARN;
  /// Tokens of a server started with --admin-token-file / --client-token-file, sent as
  /// `Authorization: Bearer` on the routes that need them (docs/reliability.md). Empty =
  /// $SWARM_ADMIN_TOKEN / $SWARM_CLIENT_TOKEN when set, else none.
  std::string admin_token;
  std::string client_token;
  /// https:// servers: a PEM file with the CA (or the self-signed certificate) the server's
  /// certificate must chain to, besides the system's trusted CAs. Empty = $SWARM_CA_FILE when
  /// set. Passed on to the OpenAIEndpoint of each claimed episode.
  std::string ca_file;
  /// Source of time for the episode lifetime rule; empty = std::chrono::steady_clock.
  /// Tests inject a fake one.
  std::function<std::chrono::steady_clock::time_point()> now;
};

/// Where an agent sends its LLM calls for one claimed episode. `base_url` ends in `/v1`
/// (OpenAI SDK convention); `api_key` is bound to `episode_uuid` on the server.
struct OpenAIEndpoint {
  std::string base_url;
  std::string api_key;
  std::string episode_uuid;
  std::string ca_file;  // https: the CA file of the SwarmClient that claimed it (SwarmClientOptions::ca_file)
};

/// The server's state machine as reported by `GET /get_engine_status`.
/// `engine_status` is one of "ENGINE.OFFLINE", "ENGINE.BOOTING", "ENGINE.ROLLING",
/// "ENGINE.ROLLING_POST", "ENGINE.WEIGHT_SYNCING".
struct EngineStatus {
  std::string engine_status;
  std::string engine_status_detail;
  int64_t global_step = 0;
  int64_t policy_version = 0;
  double seconds_in_state = 0.0;
};

/// Outcome of run_episodes_until_all_complete().
struct RunSummary {
  size_t completed = 0;  // tasks whose episode was ended successfully
  size_t failed = 0;     // tasks that ran out of attempts
  size_t retries = 0;    // extra attempts made (over all tasks)
  /// One entry per task, in task order: the reported reward, or nullopt if the task
  /// failed (or its workflow reported a null reward).
  std::vector<std::optional<double>> rewards;
};

/// The agent-side client of one swarm server.
///
/// Thread-safe: one SwarmClient is meant to be shared by many agent threads. Internally
/// it keeps a bounded pool of keep-alive connections; no lock is held during I/O.
///
/// Errors (include/swarm/errors.hpp): TransportError when the server cannot be reached,
/// ServerError for an error status (4xx: the request is wrong, never retried; 5xx:
/// retryable), TimeoutError when a deadline given to a waiting call passes, ConfigError
/// for bad arguments detected locally. No Beast/Asio/JSON exception escapes.
/// Single calls (end_episode, get_engine_status, ...) do not retry; begin_episode and
/// auto_sync_train_config_and_start_engine retry/poll with exponential backoff.
class SwarmClient {
 public:
  /// `server_url` like "http://127.0.0.1:10086". Does not contact the server.
  /// Throws ConfigError if the URL is malformed.
  explicit SwarmClient(std::string server_url, SwarmClientOptions opts = {});
  ~SwarmClient();
  SwarmClient(const SwarmClient&) = delete;
  SwarmClient& operator=(const SwarmClient&) = delete;

  // ------------------------------------------------------------------ episodes

  /// Claims an episode (`POST /claim_episode`), retrying until one is granted: when the
  /// server says not now (engine not ROLLING, no free slot), on TransportError and on 5xx
  /// it sleeps with jittered exponential backoff and tries again. A 4xx throws
  /// ServerError at once. With a `deadline` (measured from the call), throws
  /// TimeoutError naming the last failure cause once it passes; without one it waits
  /// indefinitely (e.g. through ROLLING_POST / WEIGHT_SYNCING, or a server restart).
  /// The episode must later be ended or aborted. Its client-side lifetime is
  /// 2 × `discard_episode_timeout` (see end_episode()).
  OpenAIEndpoint begin_episode(double discard_episode_timeout = 600,
                               const std::string& episode_type = "train",
                               std::optional<std::chrono::milliseconds> deadline = std::nullopt);

  /// Reports the episode's result (`POST /end_episode`) and returns true. If the episode
  /// was claimed by this client more than 2 × discard_episode_timeout ago, its data is
  /// considered stale: an abort is sent instead (best effort, failures only logged) and
  /// false is returned. The episode is forgotten locally either way.
  /// Throws ConfigError (nothing sent; abort the episode) if the task/output JSON text fields
  /// are not valid JSON or the reward is not a finite number.
  bool end_episode(const Task& task, const std::string& episode_uuid, const WorkflowOutput& output);

  /// Gives the episode up (`POST /abort_episode`): its context is discarded. Use it on
  /// every failure path after begin_episode(). Forgets the episode locally.
  void abort_episode(const std::string& episode_uuid);

  /// Whether the episode is still worth continuing: false if its client-side lifetime
  /// has passed, otherwise the server's answer (`POST /can_continue_episode`).
  bool can_continue_episode(const std::string& episode_uuid);

  // ------------------------------------------------------------------ engine control

  /// Sends the job as YAML (`POST /sync_train_config`). Validates it locally first
  /// (ConfigError naming the key). The server accepts it only while OFFLINE (else 409).
  void sync_train_config(const Job& job);
  /// `POST /start_engine`: returns at once; the engine boots in the background.
  /// `resume`: continue the experiment's latest checkpoint instead of a fresh run (the job's
  /// `resume` key does the same for every start).
  void start_engine(bool resume = false);
  /// `POST /stop_engine`: stops training from any state. Any client can do this, so be
  /// careful during a run.
  void stop_engine();

  /// Brings the server to ROLLING with this job, idempotently:
  /// ROLLING / ROLLING_POST / WEIGHT_SYNCING → does nothing (with `force_restart`: stop,
  /// sync, start); BOOTING → waits for ROLLING; OFFLINE → sync + start, then waits for
  /// ROLLING. Polls get_engine_status with backoff. Throws ClientError carrying
  /// engine_status_detail if the boot fails (engine falls back to OFFLINE), and
  /// TimeoutError after `timeout`.
  void auto_sync_train_config_and_start_engine(const Job& job, bool force_restart = false,
                                               std::chrono::milliseconds timeout = std::chrono::minutes(10));

  // ------------------------------------------------------------------ monitoring

  /// `GET /get_engine_status`.
  EngineStatus get_engine_status();
  /// `GET /get_current_batch_rollout_pool_information`, as returned by the server.
  nlohmann::json get_pool_information();
  /// True if the server is reachable and reports status "ok". Never throws.
  bool health();

  // ------------------------------------------------------------------ helpers

  /// The workflow an agent runs for one claimed episode.
  using EpisodeFn = std::function<WorkflowOutput(const Task&, const OpenAIEndpoint&)>;

  /// Runs every task once on a pool of `max_parallel` threads: begin_episode, `fn`,
  /// end_episode. If `fn` (or end_episode) throws, or the end is turned into an abort,
  /// the episode is aborted and the task retried, at most `max_retries` more times;
  /// after that the task counts as failed. A claimed episode is never leaked. Blocks
  /// until every task is done. `fn` is called concurrently from several threads.
  RunSummary run_episodes_until_all_complete(const std::vector<Task>& tasks, const EpisodeFn& fn,
                                             int max_parallel = 8, int max_retries = 3,
                                             double discard_episode_timeout = 600);

  /// The uuid this client identifies itself with.
  const std::string& client_uuid() const;
  /// The server URL given at construction (without a trailing slash).
  const std::string& server_url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarm
