// The control channel of a multi-rank training job: rank 0 (which serves HTTP and owns the
// rollout pool) tells the follower ranks what to do — boot, train on this batch, save, release —
// and collects their answers. Plain TCP with length-prefixed frames; no torch. The tensors
// themselves travel over c10d (src/dist/collectives_torch.hpp), not here.
//
// A message is a JSON header (its "kind" says what it is) plus an opaque binary payload (a
// serialized TrainBatch for "train"). A follower answers every message with a reply whose
// "ok" is true, or false with an "error" text that rank 0 raises, naming the rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rollout_pool/types.hpp"

namespace swarm {

struct RankMessage {
  nlohmann::json header;  // {"kind": ..., ...}
  std::string payload;    // binary, may be empty
};

/// Rank 0's end: one connection per follower rank. Not thread-safe (the engine's control
/// thread drives it). Every failure — a follower that died (EOF, reset), a timeout, an error
/// reply — throws SwarmError(UNAVAILABLE) naming the rank; after a transport failure the
/// leader is broken and every later call throws too (the job must be restarted).
class RankLeader {
 public:
  /// Listens on host:port and accepts `world_size - 1` followers, each of which introduces
  /// itself with its rank and proves it knows `secret` (the job's rendezvous secret; the other
  /// side checks that rank 0 knows it too). A connection that fails that — a stranger, another
  /// job's rank, a rank that joined already — is refused, logged, and the wait goes on. Throws
  /// UNAVAILABLE when not all joined within `timeout`.
  static std::unique_ptr<RankLeader> accept(const std::string& host, int port, int world_size,
                                            std::chrono::milliseconds timeout, const std::string& secret);
  ~RankLeader();
  RankLeader(const RankLeader&) = delete;
  RankLeader& operator=(const RankLeader&) = delete;

  int world_size() const noexcept { return static_cast<int>(fds_.size()) + 1; }
  /// Sends `message` to every follower.
  void send_all(const RankMessage& message);
  /// Waits for one reply from every follower (in rank order) and returns them; throws
  /// UNAVAILABLE for the first follower that answered with an error or did not answer
  /// within `timeout` — after reading every reply, so the channel stays in step.
  std::vector<nlohmann::json> collect(std::chrono::milliseconds timeout);
  /// send_all + collect.
  std::vector<nlohmann::json> request(const RankMessage& message, std::chrono::milliseconds timeout);
  /// Closes every connection: the followers see the end of the job and exit. Later calls throw.
  void close();
  /// Why the leader is unusable ("" while it works).
  const std::string& broken() const noexcept { return broken_; }
  /// Hands over the joined connections (index r - 1 is rank r), for a channel other than
  /// this one's request/reply (the serving link, dist/serve_link.hpp); the leader is closed.
  std::vector<int> take_connections();

 private:
  RankLeader() = default;
  [[noreturn]] void fail(const std::string& why);
  std::vector<int> fds_;  // fds_[r - 1] is rank r
  std::string broken_;
};

/// A follower's end. Not thread-safe.
class RankFollower {
 public:
  /// Connects to rank 0 at host:port (retrying while it is not listening yet) and joins as
  /// `rank`, both sides proving they know `secret`. Throws UNAVAILABLE when that does not
  /// succeed within `timeout`, or at once, saying why, when rank 0 refuses or is not rank 0 of
  /// this job.
  static std::unique_ptr<RankFollower> connect(const std::string& host, int port, int rank,
                                               std::chrono::milliseconds timeout, const std::string& secret);
  ~RankFollower();
  RankFollower(const RankFollower&) = delete;
  RankFollower& operator=(const RankFollower&) = delete;

  /// Blocks for rank 0's next message; nullopt when rank 0 closed the channel (it is done).
  /// Throws UNAVAILABLE on a broken connection or a malformed frame.
  std::optional<RankMessage> receive();
  /// Answers the message just received.
  void reply_ok(nlohmann::json extra = nlohmann::json::object());
  void reply_error(const std::string& error);
  /// Hands over the joined connection (see RankLeader::take_connections).
  int take_connection();

 private:
  RankFollower() = default;
  void join(const std::string& where, const std::string& secret);
  int fd_ = -1;
  int rank_ = 0;
};

/// One frame of the rank channels on a connected socket: used by the serving link
/// (dist/serve_link.hpp), which runs over connections joined as above. Writes are not
/// synchronised (one writer at a time). Reading returns nullopt on a clean end of the
/// connection; both throw UNAVAILABLE on a broken connection or a malformed frame.
void write_rank_frame(int fd, const RankMessage& message);
std::optional<RankMessage> read_rank_frame(int fd);

/// Exact binary encoding of a TrainBatch: its episodes in the episode store's encoding
/// (store/episode_codec.hpp), so every field of every episode arrives bit for bit.
std::string serialize_train_batch(const TrainBatch& batch);
/// Inverse of serialize_train_batch; throws INVALID_ARGUMENT on a truncated or corrupt buffer.
TrainBatch deserialize_train_batch(const std::string& bytes);

/// The leader's side of the join handshake on an accepted connection (the rendezvous store's
/// connections use it; RankLeader::accept does the same and also refuses a rank twice): the
/// rank the peer proved, after telling it it joined; -1 with `why` set when it did not prove
/// the secret (nothing was sent then but the challenge). Throws nothing.
int accept_rank_handshake(int fd, const std::string& secret, int world_size, std::string& why);

/// The namespace of a job's keys in c10d's TCPStore for the boot whose store listens on
/// `store_port`: HMAC-SHA256(secret, "store|<port>") in hex. The store accepts any connection
/// (it has no authentication), but a process without the secret cannot name the job's keys —
/// it can neither read the addresses and ids the collectives exchange nor overwrite them.
std::string store_namespace(const std::string& secret, int store_port);

/// A TCP port on `host` that was free a moment ago (bind to port 0, read it, close).
int pick_free_port(const std::string& host = "127.0.0.1");

}  // namespace swarm
