// The serving link (dist/serve_link.hpp) over a socket pair: requests and results cross it bit
// for bit, a follower's observer calls arrive at rank 0's observer in order, cancellations
// reach the follower, and a follower that dies or sends garbage fails what is in flight with
// an error naming the rank — never the process. Grammars travel in their serialized form.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

#include "common/error.hpp"
#include "dist/serve_link.hpp"
#include "grammar/grammar.hpp"
#include "support/generation_results.hpp"

namespace swarm {
namespace {

using namespace std::chrono_literals;

// What rank 0's side of a request saw.
class Seen final : public GenerationObserver {
 public:
  void on_text(int64_t choice, const std::string& delta) override {
    std::lock_guard lk(mu_);
    deltas.emplace_back(choice, delta);
  }
  void on_complete(GenerationResult r) override {
    std::lock_guard lk(mu_);
    result = std::move(r);
    ++ends;
    cv_.notify_all();
  }
  void on_error(ErrorKind k, const std::string& m) override {
    std::lock_guard lk(mu_);
    error_kind = k;
    error = m;
    ++ends;
    cv_.notify_all();
  }
  bool cancelled() const override { return cancel.load(); }
  bool wait(std::chrono::milliseconds t = 5s) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, t, [&] { return ends > 0; });
  }
  std::vector<std::pair<int64_t, std::string>> deltas;
  std::optional<GenerationResult> result;
  ErrorKind error_kind = ErrorKind::INTERNAL;
  std::string error;
  int ends = 0;
  std::atomic<bool> cancel{false};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

// The follower's engine, played by the test: it keeps what it was given.
struct FakeEngine {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<GenerationRequest, std::shared_ptr<GenerationObserver>>> got;
  std::vector<int64_t> versions;
  ServeLinkFollower::Submit submit() {
    return [this](GenerationRequest r, std::shared_ptr<GenerationObserver> o) {
      std::lock_guard lk(mu);
      got.emplace_back(std::move(r), std::move(o));
      cv.notify_all();
    };
  }
  std::function<void(int64_t)> version() {
    return [this](int64_t v) {
      std::lock_guard lk(mu);
      versions.push_back(v);
      cv.notify_all();
    };
  }
  bool wait_for(size_t n, std::chrono::milliseconds t = 5s) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, t, [&] { return got.size() >= n; });
  }
};

struct Pair {
  int leader_fd = -1, follower_fd = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    leader_fd = fds[0];
    follower_fd = fds[1];
  }
};

std::shared_ptr<const grammar::Grammar> letters_grammar() {
  grammar::Grammar g;
  const uint32_t root = g.add_rule("word");
  g.add_alternative(root, {grammar::Element::bytes('a', 'z'), grammar::Element::rule(root)});
  g.add_alternative(root, {grammar::Element::bytes('a', 'z')});
  const uint32_t top = g.rule_of({{grammar::Element::rule(root), grammar::Element::token(7)}}, "top");
  g.set_root(top);
  return std::make_shared<const grammar::Grammar>(std::move(g));
}

GenerationRequest full_request() {
  GenerationRequest r;
  r.prompt_ids = {1, 2, 3, 1 << 20};
  r.params.temperature = 0.7000000000000001;
  r.params.top_p = 0.9;
  r.params.top_k = 40;
  r.params.max_tokens = 17;
  r.params.seed = ~uint64_t{0} - 3;
  r.params.stop = {"\n\n", std::string("\xff\x00z", 3)};
  r.params.stop_token_ids = {5, 9};
  r.params.n = 3;
  r.params.logprobs = true;
  r.params.top_logprobs = 2;
  r.grammar = letters_grammar();
  r.affinity = "not sent";
  return r;
}

GenerationResult full_result() {
  GenerationResult r;
  r.policy_version = 42;
  for (int c = 0; c < 2; ++c) {
    GenerationChoice& ch = r.choices.emplace_back();
    ch.ids = {10 + c, 11, 12};
    ch.logprobs = {-0.1f, -1e-30f, -7.5f};
    ch.versions = {41, 42, 42};
    ch.top = {{{3, -0.5f}, {4, -std::numeric_limits<float>::infinity()}}, {}, {{5, -2.f}}};
    ch.text = std::string("ab\xe2\x82", 4);  // an unfinished UTF-8 sequence crosses as bytes
    ch.finish_reason = c ? "length" : "stop";
  }
  return r;
}

using testing::expect_same_generation;

TEST(ServeLink, RequestsCrossExactlyWithTheirGrammar) {
  const GenerationRequest in = full_request();
  const RankMessage m = encode_generate_request(9, in);
  EXPECT_EQ(m.header["id"], 9);
  const GenerationRequest out = decode_generate_request(m);
  EXPECT_EQ(out.prompt_ids, in.prompt_ids);
  EXPECT_EQ(out.params.temperature, in.params.temperature);
  EXPECT_EQ(out.params.top_p, in.params.top_p);
  EXPECT_EQ(out.params.top_k, in.params.top_k);
  EXPECT_EQ(out.params.max_tokens, in.params.max_tokens);
  EXPECT_EQ(out.params.seed, in.params.seed);
  EXPECT_EQ(out.params.stop, in.params.stop);
  EXPECT_EQ(out.params.stop_token_ids, in.params.stop_token_ids);
  EXPECT_EQ(out.params.n, in.params.n);
  EXPECT_EQ(out.params.logprobs, in.params.logprobs);
  EXPECT_EQ(out.params.top_logprobs, in.params.top_logprobs);
  ASSERT_NE(out.grammar, nullptr);
  EXPECT_EQ(out.grammar->serialize(), in.grammar->serialize());
  EXPECT_EQ(out.grammar->root(), in.grammar->root());
  EXPECT_EQ(out.grammar->num_rules(), in.grammar->num_rules());
  EXPECT_TRUE(out.affinity.empty());
  // The same grammar twice is one compiled object on the follower (its mask cache stays warm).
  EXPECT_EQ(decode_generate_request(m).grammar, out.grammar);

  GenerationRequest plain;
  plain.prompt_ids = {4};
  const GenerationRequest back = decode_generate_request(encode_generate_request(1, plain));
  EXPECT_EQ(back.grammar, nullptr);
  EXPECT_FALSE(back.params.seed.has_value());
}

TEST(ServeLink, CorruptRequestsAndGrammarsAreRefused) {
  RankMessage m = encode_generate_request(1, full_request());
  for (size_t cut : {size_t{0}, size_t{3}, m.payload.size() / 2, m.payload.size() - 1}) {
    RankMessage t = m;
    t.payload.resize(cut);
    EXPECT_THROW(decode_generate_request(t), SwarmError) << cut;
  }
  RankMessage longer = m;
  longer.payload += 'x';
  EXPECT_THROW(decode_generate_request(longer), SwarmError);
  // A grammar referring to a rule that does not exist, or claiming more than it holds.
  const std::string good = letters_grammar()->serialize();
  std::string bad = good;
  bad[4] = 99;  // the root
  EXPECT_THROW(grammar::Grammar::deserialize(bad), std::invalid_argument);
  std::string huge = good;
  huge[0] = huge[1] = huge[2] = huge[3] = '\x7f';
  EXPECT_THROW(grammar::Grammar::deserialize(huge), std::invalid_argument);
  EXPECT_THROW(grammar::Grammar::deserialize(good.substr(0, good.size() - 2)), std::invalid_argument);
}

TEST(ServeLink, ResultsCrossBitForBit) {
  const GenerationResult in = full_result();
  nlohmann::json header{{"id", 3}};
  const std::string payload = encode_generation_result(in, header);
  EXPECT_EQ(header["kind"], "done");
  expect_same_generation(decode_generation_result(header, payload), in);
  EXPECT_THROW(decode_generation_result(header, payload.substr(0, payload.size() - 1)), SwarmError);
}

TEST(ServeLink, TheFollowersObserverCallsReachRankZeroInOrder) {
  Pair p;
  FakeEngine engine;
  ServeLinkLeader leader(p.leader_fd, 1);
  ServeLinkFollower follower(p.follower_fd, 1, engine.submit(), engine.version());
  leader.set_policy_version(12);
  auto seen = std::make_shared<Seen>();
  leader.submit(full_request(), seen);
  ASSERT_TRUE(engine.wait_for(1));
  {
    std::lock_guard lk(engine.mu);
    EXPECT_EQ(engine.versions, std::vector<int64_t>{12});  // before the request that follows it
    EXPECT_EQ(engine.got[0].first.prompt_ids, full_request().prompt_ids);
  }
  auto remote = engine.got[0].second;
  remote->on_text(0, "ab");
  remote->on_text(1, std::string("\xe2\x82", 2));
  remote->on_text(0, "c");
  remote->on_complete(full_result());
  ASSERT_TRUE(seen->wait());
  EXPECT_EQ(seen->deltas, (std::vector<std::pair<int64_t, std::string>>{
                              {0, "ab"}, {1, std::string("\xe2\x82", 2)}, {0, "c"}}));
  ASSERT_TRUE(seen->result.has_value());
  expect_same_generation(*seen->result, full_result());
  EXPECT_EQ(follower.requests(), 1);

  // An error the follower's engine reports arrives as that error.
  auto second = std::make_shared<Seen>();
  leader.submit(full_request(), second);
  ASSERT_TRUE(engine.wait_for(2));
  engine.got[1].second->on_error(ErrorKind::INVALID_ARGUMENT, "prompt longer than the context");
  ASSERT_TRUE(second->wait());
  EXPECT_EQ(second->error_kind, ErrorKind::INVALID_ARGUMENT);
  EXPECT_EQ(second->error, "prompt longer than the context");
  EXPECT_EQ(leader.broken(), "");
}

TEST(ServeLink, ACancelledRequestIsCancelledOnTheFollower) {
  Pair p;
  FakeEngine engine;
  ServeLinkLeader leader(p.leader_fd, 1);
  ServeLinkFollower follower(p.follower_fd, 1, engine.submit(), engine.version());
  auto seen = std::make_shared<Seen>();
  leader.submit(full_request(), seen);
  ASSERT_TRUE(engine.wait_for(1));
  auto remote = engine.got[0].second;
  EXPECT_FALSE(remote->cancelled());
  seen->cancel = true;  // the client went away
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!remote->cancelled() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(remote->cancelled());
  // The engine drops it and says so; rank 0's observer hears it as from its own engine.
  remote->on_error(ErrorKind::CONFLICT, "generation cancelled");
  ASSERT_TRUE(seen->wait());
  EXPECT_EQ(seen->error_kind, ErrorKind::CONFLICT);
}

TEST(ServeLink, AFollowerThatDiesFailsWhatItServesNamingItsRank) {
  Pair p;
  FakeEngine engine;
  std::atomic<int> broken_calls{0};
  ServeLinkLeader leader(p.leader_fd, 3, [&](const std::string&) { ++broken_calls; });
  auto follower = std::make_unique<ServeLinkFollower>(p.follower_fd, 3, engine.submit(), engine.version());
  auto seen = std::make_shared<Seen>();
  leader.submit(full_request(), seen);
  ASSERT_TRUE(engine.wait_for(1));
  follower.reset();  // the rank's process is gone: its end of the connection closes
  ASSERT_TRUE(seen->wait());
  EXPECT_EQ(seen->error_kind, ErrorKind::UNAVAILABLE);
  EXPECT_NE(seen->error.find("rank 3"), std::string::npos) << seen->error;
  EXPECT_NE(leader.broken(), "");
  EXPECT_EQ(broken_calls.load(), 1);
  // Later requests fail at once, naming the rank; the late answer of the dead rank's engine
  // goes nowhere.
  auto later = std::make_shared<Seen>();
  leader.submit(full_request(), later);
  ASSERT_TRUE(later->wait(1s));
  EXPECT_EQ(later->error_kind, ErrorKind::UNAVAILABLE);
  EXPECT_NE(later->error.find("rank 3"), std::string::npos);
  engine.got[0].second->on_complete(full_result());
  EXPECT_TRUE(engine.got[0].second->cancelled());
  EXPECT_EQ(seen->ends, 1);
}

TEST(ServeLink, GarbageFromAFollowerBreaksItsLinkNotTheProcess) {
  Pair p;
  ServeLinkLeader leader(p.leader_fd, 2);
  auto seen = std::make_shared<Seen>();
  leader.submit(full_request(), seen);
  std::optional<RankMessage> request = read_rank_frame(p.follower_fd);
  ASSERT_TRUE(request.has_value());
  const uint64_t id = request->header["id"];
  // A result that claims more than it holds.
  write_rank_frame(p.follower_fd, RankMessage{nlohmann::json{{"kind", "done"}, {"id", id}}, "\x01\x02"});
  ASSERT_TRUE(seen->wait());
  EXPECT_EQ(seen->error_kind, ErrorKind::UNAVAILABLE);
  EXPECT_NE(seen->error.find("rank 2"), std::string::npos) << seen->error;
  EXPECT_NE(seen->error.find("truncated"), std::string::npos) << seen->error;
  ::close(p.follower_fd);
}

TEST(ServeLink, AFollowerAnswersABadRequestWithAnErrorAndServesOn) {
  Pair p;
  FakeEngine engine;
  ServeLinkFollower follower(p.follower_fd, 1, engine.submit(), engine.version());
  RankMessage bad = encode_generate_request(5, full_request());
  bad.payload.resize(6);
  write_rank_frame(p.leader_fd, bad);
  std::optional<RankMessage> answer = read_rank_frame(p.leader_fd);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->header["kind"], "error");
  EXPECT_EQ(answer->header["id"], 5);
  EXPECT_EQ(answer->header["error_kind"], static_cast<int>(ErrorKind::INVALID_ARGUMENT));
  write_rank_frame(p.leader_fd, encode_generate_request(6, full_request()));
  ASSERT_TRUE(engine.wait_for(1));  // the good one reached the engine, the bad one did not
  EXPECT_EQ(follower.requests(), 2);
  std::lock_guard lk(engine.mu);
  EXPECT_EQ(engine.got.size(), 1u);
  ::close(p.leader_fd);
}

}  // namespace
}  // namespace swarm
