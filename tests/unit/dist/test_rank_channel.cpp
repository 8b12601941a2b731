// The control channel of multi-rank jobs: batch encoding, and rank 0 talking to followers on
// loopback (replies, error replies, a follower that goes away, timeouts).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <limits>
#include <thread>

#include "common/error.hpp"
#include "dist/rank_channel.hpp"
#include "store/episode_codec.hpp"

namespace swarm {
namespace {

using namespace std::chrono_literals;

TrainBatch sample_batch() {
  TrainBatch b;
  b.num_tasks = 2;
  b.stale_dropped = 5;
  for (int e = 0; e < 3; ++e) {
    FinishedEpisode ep;
    ep.episode_uuid = "ep-" + std::to_string(e);
    ep.client_uuid = "client";
    ep.task_id = e < 2 ? "task-a" : "task-b";
    ep.reward = 0.25 * e - 0.1;
    if (e == 1) ep.is_success = true;
    if (e == 2) ep.is_success = false;
    ep.log_metrics["turns"] = e;
    ep.finish_seq = 10 + e;
    ep.turn_rewards = {0.25 * e};
    ep.min_version = 7;
    ep.metadata_json = R"({"k":1})";
    // Every other member holds something too, so the byte comparison below covers it.
    ep.optional_task_id = "claimed-for-" + ep.task_id;
    ep.exchange_calls = {"call-record-" + std::to_string(e)};
    ep.task_metadata_json = R"({"level":2})";
    if (e == 2) ep.from_node = "node-b";
    for (int s = 0; s <= e; ++s) {
      Sample smp;
      smp.task_id = ep.task_id;
      smp.episode_uuid = ep.episode_uuid;
      smp.reward = ep.reward;
      smp.token_ids = {1, 2, 3, 40000 + s};
      smp.loss_mask = {0, 0, 1, 1};
      smp.rollout_logprobs = {0.f, 0.f, -0.123456789f, std::numeric_limits<float>::denorm_min()};
      smp.policy_versions = {-1, -1, 7, 7};
      smp.num_calls = 1;
      smp.calls = {{0, "solver", 0, 0.6f}};
      smp.token_call = {-1, -1, 0, 0};
      smp.token_rewards = {0.f, 0.f, 0.5f, -1.5f};
      ep.samples.push_back(smp);
    }
    b.episodes.push_back(ep);
  }
  return b;
}

TEST(TrainBatchEncoding, RoundTripsEveryFieldExactly) {
  const TrainBatch in = sample_batch();
  const TrainBatch out = deserialize_train_batch(serialize_train_batch(in));
  ASSERT_EQ(out.num_tasks, in.num_tasks);
  EXPECT_EQ(out.stale_dropped, in.stale_dropped);
  ASSERT_EQ(out.episodes.size(), in.episodes.size());
  for (size_t e = 0; e < in.episodes.size(); ++e) {
    const auto &a = in.episodes[e], &b = out.episodes[e];
    EXPECT_EQ(a.episode_uuid, b.episode_uuid);
    EXPECT_EQ(a.client_uuid, b.client_uuid);
    EXPECT_EQ(a.task_id, b.task_id);
    EXPECT_EQ(a.reward, b.reward);
    EXPECT_EQ(a.is_success, b.is_success);
    EXPECT_EQ(a.log_metrics, b.log_metrics);
    EXPECT_EQ(a.finish_seq, b.finish_seq);
    ASSERT_EQ(a.samples.size(), b.samples.size());
    for (size_t s = 0; s < a.samples.size(); ++s) {
      EXPECT_EQ(a.samples[s].token_ids, b.samples[s].token_ids);
      EXPECT_EQ(a.samples[s].loss_mask, b.samples[s].loss_mask);
      EXPECT_EQ(a.samples[s].rollout_logprobs, b.samples[s].rollout_logprobs);  // bit-exact floats
      EXPECT_EQ(a.samples[s].policy_versions, b.samples[s].policy_versions);
      EXPECT_EQ(a.samples[s].num_calls, b.samples[s].num_calls);
      EXPECT_EQ(a.samples[s].reward, b.samples[s].reward);
      EXPECT_EQ(a.samples[s].token_call, b.samples[s].token_call);
      EXPECT_EQ(a.samples[s].token_rewards, b.samples[s].token_rewards);
      ASSERT_EQ(a.samples[s].calls.size(), b.samples[s].calls.size());
      EXPECT_EQ(a.samples[s].calls[0].agent, b.samples[s].calls[0].agent);
      EXPECT_EQ(a.samples[s].calls[0].temperature, b.samples[s].calls[0].temperature);
    }
    EXPECT_EQ(a.turn_rewards, b.turn_rewards);
    EXPECT_EQ(a.min_version, b.min_version);
    EXPECT_EQ(a.metadata_json, b.metadata_json);
    // Every other field too: the one encoding of an episode gives the same bytes.
    EXPECT_EQ(encode_finished_episode(a), encode_finished_episode(b));
  }
}

TEST(TrainBatchEncoding, RejectsTruncatedAndCorruptBuffers) {
  const std::string bytes = serialize_train_batch(sample_batch());
  for (size_t cut : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 1})
    EXPECT_THROW(deserialize_train_batch(bytes.substr(0, cut)), SwarmError) << "cut at " << cut;
  std::string bad_magic = bytes;
  bad_magic[0] ^= 0x5a;
  EXPECT_THROW(deserialize_train_batch(bad_magic), SwarmError);
  EXPECT_THROW(deserialize_train_batch(bytes + "x"), SwarmError);
  // The episode count (after magic, num_tasks and stale_dropped) claims more than the buffer holds.
  std::string huge_count = bytes;
  huge_count[4 + 8 + 8 + 7] = '\x7f';
  EXPECT_THROW(deserialize_train_batch(huge_count), SwarmError);
}

const std::string kSecret = "the job's rendezvous secret";

// A follower on a thread that answers each command with `answer(header)` ("" = ok).
std::thread follower(int port, int rank, std::function<std::string(const nlohmann::json&)> answer) {
  return std::thread([=] {
    auto f = RankFollower::connect("127.0.0.1", port, rank, 10s, kSecret);
    while (auto m = f->receive()) {
      const std::string err = answer(m->header);
      if (err == "exit") return;  // vanish without answering
      if (err.empty()) {
        f->reply_ok({{"payload_bytes", m->payload.size()}});
      } else {
        f->reply_error(err);
      }
    }
  });
}

// c10d's store keeps a job's keys under a name only the job's ranks derive: the same on every
// rank of a boot, another for another secret or another boot's store port.
TEST(RankChannel, TheStoreNamespaceNeedsTheSecret) {
  const std::string ns = store_namespace("the job's secret", 29500);
  EXPECT_EQ(ns.size(), 64u);
  EXPECT_EQ(ns.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(store_namespace("the job's secret", 29500), ns);
  EXPECT_NE(store_namespace("another secret", 29500), ns);
  EXPECT_NE(store_namespace("the job's secret", 29501), ns);
  EXPECT_EQ(ns.find("secret"), std::string::npos);
}

TEST(RankChannel, LeaderCollectsEveryFollowersReply) {
  const int port = pick_free_port();
  std::thread f1 = follower(port, 1, [](const nlohmann::json&) { return ""; });
  std::thread f2 = follower(port, 2, [](const nlohmann::json&) { return ""; });
  auto leader = RankLeader::accept("127.0.0.1", port, 3, 10s, kSecret);
  EXPECT_EQ(leader->world_size(), 3);
  const auto replies = leader->request(RankMessage{{{"kind", "train"}}, std::string(100000, 'x')}, 10s);
  ASSERT_EQ(replies.size(), 2u);
  for (const auto& r : replies) EXPECT_EQ(r.at("payload_bytes").get<size_t>(), 100000u);
  leader->close();  // followers see the end of the job
  f1.join();
  f2.join();
  EXPECT_THROW(leader->send_all(RankMessage{{{"kind", "x"}}, {}}), SwarmError);
}

TEST(RankChannel, AnErrorReplyNamesTheRankAndKeepsTheChannelInStep) {
  const int port = pick_free_port();
  std::thread f1 = follower(
      port, 1, [](const nlohmann::json& h) { return h.at("kind") == "boot" ? "no such model" : ""; });
  auto leader = RankLeader::accept("127.0.0.1", port, 2, 10s, kSecret);
  try {
    leader->request(RankMessage{{{"kind", "boot"}}, {}}, 10s);
    FAIL() << "no error";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UNAVAILABLE);
    EXPECT_NE(std::string(e.what()).find("rank 1: no such model"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(leader->broken().empty());  // an error answer is not a broken channel
  EXPECT_NO_THROW(leader->request(RankMessage{{{"kind", "release"}}, {}}, 10s));
  leader->close();
  f1.join();
}

TEST(RankChannel, AFollowerThatGoesAwayBreaksTheJobWithAClearError) {
  const int port = pick_free_port();
  std::thread f1 = follower(port, 1, [](const nlohmann::json&) { return "exit"; });
  auto leader = RankLeader::accept("127.0.0.1", port, 2, 10s, kSecret);
  try {
    leader->request(RankMessage{{{"kind", "train"}}, {}}, 10s);
    FAIL() << "no error";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 exited"), std::string::npos) << e.what();
  }
  f1.join();
  EXPECT_FALSE(leader->broken().empty());
  EXPECT_THROW(leader->request(RankMessage{{{"kind", "train"}}, {}}, 1s), SwarmError);
}

TEST(RankChannel, SilenceAndMissingRanksTimeOut) {
  const int port = pick_free_port();
  // Nobody joins: accept gives up in time and says how many joined.
  try {
    RankLeader::accept("127.0.0.1", port, 2, 300ms, kSecret);
    FAIL() << "no error";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("only 1 of 2 ranks joined"), std::string::npos) << e.what();
  }
  // A follower that never answers: collect times out.
  std::atomic<bool> release{false};
  const int port2 = pick_free_port();
  std::thread f1([&] {
    auto f = RankFollower::connect("127.0.0.1", port2, 1, 10s, kSecret);
    (void)f->receive();
    while (!release) std::this_thread::sleep_for(10ms);
  });
  auto leader = RankLeader::accept("127.0.0.1", port2, 2, 10s, kSecret);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(leader->request(RankMessage{{{"kind", "train"}}, {}}, 300ms), SwarmError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  release = true;
  f1.join();
}

// The join handshake: a rank without the job's secret is refused (the leader says so in its
// log and goes on waiting), and the real rank joins after it.
TEST(RankChannel, ARankWithoutTheSecretIsRefusedAndTheJobWaitsForItsOwn) {
  const int port = pick_free_port();
  std::string stranger_error;
  std::thread stranger([&] {
    try {
      RankFollower::connect("127.0.0.1", port, 1, 10s, "another job's secret");
    } catch (const SwarmError& e) {
      stranger_error = e.what();
    }
  });
  std::thread own;
  std::unique_ptr<RankLeader> leader;
  std::thread accepting([&] { leader = RankLeader::accept("127.0.0.1", port, 2, 10s, kSecret); });
  stranger.join();
  // The stranger learns that the process it reached is not its job's rank 0 (the leader's proof
  // fails with the stranger's secret) before it could send anything else.
  EXPECT_NE(stranger_error.find("does not know this job's rendezvous secret"), std::string::npos)
      << stranger_error;
  own = follower(port, 1, [](const nlohmann::json&) { return ""; });
  accepting.join();
  ASSERT_NE(leader, nullptr);
  EXPECT_NO_THROW(leader->request(RankMessage{{{"kind", "ping"}}, {}}, 10s));
  leader->close();
  own.join();
}

// Raw bytes at the leader's port: a frame that is not a hello, one that claims a huge payload,
// a hello with a wrong proof, a duplicate rank. Each is refused; the job still forms.
TEST(RankChannel, HostileJoinsAreRefusedWithoutHarm) {
  const int port = pick_free_port();
  std::unique_ptr<RankLeader> leader;
  std::thread accepting([&] { leader = RankLeader::accept("127.0.0.1", port, 2, 10s, kSecret); });
  const auto raw = [&](const std::string& bytes) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        char buf[256];
        while (::recv(fd, buf, sizeof buf, 0) > 0) {  // until the leader closes it
        }
        ::close(fd);
        return;
      }
      ::close(fd);
      std::this_thread::sleep_for(20ms);
    }
    ADD_FAILURE() << "could not reach the leader";
  };
  const auto frame = [](const std::string& header, uint64_t payload_len) {
    uint64_t lens[2] = {header.size(), payload_len};
    return std::string(reinterpret_cast<const char*>(lens), sizeof lens) + header;
  };
  raw(frame(R"({"kind":"train"})", 0));
  raw(frame(R"({"kind":"hello","rank":1,"nonce":"00"})", uint64_t{1} << 40));  // a 1 TiB payload claim
  raw(frame(std::string(R"({"kind":"hello","rank":1,"nonce":")") + std::string(64, 'a') + "\"}", 0) +
      frame(R"({"kind":"auth","proof":"0000"})", 0));
  raw(frame(R"({"kind":"hello","rank":7,"nonce":"00"})", 0));  // not a rank of a 2-rank job
  std::thread own = follower(port, 1, [](const nlohmann::json&) { return ""; });
  accepting.join();
  ASSERT_NE(leader, nullptr);
  EXPECT_NO_THROW(leader->request(RankMessage{{{"kind", "ping"}}, {}}, 10s));
  leader->close();
  own.join();
}

TEST(RankChannel, AFollowerWithoutALeaderGivesUp) {
  const int port = pick_free_port();
  try {
    RankFollower::connect("127.0.0.1", port, 1, 300ms, kSecret);
    FAIL() << "no error";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach rank 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace swarm
