// The swarm group message: what is published round-trips, and every kind of bad message is
// refused with its reason (never an exception).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "exchange/exchange.hpp"
#include "exchange/sapo_message.hpp"

using namespace swarm;
using OJson = nlohmann::ordered_json;

namespace {

SapoGroup sample_group(const std::string& node = "node-a", std::vector<double> rewards = {1.0, 0.0}) {
  SapoGroup g;
  g.node_id = node;
  g.run = "0badc0de";
  g.model = "tiny";
  g.policy_step = 3;
  g.created = 1.7e9;
  g.task_id = "task-7";
  g.task_metadata = {{"answer", "4"}};
  for (double r : rewards) {
    SapoEpisode e;
    e.reward = r;
    e.calls.push_back({{"messages", OJson::array({{{"role", "user"}, {"content", "2+2? é"}}})},
                       {"completion", {{"role", "assistant"}, {"content", "4"}}},
                       {"text", "4<|im_end|>"},
                       {"finish_reason", "stop"}});
    e.metadata = {{"source", "test"}};
    g.episodes.push_back(std::move(e));
  }
  return g;
}

SapoDrop drop_of(const std::string& payload, int64_t max_bytes = 1 << 20) {
  SapoLimits limits;
  limits.max_bytes = max_bytes;
  const SapoParse p = parse_sapo_group(payload, limits);
  EXPECT_FALSE(p.group.has_value()) << payload.substr(0, 200);
  EXPECT_FALSE(p.reason.empty());
  return p.drop;
}

// Receives `g` as the consumer would: on its node's subject, under its own message id.
void deliver(Exchange& x, const SapoGroup& g) {
  x.receive("swarm." + x.config().swarm_name + ".groups." + g.node_id, encode_sapo_group(g),
            sapo_message_id(g));
}

int64_t dropped(const ExchangeStatus& st, const char* reason) {
  return st.dropped.count(reason) ? st.dropped.at(reason) : 0;
}

// The sample message with one field replaced (or removed when `value` is discarded).
std::string with(const std::string& pointer, const OJson& value) {
  OJson j = OJson::parse(encode_sapo_group(sample_group()));
  if (value.is_discarded()) {
    const auto slash = pointer.rfind('/');
    j[OJson::json_pointer(pointer.substr(0, slash))].erase(pointer.substr(slash + 1));
  } else {
    j[OJson::json_pointer(pointer)] = value;
  }
  return j.dump();
}

TEST(SapoMessage, RoundTripsEveryField) {
  const SapoGroup g = sample_group();
  const SapoParse p = parse_sapo_group(encode_sapo_group(g), SapoLimits{});
  ASSERT_TRUE(p.group.has_value()) << p.reason;
  EXPECT_EQ(p.group->node_id, "node-a");
  EXPECT_EQ(p.group->run, "0badc0de");
  EXPECT_EQ(p.group->model, "tiny");
  EXPECT_EQ(p.group->policy_step, 3);
  EXPECT_DOUBLE_EQ(p.group->created, 1.7e9);
  EXPECT_EQ(p.group->task_id, "task-7");
  EXPECT_EQ(p.group->task_metadata["answer"], "4");
  ASSERT_EQ(p.group->episodes.size(), 2u);
  EXPECT_EQ(p.group->episodes[0].reward, 1.0);
  EXPECT_EQ(p.group->episodes[1].reward, 0.0);
  EXPECT_EQ(p.group->episodes[0].calls, g.episodes[0].calls);
  EXPECT_EQ(p.group->episodes[0].metadata["source"], "test");
  EXPECT_FALSE(sapo_zero_advantage(*p.group));
  EXPECT_TRUE(sapo_zero_advantage(sample_group("n", {0.5, 0.5, 0.5})));
}

TEST(SapoMessage, MalformedAndInvalidUtf8AreRefused) {
  EXPECT_EQ(drop_of("not json"), SapoDrop::MALFORMED);
  EXPECT_EQ(drop_of("[1,2]"), SapoDrop::MALFORMED);
  EXPECT_EQ(drop_of(""), SapoDrop::MALFORMED);
  std::string bad = encode_sapo_group(sample_group());
  bad.replace(bad.find("\xc3\xa9"), 2, "\xc3\x28");  // an invalid UTF-8 sequence inside a string
  EXPECT_EQ(drop_of(bad), SapoDrop::MALFORMED);
}

TEST(SapoMessage, OversizedIsRefusedBeforeParsing) {
  const std::string ok = encode_sapo_group(sample_group());
  EXPECT_EQ(drop_of(ok, static_cast<int64_t>(ok.size()) - 1), SapoDrop::TOO_LARGE);
  SapoLimits exact;
  exact.max_bytes = static_cast<int64_t>(ok.size());
  EXPECT_TRUE(parse_sapo_group(ok, exact).group.has_value());
}

// Nesting past kSapoMaxNesting is dropped as malformed before it is parsed: one peer's deep
// message must not crash every consuming node (the dump and copy of a parsed value recurse per
// level), nor again on each replay after a restart.
TEST(SapoMessage, DeepNestingIsDroppedBeforeParsing) {
  OJson j = OJson::parse(encode_sapo_group(sample_group()));
  const std::string text = j.dump();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string bad = text;
  bad.replace(bad.find(R"({"answer":"4"})"), 14, R"({"answer":)" + deep + "}");
  SapoLimits limits;
  const SapoParse p = parse_sapo_group(bad, limits);
  EXPECT_FALSE(p.group.has_value());
  EXPECT_EQ(p.drop, SapoDrop::MALFORMED);
  EXPECT_EQ(p.reason, "nested deeper than 144 levels");
  // The same message with the metadata at the depth a request body may have is kept: task
  // metadata sits at depth 2 of the message, so 140 more levels are 142.
  std::string ok = text;
  ok.replace(ok.find(R"({"answer":"4"})"), 14,
             R"({"answer":)" + std::string(140, '[') + std::string(140, ']') + "}");
  EXPECT_TRUE(parse_sapo_group(ok, limits).group.has_value()) << parse_sapo_group(ok, limits).reason;
}

TEST(SapoMessage, SchemaViolationsAreRefused) {
  const OJson discard = OJson::value_t::discarded;
  EXPECT_EQ(drop_of(with("/schema", 2)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/schema", "1")), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/node_id", "a.b")), SapoDrop::SCHEMA);  // would break subjects
  EXPECT_EQ(drop_of(with("/node_id", 5)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/run", discard)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/run", "a:b")), SapoDrop::SCHEMA);  // would make the message id ambiguous
  EXPECT_EQ(drop_of(with("/task_id", discard)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/policy_step", -1)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes", OJson::array())), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/reward", "high")), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/calls", OJson::array())), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/calls/0/text", discard)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/calls/0/messages/0/role", "root")), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/calls/0/messages/0/content", 12)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/calls/0/completion/role", "user")), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/calls/0/completion", discard)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/calls/0/completion/tool_calls", OJson::array({{{"function", 3}}}))),
            SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/calls/0/tools", "all")), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/episodes/0/metadata", 1)), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/task_metadata", "x")), SapoDrop::SCHEMA);
  EXPECT_EQ(drop_of(with("/created", "yesterday")), SapoDrop::SCHEMA);
  for (const OJson& t : {OJson(0), OJson(-0.5), OJson(1e-9), OJson(2.5), OJson("0.7")})
    EXPECT_EQ(drop_of(with("/episodes/0/calls/0/temperature", t)), SapoDrop::SCHEMA) << t;
  const SapoParse ok = parse_sapo_group(with("/episodes/0/calls/0/temperature", 0.7), SapoLimits{});
  ASSERT_TRUE(ok.group.has_value()) << ok.reason;
  EXPECT_EQ(ok.group->episodes.at(0).calls.at(0).at("temperature"), 0.7);
}

TEST(SapoMessage, NonFiniteOrAbsurdRewardsAreRefused) {
  std::string inf = with("/episodes/0/reward", 0.25);
  inf.replace(inf.find("0.25"), 4, "1e999");  // JSON has no NaN/Infinity; an overflow is a parse error
  EXPECT_EQ(drop_of(inf), SapoDrop::MALFORMED);
  std::string nan = with("/episodes/0/reward", 0.25);
  nan.replace(nan.find("0.25"), 4, "NaN");
  EXPECT_EQ(drop_of(nan), SapoDrop::MALFORMED);
  EXPECT_EQ(drop_of(with("/episodes/1/reward", 1e12)), SapoDrop::NON_FINITE);
}

TEST(SapoMessage, ExchangeReceiveCountsEachReasonAndBuffersTheRest) {
  ExchangeConfig c;  // no URL: nothing connects; receive() is what the consumer calls
  c.node_id = "me";
  c.swarm_name = "t";
  c.buffer_groups = 2;
  c.max_message_bytes = 4096;
  c.trusted_nodes = {"node-a", "node-b", "node-c", "node-d"};
  c.now = [] { return 1.7e9 + 10; };
  Exchange x(c);
  const std::string prefix = "swarm.t.groups.";
  x.receive(prefix + "me", encode_sapo_group(sample_group("me")), "m1");              // own
  x.receive(prefix + "stranger", encode_sapo_group(sample_group("stranger")), "s1");  // untrusted
  x.receive(prefix + "node-a", encode_sapo_group(sample_group("node-b")), "a0");      // spoofed
  x.receive(prefix + "node-a", "{oops", "a1");                                        // malformed
  x.receive(prefix + "node-a", std::string(5000, ' '), "a2");                         // too large
  deliver(x, sample_group("node-a", {1, 1}));                                         // zero advantage
  SapoGroup old = sample_group("node-a");
  old.created = 1.7e9 - 1000;
  deliver(x, old);  // stale (600 s window)
  deliver(x, sample_group("node-a"));
  deliver(x, sample_group("node-a"));  // duplicate
  deliver(x, sample_group("node-c"));
  deliver(x, sample_group("node-d"));  // evicts node-a's group (all hold 1: the oldest)
  const ExchangeStatus st = x.status();
  EXPECT_EQ(st.received, 11);
  EXPECT_EQ(st.accepted, 3);
  EXPECT_EQ(st.buffered, 2);
  for (const char* reason : {"own", "untrusted", "spoofed", "malformed", "too_large", "zero_advantage",
                             "stale", "duplicate", "evicted"})
    EXPECT_EQ(st.dropped.count(reason) ? st.dropped.at(reason) : 0, 1) << reason;
  EXPECT_EQ(st.peers.at("node-a").received, 7);
  EXPECT_EQ(st.peers.at("node-a").accepted, 1);
  EXPECT_EQ(st.peers.count("me"), 0u);
  std::mt19937_64 rng(1);
  auto drawn = x.draw(5, rng);
  ASSERT_EQ(drawn.size(), 2u);  // all there is
  EXPECT_NE(drawn[0].node_id, drawn[1].node_id);
  EXPECT_EQ(x.status().buffered, 0);
  EXPECT_EQ(x.status().used, 2);
  EXPECT_EQ(x.status().peers.at("node-c").used + x.status().peers.at("node-d").used, 2);
}

TEST(SapoMessage, AFloodingPeerEvictsItsOwnGroupsNotTheOthers) {
  ExchangeConfig c;
  c.node_id = "me";
  c.swarm_name = "t";
  c.buffer_groups = 4;
  c.now = [] { return 1.7e9; };
  Exchange x(c);
  deliver(x, sample_group("quiet"));
  for (int k = 0; k < 50; ++k) {
    SapoGroup g = sample_group("loud");
    g.task_id = "task-" + std::to_string(k);
    deliver(x, g);
  }
  std::mt19937_64 rng(1);
  int quiet = 0;
  for (const SapoGroup& g : x.draw(4, rng)) quiet += g.node_id == "quiet";
  EXPECT_EQ(quiet, 1);
  EXPECT_EQ(x.status().peers.at("loud").dropped, 47);
  EXPECT_EQ(x.status().peers.at("quiet").dropped, 0);
}

TEST(SapoMessage, DrawIsUniformOverTheBuffer) {
  ExchangeConfig c;
  c.node_id = "me";
  c.swarm_name = "t";
  c.buffer_groups = 8;
  c.now = [] { return 1.7e9; };
  std::map<std::string, int> picked;
  std::mt19937_64 rng(7);
  for (int round = 0; round < 800; ++round) {
    Exchange x(c);
    for (int k = 0; k < 4; ++k) deliver(x, sample_group("node-" + std::to_string(k)));
    ++picked[x.draw(1, rng).at(0).node_id];
  }
  // 800 draws of 1 in 4: 200 each expected; 3.5 standard deviations (12.2) either side.
  for (const auto& [node, n] : picked) EXPECT_NEAR(n, 200, 43) << node;
  EXPECT_EQ(picked.size(), 4u);
}

TEST(SapoMessage, RedactsCredentialsInUrls) {
  EXPECT_EQ(redact_url("nats://user:secret@host:4222"), "nats://***@host:4222");
  EXPECT_EQ(redact_url("nats://host:4222"), "nats://host:4222");
}

ExchangeConfig receiver_config() {
  ExchangeConfig c;
  c.node_id = "me";
  c.swarm_name = "t";
  c.buffer_groups = 8;
  c.now = [] { return 1.7e9 + 10; };
  return c;
}

// The message id names the group: "<node>:<run>:<step>:<FNV-1a of the task id>", and what a
// node publishes is stamped with its run and sent under that id.
TEST(SapoMessage, TheMessageIdIsDerivedFromTheGroup) {
  const SapoGroup g = sample_group();
  EXPECT_EQ(
      sapo_message_id(g), "node-a:0badc0de:3:" + [] {
        uint64_t h = 1469598103934665603ull;
        for (unsigned char c : std::string("task-7")) h = (h ^ c) * 1099511628211ull;
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
        return std::string(hex);
      }());
  Exchange x(receiver_config());
  EXPECT_EQ(x.run_id().size(), 8u);
  SapoGroup stamped = g;
  stamped.run = x.run_id();
  EXPECT_EQ(x.message_id(g), sapo_message_id(stamped));
}

// A received message's Nats-Msg-Id must be the id its own fields make: one without the header,
// or with any other id, is dropped and counted (against its sender), and nothing is kept.
TEST(SapoMessage, AMessageWithoutItsOwnIdIsDroppedAndCounted) {
  Exchange x(receiver_config());
  const SapoGroup g = sample_group("node-a");
  const std::string subject = "swarm.t.groups.node-a", payload = encode_sapo_group(g);
  x.receive(subject, payload, "");
  EXPECT_EQ(dropped(x.status(), "no_id"), 1);
  EXPECT_EQ(x.status().buffered, 0);
  // Each part of the id differs in turn: node, run, step, task.
  for (auto change : std::vector<void (*)(SapoGroup&)>{
           [](SapoGroup& o) { o.node_id = "node-b"; }, [](SapoGroup& o) { o.run = "ffffffff"; },
           [](SapoGroup& o) { o.policy_step = 4; }, [](SapoGroup& o) { o.task_id = "task-8"; }}) {
    SapoGroup other = g;
    change(other);
    x.receive(subject, payload, sapo_message_id(other));
  }
  x.receive(subject, payload, "a5");
  ExchangeStatus st = x.status();
  EXPECT_EQ(dropped(st, "id_mismatch"), 5);
  EXPECT_EQ(st.accepted, 0);
  EXPECT_EQ(st.buffered, 0);
  EXPECT_EQ(st.peers.at("node-a").dropped, 6);
  x.receive(subject, payload, sapo_message_id(g));  // its own id: kept
  st = x.status();
  EXPECT_EQ(st.accepted, 1);
  EXPECT_EQ(st.buffered, 1);
}

// De-duplication is on the group (node, run, step, task), not on the header's text: the same
// group sent again under another id, or none, is a duplicate. A new run of the same node is a
// new group. The memory of what was accepted stays bounded.
TEST(SapoMessage, TheSameGroupUnderANewIdIsADuplicate) {
  ExchangeConfig c = receiver_config();
  c.buffer_groups = 2;  // remembers max(1024, 4 * 2) ids
  Exchange x(c);
  const SapoGroup g = sample_group("node-a");
  const std::string subject = "swarm.t.groups.node-a", payload = encode_sapo_group(g);
  deliver(x, g);
  SapoGroup other_run = g;
  other_run.run = "ffffffff";
  x.receive(subject, payload, sapo_message_id(other_run));  // the same group under a new id
  x.receive(subject, payload, "node-a:0badc0de:3:0000000000000000");
  x.receive(subject, payload, "");
  deliver(x, g);
  ExchangeStatus st = x.status();
  EXPECT_EQ(dropped(st, "duplicate"), 4);
  EXPECT_EQ(st.accepted, 1);
  deliver(x, other_run);  // the node restarted: a new run, a new group
  EXPECT_EQ(x.status().accepted, 2);
  for (int k = 0; k < 1024; ++k) {
    SapoGroup filler = sample_group("node-c");
    filler.task_id = "filler-" + std::to_string(k);
    deliver(x, filler);
  }
  deliver(x, g);  // forgotten by now: the memory is bounded
  st = x.status();
  EXPECT_EQ(st.accepted, 2 + 1024 + 1);
  EXPECT_EQ(dropped(st, "duplicate"), 4);
}

// `created` more than kSapoMaxClockSkewSeconds ahead of the receiver's clock is dropped as
// `schema`: a sender cannot dodge exchange_max_age_seconds by dating its groups in the future.
// Clocks a little apart are fine.
TEST(SapoMessage, CreatedInTheFutureBeyondTheClockSkewIsDropped) {
  EXPECT_EQ(kSapoMaxClockSkewSeconds, 300.0);
  SapoLimits limits;
  limits.now = 1.7e9 - 3600;  // the sample was created an hour after this
  EXPECT_EQ(parse_sapo_group(encode_sapo_group(sample_group()), limits).drop, SapoDrop::SCHEMA);
  EXPECT_FALSE(parse_sapo_group(encode_sapo_group(sample_group()), limits).group.has_value());
  EXPECT_EQ(parse_sapo_group(encode_sapo_group(sample_group()), limits).reason,
            "created is 3600 s ahead of this node's clock (at most 300 s)");
  limits.now = 1.7e9 - 10;
  EXPECT_TRUE(parse_sapo_group(encode_sapo_group(sample_group()), limits).group.has_value());
  limits.now.reset();  // not checked without a clock
  EXPECT_TRUE(parse_sapo_group(with("/created", 1.7e9 + 1e6), limits).group.has_value());

  double now = 1.7e9 + 10;
  ExchangeConfig c = receiver_config();
  c.now = [&now] { return now; };
  Exchange x(c);
  SapoGroup ahead = sample_group("node-a");
  ahead.created = now + 3600;
  deliver(x, ahead);
  ExchangeStatus st = x.status();
  EXPECT_EQ(dropped(st, "schema"), 1);
  EXPECT_EQ(st.peers.at("node-a").dropped, 1);
  EXPECT_EQ(st.buffered, 0);
  SapoGroup near = sample_group("node-b");
  near.created = now + 10;  // within the skew
  deliver(x, near);
  EXPECT_EQ(x.status().accepted, 1);
  EXPECT_EQ(x.status().buffered, 1);
  // It goes stale by its own date: no later than the limit after a message created now.
  now += 10 + c.max_age_seconds + 1;
  std::mt19937_64 rng(1);
  EXPECT_TRUE(x.draw(1, rng).empty());
  EXPECT_EQ(dropped(x.status(), "stale"), 1);
}

}  // namespace
