// Serving on every rank of a multi-rank job (docs/design.md §6): rank 0 keeps the one HTTP
// endpoint and hands generation requests to the other ranks' serving engines over one
// connection per follower, the serving link.
//
// Why a connection of its own and not the control channel: the control channel is strictly
// request/reply and owned by the engine's control thread (a policy step holds it for its whole
// length), while generations are many, concurrent, streamed and must flow during a step
// (asynchronous training). The link is opened at every boot like the control channel (the
// followers connect to a port rank 0 names in the boot message, proving the rendezvous secret:
// dist/rank_channel.hpp), so it crosses machines exactly where the control channel does and
// needs no port of its own on the followers.
//
// Frames (a JSON header, a binary payload: rank_channel's framing), rank 0 -> follower:
//   generate {id, params, grammar?}  payload: prompt ids (+ the serialized grammar)
//   cancel   {id}                    the client went away: the follower's engine drops it
//   version  {version}               the policy version stamped from now on (a resumed run)
// follower -> rank 0:
//   text     {id, choice, delta}     streamed text, in order
//   done     {id, policy_version, choices: [{text, finish_reason}]}  payload: ids, log-probs,
//                                    versions and alternatives of every choice, bit for bit
//   error    {id, error_kind, message}
// A request is answered exactly as rank 0's own engine answers it: the same observer calls
// with the same values. Torch-free; the serving engine is behind a function.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dist/rank_channel.hpp"
#include "inference/generation.hpp"

namespace swarm {

/// Exact wire forms (also what the tests check): a request with its grammar, a result.
RankMessage encode_generate_request(uint64_t id, const GenerationRequest& request);
/// Throws INVALID_ARGUMENT on a malformed message. The grammar is rebuilt from its bytes.
GenerationRequest decode_generate_request(const RankMessage& message);
std::string encode_generation_result(const GenerationResult& result, nlohmann::json& header);
GenerationResult decode_generation_result(const nlohmann::json& header, const std::string& payload);

/// Rank 0's end of the link to one follower rank. Thread-safe. A reader thread delivers the
/// follower's frames to the requests' observers and forwards cancellations (polled from the
/// observers every few milliseconds). When the link breaks — the follower died, a malformed
/// frame — every request in flight gets UNAVAILABLE naming the rank, later submissions too,
/// and `on_broken` (if set) is called once with the reason.
class ServeLinkLeader {
 public:
  ServeLinkLeader(int fd, int rank, std::function<void(const std::string&)> on_broken = {});
  /// Closes the link: what is still in flight fails with UNAVAILABLE.
  ~ServeLinkLeader();
  ServeLinkLeader(const ServeLinkLeader&) = delete;
  ServeLinkLeader& operator=(const ServeLinkLeader&) = delete;

  void submit(const GenerationRequest& request, const std::shared_ptr<GenerationObserver>& observer);
  void set_policy_version(int64_t version);
  /// Why the link is down ("" while it works).
  std::string broken() const;
  int rank() const noexcept { return rank_; }
  /// Closes the connection and fails what is in flight with `reason`. Idempotent.
  void close(const std::string& reason);

 private:
  struct Pending {
    std::shared_ptr<GenerationObserver> observer;
    bool cancel_sent = false;
  };
  void read_loop();
  void send(const RankMessage& message);
  void fail_all(const std::string& why);
  std::shared_ptr<GenerationObserver> take(uint64_t id);
  std::shared_ptr<GenerationObserver> find(uint64_t id);

  const int rank_;
  int fd_;
  std::function<void(const std::string&)> on_broken_;
  mutable std::mutex mu_;  // pending_, next_id_, broken_
  std::mutex write_mu_;    // one frame at a time on the socket
  std::map<uint64_t, Pending> pending_;
  uint64_t next_id_ = 1;
  std::string broken_;
  std::atomic<bool> stopping_{false};
  std::thread reader_;
};

/// A follower's end: runs rank 0's requests through `submit` (its serving engine) and sends
/// back what their observers see. Thread-safe. Ends when rank 0 closes the link (or it breaks:
/// the requests in flight are then cancelled through their observers).
class ServeLinkFollower {
 public:
  using Submit = std::function<void(GenerationRequest, std::shared_ptr<GenerationObserver>)>;
  ServeLinkFollower(int fd, int rank, Submit submit, std::function<void(int64_t)> set_policy_version);
  ~ServeLinkFollower();
  ServeLinkFollower(const ServeLinkFollower&) = delete;
  ServeLinkFollower& operator=(const ServeLinkFollower&) = delete;

  /// Requests received so far (for the log).
  int64_t requests() const noexcept { return requests_.load(); }

 private:
  class Remote;
  void read_loop();
  void send(const RankMessage& message);  // after a failed write the link is down: later sends do nothing

  const int rank_;
  int fd_;
  Submit submit_;
  std::function<void(int64_t)> set_policy_version_;
  std::mutex write_mu_;
  bool write_failed_ = false;
  std::mutex mu_;  // live_
  std::map<uint64_t, std::weak_ptr<Remote>> live_;
  std::atomic<int64_t> requests_{0};
  std::atomic<bool> stopping_{false};
  std::thread reader_;
  friend class Remote;
};

}  // namespace swarm
