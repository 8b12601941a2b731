// Swarm experience sharing over NATS JetStream (SAPO, docs/sapo.md). One Exchange per run: a
// background thread connects (and reconnects) to the broker, makes sure the swarm's stream
// exists, publishes this node's groups from a bounded outbox and pulls the other nodes' groups
// into a bounded buffer, validating each and counting what it drops. Training never waits on
// it: with the broker away, draw() returns what the buffer holds (or nothing) and the outbox
// keeps the newest groups until the broker is back. No torch; nats.h stays in the .cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "exchange/sapo_message.hpp"

namespace swarm {

struct ExchangeConfig {
  std::string url;               // nats://host:port, tls://..., user:password@ allowed
  std::string credentials_file;  // .creds (user JWT + nkey seed); "" = none
  std::string swarm_name = "default";
  std::string node_id;
  bool publish = true;
  bool consume = true;
  double max_age_seconds = 600.0;
  int64_t buffer_groups = 256;
  std::vector<std::string> trusted_nodes;  // empty = every node
  int64_t max_message_bytes = 1 << 20;
  // The stream, when this node creates it: total bytes, and messages kept per node (each node
  // publishes on its own subject, so one node cannot push the others' groups out).
  int64_t stream_max_bytes = int64_t{1} << 30;
  int64_t max_msgs_per_node = 10000;
  int64_t outbox_groups = 64;       // groups waiting for the broker (the oldest is dropped)
  int64_t max_peers_tracked = 256;  // per-peer counters kept; the rest are summed under "(other)"
  std::function<double()> now;      // unix seconds; default: the system clock
};

/// What one peer sent this node.
struct ExchangePeer {
  int64_t received = 0;  // messages, kept or not
  int64_t accepted = 0;  // put in the buffer
  int64_t used = 0;      // trained on
  int64_t dropped = 0;
  int64_t last_policy_step = -1;
  double last_seen = 0.0;  // unix seconds
  std::string model;
};

struct ExchangeStatus {
  std::string url;  // without credentials
  std::string node_id;
  std::string swarm_name;
  std::string stream;
  bool connected = false;  // to the broker
  bool ready = false;      // connected, stream there, consumer made
  std::string last_error;  // the latest failure ("" when none since the last success)
  int64_t published = 0;
  int64_t publish_duplicates = 0;  // the broker had the message id already (a republish)
  int64_t publish_errors = 0;
  int64_t publish_too_large = 0;
  int64_t publish_skipped_zero_advantage = 0;  // every reward equal: not worth sending
  int64_t outbox = 0;                          // waiting for the broker
  int64_t outbox_dropped = 0;                  // pushed out of a full outbox
  int64_t received = 0;                        // messages from the stream, own ones included
  int64_t accepted = 0;
  int64_t buffered = 0;
  int64_t used = 0;
  int64_t reconnects = 0;
  std::map<std::string, int64_t> dropped;  // sapo_drop_name → count
  std::map<std::string, ExchangePeer> peers;
};

class Exchange {
 public:
  /// Returns at once; the broker is reached in the background (and again after each loss).
  explicit Exchange(ExchangeConfig config);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  /// Queues a group for publishing (bounded outbox), stamped with this Exchange's run. Its
  /// message id makes a republish harmless.
  void publish(const SapoGroup& group);
  /// Up to `count` groups drawn uniformly from the buffer, removed from it; stale ones are
  /// dropped on the way.
  std::vector<SapoGroup> draw(size_t count, std::mt19937_64& rng);
  /// A drawn group this node could not use (counted against its sender).
  void note_unusable(const SapoGroup& group, SapoDrop reason);
  /// Handles one message as if pulled from the stream (what the consumer calls; tests use it
  /// directly). `msg_id` is its Nats-Msg-Id ("" if none): it must be sapo_message_id() of the
  /// message's own fields.
  void receive(const std::string& subject, std::string_view payload, const std::string& msg_id);

  ExchangeStatus status() const;
  /// Tests: wait until the buffer holds `n` groups (false on timeout).
  bool wait_buffered(size_t n, double timeout_seconds) const;

  const ExchangeConfig& config() const { return config_; }
  std::string subject() const;      // this node's publishing subject
  std::string stream_name() const;  // SWARM_<swarm_name>
  /// The Nats-Msg-Id this node publishes the group under: sapo_message_id() with run_id() as
  /// the run (a node restarted from step 0 does not repeat its ids).
  std::string message_id(const SapoGroup& group) const;
  /// This Exchange's run: 8 random hex digits drawn when it was made.
  const std::string& run_id() const { return run_id_; }

 private:
  struct Impl;
  ExchangeConfig config_;
  std::string run_id_;
  std::unique_ptr<Impl> impl_;
};

/// The URL with any user:password@ part removed (for logs and status).
std::string redact_url(const std::string& url);

}  // namespace swarm
