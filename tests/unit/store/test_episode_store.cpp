// The episode store: exact records, what a restart reloads, group commit under concurrency, and
// a full disk (a real 1 MiB tmpfs when this process may mount one).
#include <sys/mount.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "common/error.hpp"
#include "store/episode_codec.hpp"
#include "store/episode_store.hpp"
#include "support/scratch_dir.hpp"

namespace swarm {
namespace {

using swarm::testing::ScratchDir;

FinishedEpisode make_episode(const std::string& uuid, const std::string& task, int tokens = 6) {
  FinishedEpisode e;
  e.episode_uuid = uuid;
  e.client_uuid = "client-" + uuid;
  e.task_id = task;
  e.reward = 0.25 + static_cast<double>(uuid.size());
  e.is_success = true;
  e.log_metrics = {{"steps", 3.0}, {"score", -1.5}};
  e.optional_task_id = task;
  e.turn_rewards = {0.5, std::numeric_limits<double>::denorm_min()};
  e.finish_seq = 7;
  e.min_version = 2;
  e.exchange_calls = {R"({"messages":[]})", ""};
  e.metadata_json = R"({"k":"v"})";
  e.task_metadata_json = "{}";
  for (int k = 0; k < 2; ++k) {
    Sample s;
    s.task_id = task;
    s.episode_uuid = uuid;
    s.reward = e.reward;
    s.num_calls = 2;
    s.calls = {{0, "proposer", 0, 0.6f}, {1, "", 0, 1.0f}};
    for (int t = 0; t < tokens; ++t) {
      s.token_ids.push_back(100 * k + t);
      const bool gen = t % 2 == 1;
      s.loss_mask.push_back(gen ? 1 : 0);
      s.rollout_logprobs.push_back(gen ? -0.1f * static_cast<float>(t) - 1e-7f : 0.0f);
      s.policy_versions.push_back(gen ? 2 + t : -1);
      s.token_call.push_back(gen ? t % 4 / 2 : -1);
      s.token_rewards.push_back(gen ? 0.125f : 0.0f);
    }
    e.samples.push_back(std::move(s));
  }
  return e;
}

// Every field, bit for bit (float log-probs compared by their bytes).
void expect_same(const FinishedEpisode& a, const FinishedEpisode& b) {
  EXPECT_EQ(encode_finished_episode(a), encode_finished_episode(b));
  EXPECT_EQ(a.episode_uuid, b.episode_uuid);
  EXPECT_EQ(a.client_uuid, b.client_uuid);
  EXPECT_EQ(a.task_id, b.task_id);
  EXPECT_EQ(a.reward, b.reward);
  EXPECT_EQ(a.is_success, b.is_success);
  EXPECT_EQ(a.log_metrics, b.log_metrics);
  EXPECT_EQ(a.optional_task_id, b.optional_task_id);
  EXPECT_EQ(a.turn_rewards, b.turn_rewards);
  EXPECT_EQ(a.finish_seq, b.finish_seq);
  EXPECT_EQ(a.min_version, b.min_version);
  EXPECT_EQ(a.exchange_calls, b.exchange_calls);
  EXPECT_EQ(a.metadata_json, b.metadata_json);
  EXPECT_EQ(a.task_metadata_json, b.task_metadata_json);
  EXPECT_EQ(a.from_node, b.from_node);
  ASSERT_EQ(a.samples.size(), b.samples.size());
  for (size_t i = 0; i < a.samples.size(); ++i) {
    const Sample& x = a.samples[i];
    const Sample& y = b.samples[i];
    EXPECT_EQ(x.token_ids, y.token_ids);
    EXPECT_EQ(x.loss_mask, y.loss_mask);
    ASSERT_EQ(x.rollout_logprobs.size(), y.rollout_logprobs.size());
    EXPECT_EQ(0, std::memcmp(x.rollout_logprobs.data(), y.rollout_logprobs.data(),
                             x.rollout_logprobs.size() * sizeof(float)));
    EXPECT_EQ(x.policy_versions, y.policy_versions);
    EXPECT_EQ(x.token_call, y.token_call);
    EXPECT_EQ(x.token_rewards, y.token_rewards);
    EXPECT_EQ(x.num_calls, y.num_calls);
    ASSERT_EQ(x.calls.size(), y.calls.size());
    for (size_t c = 0; c < x.calls.size(); ++c) {
      EXPECT_EQ(x.calls[c].index, y.calls[c].index);
      EXPECT_EQ(x.calls[c].agent, y.calls[c].agent);
      EXPECT_EQ(x.calls[c].turn, y.calls[c].turn);
      EXPECT_EQ(x.calls[c].temperature, y.calls[c].temperature);
    }
  }
}

TEST(EpisodeCodec, RoundTripsEveryFieldExactly) {
  FinishedEpisode e = make_episode("ep-1", "task-a");
  e.is_success.reset();
  e.from_node = "node-b";
  e.samples[1].token_rewards.clear();  // optional per-token list
  e.samples[0].rollout_logprobs[1] = std::nextafter(-0.1f, 0.0f);
  const std::string bytes = encode_finished_episode(e);
  expect_same(e, decode_finished_episode(bytes));
}

TEST(EpisodeCodec, RejectsEveryTruncationAndTrailingBytes) {
  const std::string bytes = encode_finished_episode(make_episode("ep-2", "t"));
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(decode_finished_episode(std::string_view(bytes).substr(0, n)), SwarmError)
        << "prefix of " << n;
  EXPECT_THROW(decode_finished_episode(bytes + "x"), SwarmError);
  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  EXPECT_THROW(decode_finished_episode(wrong_magic), SwarmError);
  std::string wrong_version = bytes;
  wrong_version[4] = 9;
  try {
    decode_finished_episode(wrong_version);
    FAIL() << "an unknown format version was read";
  } catch (const SwarmError& err) {
    EXPECT_NE(std::string(err.what()).find("format version 9"), std::string::npos) << err.what();
  }
}

// A record of format version 1 (before calls carried their temperature), written field by field
// as that version laid it out: episodes a store kept from before still load, at temperature 1.
std::string version1_record(const FinishedEpisode& e) {
  std::string out("SWEP");
  const auto pod = [&out](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  const auto str = [&](const std::string& v) {
    pod(static_cast<uint64_t>(v.size()));
    out += v;
  };
  const auto vec = [&](const auto& v) {
    pod(static_cast<uint64_t>(v.size()));
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof v[0]);
  };
  pod(uint32_t{1});
  str(e.episode_uuid), str(e.client_uuid), str(e.task_id), pod(e.reward);
  pod(static_cast<int8_t>(e.is_success ? (*e.is_success ? 1 : 0) : -1));
  pod(static_cast<uint64_t>(e.log_metrics.size()));
  for (const auto& [k, v] : e.log_metrics) str(k), pod(v);
  str(e.optional_task_id);
  pod(static_cast<uint64_t>(e.samples.size()));
  for (const Sample& s : e.samples) {
    str(s.task_id), str(s.episode_uuid), pod(s.reward);
    vec(s.token_ids), vec(s.loss_mask), vec(s.rollout_logprobs), vec(s.policy_versions);
    pod(static_cast<int64_t>(s.num_calls));
    pod(static_cast<uint64_t>(s.calls.size()));
    for (const SampleCall& c : s.calls) pod(c.index), str(c.agent), pod(c.turn);
    vec(s.token_call), vec(s.token_rewards);
  }
  vec(e.turn_rewards), pod(e.finish_seq), pod(e.min_version);
  pod(static_cast<uint64_t>(e.exchange_calls.size()));
  for (const std::string& c : e.exchange_calls) str(c);
  str(e.metadata_json), str(e.task_metadata_json), str(e.from_node);
  return out;
}

TEST(EpisodeCodec, ReadsVersionOneRecordsAtTemperatureOne) {
  FinishedEpisode e = make_episode("ep-old", "t");
  const FinishedEpisode read = decode_finished_episode(version1_record(e));
  for (Sample& s : e.samples)
    for (SampleCall& c : s.calls) c.temperature = 1.0f;  // what version 1 means
  expect_same(e, read);
}

TEST(EpisodeCodec, RejectsATemperatureThatIsNotPositive) {
  for (const float t :
       {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    FinishedEpisode e = make_episode("ep-t", "t");
    e.samples[0].calls[0].temperature = t;
    EXPECT_THROW(decode_finished_episode(encode_finished_episode(e)), SwarmError) << t;
  }
}

TEST(EpisodeCodec, RejectsInconsistentPerTokenLists) {
  FinishedEpisode e = make_episode("ep-3", "t");
  e.samples[0].loss_mask.pop_back();
  EXPECT_THROW(decode_finished_episode(encode_finished_episode(e)), SwarmError);
  FinishedEpisode f = make_episode("ep-4", "t");
  f.samples[0].token_call[1] = 5;  // names a call the sample does not have
  EXPECT_THROW(decode_finished_episode(encode_finished_episode(f)), SwarmError);
}

TEST(EpisodeStore, ARestartReloadsWhatWasNotTrainedInOrder) {
  ScratchDir dir("swarm-store");
  const auto file = dir.path() / "episodes.sqlite";
  std::vector<FinishedEpisode> sent;
  {
    EpisodeStore store(file);
    for (int i = 0; i < 5; ++i) {
      sent.push_back(make_episode("ep-" + std::to_string(i), "task-" + std::to_string(i / 2)));
      store.record(sent.back());
    }
    EXPECT_EQ(store.stats().recorded, 5);
    EXPECT_EQ(store.stats().pending, 5);
    // No flush, no clean close of the transaction queue needed: record returned after the commit.
  }
  EpisodeStore again(file);
  EXPECT_EQ(again.stats().pending, 5);
  StoredEpisodes got = again.pending_for_restart(std::nullopt);
  ASSERT_EQ(got.episodes.size(), 5u);
  for (size_t i = 0; i < 5; ++i) expect_same(sent[i], got.episodes[i]);
  EXPECT_EQ(got.retrained, 0);
  EXPECT_EQ(got.discarded, 0);
}

TEST(EpisodeStore, TrainedRecordsAreNeverReloadedUnlessTheirStepWasLost) {
  ScratchDir dir("swarm-store");
  const auto file = dir.path() / "episodes.sqlite";
  {
    EpisodeStore store(file);
    for (const char* u : {"a", "b", "c", "d"}) store.record(make_episode(u, "t"));
    store.mark_trained({"a"}, 1);
    store.mark_trained({"b"}, 2);
    store.forget({"d"});  // dropped (safety valve / staleness): never trains
    store.flush();
    EXPECT_EQ(store.stats().pending, 1);  // c
    EXPECT_EQ(store.stats().marked_trained, 2);
    EXPECT_EQ(store.stats().forgotten, 1);
  }
  {
    // Resuming from checkpoint 1: step 2's training is lost with its weights, so b trains again;
    // a is in the checkpoint.
    EpisodeStore store(file);
    StoredEpisodes got = store.pending_for_restart(int64_t{1});
    ASSERT_EQ(got.episodes.size(), 2u);
    EXPECT_EQ(got.episodes[0].episode_uuid, "b");
    EXPECT_EQ(got.episodes[1].episode_uuid, "c");
    EXPECT_EQ(got.retrained, 1);
    store.mark_trained({"b", "c"}, 2);
    store.prune_trained_through(2);  // checkpoint 2 holds them
    store.flush();
    EXPECT_EQ(store.stats().pruned, 2);
  }
  EpisodeStore store(file);
  EXPECT_TRUE(store.pending_for_restart(int64_t{0}).episodes.empty());
}

// A transaction that fails (here: another connection holds the database's write lock) does not
// lose the run's bookkeeping: the marks are tried again, and a flush returns only once they are
// committed. The engine flushes before each checkpoint, so a crash right after the checkpoint of
// step 1 does not reload (and train again) what step 1 trained.
TEST(EpisodeStore, AFailedTransactionsMarksAreRetriedBeforeAFlushReturns) {
  ScratchDir dir("swarm-store");
  const auto file = dir.path() / "episodes.sqlite";
  EpisodeStoreOptions options;
  options.busy_timeout_ms = 20;
  {
    EpisodeStore store(file, options);
    store.record(make_episode("a", "t"));
    store.record(make_episode("b", "t"));
    sqlite3* other = nullptr;
    ASSERT_EQ(sqlite3_open(file.c_str(), &other), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr),
              SQLITE_OK);  // the write lock
    store.mark_trained({"a"}, 1);
    std::atomic<bool> flushed{false};
    std::thread flusher([&] {
      store.flush();
      flushed = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few failed transactions
    EXPECT_FALSE(flushed) << "the flush returned while the mark was not committed";
    EXPECT_GE(store.stats().retried, 1);
    sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(other);
    flusher.join();
    EXPECT_EQ(store.stats().marked_trained, 1);
    EXPECT_EQ(store.stats().given_up, 0);
  }
  EpisodeStore store(file);
  const StoredEpisodes got = store.pending_for_restart(int64_t{1});  // checkpoint 1 holds a's training
  ASSERT_EQ(got.episodes.size(), 1u);
  EXPECT_EQ(got.episodes[0].episode_uuid, "b");
}

TEST(EpisodeStore, AFreshStartKeepsUntrainedOnly) {
  ScratchDir dir("swarm-store");
  const auto file = dir.path() / "episodes.sqlite";
  {
    EpisodeStore store(file);
    store.record(make_episode("x", "t"));
    store.record(make_episode("y", "t"));
    store.mark_trained({"x"}, 5);
    store.flush();
  }
  EpisodeStore store(file);
  StoredEpisodes got = store.pending_for_restart(std::nullopt);
  ASSERT_EQ(got.episodes.size(), 1u);
  EXPECT_EQ(got.episodes[0].episode_uuid, "y");
}

TEST(EpisodeStore, ConcurrentRecordsShareCommitsAndAllSurvive) {
  ScratchDir dir("swarm-store");
  const auto file = dir.path() / "episodes.sqlite";
  constexpr int kThreads = 16, kEach = 40;
  int64_t commits = 0;
  {
    EpisodeStore store(file);
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          try {
            store.record(make_episode("t" + std::to_string(t) + "-" + std::to_string(i), "task", 64));
          } catch (...) {
            failures++;
          }
        }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    const EpisodeStoreStats st = store.stats();
    EXPECT_EQ(st.recorded, kThreads * kEach);
    commits = st.commits;
    EXPECT_GE(commits, 1);
    EXPECT_LE(commits, kThreads * kEach);
    std::printf("[ figures ] %d records from %d threads in %lld commit(s)\n", kThreads * kEach, kThreads,
                static_cast<long long>(commits));
  }
  EpisodeStore store(file);
  EXPECT_EQ(store.pending_for_restart(std::nullopt).episodes.size(), static_cast<size_t>(kThreads * kEach));
}

TEST(EpisodeStore, AnUnreadableRecordIsDroppedAndTheRestReload) {
  ScratchDir dir("swarm-store");
  const auto file = dir.path() / "episodes.sqlite";
  {
    EpisodeStore store(file);
    store.record(make_episode("good-1", "t"));
    store.record(make_episode("good-2", "t"));
  }
  // Damage one record's bytes behind the store's back.
  ASSERT_EQ(0, std::system(
                   ("/usr/bin/env sqlite3 -version >/dev/null 2>&1 || exit 0; /usr/bin/env sqlite3 '" +
                    file.string() + "' \"UPDATE episodes SET record = x'00' WHERE episode_uuid = 'good-1'\"")
                       .c_str()));
  EpisodeStore store(file);
  StoredEpisodes got = store.pending_for_restart(std::nullopt);
  if (got.discarded == 0) GTEST_SKIP() << "no sqlite3 command line tool to damage a record with";
  EXPECT_EQ(got.discarded, 1);
  ASSERT_EQ(got.episodes.size(), 1u);
  EXPECT_EQ(got.episodes[0].episode_uuid, "good-2");
}

TEST(EpisodeStore, OpeningAnUnwritablePathSaysWhere) {
  try {
    EpisodeStore store("/proc/no-such-dir/episodes.sqlite");
    FAIL() << "opened a store under /proc";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/no-such-dir/episodes.sqlite"), std::string::npos) << e.what();
  }
}

// A real full disk: a 1 MiB tmpfs (needs permission to mount; skipped otherwise).
TEST(EpisodeStore, AFullDiskFailsTheRecordLoudlyAndKeepsWhatWasCommitted) {
  ScratchDir dir("swarm-store");
  const auto mnt = dir.path() / "tiny";
  std::filesystem::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::filesystem::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const auto file = mnt / "episodes.sqlite";
  int64_t stored = 0;
  std::string error;
  {
    EpisodeStore store(file);
    for (int i = 0; i < 10000 && error.empty(); ++i) {
      try {
        store.record(make_episode("big-" + std::to_string(i), "t", 2000));  // ~100 KB each
        ++stored;
      } catch (const SwarmError& e) {
        EXPECT_EQ(e.kind(), ErrorKind::UNAVAILABLE);
        error = e.what();
      }
    }
    ASSERT_FALSE(error.empty()) << "1 MiB held " << stored << " records of ~100 KB?";
    EXPECT_NE(error.find("not accepted"), std::string::npos) << error;
    EXPECT_EQ(store.stats().record_failures, 1);
    std::printf("[ figures ] the 1 MiB disk took %lld record(s), then: %s\n", static_cast<long long>(stored),
                error.c_str());
  }
  EpisodeStore store(file);
  EXPECT_EQ(store.pending_for_restart(std::nullopt).episodes.size(), static_cast<size_t>(stored));
}

}  // namespace
}  // namespace swarm
