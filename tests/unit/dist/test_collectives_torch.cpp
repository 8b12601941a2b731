// Collectives: the single-process implementation, DistConfig::from_env, and real 2-rank Gloo
// jobs on loopback. A multi-rank test re-executes this binary once per rank (posix_spawn, so
// no fork of a process that already runs torch threads) with RANK / WORLD_SIZE / MASTER_PORT
// and SWARM_TEST_COLLECTIVES_ROLE set; that variable registers the one CollectivesRank.<role>
// test the rank runs, so the ranks' bodies never appear in the normal test list.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "support/rank_job.hpp"
#include "dist/collectives_torch.hpp"

namespace swarm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kRoleVar = "SWARM_TEST_COLLECTIVES_ROLE";

// Sets (or, with nullopt, unsets) environment variables for one test; restores them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

void expect_error(ErrorKind kind, const std::string& needle, const std::function<void()>& f) {
  try {
    f();
    ADD_FAILURE() << "expected SwarmError mentioning '" << needle << "'";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- single process

TEST(SingleProcessCollectives, EveryOpIsTheIdentityOrACopy) {
  auto c = make_single_process_collectives();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_EQ(c->backend_name(), "single");
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor values = at::arange(6, at::kFloat).to(dtype);
    at::Tensor t = values.clone().view({2, 3});
    c->all_reduce_sum(t);
    EXPECT_TRUE(t.view(-1).equal(values));
    c->broadcast(t, 0);
    EXPECT_TRUE(t.view(-1).equal(values));

    at::Tensor shard = at::zeros({3, 2}, dtype);
    c->reduce_scatter_sum(values, shard);
    EXPECT_TRUE(shard.view(-1).equal(values));

    at::Tensor full = at::zeros({6}, dtype);
    c->all_gather(shard, full);
    EXPECT_TRUE(full.equal(values));
    c->barrier();
  }
}

TEST(SingleProcessCollectives, RejectsShapesThatDoNotFitAndBadRoots) {
  auto c = make_single_process_collectives();
  at::Tensor shard = at::zeros({4});
  expect_error(ErrorKind::INVALID_ARGUMENT, "reduce_scatter",
               [&] { c->reduce_scatter_sum(at::zeros({6}), shard); });
  at::Tensor full = at::zeros({5});
  expect_error(ErrorKind::INVALID_ARGUMENT, "all_gather", [&] { c->all_gather(at::zeros({4}), full); });
  at::Tensor t = at::zeros({2});
  expect_error(ErrorKind::INVALID_ARGUMENT, "root 1", [&] { c->broadcast(t, 1); });
}

TEST(MakeCollectives, WorldOfOneIsSingleProcess) {
  DistConfig config;
  EXPECT_EQ(make_collectives(config)->backend_name(), "single");
  config.rank = 1;
  expect_error(ErrorKind::INVALID_ARGUMENT, "rank 1", [&] { make_collectives(config); });
}

// ---------------------------------------------------------------- DistConfig::from_env

const std::map<std::string, std::optional<std::string>> kNoDistEnv = {
    {"RANK", std::nullopt},
    {"WORLD_SIZE", std::nullopt},
    {"MASTER_ADDR", std::nullopt},
    {"MASTER_PORT", std::nullopt},
    {"LOCAL_WORLD_SIZE", std::nullopt},
    {"SWARM_DIST_TIMEOUT_SECONDS", std::nullopt}};

TEST(DistConfigFromEnv, ReadsTorchrunVariables) {
  ScopedEnv clean(kNoDistEnv);
  ScopedEnv env({{"RANK", "3"},
                 {"WORLD_SIZE", "4"},
                 {"MASTER_ADDR", "10.1.2.3"},
                 {"MASTER_PORT", "12345"},
                 {"SWARM_DIST_TIMEOUT_SECONDS", "2.5"}});
  const DistConfig c = DistConfig::from_env();
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.master_addr, "10.1.2.3");
  EXPECT_EQ(c.master_port, 12345);
  EXPECT_EQ(c.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.local_world_size, 4);  // unset: every rank on this machine
  ScopedEnv two_per_machine(std::map<std::string, std::optional<std::string>>{{"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(DistConfig::from_env().local_world_size, 2);
}

TEST(DistConfigFromEnv, UnsetWorldSizeIsSingleProcessWithDefaults) {
  ScopedEnv clean(kNoDistEnv);
  const DistConfig c = DistConfig::from_env();
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.world_size, 1);
  EXPECT_EQ(c.master_addr, "127.0.0.1");
  EXPECT_EQ(c.master_port, 29500);
  EXPECT_EQ(c.timeout, std::chrono::milliseconds(60000));
}

TEST(DistConfigFromEnv, RejectsBadValuesNamingTheVariable) {
  ScopedEnv clean(kNoDistEnv);
  const auto rejected = [](const std::map<std::string, std::optional<std::string>>& vars,
                           const std::string& name) {
    ScopedEnv env(vars);
    expect_error(ErrorKind::INVALID_ARGUMENT, name, [] { DistConfig::from_env(); });
  };
  rejected({{"WORLD_SIZE", "0"}, {"RANK", "0"}}, "WORLD_SIZE");
  rejected({{"WORLD_SIZE", "two"}, {"RANK", "0"}}, "WORLD_SIZE");
  rejected({{"WORLD_SIZE", "2"}}, "RANK");  // missing
  rejected({{"WORLD_SIZE", "2"}, {"RANK", "2"}}, "RANK");
  rejected({{"WORLD_SIZE", "2"}, {"RANK", "-1"}}, "RANK");
  rejected({{"RANK", "1"}}, "RANK");  // no WORLD_SIZE: a world of one
  rejected({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "http"}}, "MASTER_PORT");
  rejected({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT");
  rejected({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "29500x"}}, "MASTER_PORT");
  rejected({{"SWARM_DIST_TIMEOUT_SECONDS", "0"}}, "SWARM_DIST_TIMEOUT_SECONDS");
  rejected({{"SWARM_DIST_TIMEOUT_SECONDS", "soon"}}, "SWARM_DIST_TIMEOUT_SECONDS");
  rejected({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_WORLD_SIZE", "3"}}, "LOCAL_WORLD_SIZE");
}

// ---------------------------------------------------------------- multi-rank jobs

using swarm::testing::free_loopback_port;

// Runs this binary as every rank of a job, each running CollectivesRank.<role>, and returns
// each rank's exit code; a rank still running after `limit` is killed (code -1).
std::vector<int> run_job(const std::string& role, int world_size, std::chrono::seconds limit) {
  const int port = free_loopback_port();
  EXPECT_GT(port, 0);
  swarm::testing::RankJob job(world_size, "CollectivesRank." + role, [&](int rank) {
    return std::map<std::string, std::string>{{kRoleVar, role},
                                              {"RANK", std::to_string(rank)},
                                              {"WORLD_SIZE", std::to_string(world_size)},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(port)},
                                              {"SWARM_DIST_TIMEOUT_SECONDS", "3"}};
  });
  return job.wait(limit);
}

TEST(MakeCollectives, RendezvousWithoutPeersFailsAfterTheTimeout) {
  DistConfig config;
  config.rank = 1;
  config.world_size = 2;
  config.master_port = free_loopback_port();
  config.timeout = std::chrono::seconds(2);
  const auto start = Clock::now();
  expect_error(ErrorKind::UNAVAILABLE, "rendezvous at 127.0.0.1:", [&] { make_collectives(config); });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

TEST(Collectives, TwoGlooRanksComputeExactResults) {
  EXPECT_EQ(run_job("Ops", 2, std::chrono::seconds(90)), (std::vector<int>{0, 0}));
}

TEST(Collectives, DeadPeerMakesTheNextCollectiveFailInBoundedTime) {
  const auto start = Clock::now();
  EXPECT_EQ(run_job("DeadPeer", 2, std::chrono::seconds(60)), (std::vector<int>{0, 0}));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

TEST(Collectives, SilentPeerMakesTheNextCollectiveTimeOut) {
  const auto start = Clock::now();
  EXPECT_EQ(run_job("SilentPeer", 2, std::chrono::seconds(60)), (std::vector<int>{0, 0}));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

// One rank of the 2-rank job: every op on fp32 and bf16 with rank-dependent values, all
// small integers so that sums are exact in bf16.
void ops_rank() {
  const DistConfig config = DistConfig::from_env();
  auto c = make_collectives(config);
  const int r = c->rank(), w = c->world_size();
  ASSERT_EQ(c->backend_name(), "gloo");
  ASSERT_EQ(w, 2);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(dtype == at::kFloat ? "fp32" : "bf16");
    const at::Tensor i6 = at::arange(1, 7, at::kFloat);  // 1..6

    // all_reduce: rank r contributes (r+1)*i -> sum 3*i.
    at::Tensor t = (i6 * (r + 1)).to(dtype).view({2, 3});
    c->all_reduce_sum(t);
    EXPECT_EQ(t.scalar_type(), dtype);
    EXPECT_TRUE(t.view(-1).to(at::kFloat).equal(i6 * 3)) << t;

    // reduce_scatter: full = j + 10*r over 8 elements; shard on rank r = sum_k (r*4+j + 10k).
    const at::Tensor full_in = (at::arange(8, at::kFloat) + 10 * r).to(dtype);
    const at::Tensor full_before = full_in.clone();
    at::Tensor shard = at::zeros({2, 2}, dtype);
    c->reduce_scatter_sum(full_in, shard);
    const at::Tensor want_shard = at::arange(4, at::kFloat) * 2 + 8 * r + 10;
    EXPECT_TRUE(shard.view(-1).to(at::kFloat).equal(want_shard)) << shard;
    EXPECT_TRUE(full_in.equal(full_before));

    // all_gather: rank r's shard = 100*(r+1) + j -> concatenated in rank order.
    const at::Tensor mine = (at::arange(3, at::kFloat) + 100 * (r + 1)).to(dtype);
    at::Tensor gathered = at::zeros({w * 3}, dtype);
    c->all_gather(mine, gathered);
    const at::Tensor want_gathered =
        at::cat({at::arange(3, at::kFloat) + 100, at::arange(3, at::kFloat) + 200});
    EXPECT_TRUE(gathered.to(at::kFloat).equal(want_gathered)) << gathered;

    // broadcast from each root: everyone ends with the root's values. ±1e38 in bf16 have the
    // bit patterns of fp16 NaNs, which the bf16-as-fp16 transfer must carry unchanged.
    const auto values_of = [&](int k) {
      return at::cat({i6 + 0.5 * (k + 1) + 10 * k, at::tensor({1e38f, -1e38f}) * (k + 1)}).to(dtype);
    };
    for (int root = 0; root < w; ++root) {
      at::Tensor b = values_of(r);
      c->broadcast(b, root);
      EXPECT_TRUE(b.equal(values_of(root))) << "root " << root << ": " << b;
    }
    c->barrier();
  }
}

// One rank of the dead-peer job: rank 1 leaves right after the rendezvous (no clean shutdown,
// as if it crashed); rank 0's next all_reduce must fail with UNAVAILABLE well within 30 s.
void dead_peer_rank() {
  const DistConfig config = DistConfig::from_env();
  ASSERT_EQ(config.timeout, std::chrono::seconds(3));
  auto c = make_collectives(config);
  c->barrier();  // both ranks are fully connected
  if (c->rank() == 1) std::_Exit(0);

  at::Tensor t = at::ones({1024});
  const auto start = Clock::now();
  try {
    c->all_reduce_sum(t);
    ADD_FAILURE() << "all_reduce with a dead peer returned";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UNAVAILABLE);
    EXPECT_NE(std::string(e.what()).find("collective all_reduce on rank 0 of 2 failed"), std::string::npos)
        << e.what();
    std::printf("dead peer detected after %.2f s: %s\n",
                std::chrono::duration<double>(Clock::now() - start).count(), e.what());
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  // The group is now unusable, and says so without waiting.
  expect_error(ErrorKind::UNAVAILABLE, "earlier collective failed", [&] { c->barrier(); });
}

// One rank of the silent-peer job: rank 1 stays alive but never joins the all_reduce; rank 0's
// must fail once the 3 s timeout has passed, not hang.
void silent_peer_rank() {
  auto c = make_collectives(DistConfig::from_env());
  c->barrier();
  if (c->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(6));
    std::_Exit(0);
  }
  at::Tensor t = at::ones({16});
  const auto start = Clock::now();
  try {
    c->all_reduce_sum(t);
    ADD_FAILURE() << "all_reduce with a silent peer returned";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UNAVAILABLE);
    EXPECT_NE(std::string(e.what()).find("collective all_reduce on rank 0 of 2 failed"), std::string::npos)
        << e.what();
    std::printf("silent peer detected after %.2f s: %s\n",
                std::chrono::duration<double>(Clock::now() - start).count(), e.what());
  }
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, std::chrono::milliseconds(2500));  // it did wait for the peer...
  EXPECT_LT(elapsed, std::chrono::seconds(10));         // ...but only about the timeout
}

// In a spawned rank only: registers CollectivesRank.<role>.
[[maybe_unused]] const bool kRankTestRegistered = swarm::testing::register_rank_test(
    kRoleVar, "CollectivesRank",
    {{"Ops", ops_rank}, {"DeadPeer", dead_peer_rank}, {"SilentPeer", silent_peer_rank}});

}  // namespace
}  // namespace swarm
