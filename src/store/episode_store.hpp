// The episode store: finished train episodes in an embedded SQLite database (WAL mode) in the
// experiment directory, written before end_episode answers success, so that a crash or a
// `kill -9` loses nothing that was acknowledged (docs/reliability.md). One writer thread
// commits whatever is queued in one transaction (group commit): concurrent end_episode calls
// share an fsync. No torch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rollout_pool/journal.hpp"

struct sqlite3;

namespace swarm {

struct EpisodeStoreOptions {
  /// SQLite's synchronous setting: true = FULL (every commit is fsynced: survives a power cut),
  /// false = NORMAL (survives a crash or kill -9 of the server, not a power cut).
  bool fsync_every_commit = true;
  /// The most records one transaction takes from the queue.
  size_t max_batch = 256;
  /// How long a transaction waits for another connection's lock on the database (SQLite's
  /// busy timeout) before it fails.
  int busy_timeout_ms = 5000;
};

struct EpisodeStoreStats {
  int64_t recorded = 0;  // episodes made durable
  int64_t record_failures = 0;
  int64_t commits = 0;  // transactions (several records share one under load)
  int64_t bytes = 0;    // record bytes written
  int64_t pending = 0;  // untrained records in the database now
  int64_t marked_trained = 0;
  int64_t forgotten = 0;
  int64_t pruned = 0;
  int64_t retried = 0;  // bookkeeping operations (mark, forget, prune) tried again after a failed transaction
  int64_t given_up = 0;  // ... and dropped after kMaxAttempts (logged)
  double last_commit_ms = 0.0;
};

/// What a restart reloads (pending_for_restart).
struct StoredEpisodes {
  std::vector<FinishedEpisode> episodes;  // in the order they were recorded
  int64_t retrained = 0;  // trained by a step after the resumed checkpoint (that training was lost)
  int64_t discarded = 0;  // records that could not be decoded (logged, deleted)
};

class EpisodeStore final : public EpisodeJournal {
 public:
  /// Opens (creating) the database at `file`, in WAL mode. SwarmError(INTERNAL) when it cannot.
  explicit EpisodeStore(std::filesystem::path file, EpisodeStoreOptions options = {});
  ~EpisodeStore() override;  // commits what is queued, then closes
  EpisodeStore(const EpisodeStore&) = delete;
  EpisodeStore& operator=(const EpisodeStore&) = delete;

  // EpisodeJournal: `done` runs on the writer thread once the record's transaction is
  // committed (or failed).
  void record_async(const FinishedEpisode& episode, Done done) override;
  void forget(std::vector<std::string> episode_uuids) override;

  /// Policy step `step` trained these episodes (queued; committed in order with the rest).
  void mark_trained(std::vector<std::string> episode_uuids, int64_t step);
  /// Checkpoint `step` holds everything trained up to it: deletes those records (queued).
  void prune_trained_through(int64_t step);
  /// Waits until everything queued so far is committed. Marks, forgets and prunes of a failed
  /// transaction are tried again (up to kMaxAttempts, with a growing pause) before a flush
  /// queued after them returns: the engine flushes before it writes a checkpoint, so the
  /// checkpoint of step N never goes out before step N's episodes are marked trained.
  void flush();
  static constexpr int kMaxAttempts = 10;

  /// At boot, before any record: the episodes a restarted run trains on. Untrained records,
  /// and, when resuming from checkpoint `resumed_step`, records trained by later steps (the
  /// weights they trained are gone): those are marked untrained again. Without a resumed step
  /// (a fresh start), trained records are deleted. Records that cannot be decoded are deleted
  /// and counted.
  StoredEpisodes pending_for_restart(std::optional<int64_t> resumed_step);

  EpisodeStoreStats stats() const;
  const std::filesystem::path& file() const { return file_; }

 private:
  struct Op {
    enum Kind { RECORD, FORGET, MARK, PRUNE, FLUSH } kind = RECORD;
    std::string uuid;
    std::string task_id;
    std::string bytes;
    std::vector<std::string> uuids;
    int64_t step = 0;
    int attempts = 0;         // transactions it was part of that failed (FORGET, MARK, PRUNE)
    Done recorded;            // RECORD
    std::promise<void> done;  // FLUSH
  };
  bool enqueue(std::unique_ptr<Op>&& op);  // false (or a throw, for a record) once closing
  void writer_loop();
  void apply(Op& op);  // inside a transaction (writer thread)
  void exec(const char* sql);
  int64_t count_pending();

  class Statement;
  std::filesystem::path file_;
  EpisodeStoreOptions options_;
  sqlite3* db_ = nullptr;
  std::unique_ptr<Statement> insert_, forget_, mark_, prune_;  // prepared once; writer thread

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> queue_;
  bool stopping_ = false;
  EpisodeStoreStats stats_;
  std::thread writer_;
};

}  // namespace swarm
