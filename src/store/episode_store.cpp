#include "store/episode_store.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "store/episode_codec.hpp"

namespace swarm {

// A prepared statement (the writer keeps its four prepared for the store's life).
class EpisodeStore::Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &st_, nullptr) != SQLITE_OK)
      throw SwarmError(ErrorKind::INTERNAL,
                       std::string("episode store: ") + sqlite3_errmsg(db) + " in: " + sql);
  }
  ~Statement() { sqlite3_finalize(st_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  void text(int i, const std::string& s) {
    sqlite3_bind_text(st_, i, s.data(), static_cast<int>(s.size()), SQLITE_STATIC);
  }
  void blob(int i, const std::string& s) {
    sqlite3_bind_blob(st_, i, s.data(), static_cast<int>(s.size()), SQLITE_STATIC);
  }
  void integer(int i, int64_t v) { sqlite3_bind_int64(st_, i, v); }
  /// Runs a statement that returns no rows; resets it for the next bindings. Returns the rows changed.
  int64_t run() {
    const int rc = sqlite3_step(st_);
    sqlite3_reset(st_);
    if (rc != SQLITE_DONE)
      throw SwarmError(ErrorKind::UNAVAILABLE, std::string("episode store: ") + sqlite3_errmsg(db_));
    return sqlite3_changes(db_);
  }
  bool row() {
    const int rc = sqlite3_step(st_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE)
      throw SwarmError(ErrorKind::UNAVAILABLE, std::string("episode store: ") + sqlite3_errmsg(db_));
    return false;
  }
  int64_t column_int(int i) { return sqlite3_column_int64(st_, i); }
  bool column_null(int i) { return sqlite3_column_type(st_, i) == SQLITE_NULL; }
  std::string column_text(int i) {
    const auto* p = sqlite3_column_text(st_, i);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(st_, i)))
             : "";
  }
  std::string_view column_blob(int i) {
    const void* p = sqlite3_column_blob(st_, i);
    return p ? std::string_view(static_cast<const char*>(p),
                                static_cast<size_t>(sqlite3_column_bytes(st_, i)))
             : std::string_view();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* st_ = nullptr;
};

namespace {
constexpr int kSchemaVersion = 1;
}  // namespace

EpisodeStore::EpisodeStore(std::filesystem::path file, EpisodeStoreOptions options)
    : file_(std::move(file)), options_(options) {
  std::error_code ec;
  if (file_.has_parent_path()) std::filesystem::create_directories(file_.parent_path(), ec);
  const int rc = sqlite3_open_v2(file_.c_str(), &db_,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw SwarmError(ErrorKind::INTERNAL, "episode store: cannot open " + file_.string() + ": " + why);
  }
  try {
    sqlite3_busy_timeout(db_, options_.busy_timeout_ms);
    exec("PRAGMA journal_mode=WAL");
    exec(options_.fsync_every_commit ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
    exec("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)");
    exec(
        "CREATE TABLE IF NOT EXISTS episodes("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " episode_uuid TEXT NOT NULL UNIQUE,"
        " task_id TEXT NOT NULL,"
        " trained_step INTEGER,"  // NULL until a policy step trained it
        " record BLOB NOT NULL)");
    // No index on trained_step: every insert would pay for it, and the table is small (pruned
    // at each checkpoint), so marking and pruning scan it instead. A WAL checkpoint (copying the
    // log into the database, with its fsyncs) every 4000 pages rather than SQLite's 1000.
    exec("DROP INDEX IF EXISTS episodes_trained");
    exec("PRAGMA wal_autocheckpoint=4000");
    {
      Statement get(db_, "SELECT value FROM meta WHERE key='schema'");
      if (get.row()) {
        const std::string v = get.column_text(0);
        if (v != std::to_string(kSchemaVersion))
          throw SwarmError(ErrorKind::INTERNAL, "episode store " + file_.string() + " has schema " + v +
                                                    "; this build reads schema " +
                                                    std::to_string(kSchemaVersion));
      }
    }
    exec("INSERT OR IGNORE INTO meta(key, value) VALUES('schema', '1')");
    stats_.pending = count_pending();
    insert_ = std::make_unique<Statement>(db_,
                                          "INSERT OR REPLACE INTO episodes(episode_uuid, task_id, "
                                          "trained_step, record) VALUES(?1, ?2, NULL, ?3)");
    forget_ = std::make_unique<Statement>(db_, "DELETE FROM episodes WHERE episode_uuid = ?1");
    mark_ = std::make_unique<Statement>(db_, "UPDATE episodes SET trained_step = ?2 WHERE episode_uuid = ?1");
    prune_ = std::make_unique<Statement>(
        db_, "DELETE FROM episodes WHERE trained_step IS NOT NULL AND trained_step <= ?1");
  } catch (...) {
    insert_.reset();
    forget_.reset();
    mark_.reset();
    prune_.reset();
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
  writer_ = std::thread([this] { writer_loop(); });
}

EpisodeStore::~EpisodeStore() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  insert_.reset();
  forget_.reset();
  mark_.reset();
  prune_.reset();
  sqlite3_close(db_);
}

void EpisodeStore::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string why = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    throw SwarmError(ErrorKind::UNAVAILABLE,
                     "episode store " + file_.string() + ": " + why + " (in: " + sql + ")");
  }
}

int64_t EpisodeStore::count_pending() {
  Statement count(db_, "SELECT count(*) FROM episodes WHERE trained_step IS NULL");
  return count.row() ? count.column_int(0) : 0;
}

bool EpisodeStore::enqueue(std::unique_ptr<Op>&& op) {  // moved from only when queued
  {
    std::lock_guard lk(mu_);
    if (stopping_) {
      // Only the destructor sets this, after the engine let go of the store: nothing should
      // still write. A record says so; the rest is dropped.
      if (op->kind == Op::RECORD) throw SwarmError(ErrorKind::UNAVAILABLE, "the episode store is closing");
      return false;
    }
    queue_.push_back(std::move(op));
  }
  cv_.notify_one();
  return true;
}

void EpisodeStore::record_async(const FinishedEpisode& episode, Done done) {
  auto op = std::make_unique<Op>();
  op->kind = Op::RECORD;
  op->uuid = episode.episode_uuid;
  op->task_id = episode.task_id;
  op->bytes = encode_finished_episode(episode);
  op->recorded = std::move(done);
  try {
    enqueue(std::move(op));
  } catch (...) {  // closing: not queued, so `op` still holds the callback
    op->recorded(std::current_exception());
  }
}

void EpisodeStore::forget(std::vector<std::string> episode_uuids) {
  if (episode_uuids.empty()) return;
  auto op = std::make_unique<Op>();
  op->kind = Op::FORGET;
  op->uuids = std::move(episode_uuids);
  enqueue(std::move(op));
}

void EpisodeStore::mark_trained(std::vector<std::string> episode_uuids, int64_t step) {
  if (episode_uuids.empty()) return;
  auto op = std::make_unique<Op>();
  op->kind = Op::MARK;
  op->uuids = std::move(episode_uuids);
  op->step = step;
  enqueue(std::move(op));
}

void EpisodeStore::prune_trained_through(int64_t step) {
  auto op = std::make_unique<Op>();
  op->kind = Op::PRUNE;
  op->step = step;
  enqueue(std::move(op));
}

void EpisodeStore::flush() {
  auto op = std::make_unique<Op>();
  op->kind = Op::FLUSH;
  std::future<void> done = op->done.get_future();
  if (enqueue(std::move(op)))
    done.wait();  // a flush fails only with its batch, whose records already said so
}

void EpisodeStore::apply(Op& op) {
  switch (op.kind) {
    case Op::RECORD:
      insert_->text(1, op.uuid);
      insert_->text(2, op.task_id);
      insert_->blob(3, op.bytes);
      insert_->run();
      break;
    case Op::FORGET:
      for (const std::string& u : op.uuids) {
        forget_->text(1, u);
        forget_->run();
      }
      break;
    case Op::MARK:
      mark_->integer(2, op.step);
      for (const std::string& u : op.uuids) {
        mark_->text(1, u);
        mark_->run();
      }
      break;
    case Op::PRUNE:
      prune_->integer(1, op.step);
      op.step = prune_->run();  // rows deleted, for the stats
      break;
    case Op::FLUSH:
      break;
  }
}

void EpisodeStore::writer_loop() {
  for (;;) {
    std::vector<std::unique_ptr<Op>> batch;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything is committed
      while (!queue_.empty() && batch.size() < options_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::exception_ptr failure;
    try {
      exec("BEGIN IMMEDIATE");
      try {
        for (auto& op : batch) apply(*op);
        exec("COMMIT");
      } catch (...) {
        sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
      }
    } catch (const std::exception& e) {
      failure = std::make_exception_ptr(
          SwarmError(ErrorKind::UNAVAILABLE,
                     std::string("the episode could not be stored durably, so it is not accepted: ") +
                         e.what() + " (is the disk full?)"));
      spdlog::error("episode store {}: a transaction of {} operation(s) failed: {}", file_.string(),
                    batch.size(), e.what());
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard lk(mu_);
      stats_.last_commit_ms = ms;
      if (!failure) stats_.commits++;
      for (auto& op : batch) {
        if (failure) {
          if (op->kind == Op::RECORD) stats_.record_failures++;
          continue;
        }
        switch (op->kind) {
          case Op::RECORD:
            stats_.recorded++;
            stats_.pending++;
            stats_.bytes += static_cast<int64_t>(op->bytes.size());
            break;
          case Op::FORGET:
            stats_.forgotten += static_cast<int64_t>(op->uuids.size());
            break;
          case Op::MARK:
            stats_.marked_trained += static_cast<int64_t>(op->uuids.size());
            break;
          case Op::PRUNE:
            stats_.pruned += op->step;
            break;
          case Op::FLUSH:
            break;
        }
      }
    }
    // The run's bookkeeping (marks, forgets, prunes) is not an agent's answer that can be
    // refused: after a failed transaction it goes back to the front of the queue, in order,
    // with the flushes that wait for it, and is tried again after a pause.
    if (failure) {
      std::vector<std::unique_ptr<Op>> again;
      bool bookkeeping = false;
      for (auto& op : batch) {
        if (op->kind == Op::RECORD) continue;
        if (op->kind != Op::FLUSH) {
          if (++op->attempts >= kMaxAttempts) {
            spdlog::error("episode store {}: gave up on a {} of {} episode(s) after {} failed transactions",
                          file_.string(),
                          op->kind == Op::MARK     ? "mark-trained"
                          : op->kind == Op::FORGET ? "forget"
                                                   : "prune",
                          op->uuids.size(), op->attempts);
            std::lock_guard lk(mu_);
            stats_.given_up++;
            continue;
          }
          bookkeeping = true;
        }
        again.push_back(std::move(op));
      }
      if (bookkeeping) {
        int attempts = 0;
        for (const auto& op : again) attempts = std::max(attempts, op->attempts);
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempts));
        std::lock_guard lk(mu_);
        for (auto it = again.rbegin(); it != again.rend(); ++it) {
          if ((*it)->kind != Op::FLUSH) stats_.retried++;
          queue_.push_front(std::move(*it));
        }
      } else {
        for (auto& op : again) batch.push_back(std::move(op));  // flushes only: answered below
      }
      batch.erase(std::remove(batch.begin(), batch.end(), nullptr), batch.end());
    }
    if (!failure && std::any_of(batch.begin(), batch.end(), [](const auto& op) {
          return op->kind == Op::FORGET || op->kind == Op::MARK;
        })) {
      try {
        const int64_t pending = count_pending();
        std::lock_guard lk(mu_);
        stats_.pending = pending;
      } catch (const std::exception&) {}
    }
    for (auto& op : batch) {
      if (op->kind == Op::FLUSH) op->done.set_value();
      if (op->kind != Op::RECORD || !op->recorded) continue;
      try {
        op->recorded(failure);  // the pool caches the episode and end_episode answers
      } catch (const std::exception& e) {
        spdlog::error("episode store: a record's completion threw: {}", e.what());
      } catch (...) {
        spdlog::error("episode store: a record's completion threw");
      }
    }
  }
}

StoredEpisodes EpisodeStore::pending_for_restart(std::optional<int64_t> resumed_step) {
  flush();
  StoredEpisodes out;
  // The writer is idle after the flush and nothing else writes at boot; the connection is
  // serialized (FULLMUTEX) in any case.
  exec("BEGIN IMMEDIATE");
  try {
    if (resumed_step) {
      Statement reopen(db_, "UPDATE episodes SET trained_step = NULL WHERE trained_step > ?1");
      reopen.integer(1, *resumed_step);
      out.retrained = reopen.run();
    }
    Statement prune(db_, "DELETE FROM episodes WHERE trained_step IS NOT NULL");
    prune.run();
    std::vector<std::string> bad;
    {
      Statement rows(db_, "SELECT episode_uuid, record FROM episodes ORDER BY seq");
      while (rows.row()) {
        try {
          out.episodes.push_back(decode_finished_episode(rows.column_blob(1)));
        } catch (const std::exception& e) {
          spdlog::error("episode store {}: episode {} is unreadable and is deleted: {}", file_.string(),
                        rows.column_text(0), e.what());
          bad.push_back(rows.column_text(0));
        }
      }
    }
    Statement del(db_, "DELETE FROM episodes WHERE episode_uuid = ?1");
    for (const std::string& u : bad) {
      del.text(1, u);
      del.run();
    }
    out.discarded = static_cast<int64_t>(bad.size());
    exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  std::lock_guard lk(mu_);
  stats_.pending = static_cast<int64_t>(out.episodes.size());
  return out;
}

EpisodeStoreStats EpisodeStore::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace swarm
