#include "rollout_pool/rollout_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <thread>

#include "common/error.hpp"

namespace swarm {

// Friend of RolloutPool: lets the tests see the FIFO of claimable episodes.
class RolloutPoolTestPeer {
 public:
  static std::vector<std::string> unclaimed(const RolloutPool& pool) {
    std::lock_guard lock(pool.mu_);
    return {pool.unclaimed_.begin(), pool.unclaimed_.end()};
  }
};

namespace {

using namespace std::chrono_literals;

ErrorKind kind_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const SwarmError& e) {
    return e.kind();
  }
  ADD_FAILURE() << "expected a SwarmError";
  return ErrorKind::INTERNAL;
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const SwarmError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a SwarmError";
  return "";
}

LlmCall make_call(std::vector<TokenId> prompt, std::vector<TokenId> completion, int64_t version = 0) {
  LlmCall c;
  c.prompt_ids = std::move(prompt);
  c.completion_ids = std::move(completion);
  c.completion_logprobs.assign(c.completion_ids.size(), -0.5f);
  c.policy_version = version;
  c.finish_reason = "stop";
  return c;
}

WorkflowOutput reward_of(double r) {
  WorkflowOutput out;
  out.reward = r;
  return out;
}

class RolloutPoolTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();

  std::unique_ptr<RolloutPool> make_pool(PoolConfig config, bool accepting = true) {
    auto pool = std::make_unique<RolloutPool>(config, clock_);
    if (accepting) pool->set_accepting_claims(true);
    return pool;
  }

  static ClaimedEpisode claim_ok(RolloutPool& pool, const std::string& client = "client-a",
                                 EpisodeType type = EpisodeType::TRAIN, double timeout = 60.0) {
    ClaimResult r = pool.claim(ClaimRequest{client, type, timeout});
    EXPECT_TRUE(r.episode.has_value()) << r.fail_cause;
    EXPECT_TRUE(r.fail_cause.empty());
    return r.episode.value_or(ClaimedEpisode{});
  }

  static void call_ok(RolloutPool& pool, const ClaimedEpisode& ep, LlmCall call = make_call({1, 2}, {3})) {
    CallTicket t = pool.begin_call(ep.api_key);
    EXPECT_EQ(t.episode_uuid, ep.episode_uuid);
    EXPECT_TRUE(pool.finish_call(t.episode_uuid, std::move(call)));
  }

  // Claims, makes one call, ends with the reward; returns the outcome.
  static EndOutcome run_episode(RolloutPool& pool, const std::string& task, double reward,
                                const std::string& client = "client-a") {
    ClaimedEpisode ep = claim_ok(pool, client);
    call_ok(pool, ep);
    return pool.end_episode(client, ep.episode_uuid, task, reward_of(reward));
  }

  static PoolConfig small_config() {
    PoolConfig c;
    c.max_parallel_episodes = 4;
    c.batch_size = 2;
    c.num_repeat = 2;
    c.max_cached_episodes = 100;
    return c;
  }
};

// ---------------------------------------------------------------- names, config

TEST(CollectionMethod, WireNamesRoundTrip) {
  for (CollectionMethod m : {CollectionMethod::ENOUGH_EPISODES, CollectionMethod::ENOUGH_TASKS,
                             CollectionMethod::ENOUGH_NON_DUMMY_TASKS, CollectionMethod::ANY_CLIENT_AGREES,
                             CollectionMethod::ALL_CLIENTS_AGREE}) {
    CollectionMethod parsed = CollectionMethod::ENOUGH_EPISODES;
    ASSERT_TRUE(parse_collection_method(collection_method_name(m), &parsed));
    EXPECT_EQ(parsed, m);
  }
  EXPECT_STREQ(collection_method_name(CollectionMethod::ENOUGH_TASKS), "rollout_until_finish_enough_tasks");
  EXPECT_STREQ(collection_method_name(CollectionMethod::ENOUGH_EPISODES),
               "rollout_until_finish_enough_episodes");
  EXPECT_STREQ(collection_method_name(CollectionMethod::ENOUGH_NON_DUMMY_TASKS),
               "rollout_until_finish_enough_non_dummy_tasks");
  EXPECT_STREQ(collection_method_name(CollectionMethod::ANY_CLIENT_AGREES),
               "rollout_until_any_client_agree_sync_weight");
  EXPECT_STREQ(collection_method_name(CollectionMethod::ALL_CLIENTS_AGREE),
               "rollout_until_all_clients_agree_sync_weight");
  EXPECT_TRUE(is_agree_method(CollectionMethod::ANY_CLIENT_AGREES));
  EXPECT_FALSE(is_agree_method(CollectionMethod::ENOUGH_TASKS));
  CollectionMethod out = CollectionMethod::ENOUGH_TASKS;
  EXPECT_FALSE(parse_collection_method("rollout_until_bored", &out));
  EXPECT_EQ(out, CollectionMethod::ENOUGH_TASKS);
}

TEST_F(RolloutPoolTest, RejectsInvalidConfig) {
  PoolConfig c = small_config();
  c.num_repeat = 0;
  EXPECT_EQ(kind_of([&] { RolloutPool p(c, clock_); }), ErrorKind::INVALID_ARGUMENT);
  c = small_config();
  c.max_parallel_episodes = -1;
  EXPECT_EQ(kind_of([&] { RolloutPool p(c, clock_); }), ErrorKind::INVALID_ARGUMENT);
}

// ---------------------------------------------------------------- claims and slots

TEST_F(RolloutPoolTest, NoClaimsUntilAccepting) {
  auto pool = make_pool(small_config(), /*accepting=*/false);
  ClaimResult r = pool->claim(ClaimRequest{"client-a", EpisodeType::TRAIN, 60});
  EXPECT_FALSE(r.episode.has_value());
  EXPECT_NE(r.fail_cause.find("not accepting new episodes"), std::string::npos) << r.fail_cause;
  EXPECT_EQ(pool->snapshot().unclaimed, 0);
}

TEST_F(RolloutPoolTest, ClaimsAreFifoInRegistrationOrder) {
  auto pool = make_pool(small_config());
  std::vector<std::string> registered = RolloutPoolTestPeer::unclaimed(*pool);
  ASSERT_EQ(registered.size(), 4u);
  EXPECT_EQ(std::set<std::string>(registered.begin(), registered.end()).size(), 4u);

  ClaimedEpisode a = claim_ok(*pool);
  ClaimedEpisode b = claim_ok(*pool);
  EXPECT_EQ(a.episode_uuid, registered[0]);
  EXPECT_EQ(b.episode_uuid, registered[1]);

  // Freeing a slot registers a brand-new episode at the back of the FIFO.
  pool->abort_episode("client-a", a.episode_uuid, /*delete_record=*/false);
  std::vector<std::string> now = RolloutPoolTestPeer::unclaimed(*pool);
  ASSERT_EQ(now.size(), 3u);
  EXPECT_EQ(now[0], registered[2]);
  EXPECT_EQ(now[1], registered[3]);
  EXPECT_NE(now[2], a.episode_uuid);
  EXPECT_EQ(std::count(registered.begin(), registered.end(), now[2]), 0);

  EXPECT_EQ(claim_ok(*pool).episode_uuid, registered[2]);
  EXPECT_EQ(claim_ok(*pool).episode_uuid, registered[3]);
  EXPECT_EQ(claim_ok(*pool).episode_uuid, now[2]);
}

TEST_F(RolloutPoolTest, SlotLimitAndFailCause) {
  auto pool = make_pool(small_config());
  std::vector<ClaimedEpisode> eps;
  for (int i = 0; i < 4; ++i) eps.push_back(claim_ok(*pool));
  ClaimResult r = pool->claim(ClaimRequest{"client-b", EpisodeType::TRAIN, 60});
  EXPECT_FALSE(r.episode.has_value());
  EXPECT_EQ(r.fail_cause, "No available episodes to claim. All 4 slots are in use; try again later.");
  EXPECT_EQ(pool->running(), 4);
  EXPECT_EQ(pool->snapshot().unclaimed, 0);

  pool->end_episode("client-a", eps[0].episode_uuid, "t", reward_of(1.0));
  EXPECT_EQ(pool->snapshot().unclaimed, 1);
  claim_ok(*pool, "client-b");
  EXPECT_EQ(pool->counters().claimed, 5);
}

// max_claimed_per_client: a client that hoards slots is refused with a clear
// cause while the others still claim; ending one lets it claim again.
TEST_F(RolloutPoolTest, OneClientCannotHoardTheSlots) {
  PoolConfig c = small_config();
  c.max_claimed_per_client = 2;
  auto pool = make_pool(c);
  const ClaimedEpisode a1 = claim_ok(*pool, "hoarder");
  const ClaimedEpisode a2 = claim_ok(*pool, "hoarder");
  ClaimResult r = pool->claim(ClaimRequest{"hoarder", EpisodeType::TRAIN, 60});
  EXPECT_FALSE(r.episode.has_value());
  EXPECT_EQ(r.fail_cause,
            "Client hoarder holds 2 unfinished episodes, the most one client may "
            "(max_claimed_per_client 2): end or abort one before claiming another.");
  EXPECT_EQ(pool->snapshot().unclaimed, 2) << "the refused claim took a slot";
  claim_ok(*pool, "other");
  claim_ok(*pool, "other");
  pool->end_episode("hoarder", a1.episode_uuid, "t", reward_of(0.0));
  claim_ok(*pool, "hoarder");
  pool->end_episode("hoarder", a2.episode_uuid, "t", reward_of(1.0));
  EXPECT_EQ(pool->running(), 3);
}

TEST_F(RolloutPoolTest, ClaimValidatesRequest) {
  auto pool = make_pool(small_config());
  EXPECT_EQ(kind_of([&] {
              pool->claim(ClaimRequest{"", EpisodeType::TRAIN, 60});
            }),
            ErrorKind::INVALID_ARGUMENT);
  EXPECT_EQ(kind_of([&] {
              pool->claim(ClaimRequest{"c", EpisodeType::TRAIN, 0});
            }),
            ErrorKind::INVALID_ARGUMENT);
  EXPECT_EQ(kind_of([&] {
              pool->claim(ClaimRequest{"c", EpisodeType::TRAIN, -5});
            }),
            ErrorKind::INVALID_ARGUMENT);
  EXPECT_EQ(pool->counters().claimed, 0);
  EXPECT_EQ(pool->snapshot().unclaimed, 4);
}

TEST_F(RolloutPoolTest, KeysAndUuidsAreUniqueAndRandomLooking) {
  PoolConfig c = small_config();
  c.max_parallel_episodes = 300;
  auto pool = make_pool(c);
  std::set<std::string> keys, uuids;
  for (int i = 0; i < 300; ++i) {
    ClaimedEpisode ep = claim_ok(*pool);
    ASSERT_EQ(ep.api_key.size(), 9u + 48u) << ep.api_key;
    ASSERT_EQ(ep.api_key.rfind("sk-swarm-", 0), 0u);
    for (char ch : ep.api_key.substr(9)) {
      ASSERT_TRUE((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')) << ep.api_key;
    }
    ASSERT_EQ(ep.episode_uuid.size(), 36u);
    EXPECT_EQ(ep.episode_uuid[8], '-');
    EXPECT_EQ(ep.episode_uuid[13], '-');
    EXPECT_EQ(ep.episode_uuid[14], '4');  // version 4
    EXPECT_NE(std::string("89ab").find(ep.episode_uuid[19]), std::string::npos);
    keys.insert(ep.api_key);
    uuids.insert(ep.episode_uuid);
  }
  EXPECT_EQ(keys.size(), 300u);
  EXPECT_EQ(uuids.size(), 300u);
  // Crude randomness check: every hex digit shows up in the key bodies.
  std::set<char> digits;
  for (const auto& k : keys) digits.insert(k.begin() + 9, k.end());
  EXPECT_EQ(digits.size(), 16u);
  EXPECT_EQ(random_hex(0), "");
  EXPECT_EQ(random_hex(3).size(), 6u);
}

TEST_F(RolloutPoolTest, StopAcceptingDropsUnclaimedKeepsRunning) {
  auto pool = make_pool(small_config());
  ClaimedEpisode a = claim_ok(*pool);
  ClaimedEpisode b = claim_ok(*pool);
  pool->set_accepting_claims(false);
  PoolSnapshot s = pool->snapshot();
  EXPECT_FALSE(s.accepting_claims);
  EXPECT_EQ(s.unclaimed, 0);
  EXPECT_EQ(s.running, 2);
  EXPECT_TRUE(RolloutPoolTestPeer::unclaimed(*pool).empty());

  // Running episodes continue; their slots are not re-registered.
  call_ok(*pool, a);
  pool->end_episode("client-a", a.episode_uuid, "t", reward_of(1.0));
  EXPECT_EQ(pool->snapshot().unclaimed, 0);
  EXPECT_EQ(pool->running(), 1);

  // Accepting again fills up to max_parallel_episodes including the running one.
  pool->set_accepting_claims(true);
  EXPECT_EQ(pool->snapshot().unclaimed, 3);
  EXPECT_TRUE(pool->can_continue("client-a", b.episode_uuid));
}

// ---------------------------------------------------------------- calls and activity

TEST_F(RolloutPoolTest, BeginCallWithBadKeyIsUnauthorized) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool);
  std::string msg = message_of([&] { pool->begin_call("sk-swarm-nope"); });
  EXPECT_EQ(kind_of([&] { pool->begin_call("sk-swarm-nope"); }), ErrorKind::UNAUTHORIZED);
  EXPECT_EQ(kind_of([&] { pool->begin_call(""); }), ErrorKind::UNAUTHORIZED);
  EXPECT_NE(msg.find("invalid API key"), std::string::npos);
  EXPECT_EQ(msg.find(ep.api_key), std::string::npos);
  EXPECT_EQ(msg.find(ep.episode_uuid), std::string::npos);

  CallTicket t = pool->begin_call(ep.api_key);
  EXPECT_EQ(t.episode_uuid, ep.episode_uuid);
  EXPECT_EQ(t.client_uuid, "client-a");
  EXPECT_EQ(t.episode_type, EpisodeType::TRAIN);
}

TEST_F(RolloutPoolTest, CallsAndTouchRefreshActivity) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool, "client-a", EpisodeType::TRAIN, 10.0);
  clock_->advance(8s);
  call_ok(*pool, ep);
  clock_->advance(8s);
  EXPECT_TRUE(pool->reap_idle().empty());
  pool->touch(ep.episode_uuid);
  clock_->advance(9s);
  EXPECT_TRUE(pool->reap_idle().empty());
  EXPECT_DOUBLE_EQ(pool->snapshot().running_episodes.at(0).seconds_idle, 9.0);
  clock_->advance(2s);
  EXPECT_EQ(pool->reap_idle(), std::vector<std::string>{ep.episode_uuid});
  EXPECT_EQ(pool->counters().timed_out, 1);
}

TEST_F(RolloutPoolTest, ReapingHonoursPerEpisodeTimeoutAndFreesSlot) {
  auto pool = make_pool(small_config());
  ClaimedEpisode fast = claim_ok(*pool, "client-a", EpisodeType::TRAIN, 5.0);
  ClaimedEpisode slow = claim_ok(*pool, "client-a", EpisodeType::TRAIN, 50.0);
  call_ok(*pool, fast);
  clock_->advance(6s);
  EXPECT_EQ(pool->reap_idle(), std::vector<std::string>{fast.episode_uuid});

  // Context discarded, key revoked, slot re-registered with a new uuid.
  EXPECT_EQ(kind_of([&] { pool->begin_call(fast.api_key); }), ErrorKind::UNAUTHORIZED);
  EXPECT_FALSE(pool->can_continue("client-a", fast.episode_uuid));
  EXPECT_TRUE(pool->can_continue("client-a", slow.episode_uuid));
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.running, 1);
  EXPECT_EQ(s.unclaimed, 3);
  auto unclaimed = RolloutPoolTestPeer::unclaimed(*pool);
  EXPECT_EQ(std::count(unclaimed.begin(), unclaimed.end(), fast.episode_uuid), 0);

  // A late end is rejected with a clear message.
  std::string msg =
      message_of([&] { pool->end_episode("client-a", fast.episode_uuid, "t", reward_of(1.0)); });
  EXPECT_NE(msg.find(fast.episode_uuid), std::string::npos);
  EXPECT_NE(msg.find("not found"), std::string::npos);
  EXPECT_NE(msg.find("timed out"), std::string::npos);
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-a", fast.episode_uuid, "t", reward_of(1.0)); }),
            ErrorKind::NOT_FOUND);
}

TEST_F(RolloutPoolTest, InFlightCallPreventsReapingAndLateFinishIsDropped) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool, "client-a", EpisodeType::TRAIN, 10.0);
  CallTicket t = pool->begin_call(ep.api_key);
  clock_->advance(100s);  // a very long generation
  EXPECT_TRUE(pool->reap_idle().empty());
  EXPECT_EQ(pool->snapshot().running_episodes.at(0).in_flight_calls, 1);
  clock_->advance(100s);
  EXPECT_TRUE(pool->reap_idle().empty());
  EXPECT_TRUE(pool->finish_call(t.episode_uuid, make_call({1}, {2})));

  // The idle clock starts when the call finishes.
  clock_->advance(9s);
  EXPECT_TRUE(pool->reap_idle().empty());
  clock_->advance(2s);
  EXPECT_EQ(pool->reap_idle().size(), 1u);

  // A call that straggles in after the reap is dropped and counted.
  EXPECT_FALSE(pool->finish_call(ep.episode_uuid, make_call({1}, {2})));
  PoolCounters c = pool->counters();
  EXPECT_EQ(c.late_calls_dropped, 1);
  EXPECT_EQ(c.llm_calls, 1);
  EXPECT_EQ(c.timed_out, 1);
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-a", ep.episode_uuid, "t", reward_of(1.0)); }),
            ErrorKind::NOT_FOUND);
}

TEST_F(RolloutPoolTest, CancelCallReleasesInFlight) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool, "client-a", EpisodeType::TRAIN, 10.0);
  pool->begin_call(ep.api_key);
  pool->cancel_call(ep.episode_uuid);
  pool->cancel_call("no-such-episode");  // harmless
  EXPECT_EQ(pool->snapshot().running_episodes.at(0).in_flight_calls, 0);
  EXPECT_EQ(pool->snapshot().running_episodes.at(0).llm_calls, 0);
  clock_->advance(11s);
  EXPECT_EQ(pool->reap_idle().size(), 1u);
}

TEST_F(RolloutPoolTest, CallBudgetCountsInFlightCalls) {
  PoolConfig c = small_config();
  c.max_llm_calls_per_episode = 2;
  auto pool = make_pool(c);
  ClaimedEpisode ep = claim_ok(*pool);
  call_ok(*pool, ep);
  pool->begin_call(ep.api_key);  // second, in flight
  EXPECT_EQ(kind_of([&] { pool->begin_call(ep.api_key); }), ErrorKind::CONFLICT);
  std::string msg = message_of([&] { pool->begin_call(ep.api_key); });
  EXPECT_NE(msg.find("max_llm_calls_per_episode"), std::string::npos) << msg;
  // A failed call frees its budget; the rejected ones left nothing in flight.
  pool->cancel_call(ep.episode_uuid);
  EXPECT_EQ(pool->snapshot().running_episodes.at(0).in_flight_calls, 0);
  call_ok(*pool, ep);
  EXPECT_EQ(kind_of([&] { pool->begin_call(ep.api_key); }), ErrorKind::CONFLICT);
  EXPECT_EQ(pool->counters().llm_calls, 2);
}

TEST_F(RolloutPoolTest, MismatchedLogprobsAreInternalAndReleaseTheCall) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool);
  pool->begin_call(ep.api_key);
  LlmCall bad = make_call({1}, {2, 3});
  bad.completion_logprobs.pop_back();
  EXPECT_EQ(kind_of([&] { pool->finish_call(ep.episode_uuid, bad); }), ErrorKind::INTERNAL);
  auto info = pool->snapshot().running_episodes.at(0);
  EXPECT_EQ(info.in_flight_calls, 0);
  EXPECT_EQ(info.llm_calls, 0);
}

// ---------------------------------------------------------------- end, abort, ownership

TEST_F(RolloutPoolTest, EndEpisodeBuildsStampedSamples) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ENOUGH_EPISODES;
  c.batch_size = 1;
  c.num_repeat = 1;
  auto pool = make_pool(c);
  ClaimedEpisode ep = claim_ok(*pool);
  call_ok(*pool, ep, make_call({1, 2}, {10}, 3));
  call_ok(*pool, ep, make_call({1, 2, 10, 4}, {11}, 3));
  call_ok(*pool, ep, make_call({7}, {12}, 4));  // unrelated context: second sample
  WorkflowOutput out = reward_of(0.75);
  out.is_success = true;
  out.log_metrics["turns"] = 3;
  EndOutcome o = pool->end_episode("client-a", ep.episode_uuid, "task-1", out);
  EXPECT_TRUE(o.accepted);
  EXPECT_TRUE(o.batch_ready);
  EXPECT_EQ(pool->counters().episodes_split_by_drift, 1);  // two samples: the history drifted

  TrainBatch batch = pool->take_batch();
  ASSERT_EQ(batch.episodes.size(), 1u);
  const FinishedEpisode& fe = batch.episodes[0];
  EXPECT_EQ(fe.episode_uuid, ep.episode_uuid);
  EXPECT_EQ(fe.client_uuid, "client-a");
  EXPECT_EQ(fe.task_id, "task-1");
  EXPECT_DOUBLE_EQ(fe.reward, 0.75);
  EXPECT_EQ(fe.is_success, std::optional<bool>(true));
  EXPECT_DOUBLE_EQ(fe.log_metrics.at("turns"), 3.0);
  ASSERT_EQ(fe.samples.size(), 2u);
  EXPECT_EQ(batch.num_samples(), 2);
  for (const Sample& s : fe.samples) {
    EXPECT_EQ(s.task_id, "task-1");
    EXPECT_EQ(s.episode_uuid, ep.episode_uuid);
    EXPECT_DOUBLE_EQ(s.reward, 0.75);
  }
  EXPECT_EQ(fe.samples[0].token_ids, (std::vector<TokenId>{1, 2, 10, 4, 11}));
  EXPECT_EQ(fe.samples[0].num_calls, 2);
  EXPECT_EQ(fe.samples[1].policy_versions, (std::vector<int64_t>{-1, 4}));
}

TEST_F(RolloutPoolTest, EpisodeWithoutCallsEndsWithZeroSamples) {
  PoolConfig c = small_config();
  c.num_repeat = 1;
  c.batch_size = 1;
  auto pool = make_pool(c);
  ClaimedEpisode ep = claim_ok(*pool);
  EndOutcome o = pool->end_episode("client-a", ep.episode_uuid, "t", reward_of(0.0));
  EXPECT_TRUE(o.accepted);
  EXPECT_NE(o.note.find("made no LLM call: it holds no sample"), std::string::npos) << o.note;
  EXPECT_TRUE(o.batch_ready);
  EXPECT_EQ(pool->snapshot().finished_episodes, 1);
  TrainBatch b = pool->take_batch();
  ASSERT_EQ(b.episodes.size(), 1u);
  EXPECT_TRUE(b.episodes[0].samples.empty());
}

TEST_F(RolloutPoolTest, OwnershipAndValidationOnEnd) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool, "client-a");
  auto end_as = [&](const std::string& client, const std::string& task) {
    pool->end_episode(client, ep.episode_uuid, task, reward_of(1.0));
  };
  EXPECT_EQ(kind_of([&] { end_as("client-b", "t"); }), ErrorKind::FORBIDDEN);
  std::string msg = message_of([&] { end_as("client-b", "t"); });
  EXPECT_NE(msg.find("belongs to another client"), std::string::npos);
  EXPECT_EQ(msg.find("client-a"), std::string::npos);  // don't reveal the owner
  EXPECT_EQ(kind_of([&] { pool->abort_episode("client-b", ep.episode_uuid, false); }), ErrorKind::FORBIDDEN);
  EXPECT_EQ(kind_of([&] { end_as("client-a", ""); }), ErrorKind::INVALID_ARGUMENT);
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-a", "no-such-uuid", "t", reward_of(1.0)); }),
            ErrorKind::NOT_FOUND);
  EXPECT_FALSE(pool->abort_episode("client-a", "no-such-uuid", true));  // nothing to abort
  // An unclaimed slot's uuid cannot be ended either.
  std::string unclaimed = RolloutPoolTestPeer::unclaimed(*pool).front();
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-a", unclaimed, "t", reward_of(1.0)); }),
            ErrorKind::NOT_FOUND);
  EXPECT_FALSE(pool->can_continue("client-b", ep.episode_uuid));

  // None of that disturbed the episode.
  EXPECT_TRUE(pool->can_continue("client-a", ep.episode_uuid));
  end_as("client-a", "t");
  EXPECT_FALSE(pool->can_continue("client-a", ep.episode_uuid));
  // Ending it again is a retry: the recorded outcome (ARetriedEndGetsTheRecordedOutcome), not a
  // second end; for another client still FORBIDDEN.
  EXPECT_NO_THROW(end_as("client-a", "t"));
  EXPECT_EQ(kind_of([&] { end_as("client-b", "t"); }), ErrorKind::FORBIDDEN);
  EXPECT_EQ(pool->counters().ended, 1);
}

TEST_F(RolloutPoolTest, AbortInRollingReregistersSlotAndRevokesKey) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool);
  CallTicket t = pool->begin_call(ep.api_key);
  pool->abort_episode("client-a", ep.episode_uuid, /*delete_record=*/false);

  EXPECT_EQ(kind_of([&] { pool->begin_call(ep.api_key); }), ErrorKind::UNAUTHORIZED);
  EXPECT_FALSE(pool->finish_call(t.episode_uuid, make_call({1}, {2})));
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.unclaimed, 4);
  EXPECT_EQ(s.finished_episodes, 0);
  EXPECT_EQ(s.counters.aborted, 1);
  EXPECT_EQ(s.counters.late_calls_dropped, 1);
  auto unclaimed = RolloutPoolTestPeer::unclaimed(*pool);
  EXPECT_EQ(std::count(unclaimed.begin(), unclaimed.end(), ep.episode_uuid), 0);
  // A second abort is idempotent: nothing to abort, nothing changes.
  EXPECT_FALSE(pool->abort_episode("client-a", ep.episode_uuid, false));
  EXPECT_EQ(pool->snapshot().counters.aborted, 1);
  EXPECT_EQ(pool->snapshot().unclaimed, 4);
}

TEST_F(RolloutPoolTest, AbortInRollingPostDeletesRecord) {
  auto pool = make_pool(small_config());
  ClaimedEpisode a = claim_ok(*pool);
  ClaimedEpisode b = claim_ok(*pool);
  pool->set_accepting_claims(false);  // ROLLING_POST
  pool->abort_episode("client-a", a.episode_uuid, /*delete_record=*/true);
  EXPECT_EQ(pool->running(), 1);
  EXPECT_EQ(pool->snapshot().unclaimed, 0);
  pool->abort_episode("client-a", b.episode_uuid, /*delete_record=*/true);
  EXPECT_EQ(pool->running(), 0);  // weight sync can proceed
  EXPECT_EQ(pool->counters().aborted, 2);
}

// ---------------------------------------------------------------- eval, null reward

TEST_F(RolloutPoolTest, EvalEpisodesNeverEnterABatch) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ENOUGH_EPISODES;
  c.batch_size = 1;
  c.num_repeat = 1;
  auto pool = make_pool(c);
  for (double r : {1.0, 0.0}) {
    ClaimedEpisode ep = claim_ok(*pool, "client-a", EpisodeType::EVAL);
    EXPECT_EQ(pool->begin_call(ep.api_key).episode_type, EpisodeType::EVAL);
    EXPECT_TRUE(pool->finish_call(ep.episode_uuid, make_call({1}, {2})));
    WorkflowOutput out = reward_of(r);
    out.log_metrics["accuracy"] = r * 0.5;
    EndOutcome o = pool->end_episode("client-a", ep.episode_uuid, "eval-task", out);
    EXPECT_TRUE(o.accepted);
    EXPECT_FALSE(o.batch_ready);
  }
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 0);
  EXPECT_TRUE(s.tasks.empty());
  EXPECT_TRUE(s.recent_rewards.empty());
  EXPECT_DOUBLE_EQ(s.eval_metrics.at("eval/reward_mean"), 0.5);
  EXPECT_DOUBLE_EQ(s.eval_metrics.at("eval/episodes"), 2.0);
  EXPECT_DOUBLE_EQ(s.eval_metrics.at("eval/accuracy"), 0.25);
  EXPECT_EQ(s.counters.ended, 2);
  EXPECT_EQ(s.counters.ended_eval, 2);
  EXPECT_FALSE(pool->batch_ready());

  // A train episode completes the batch; the eval ones are not in it.
  EXPECT_TRUE(run_episode(*pool, "train-task", 1.0).batch_ready);
  TrainBatch b = pool->take_batch();
  ASSERT_EQ(b.episodes.size(), 1u);
  EXPECT_EQ(b.episodes[0].task_id, "train-task");
  // Eval stats restart with the next batch.
  s = pool->snapshot();
  EXPECT_EQ(s.eval_metrics.count("eval/reward_mean"), 0u);
  EXPECT_DOUBLE_EQ(s.eval_metrics.at("eval/episodes"), 0.0);
}

// Each episode's own metric names are bounded at the route; across episodes the eval means
// keep at most 1024 distinct names per step (later names are left out), while names already
// kept go on averaging.
TEST_F(RolloutPoolTest, EvalMetricNamesAreBoundedPerStep) {
  auto pool = make_pool(small_config());
  for (int e = 0; e < 2; ++e) {
    ClaimedEpisode ep = claim_ok(*pool, "client-a", EpisodeType::EVAL);
    WorkflowOutput out = reward_of(1.0);
    out.log_metrics["kept"] = e;
    for (int i = 0; i < 1000; ++i) out.log_metrics["m" + std::to_string(e) + "_" + std::to_string(i)] = 1.0;
    pool->end_episode("client-a", ep.episode_uuid, "eval-task", out);
  }
  const PoolSnapshot s = pool->snapshot();
  int64_t names = 0;
  for (const auto& [name, value] : s.eval_metrics)
    names += name != "eval/episodes" && name != "eval/reward_mean";
  EXPECT_EQ(names, 1024);
  EXPECT_DOUBLE_EQ(s.eval_metrics.at("eval/kept"), 0.5);  // both episodes counted
  EXPECT_EQ(s.eval_metrics.count("eval/m1_999"), 0u);     // past the bound
}

TEST_F(RolloutPoolTest, NullRewardDropsTrainEpisode) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool);
  call_ok(*pool, ep);
  EndOutcome o = pool->end_episode("client-a", ep.episode_uuid, "t", WorkflowOutput{});
  EXPECT_FALSE(o.accepted);
  EXPECT_FALSE(o.note.empty());
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 0);
  EXPECT_TRUE(s.tasks.empty());
  EXPECT_EQ(s.counters.ended_without_reward, 1);
  EXPECT_EQ(s.counters.ended, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.unclaimed, 4);
}

TEST_F(RolloutPoolTest, NonFiniteRewardIsRejected) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool);
  EXPECT_EQ(kind_of([&] {
              pool->end_episode("client-a", ep.episode_uuid, "t",
                                reward_of(std::numeric_limits<double>::quiet_NaN()));
            }),
            ErrorKind::INVALID_ARGUMENT);
  EXPECT_TRUE(pool->can_continue("client-a", ep.episode_uuid));
}

// ---------------------------------------------------------------- collection methods

TEST_F(RolloutPoolTest, EnoughEpisodesCountsEveryFinishedEpisode) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ENOUGH_EPISODES;  // target 2 * 2 = 4 episodes
  auto pool = make_pool(c);
  EXPECT_FALSE(run_episode(*pool, "a", 1).batch_ready);
  EXPECT_FALSE(run_episode(*pool, "b", 1).batch_ready);
  EXPECT_FALSE(run_episode(*pool, "c", 1).batch_ready);
  EXPECT_TRUE(run_episode(*pool, "a", 0).batch_ready);
  EXPECT_TRUE(pool->batch_ready());
  EXPECT_EQ(pool->snapshot().target_episodes, 4);

  TrainBatch b = pool->take_batch();
  ASSERT_EQ(b.episodes.size(), 4u);
  EXPECT_EQ(b.num_tasks, 3);
  // Grouped by task in order of first arrival.
  EXPECT_EQ(b.episodes[0].task_id, "a");
  EXPECT_EQ(b.episodes[1].task_id, "a");
  EXPECT_EQ(b.episodes[2].task_id, "b");
  EXPECT_EQ(b.episodes[3].task_id, "c");
  EXPECT_FALSE(pool->batch_ready());
  EXPECT_EQ(pool->snapshot().finished_episodes, 0);
  EXPECT_EQ(pool->counters().batches_taken, 1);
}

TEST_F(RolloutPoolTest, EnoughTasksNeedsCompleteGroupsAndLeavesIncompleteOnes) {
  auto pool = make_pool(small_config());  // 2 tasks x 2 repeats
  EXPECT_FALSE(run_episode(*pool, "a", 1).batch_ready);
  EXPECT_FALSE(run_episode(*pool, "b", 1).batch_ready);
  EXPECT_FALSE(run_episode(*pool, "a", 0).batch_ready);  // a complete
  EXPECT_FALSE(run_episode(*pool, "c", 1).batch_ready);
  EXPECT_TRUE(run_episode(*pool, "c", 1).batch_ready);  // c complete (dummy counts here)

  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.complete_tasks, 2);
  EXPECT_EQ(s.finished_episodes, 5);

  TrainBatch batch = pool->take_batch();
  EXPECT_EQ(batch.num_tasks, 2);
  ASSERT_EQ(batch.episodes.size(), 4u);
  EXPECT_EQ(batch.episodes[0].task_id, "a");
  EXPECT_EQ(batch.episodes[1].task_id, "a");
  EXPECT_EQ(batch.episodes[2].task_id, "c");
  EXPECT_EQ(batch.episodes[3].task_id, "c");

  s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 1);
  ASSERT_EQ(s.tasks.size(), 1u);
  EXPECT_EQ(s.tasks[0].task_id, "b");
  EXPECT_FALSE(s.tasks[0].complete);
  EXPECT_FALSE(pool->batch_ready());

  // The leftover group completes in the next round.
  run_episode(*pool, "b", 0);
  EXPECT_FALSE(pool->batch_ready());
  EXPECT_EQ(pool->snapshot().complete_tasks, 1);
}

TEST_F(RolloutPoolTest, EnoughNonDummyTasksIgnoresGroupsWithEqualRewards) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ENOUGH_NON_DUMMY_TASKS;
  c.batch_size = 2;
  auto pool = make_pool(c);
  run_episode(*pool, "same", 1);
  EXPECT_FALSE(run_episode(*pool, "same", 1).batch_ready);
  run_episode(*pool, "also-same", 0);
  EXPECT_FALSE(run_episode(*pool, "also-same", 0).batch_ready);
  run_episode(*pool, "diff", 1);
  EXPECT_FALSE(run_episode(*pool, "diff", 0).batch_ready);
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.complete_tasks, 3);
  EXPECT_EQ(s.complete_non_dummy_tasks, 1);
  run_episode(*pool, "diff2", 0.5);
  EXPECT_TRUE(run_episode(*pool, "diff2", 0.25).batch_ready);
  EXPECT_EQ(pool->snapshot().complete_non_dummy_tasks, 2);

  // Every complete group is taken (dummy ones carry no signal but would never leave).
  TrainBatch b = pool->take_batch();
  EXPECT_EQ(b.num_tasks, 4);
  EXPECT_EQ(b.episodes.size(), 8u);
}

TEST_F(RolloutPoolTest, EnoughNonDummyTasksToleratesRoundingNoise) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ENOUGH_NON_DUMMY_TASKS;
  c.batch_size = 1;
  auto pool = make_pool(c);
  run_episode(*pool, "t", 0.1 + 0.2);
  EXPECT_FALSE(run_episode(*pool, "t", 0.3).batch_ready);
  EXPECT_TRUE(pool->snapshot().tasks.at(0).dummy);
}

// ---------------------------------------------------------------- safety valve

TEST_F(RolloutPoolTest, SafetyValveDropsOldestIncompleteGroups) {
  PoolConfig c = small_config();
  c.max_parallel_episodes = 8;
  c.batch_size = 10;  // never ready in this test
  c.num_repeat = 4;
  c.max_cached_episodes = 5;
  auto pool = make_pool(c);
  for (int i = 0; i < 4; ++i) run_episode(*pool, "t1", i);  // complete
  run_episode(*pool, "t2", 1);                              // 5 cached
  EXPECT_EQ(pool->counters().valve_dropped_groups, 0);
  run_episode(*pool, "t3", 1);  // 6 > 5: drop t2 (t1 is complete, never dropped)
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 5);
  ASSERT_EQ(s.tasks.size(), 2u);
  EXPECT_EQ(s.tasks[0].task_id, "t1");
  EXPECT_EQ(s.tasks[1].task_id, "t3");
  EXPECT_EQ(s.counters.valve_dropped_groups, 1);
  EXPECT_EQ(s.counters.valve_dropped_episodes, 1);

  run_episode(*pool, "t4", 1);  // 6 > 5: drop t3
  run_episode(*pool, "t4", 1);  // 6 > 5: t4 itself is now the oldest incomplete group
  s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 4);
  ASSERT_EQ(s.tasks.size(), 1u);
  EXPECT_EQ(s.tasks[0].task_id, "t1");
  EXPECT_EQ(s.counters.valve_dropped_groups, 3);
  EXPECT_EQ(s.counters.valve_dropped_episodes, 4);

  // A dropped task may come back later as a new group.
  run_episode(*pool, "t2", 1);
  EXPECT_EQ(pool->snapshot().tasks.back().task_id, "t2");
  EXPECT_EQ(pool->snapshot().tasks.back().episodes, 1);
}

// ---------------------------------------------------------------- the journal (durability)

// Records what the pool asks of the episode store; fails records on demand.
class FakeJournal : public EpisodeJournal {
 public:
  void record_async(const FinishedEpisode& e, Done done) override {
    if (throw_in_call) throw std::bad_alloc();  // fails before it took the completion
    std::exception_ptr error;
    {
      std::lock_guard lk(mu);
      if (fail) {
        error = std::make_exception_ptr(SwarmError(ErrorKind::UNAVAILABLE, "disk full (fake)"));
      } else {
        recorded.push_back(e.episode_uuid);
        samples.push_back(e.samples.size());
      }
    }
    if (defer) {
      std::lock_guard lk(mu);
      deferred.push_back([done, error] { done(error); });
    } else {
      done(error);
    }
  }
  // With `defer`, completions wait here until the test runs them (a commit in progress).
  bool defer = false;
  std::vector<std::function<void()>> deferred;
  void forget(std::vector<std::string> uuids) override {
    std::lock_guard lk(mu);
    forgotten.insert(forgotten.end(), uuids.begin(), uuids.end());
  }
  std::mutex mu;
  bool fail = false;
  bool throw_in_call = false;
  std::vector<std::string> recorded, forgotten;
  std::vector<size_t> samples;
};

// ---------------------------------------------------------------- retried ends

// A client whose end_episode answer was lost sends it again: the same outcome, not a 404 that
// would make it run the task again (the group would gain a member).
TEST_F(RolloutPoolTest, ARetriedEndGetsTheRecordedOutcome) {
  auto pool = make_pool(small_config());
  ClaimedEpisode ep = claim_ok(*pool);
  call_ok(*pool, ep);
  const EndOutcome first = pool->end_episode("client-a", ep.episode_uuid, "t1", reward_of(1.0));
  const EndOutcome again = pool->end_episode("client-a", ep.episode_uuid, "t1", reward_of(1.0));
  EXPECT_EQ(again.accepted, first.accepted);
  EXPECT_EQ(again.note, first.note);
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 1);  // cached once
  EXPECT_EQ(s.counters.ended, 1);
  EXPECT_EQ(s.counters.end_replayed, 1);
  // Another client cannot end it, nor learn its outcome.
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-b", ep.episode_uuid, "t1", reward_of(0.0)); }),
            ErrorKind::FORBIDDEN);
  // A null reward's answer (dropped, with its note) replays the same way.
  ClaimedEpisode dropped = claim_ok(*pool);
  const EndOutcome d1 = pool->end_episode("client-a", dropped.episode_uuid, "t1", WorkflowOutput{});
  const EndOutcome d2 = pool->end_episode("client-a", dropped.episode_uuid, "t1", WorkflowOutput{});
  EXPECT_FALSE(d2.accepted);
  EXPECT_EQ(d2.note, d1.note);
  // An episode that never ended is still a 404.
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-a", "no-such-episode", "t1", reward_of(1.0)); }),
            ErrorKind::NOT_FOUND);
}

TEST_F(RolloutPoolTest, DiscardEpisodeTimeoutIsBounded) {
  auto pool = make_pool(small_config());
  EXPECT_EQ(kind_of([&] {
              pool->claim(ClaimRequest{"client-a", EpisodeType::TRAIN, 1e308});
            }),
            ErrorKind::INVALID_ARGUMENT);
  EXPECT_EQ(kind_of([&] {
              pool->claim(ClaimRequest{"client-a", EpisodeType::TRAIN, 86400.5});
            }),
            ErrorKind::INVALID_ARGUMENT);
  claim_ok(*pool, "client-a", EpisodeType::TRAIN, 86400.0);
}

TEST_F(RolloutPoolTest, RememberedEndsAreBounded) {
  auto pool = make_pool(small_config());
  std::vector<std::string> ended;
  for (size_t i = 0; i <= RolloutPool::kRememberedEnds; ++i) {
    ClaimedEpisode ep = claim_ok(*pool, "client-a", EpisodeType::EVAL);
    pool->end_episode("client-a", ep.episode_uuid, "t1", reward_of(0.5));
    ended.push_back(ep.episode_uuid);
  }
  // The oldest was forgotten, the newest is still answered.
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-a", ended.front(), "t1", reward_of(0.5)); }),
            ErrorKind::NOT_FOUND);
  EXPECT_NO_THROW(pool->end_episode("client-a", ended[1], "t1", reward_of(0.5)));
  EXPECT_NO_THROW(pool->end_episode("client-a", ended.back(), "t1", reward_of(0.5)));
}

// A pool with a FakeJournal and one claimed episode that made one call.
class JournaledEndTest : public RolloutPoolTest {
 protected:
  void SetUp() override {
    pool = make_pool(small_config());
    journal = std::make_shared<FakeJournal>();
    pool->set_journal(journal);
    ep = claim_ok(*pool);
    call_ok(*pool, ep);
  }
  std::unique_ptr<RolloutPool> pool;
  std::shared_ptr<FakeJournal> journal;
  ClaimedEpisode ep;
};

TEST_F(JournaledEndTest, ARetryWhileTheEndIsBeingStoredGetsItsOutcome) {
  journal->defer = true;
  std::vector<std::optional<EndOutcome>> answers(1 + RolloutPool::kMaxEndWaiters);
  for (auto& answer : answers) {
    pool->end_episode_async("client-a", ep.episode_uuid, "t1", reward_of(1.0), true,
                            [&answer](EndOutcome o, std::exception_ptr e) {
                              EXPECT_FALSE(e);
                              answer = o;
                            });
  }
  // One more retry than may wait: refused at once, the others unaffected.
  EXPECT_EQ(kind_of([&] {
              pool->end_episode_async("client-a", ep.episode_uuid, "t1", reward_of(1.0), true,
                                      [](EndOutcome, std::exception_ptr) { ADD_FAILURE() << "answered"; });
            }),
            ErrorKind::CONFLICT);
  for (const auto& answer : answers) EXPECT_FALSE(answer);  // nothing durable yet
  ASSERT_EQ(journal->deferred.size(), 1u);                  // recorded once
  journal->deferred[0]();
  for (const auto& answer : answers) {
    ASSERT_TRUE(answer);
    EXPECT_TRUE(answer->accepted);
  }
  EXPECT_EQ(pool->snapshot().finished_episodes, 1);
  EXPECT_EQ(pool->snapshot().counters.end_replayed, static_cast<int64_t>(RolloutPool::kMaxEndWaiters));
}

// An end that fails half-way (here the episode store's call throws before taking the episode)
// drops the episode and answers UNAVAILABLE: it does not stay "ending", which would hold
// ROLLING_POST forever.
TEST_F(JournaledEndTest, AnEndThatFailsHalfWayIsDroppedAndAnswered) {
  journal->throw_in_call = true;
  int answered = 0;
  std::exception_ptr error;
  EXPECT_NO_THROW(pool->end_episode_async("client-a", ep.episode_uuid, "t1", reward_of(1.0), true,
                                          [&](EndOutcome, std::exception_ptr e) {
                                            ++answered;
                                            error = e;
                                          }));
  EXPECT_EQ(answered, 1);
  ASSERT_TRUE(error);
  try {
    std::rethrow_exception(error);
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UNAVAILABLE);
    EXPECT_NE(std::string(e.what()).find("could not be ended"), std::string::npos) << e.what();
  }
  const PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.unclaimed, small_config().max_parallel_episodes);
  EXPECT_EQ(s.counters.end_failed, 1);
  EXPECT_EQ(s.finished_episodes, 0);
}

TEST_F(JournaledEndTest, StoppingAnswersTheRetriesOfAnEndInProgress) {
  journal->defer = true;
  std::optional<EndOutcome> first, retry;
  pool->end_episode_async("client-a", ep.episode_uuid, "t1", reward_of(1.0), true,
                          [&](EndOutcome o, std::exception_ptr) { first = o; });
  pool->end_episode_async("client-a", ep.episode_uuid, "t1", reward_of(1.0), true,
                          [&](EndOutcome o, std::exception_ptr) { retry = o; });
  pool->cancel_all();
  ASSERT_TRUE(retry);
  EXPECT_FALSE(retry->accepted);
  journal->deferred[0]();
  ASSERT_TRUE(first);
  EXPECT_FALSE(first->accepted);
}

TEST_F(RolloutPoolTest, EachAcceptedTrainEpisodeIsJournaledBeforeEndAnswers) {
  auto pool = make_pool(small_config());
  auto journal = std::make_shared<FakeJournal>();
  pool->set_journal(journal);
  ClaimedEpisode ep = claim_ok(*pool);
  call_ok(*pool, ep);
  EXPECT_TRUE(pool->end_episode("client-a", ep.episode_uuid, "t1", reward_of(1.0)).accepted);
  ASSERT_EQ(journal->recorded, std::vector<std::string>{ep.episode_uuid});
  EXPECT_EQ(journal->samples[0], 1u);  // with its samples, merged before the record
  // Eval episodes and null rewards never train: not journaled.
  ClaimedEpisode ev = claim_ok(*pool, "client-a", EpisodeType::EVAL);
  pool->end_episode("client-a", ev.episode_uuid, "t1", reward_of(1.0));
  ClaimedEpisode null_reward = claim_ok(*pool);
  pool->end_episode("client-a", null_reward.episode_uuid, "t1", WorkflowOutput{});
  EXPECT_EQ(journal->recorded.size(), 1u);
}

TEST_F(RolloutPoolTest, AnEndIsAnsweredAndCachedOnlyOnceTheJournalCommitted) {
  auto pool = make_pool(small_config());
  auto journal = std::make_shared<FakeJournal>();
  journal->defer = true;
  pool->set_journal(journal);
  ClaimedEpisode ep = claim_ok(*pool);
  call_ok(*pool, ep);
  std::optional<EndOutcome> answered;
  pool->end_episode_async("client-a", ep.episode_uuid, "t1", reward_of(1.0), true,
                          [&](EndOutcome o, std::exception_ptr e) {
                            EXPECT_FALSE(e);
                            answered = o;
                          });
  EXPECT_FALSE(answered);  // not durable yet: no answer, not cached, still running
  EXPECT_EQ(pool->snapshot().finished_episodes, 0);
  EXPECT_EQ(pool->running(), 1);
  ASSERT_EQ(journal->deferred.size(), 1u);
  journal->deferred[0]();  // the commit
  ASSERT_TRUE(answered);
  EXPECT_TRUE(answered->accepted);
  EXPECT_EQ(pool->snapshot().finished_episodes, 1);
  EXPECT_EQ(pool->running(), 0);
}

TEST_F(RolloutPoolTest, AFailedJournalRecordRefusesTheEpisodeAndFreesItsSlot) {
  auto pool = make_pool(small_config());
  auto journal = std::make_shared<FakeJournal>();
  pool->set_journal(journal);
  journal->fail = true;
  ClaimedEpisode ep = claim_ok(*pool);
  call_ok(*pool, ep);
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-a", ep.episode_uuid, "t1", reward_of(1.0)); }),
            ErrorKind::UNAVAILABLE);
  const PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 0);  // nothing acknowledged, nothing cached
  EXPECT_EQ(s.running, 0);            // ROLLING_POST does not wait for it
  EXPECT_EQ(s.unclaimed, small_config().max_parallel_episodes);
  EXPECT_EQ(s.counters.store_failures, 1);
  EXPECT_EQ(s.counters.ended, 0);
}

TEST_F(RolloutPoolTest, DroppedEpisodesAreForgottenByTheJournal) {
  PoolConfig c = small_config();
  c.max_parallel_episodes = 8;
  c.batch_size = 10;
  c.num_repeat = 4;
  c.max_cached_episodes = 2;
  auto pool = make_pool(c);
  auto journal = std::make_shared<FakeJournal>();
  pool->set_journal(journal);
  run_episode(*pool, "t1", 1);
  run_episode(*pool, "t2", 1);
  run_episode(*pool, "t3", 1);  // 3 > 2: the valve drops t1
  ASSERT_EQ(journal->recorded.size(), 3u);
  EXPECT_EQ(journal->forgotten, std::vector<std::string>{journal->recorded[0]});
  // Staleness drops too: every cached episode was sampled at version 0.
  EXPECT_EQ(pool->drop_stale(1), 2);
  EXPECT_EQ(journal->forgotten.size(), 3u);
}

TEST_F(RolloutPoolTest, RestoredEpisodesCountTowardTheBatch) {
  auto pool = make_pool(small_config());  // batch: 2 tasks x 2
  std::vector<FinishedEpisode> back;
  for (const char* task : {"t1", "t1", "t2"}) {
    FinishedEpisode e;
    e.episode_uuid = std::string("old-") + std::to_string(back.size());
    e.task_id = task;
    e.reward = static_cast<double>(back.size());
    back.push_back(e);
  }
  EXPECT_EQ(pool->restore_finished(back), 3);
  EXPECT_FALSE(pool->batch_ready());
  run_episode(*pool, "t2", 5.0);
  EXPECT_TRUE(pool->batch_ready());
  const TrainBatch b = pool->take_batch();
  ASSERT_EQ(b.episodes.size(), 4u);
  EXPECT_EQ(b.episodes[0].episode_uuid, "old-0");  // restored ones keep their order, first
  EXPECT_EQ(pool->counters().restored, 3);
}

TEST_F(RolloutPoolTest, SafetyValveNeverDropsCompleteGroups) {
  PoolConfig c = small_config();
  c.batch_size = 10;
  c.num_repeat = 2;
  c.max_cached_episodes = 3;
  auto pool = make_pool(c);
  for (const char* t : {"a", "a", "b", "b"}) run_episode(*pool, t, 1);
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 4);  // over the threshold, but every group is complete
  EXPECT_EQ(s.complete_tasks, 2);
  EXPECT_EQ(s.counters.valve_dropped_groups, 0);
  // While over the threshold a new incomplete group is the only candidate.
  run_episode(*pool, "c", 1);
  s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 4);
  EXPECT_EQ(s.tasks.size(), 2u);
  EXPECT_EQ(s.counters.valve_dropped_groups, 1);
  EXPECT_EQ(s.counters.valve_dropped_episodes, 1);
}

TEST_F(RolloutPoolTest, SafetyValveDropsDummyGroupsForNonDummyMethod) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ENOUGH_NON_DUMMY_TASKS;
  c.batch_size = 10;
  c.num_repeat = 2;
  c.max_cached_episodes = 3;
  auto pool = make_pool(c);
  run_episode(*pool, "dummy", 1);
  run_episode(*pool, "dummy", 1);
  run_episode(*pool, "useful", 0);
  run_episode(*pool, "useful", 1);  // 4 > 3, no incomplete group: drop the dummy one
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 2);
  ASSERT_EQ(s.tasks.size(), 1u);
  EXPECT_EQ(s.tasks[0].task_id, "useful");
  EXPECT_EQ(s.counters.valve_dropped_groups, 1);
  EXPECT_EQ(s.counters.valve_dropped_episodes, 2);
}

TEST_F(RolloutPoolTest, SafetyValveKeepsMemoryBoundedUnderManyTasks) {
  PoolConfig c = small_config();
  c.batch_size = 4;
  c.num_repeat = 4;
  c.max_cached_episodes = 16;
  auto pool = make_pool(c);
  // Every task gets a single episode: nothing ever completes.
  for (int i = 0; i < 200; ++i) {
    run_episode(*pool, "task-" + std::to_string(i), 1);
    ASSERT_LE(pool->snapshot().finished_episodes, 16);
  }
  PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 16);
  EXPECT_EQ(s.tasks.size(), 16u);
  EXPECT_EQ(s.tasks.front().task_id, "task-184");  // the newest ones survive
  EXPECT_EQ(s.counters.valve_dropped_groups, 184);
  EXPECT_EQ(s.counters.valve_dropped_episodes, 184);
}

// ---------------------------------------------------------------- cancel, snapshot

TEST_F(RolloutPoolTest, CancelAllClearsEverything) {
  auto pool = make_pool(small_config());
  run_episode(*pool, "a", 1);
  ClaimedEpisode r1 = claim_ok(*pool);
  ClaimedEpisode r2 = claim_ok(*pool);
  pool->cancel_all();
  PoolSnapshot s = pool->snapshot();
  EXPECT_FALSE(s.accepting_claims);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.unclaimed, 0);
  EXPECT_EQ(s.finished_episodes, 0);
  EXPECT_TRUE(s.tasks.empty());
  EXPECT_EQ(s.counters.cancelled, 2);
  EXPECT_EQ(kind_of([&] { pool->begin_call(r1.api_key); }), ErrorKind::UNAUTHORIZED);
  EXPECT_EQ(kind_of([&] { pool->end_episode("client-a", r2.episode_uuid, "a", reward_of(1)); }),
            ErrorKind::NOT_FOUND);
  ClaimResult cr = pool->claim(ClaimRequest{"client-a", EpisodeType::TRAIN, 60});
  EXPECT_FALSE(cr.episode.has_value());
  EXPECT_FALSE(cr.fail_cause.empty());
  EXPECT_TRUE(pool->take_batch().episodes.empty());
}

TEST_F(RolloutPoolTest, SnapshotContents) {
  PoolConfig c = small_config();
  c.batch_size = 3;
  c.num_repeat = 2;
  c.reward_history = 3;
  auto pool = make_pool(c);
  run_episode(*pool, "a", 1.0);
  run_episode(*pool, "a", 0.0);
  run_episode(*pool, "b", 0.5);
  run_episode(*pool, "c", 0.25);

  ClaimedEpisode first = claim_ok(*pool, "client-x", EpisodeType::TRAIN, 30.0);
  clock_->advance(2s);
  ClaimedEpisode second = claim_ok(*pool, "client-y", EpisodeType::EVAL, 40.0);
  call_ok(*pool, second);
  pool->begin_call(second.api_key);
  clock_->advance(3s);

  PoolSnapshot s = pool->snapshot();
  EXPECT_TRUE(s.accepting_claims);
  EXPECT_EQ(s.config.batch_size, 3);
  EXPECT_EQ(s.running, 2);
  EXPECT_EQ(s.unclaimed, 2);
  EXPECT_EQ(s.finished_episodes, 4);
  EXPECT_EQ(s.complete_tasks, 1);
  EXPECT_EQ(s.complete_non_dummy_tasks, 1);
  EXPECT_EQ(s.target_episodes, 6);
  EXPECT_EQ(s.target_tasks, 3);

  ASSERT_EQ(s.running_episodes.size(), 2u);
  const RunningEpisodeInfo& r0 = s.running_episodes[0];
  const RunningEpisodeInfo& r1 = s.running_episodes[1];
  EXPECT_EQ(r0.episode_uuid, first.episode_uuid);
  EXPECT_EQ(r0.client_uuid, "client-x");
  EXPECT_EQ(r0.episode_type, EpisodeType::TRAIN);
  EXPECT_EQ(r0.llm_calls, 0);
  EXPECT_DOUBLE_EQ(r0.seconds_idle, 5.0);
  EXPECT_DOUBLE_EQ(r0.seconds_since_claim, 5.0);
  EXPECT_DOUBLE_EQ(r0.discard_episode_timeout, 30.0);
  EXPECT_EQ(r1.episode_uuid, second.episode_uuid);
  EXPECT_EQ(r1.episode_type, EpisodeType::EVAL);
  EXPECT_EQ(r1.llm_calls, 1);
  EXPECT_EQ(r1.in_flight_calls, 1);
  EXPECT_DOUBLE_EQ(r1.seconds_idle, 3.0);
  EXPECT_DOUBLE_EQ(r1.seconds_since_claim, 3.0);

  ASSERT_EQ(s.tasks.size(), 3u);
  EXPECT_EQ(s.tasks[0].task_id, "a");
  EXPECT_EQ(s.tasks[0].episodes, 2);
  EXPECT_DOUBLE_EQ(s.tasks[0].reward_mean, 0.5);
  EXPECT_DOUBLE_EQ(s.tasks[0].reward_std, 0.5);  // population std
  EXPECT_TRUE(s.tasks[0].complete);
  EXPECT_FALSE(s.tasks[0].dummy);
  EXPECT_EQ(s.tasks[1].task_id, "b");
  EXPECT_FALSE(s.tasks[1].complete);
  EXPECT_DOUBLE_EQ(s.tasks[1].reward_std, 0.0);

  // Bounded by reward_history, oldest first.
  EXPECT_EQ(s.recent_rewards, (std::vector<double>{0.0, 0.5, 0.25}));

  EXPECT_EQ(s.counters.claimed, 6);
  EXPECT_EQ(s.counters.ended, 4);
  EXPECT_EQ(s.counters.llm_calls, 5);
  EXPECT_DOUBLE_EQ(s.eval_metrics.at("eval/episodes"), 0.0);
}

// ---------------------------------------------------------------- concurrency

TEST_F(RolloutPoolTest, ConcurrentClientsKeepCountersConsistent) {
  PoolConfig c;
  c.max_parallel_episodes = 6;  // fewer slots than threads: claims contend
  c.batch_size = 3;
  c.num_repeat = 2;
  c.max_cached_episodes = 24;
  c.method = CollectionMethod::ENOUGH_TASKS;
  auto pool = make_pool(c);

  constexpr int kThreads = 8;
  constexpr int kEpisodesPerThread = 400;
  std::atomic<int64_t> ended_train{0}, ended_eval{0}, no_reward{0}, aborted{0}, failed_claims{0};
  std::atomic<int64_t> taken{0};
  std::atomic<bool> done{false};

  std::thread trainer([&] {
    while (!done.load()) {
      if (pool->batch_ready()) taken += static_cast<int64_t>(pool->take_batch().episodes.size());
      pool->reap_idle();  // the clock never moves: nothing is reaped
      (void)pool->snapshot();
      std::this_thread::yield();
    }
  });

  std::vector<std::thread> workers;
  for (int w = 0; w < kThreads; ++w) {
    workers.emplace_back([&, w] {
      const std::string client = "client-" + std::to_string(w);
      for (int i = 0; i < kEpisodesPerThread; ++i) {
        ClaimResult r;
        while (!(r = pool->claim(
                     ClaimRequest{client, i % 10 == 3 ? EpisodeType::EVAL : EpisodeType::TRAIN, 600.0}))
                    .episode) {
          failed_claims++;
          std::this_thread::yield();
        }
        const ClaimedEpisode& ep = *r.episode;
        for (int k = 0; k < 2; ++k) {
          CallTicket t = pool->begin_call(ep.api_key);
          std::vector<TokenId> prompt = {1, 2, static_cast<TokenId>(k)};
          pool->finish_call(t.episode_uuid, make_call(prompt, {static_cast<TokenId>(i)}));
        }
        const std::string task = "task-" + std::to_string((w * 7 + i) % 13);
        if (i % 10 == 7) {
          pool->abort_episode(client, ep.episode_uuid, false);
          aborted++;
        } else if (i % 10 == 3) {
          pool->end_episode(client, ep.episode_uuid, task, reward_of(1.0));
          ended_eval++;
        } else if (i % 20 == 9) {
          pool->end_episode(client, ep.episode_uuid, task, WorkflowOutput{});
          no_reward++;
        } else {
          pool->end_episode(client, ep.episode_uuid, task, reward_of((i % 3) * 0.5));
          ended_train++;
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  done = true;
  trainer.join();

  PoolSnapshot s = pool->snapshot();
  const int64_t total = int64_t{kThreads} * kEpisodesPerThread;
  EXPECT_EQ(s.counters.claimed, total);
  EXPECT_EQ(s.counters.ended, ended_train + ended_eval);
  EXPECT_EQ(s.counters.ended_eval, ended_eval);
  EXPECT_EQ(s.counters.ended_without_reward, no_reward);
  EXPECT_EQ(s.counters.aborted, aborted);
  EXPECT_EQ(s.counters.claimed, s.counters.ended + s.counters.ended_without_reward + s.counters.aborted);
  EXPECT_EQ(s.counters.llm_calls, 2 * total);
  EXPECT_EQ(s.counters.timed_out, 0);
  EXPECT_EQ(s.counters.late_calls_dropped, 0);
  // Every rewarded train episode was taken, is still cached, or was dropped by the valve.
  EXPECT_EQ(taken + s.finished_episodes + s.counters.valve_dropped_episodes, ended_train.load());
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.unclaimed, c.max_parallel_episodes);
  EXPECT_GT(s.counters.batches_taken, 0);
}

// ---------------------------------------------------------------- agree methods (AgentJet)

std::vector<std::string> active_uuids(const PoolSnapshot& s) {
  std::vector<std::string> out;
  for (const auto& c : s.active_clients) out.push_back(c.client_uuid);
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(RolloutPoolTest, AnyClientAgreementCompletesTheBatchWithEveryCachedEpisode) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ANY_CLIENT_AGREES;
  auto pool = make_pool(c);
  // Not active yet: refused with the reason AgentJet's client logs, batch not ready.
  AgreeResult r = pool->agree_sync_weight("client-a");
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.failure_reason.find("not in the active list"), std::string::npos) << r.failure_reason;
  // batch_size (2 tasks x 2) is irrelevant: one episode of one task is enough.
  run_episode(*pool, "t1", 1.0, "client-a");
  EXPECT_FALSE(pool->batch_ready());
  EXPECT_EQ(active_uuids(pool->snapshot()), std::vector<std::string>{"client-a"});
  EXPECT_FALSE(pool->snapshot().active_clients[0].allowed_sync_weight);
  r = pool->agree_sync_weight("client-a");
  EXPECT_TRUE(r.success) << r.failure_reason;
  EXPECT_TRUE(r.failure_reason.empty());
  EXPECT_TRUE(pool->snapshot().active_clients[0].allowed_sync_weight);
  EXPECT_TRUE(pool->batch_ready());
  TrainBatch batch = pool->take_batch();
  ASSERT_EQ(batch.episodes.size(), 1u);  // the incomplete group trains too
  EXPECT_EQ(batch.episodes[0].task_id, "t1");
  // Agreements and the active list are per weight sync.
  EXPECT_TRUE(pool->snapshot().active_clients.empty());
  EXPECT_FALSE(pool->batch_ready());
  EXPECT_FALSE(pool->agree_sync_weight("client-a").success);
}

TEST_F(RolloutPoolTest, AllClientsMustAgreeAndAnIdleClientExpires) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ALL_CLIENTS_AGREE;
  auto pool = make_pool(c);
  run_episode(*pool, "t1", 1.0, "client-a");
  run_episode(*pool, "t2", 0.0, "client-b");
  EXPECT_EQ(active_uuids(pool->snapshot()), (std::vector<std::string>{"client-a", "client-b"}));
  EXPECT_TRUE(pool->agree_sync_weight("client-a").success);
  EXPECT_FALSE(pool->batch_ready());  // client-b has not agreed
  // client-a keeps working (a claim refreshes it); client-b goes quiet past 600 s.
  clock_->advance(400s);
  ClaimedEpisode ep = claim_ok(*pool, "client-a");
  clock_->advance(201s);
  pool->reap_idle();  // the janitor's sweep also expires idle clients
  EXPECT_EQ(active_uuids(pool->snapshot()), std::vector<std::string>{"client-a"});
  EXPECT_TRUE(pool->batch_ready());  // every remaining active client agreed
  pool->abort_episode("client-a", ep.episode_uuid, /*delete_record=*/true);
  EXPECT_EQ(pool->take_batch().episodes.size(), 2u);
}

TEST_F(RolloutPoolTest, WhoBecomesActive) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ANY_CLIENT_AGREES;
  auto pool = make_pool(c);
  // An end that does not declare the client active leaves it off the list.
  ClaimedEpisode ep = claim_ok(*pool, "quiet");
  call_ok(*pool, ep);
  pool->end_episode("quiet", ep.episode_uuid, "t1", reward_of(1.0), /*declare_client_active=*/false);
  // An abort declares it, as AgentJet's server does.
  ep = claim_ok(*pool, "aborter");
  EXPECT_TRUE(pool->abort_episode("aborter", ep.episode_uuid, false));
  // A claim alone does not.
  claim_ok(*pool, "claimer");
  EXPECT_EQ(active_uuids(pool->snapshot()), std::vector<std::string>{"aborter"});
  // Nothing cached to train on: an agreement would sync an empty batch, so it waits.
  auto fresh = make_pool(c);
  ep = claim_ok(*fresh, "aborter");
  fresh->abort_episode("aborter", ep.episode_uuid, false);
  AgreeResult r = fresh->agree_sync_weight("aborter");
  EXPECT_FALSE(r.success);
  EXPECT_NE(r.failure_reason.find("Nothing to train on"), std::string::npos) << r.failure_reason;
}

TEST_F(RolloutPoolTest, AgreeWithAnotherMethodIsAConflict) {
  auto pool = make_pool(small_config());
  run_episode(*pool, "t1", 1.0, "client-a");
  EXPECT_EQ(kind_of([&] { pool->agree_sync_weight("client-a"); }), ErrorKind::CONFLICT);
  EXPECT_NE(
      message_of([&] { pool->agree_sync_weight("client-a"); }).find("rollout_until_finish_enough_tasks"),
      std::string::npos);
}

TEST_F(RolloutPoolTest, ActiveClientsAreBounded) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ANY_CLIENT_AGREES;
  c.max_active_clients = 3;
  auto pool = make_pool(c);
  for (int i = 0; i < 5; ++i) {
    clock_->advance(1s);
    ClaimedEpisode ep = claim_ok(*pool, "client-" + std::to_string(i));
    pool->abort_episode("client-" + std::to_string(i), ep.episode_uuid, false);
  }
  // The least recently active went first.
  EXPECT_EQ(active_uuids(pool->snapshot()), (std::vector<std::string>{"client-2", "client-3", "client-4"}));
}

TEST_F(RolloutPoolTest, AgreeMethodsKeepTheCacheBounded) {
  PoolConfig c = small_config();
  c.method = CollectionMethod::ANY_CLIENT_AGREES;
  c.max_cached_episodes = 4;
  auto pool = make_pool(c);
  for (int i = 0; i < 6; ++i) run_episode(*pool, "t" + std::to_string(i), 1.0);
  const PoolSnapshot s = pool->snapshot();
  EXPECT_EQ(s.finished_episodes, 4);  // nobody agreed: the oldest groups went
  EXPECT_EQ(s.counters.valve_dropped_episodes, 2);
  ASSERT_EQ(s.tasks.size(), 4u);
  EXPECT_EQ(s.tasks.front().task_id, "t2");
}

TEST_F(RolloutPoolTest, TaskGroupsListTheirEpisodesRewardsAndThrottledClients) {
  auto pool = make_pool(small_config());
  ClaimResult r = pool->claim(ClaimRequest{"client-a", EpisodeType::TRAIN, 60.0, "t1"});
  ASSERT_TRUE(r.episode);
  call_ok(*pool, *r.episode);
  pool->end_episode("client-a", r.episode->episode_uuid, "t1", reward_of(0.5));
  run_episode(*pool, "t1", 1.0, "client-b");  // claimed without a task id
  const PoolSnapshot s = pool->snapshot();
  ASSERT_EQ(s.tasks.size(), 1u);
  ASSERT_EQ(s.tasks[0].episode_uuids.size(), 2u);
  EXPECT_EQ(s.tasks[0].episode_uuids[0], r.episode->episode_uuid);
  EXPECT_EQ(s.tasks[0].rewards, (std::vector<double>{0.5, 1.0}));
  EXPECT_EQ(s.tasks[0].throttled_client_uuids, std::vector<std::string>{"client-a"});
  EXPECT_EQ(s.counters.episodes_split_by_drift, 0);  // one call each: one sample each
}

// ---------------------------------------------------------------- asynchronous training

namespace {

// One episode of `task` whose single call was sampled by weights `version`.
void run_versioned(RolloutPool& pool, const std::string& task, double reward, int64_t version) {
  ClaimResult r = pool.claim(ClaimRequest{"client-a", EpisodeType::TRAIN, 60.0});
  ASSERT_TRUE(r.episode.has_value()) << r.fail_cause;
  CallTicket t = pool.begin_call(r.episode->api_key);
  ASSERT_TRUE(pool.finish_call(t.episode_uuid, make_call({1, 2}, {3, 4}, version)));
  pool.end_episode("client-a", r.episode->episode_uuid, task, reward_of(reward));
}

}  // namespace

// A member dropped as too stale still counts toward num_repeat: the agent will not run the task
// again, so the rest of the group completes and trains without it.
TEST_F(RolloutPoolTest, StaleDropsCountTowardTheirGroupAndTheRestTrains) {
  PoolConfig c = small_config();
  c.batch_size = 1;
  c.num_repeat = 3;
  auto pool = make_pool(c);
  run_versioned(*pool, "t", 1.0, 0);  // old
  run_versioned(*pool, "t", 0.0, 2);
  EXPECT_EQ(pool->drop_stale(1), 1);
  EXPECT_FALSE(pool->batch_ready());  // 1 kept + 1 dropped of 3
  run_versioned(*pool, "t", 1.0, 2);
  EXPECT_TRUE(pool->batch_ready());
  int64_t dropped = -1;
  const TrainBatch b = pool->take_batch_fresh(1, &dropped);
  EXPECT_EQ(dropped, 0);
  ASSERT_EQ(b.episodes.size(), 2u);
  for (const auto& e : b.episodes) EXPECT_EQ(e.min_version, 2);
  EXPECT_EQ(pool->counters().stale_dropped_episodes, 1);

  // A group whose every member so far was dropped waits, as a count, for the others.
  run_versioned(*pool, "u", 1.0, 0);
  EXPECT_EQ(pool->drop_stale(1), 1);
  EXPECT_EQ(pool->snapshot().tasks.size(), 1u);
  run_versioned(*pool, "u", 0.0, 3);
  run_versioned(*pool, "u", 1.0, 3);
  EXPECT_TRUE(pool->batch_ready());
  EXPECT_EQ(pool->take_batch_fresh(1, nullptr).episodes.size(), 2u);
  EXPECT_TRUE(pool->snapshot().tasks.empty());

  // All members dropped: the group goes, nothing to train.
  for (int i = 0; i < 3; ++i) run_versioned(*pool, "v", 1.0, 0);
  EXPECT_EQ(pool->drop_stale(1), 3);
  EXPECT_TRUE(pool->snapshot().tasks.empty());
  EXPECT_EQ(pool->snapshot().finished_episodes, 0);
}

TEST_F(RolloutPoolTest, AdmissionLimitHoldsTrainClaimsOnly) {
  PoolConfig c = small_config();
  c.max_parallel_episodes = 8;
  auto pool = make_pool(c);
  pool->set_train_admission_limit(2);
  ClaimedEpisode a = claim_ok(*pool), b = claim_ok(*pool);
  ClaimResult held = pool->claim(ClaimRequest{"client-a", EpisodeType::TRAIN, 60.0});
  EXPECT_FALSE(held.episode.has_value());
  EXPECT_NE(held.fail_cause.find("staleness bound"), std::string::npos) << held.fail_cause;
  claim_ok(*pool, "client-a", EpisodeType::EVAL);
  EXPECT_EQ(pool->counters().claims_held_by_staleness, 1);
  pool->set_train_admission_limit(-1);
  claim_ok(*pool);
  (void)a, (void)b;
}

}  // namespace
}  // namespace swarm
