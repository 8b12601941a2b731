// Control channel of a multi-rank job (see the header). POSIX sockets: this file is the only
// one that knows about them, and the frames are simple enough not to need an async library.
#include "dist/rank_channel.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/json_nesting.hpp"
#include "store/episode_codec.hpp"

namespace swarm {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t{16} << 20;
constexpr uint64_t kMaxPayloadBytes = uint64_t{16} << 30;

std::string errno_text() { return std::strerror(errno); }

sockaddr_in resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  SWARM_REQUIRE(rc == 0 && res != nullptr, ErrorKind::INVALID_ARGUMENT,
                "cannot resolve the master address '" + host + "': " + gai_strerror(rc));
  sockaddr_in addr{};
  std::memcpy(&addr, res->ai_addr, sizeof(addr));
  freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// Waits until fd is readable; false on timeout. `deadline` nullopt = forever.
bool wait_readable(int fd, std::optional<Clock::time_point> deadline) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int rc = poll(&p, 1, deadline ? remaining_ms(*deadline) : -1);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw SwarmError(ErrorKind::UNAVAILABLE, "poll failed: " + errno_text());
  }
}

// Reads exactly n bytes. Returns false on a clean EOF before the first byte; throws otherwise.
bool read_exact(int fd, char* data, size_t n, std::optional<Clock::time_point> deadline) {
  size_t done = 0;
  while (done < n) {
    if (!wait_readable(fd, deadline))
      throw SwarmError(ErrorKind::UNAVAILABLE, "timed out waiting for an answer");
    const ssize_t got = ::recv(fd, data + done, n - done, 0);
    if (got == 0) {
      if (done == 0) return false;
      throw SwarmError(ErrorKind::UNAVAILABLE, "the connection closed in the middle of a message");
    }
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw SwarmError(ErrorKind::UNAVAILABLE, "read failed: " + errno_text());
    }
    done += static_cast<size_t>(got);
  }
  return true;
}

void write_exact(int fd, const char* data, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t put = ::send(fd, data + done, n - done, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR) continue;
      throw SwarmError(ErrorKind::UNAVAILABLE, "write failed: " + errno_text());
    }
    done += static_cast<size_t>(put);
  }
}

// Frame: u64 header length, u64 payload length (host order: both ends run this code on
// the same kind of machine), header JSON text, payload bytes.
void write_frame(int fd, const RankMessage& m) {
  const std::string header = m.header.dump();
  uint64_t lens[2] = {header.size(), m.payload.size()};
  write_exact(fd, reinterpret_cast<const char*>(lens), sizeof(lens));
  write_exact(fd, header.data(), header.size());
  write_exact(fd, m.payload.data(), m.payload.size());
}

// `max_header` / `max_payload` bound what is read: the handshake reads a stranger's frames
// with small bounds (nothing large is allocated before a peer has proved the secret).
std::optional<RankMessage> read_frame(int fd, std::optional<Clock::time_point> deadline,
                                      uint64_t max_header = kMaxHeaderBytes,
                                      uint64_t max_payload = kMaxPayloadBytes) {
  uint64_t lens[2];
  if (!read_exact(fd, reinterpret_cast<char*>(lens), sizeof(lens), deadline)) return std::nullopt;
  if (lens[0] > max_header || lens[1] > max_payload)
    throw SwarmError(ErrorKind::UNAVAILABLE, "malformed frame (header " + std::to_string(lens[0]) +
                                                 " bytes, payload " + std::to_string(lens[1]) + " bytes)");
  std::string header(lens[0], '\0');
  RankMessage m;
  m.payload.resize(lens[1]);
  if (!read_exact(fd, header.data(), header.size(), deadline) ||
      !read_exact(fd, m.payload.data(), m.payload.size(), deadline))
    throw SwarmError(ErrorKind::UNAVAILABLE, "the connection closed in the middle of a message");
  if (!json_nesting_within(header))  // a hostile or broken peer; nothing recursive touches it
    throw SwarmError(ErrorKind::UNAVAILABLE, "malformed frame header: nested deeper than " +
                                                 std::to_string(kMaxJsonNesting) + " levels");
  try {
    m.header = json::parse(header);
  } catch (const json::exception& e) {
    throw SwarmError(ErrorKind::UNAVAILABLE, std::string("malformed frame header: ") + e.what());
  }
  SWARM_REQUIRE(m.header.is_object(), ErrorKind::UNAVAILABLE, "malformed frame header: not an object");
  return m;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ---- the join handshake: each side proves it knows the rendezvous secret (HMAC-SHA256 over
// both sides' fresh nonces), so neither a stranger nor another job's rank joins, and no rank
// obeys a leader that is not its job's. The secret itself never crosses the wire.
//
//   follower -> leader  {kind: hello, rank, nonce: F}
//   leader -> follower  {kind: challenge, nonce: L, proof: HMAC(secret, "leader|F|L")}
//   follower -> leader  {kind: auth, proof: HMAC(secret, "follower|rank|L|F")}
//   leader -> follower  {kind: joined}        (or the connection closes: refused)
constexpr uint64_t kHandshakeHeaderBytes = 1024;
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

std::string to_hex(const unsigned char* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) out += digits[data[i] >> 4], out += digits[data[i] & 15];
  return out;
}

std::string fresh_nonce() {
  unsigned char bytes[32];
  SWARM_REQUIRE(RAND_bytes(bytes, sizeof bytes) == 1, ErrorKind::INTERNAL,
                "no random bytes for the rank handshake");
  return to_hex(bytes, sizeof bytes);
}

std::string proof(const std::string& secret, const std::string& text) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  SWARM_REQUIRE(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                     reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac, &len) != nullptr,
                ErrorKind::INTERNAL, "HMAC failed in the rank handshake");
  return to_hex(mac, len);
}

bool same_proof(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string peer_of(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "an unknown address";
  char host[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(ntohs(addr.sin_port));
}

std::string text_field(const std::optional<RankMessage>& m, const char* kind, const char* key) {
  if (!m || m->header.value("kind", "") != kind) return "";
  const auto it = m->header.find(key);
  return it != m->header.end() && it->is_string() ? it->get<std::string>() : "";
}

// The leader's side for one accepted connection: the rank it proved, or -1 with `why` set.
int leader_handshake(int fd, const std::string& secret, int world_size, std::string& why) {
  const auto deadline = Clock::now() + kHandshakeTimeout;
  const auto hello = read_frame(fd, deadline, kHandshakeHeaderBytes, 0);
  const int rank =
      hello && hello->header.value("kind", "") == "hello" && hello->header["rank"].is_number_integer()
          ? hello->header["rank"].get<int>()
          : -1;
  const std::string their_nonce = text_field(hello, "hello", "nonce");
  if (rank < 1 || rank >= world_size || their_nonce.size() != 64) {
    why = "not a rank of this job (no valid hello)";
    return -1;
  }
  const std::string ours = fresh_nonce();
  write_frame(fd, RankMessage{json{{"kind", "challenge"},
                                   {"nonce", ours},
                                   {"proof", proof(secret, "leader|" + their_nonce + "|" + ours)}},
                              {}});
  const auto auth = read_frame(fd, deadline, kHandshakeHeaderBytes, 0);
  const std::string want = proof(secret, "follower|" + std::to_string(rank) + "|" + ours + "|" + their_nonce);
  if (!same_proof(text_field(auth, "auth", "proof"), want)) {
    why = "claimed rank " + std::to_string(rank) + " without the rendezvous secret";
    return -1;
  }
  return rank;
}

}  // namespace

// ------------------------------------------------------------------ leader

std::unique_ptr<RankLeader> RankLeader::accept(const std::string& host, int port, int world_size,
                                               std::chrono::milliseconds timeout, const std::string& secret) {
  SWARM_REQUIRE(world_size >= 2, ErrorKind::INVALID_ARGUMENT, "a rank leader needs at least one follower");
  const auto deadline = Clock::now() + timeout;
  sockaddr_in addr = resolve(host, port);
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SWARM_REQUIRE(ls >= 0, ErrorKind::UNAVAILABLE, "socket failed: " + errno_text());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } listener{ls};
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  SWARM_REQUIRE(::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, ErrorKind::UNAVAILABLE,
                "rank 0 cannot listen for the other ranks on " + host + ":" + std::to_string(port) + ": " +
                    errno_text());
  SWARM_REQUIRE(::listen(ls, world_size) == 0, ErrorKind::UNAVAILABLE, "listen failed: " + errno_text());

  std::unique_ptr<RankLeader> leader(new RankLeader());
  leader->fds_.assign(static_cast<size_t>(world_size - 1), -1);
  int joined = 0;
  while (joined < world_size - 1) {
    if (!wait_readable(ls, deadline))
      throw SwarmError(ErrorKind::UNAVAILABLE,
                       "only " + std::to_string(joined + 1) + " of " + std::to_string(world_size) +
                           " ranks joined within " + std::to_string(timeout.count() / 1000.0) +
                           " s (rank 0 listens on " + host + ":" + std::to_string(port) + ")");
    const int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      throw SwarmError(ErrorKind::UNAVAILABLE, "accept failed: " + errno_text());
    }
    set_nodelay(fd);
    std::string why;
    int rank = -1;
    try {
      rank = leader_handshake(fd, secret, world_size, why);
      if (rank > 0 && leader->fds_[static_cast<size_t>(rank - 1)] >= 0) {
        why = "claimed rank " + std::to_string(rank) + ", which has joined already";
        rank = -1;
      }
      if (rank > 0) write_frame(fd, RankMessage{json{{"kind", "joined"}}, {}});
    } catch (const SwarmError& e) {
      why = e.what();
      rank = -1;
    }
    if (rank < 0) {
      // Not one of ours: refused, said in the log, and the job goes on waiting for its ranks.
      spdlog::warn("rank 0: refused a connection from {}: {}", peer_of(fd), why);
      ::close(fd);
      continue;
    }
    leader->fds_[static_cast<size_t>(rank - 1)] = fd;
    ++joined;
  }
  return leader;
}

RankLeader::~RankLeader() { close(); }

std::vector<int> RankLeader::take_connections() {
  std::vector<int> fds = std::exchange(fds_, {});
  if (broken_.empty()) broken_ = "its connections were handed over";
  return fds;
}

void RankLeader::close() {
  for (int& fd : fds_)
    if (fd >= 0) ::close(fd), fd = -1;
  if (broken_.empty()) broken_ = "the job was closed";
}

void RankLeader::fail(const std::string& why) {
  if (broken_.empty()) broken_ = why;
  throw SwarmError(ErrorKind::UNAVAILABLE, why);
}

void RankLeader::send_all(const RankMessage& message) {
  if (!broken_.empty()) throw SwarmError(ErrorKind::UNAVAILABLE, "the multi-rank job is broken: " + broken_);
  for (size_t i = 0; i < fds_.size(); ++i) {
    try {
      write_frame(fds_[i], message);
    } catch (const SwarmError& e) {
      fail("rank " + std::to_string(i + 1) + " is gone (" + e.what() + ")");
    }
  }
}

std::vector<json> RankLeader::collect(std::chrono::milliseconds timeout) {
  if (!broken_.empty()) throw SwarmError(ErrorKind::UNAVAILABLE, "the multi-rank job is broken: " + broken_);
  const auto deadline = Clock::now() + timeout;
  std::vector<json> replies(fds_.size());
  std::string first_error, transport_error;
  for (size_t i = 0; i < fds_.size(); ++i) {
    const std::string who = "rank " + std::to_string(i + 1);
    try {
      auto m = read_frame(fds_[i], deadline);
      if (!m) {
        transport_error = who + " exited (its connection to rank 0 closed)";
        break;
      }
      replies[i] = std::move(m->header);
      if (!replies[i].value("ok", false) && first_error.empty())
        first_error = who + ": " + replies[i].value("error", std::string("failed without a message"));
    } catch (const SwarmError& e) {
      transport_error = who + ": " + e.what();
      break;
    }
  }
  if (!transport_error.empty()) fail(transport_error);
  if (!first_error.empty()) throw SwarmError(ErrorKind::UNAVAILABLE, first_error);
  return replies;
}

std::vector<json> RankLeader::request(const RankMessage& message, std::chrono::milliseconds timeout) {
  send_all(message);
  return collect(timeout);
}

// ------------------------------------------------------------------ follower

std::unique_ptr<RankFollower> RankFollower::connect(const std::string& host, int port, int rank,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& secret) {
  const auto deadline = Clock::now() + timeout;
  const sockaddr_in addr = resolve(host, port);
  std::string last_error;
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    SWARM_REQUIRE(fd >= 0, ErrorKind::UNAVAILABLE, "socket failed: " + errno_text());
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      set_nodelay(fd);
      std::unique_ptr<RankFollower> f(new RankFollower());
      f->fd_ = fd;
      f->rank_ = rank;
      f->join(host + ":" + std::to_string(port), secret);
      return f;
    }
    last_error = errno_text();
    ::close(fd);
    if (Clock::now() >= deadline)
      throw SwarmError(ErrorKind::UNAVAILABLE,
                       "rank " + std::to_string(rank) + " could not reach rank 0 at " + host + ":" +
                           std::to_string(port) + " within " + std::to_string(timeout.count() / 1000.0) +
                           " s: " + last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void RankFollower::join(const std::string& where, const std::string& secret) {
  const auto deadline = Clock::now() + kHandshakeTimeout;
  const std::string ours = fresh_nonce();
  write_frame(fd_, RankMessage{json{{"kind", "hello"}, {"rank", rank_}, {"nonce", ours}}, {}});
  const auto challenge = read_frame(fd_, deadline, kHandshakeHeaderBytes, 0);
  const std::string theirs = text_field(challenge, "challenge", "nonce");
  SWARM_REQUIRE(challenge, ErrorKind::UNAVAILABLE,
                "rank 0 at " + where + " closed the connection at once (is that rank 0 of this job?)");
  SWARM_REQUIRE(theirs.size() == 64 && same_proof(text_field(challenge, "challenge", "proof"),
                                                  proof(secret, "leader|" + ours + "|" + theirs)),
                ErrorKind::UNAVAILABLE,
                "the process at " + where +
                    " does not know this job's rendezvous secret: not rank 0 of this job (another job's "
                    "master, or --rendezvous-secret-file / SWARM_RENDEZVOUS_SECRET differs)");
  write_frame(fd_, RankMessage{json{{"kind", "auth"},
                                    {"proof", proof(secret, "follower|" + std::to_string(rank_) + "|" +
                                                                theirs + "|" + ours)}},
                               {}});
  const auto joined = read_frame(fd_, deadline, kHandshakeHeaderBytes, 0);
  SWARM_REQUIRE(joined && joined->header.value("kind", "") == "joined", ErrorKind::UNAVAILABLE,
                "rank 0 at " + where + " refused rank " + std::to_string(rank_) +
                    ": a wrong rendezvous secret, or this rank has joined already (rank 0's log says which)");
}

int RankFollower::take_connection() { return std::exchange(fd_, -1); }

RankFollower::~RankFollower() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<RankMessage> RankFollower::receive() { return read_frame(fd_, std::nullopt); }

void RankFollower::reply_ok(json extra) {
  extra["ok"] = true;
  write_frame(fd_, RankMessage{std::move(extra), {}});
}

void RankFollower::reply_error(const std::string& error) {
  write_frame(fd_, RankMessage{json{{"ok", false}, {"error", error}}, {}});
}

int accept_rank_handshake(int fd, const std::string& secret, int world_size, std::string& why) {
  try {
    const int rank = leader_handshake(fd, secret, world_size, why);
    if (rank > 0) write_frame(fd, RankMessage{json{{"kind", "joined"}}, {}});
    return rank;
  } catch (const std::exception& e) {
    why = e.what();
    return -1;
  }
}

std::string store_namespace(const std::string& secret, int store_port) {
  return proof(secret, "store|" + std::to_string(store_port));
}

void write_rank_frame(int fd, const RankMessage& message) { write_frame(fd, message); }

std::optional<RankMessage> read_rank_frame(int fd) { return read_frame(fd, std::nullopt); }

int pick_free_port(const std::string& host) {
  sockaddr_in addr = resolve(host, 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SWARM_REQUIRE(fd >= 0, ErrorKind::UNAVAILABLE, "socket failed: " + errno_text());
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  SWARM_REQUIRE(ok, ErrorKind::UNAVAILABLE, "cannot find a free port on " + host + ": " + errno_text());
  return ntohs(addr.sin_port);
}

// ------------------------------------------------------------------ batch encoding
//
// The episodes travel in the episode store's encoding (store/episode_codec.hpp), the one
// encoding of a FinishedEpisode: every field a rank trains on (calls, their temperatures, turn
// and token rewards, ...) reaches the other ranks exactly as rank 0 holds it.

namespace {

constexpr uint32_t kBatchMagic = 0x53574233;  // "SWB3": stale_dropped added

[[noreturn]] void corrupt_batch(const std::string& why) {
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "corrupt train batch (" + why + ")");
}

template <class T>
void put(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <class T>
T get(std::string_view in, size_t& at) {
  if (in.size() - at < sizeof(T)) corrupt_batch("truncated");
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  at += sizeof(T);
  return v;
}

}  // namespace

std::string serialize_train_batch(const TrainBatch& batch) {
  // Every member (a new one stops this from compiling until it is sent); the episodes travel in
  // the episode store's encoding, which names every member of theirs the same way.
  const auto& [episodes, num_tasks, stale_dropped] = batch;
  std::string out;
  put(out, kBatchMagic);
  put<int64_t>(out, num_tasks);
  put<int64_t>(out, stale_dropped);
  put<uint64_t>(out, episodes.size());
  for (const auto& e : episodes) {
    const std::string record = encode_finished_episode(e);
    put<uint64_t>(out, record.size());
    out += record;
  }
  return out;
}

TrainBatch deserialize_train_batch(const std::string& bytes) {
  size_t at = 0;
  if (get<uint32_t>(bytes, at) != kBatchMagic) corrupt_batch("bad magic");
  TrainBatch batch;
  batch.num_tasks = get<int64_t>(bytes, at);
  batch.stale_dropped = get<int64_t>(bytes, at);
  const auto episodes = get<uint64_t>(bytes, at);
  if (episodes > (bytes.size() - at) / sizeof(uint64_t)) corrupt_batch("bad episode count");
  batch.episodes.reserve(static_cast<size_t>(episodes));
  for (uint64_t i = 0; i < episodes; ++i) {
    const auto n = get<uint64_t>(bytes, at);
    if (n > bytes.size() - at) corrupt_batch("truncated");
    try {
      batch.episodes.push_back(
          decode_finished_episode(std::string_view(bytes).substr(at, static_cast<size_t>(n))));
    } catch (const SwarmError& e) {
      corrupt_batch("episode " + std::to_string(i) + ": " + e.what());
    }
    at += static_cast<size_t>(n);
  }
  if (at != bytes.size()) corrupt_batch("trailing bytes");
  return batch;
}

}  // namespace swarm
