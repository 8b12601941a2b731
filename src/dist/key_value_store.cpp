// The authenticated rendezvous store (see the header).
#include "dist/key_value_store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "dist/rank_channel.hpp"

namespace swarm {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Connections a store serves at once: each rank's, its clones', and room for strangers being
// refused.
int max_connections(int world_size) { return 4 * world_size + 16; }

std::chrono::milliseconds millis(int64_t ms) { return std::chrono::milliseconds(ms < 0 ? 0 : ms); }

}  // namespace

// ------------------------------------------------------------------ the data

void KeyValueStore::put_locked(const std::string& key, std::string value) {
  auto it = values_.find(key);
  const size_t old = it == values_.end() ? 0 : it->second.size();
  SWARM_REQUIRE(it != values_.end() || values_.size() < kMaxKeys, ErrorKind::PAYLOAD_TOO_LARGE,
                "the rendezvous store is full (" + std::to_string(kMaxKeys) + " keys)");
  SWARM_REQUIRE(bytes_ - old + value.size() <= kMaxBytes, ErrorKind::PAYLOAD_TOO_LARGE,
                "the rendezvous store is full (" + std::to_string(kMaxBytes >> 20) + " MiB)");
  bytes_ = bytes_ - old + value.size();
  values_[key] = std::move(value);
  changed_.notify_all();
}

bool KeyValueStore::all_exist_locked(const std::vector<std::string>& keys) const {
  for (const std::string& k : keys)
    if (!values_.contains(k)) return false;
  return true;
}

void KeyValueStore::set(const std::string& key, std::string value) {
  std::lock_guard lk(mu_);
  put_locked(key, std::move(value));
}

std::optional<std::string> KeyValueStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!changed_.wait_for(lk, timeout, [&] { return closed_ || values_.contains(key); }) || closed_)
    return std::nullopt;
  return values_.at(key);
}

int64_t KeyValueStore::add(const std::string& key, int64_t delta) {
  std::lock_guard lk(mu_);
  int64_t value = 0;
  if (auto it = values_.find(key); it != values_.end()) {
    try {
      value = std::stoll(it->second);
    } catch (const std::exception&) {
      throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                       "rendezvous store: key '" + key + "' does not hold a number");
    }
  }
  value += delta;
  put_locked(key, std::to_string(value));
  return value;
}

std::string KeyValueStore::compare_set(const std::string& key, const std::string& expected,
                                       std::string desired) {
  std::lock_guard lk(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) {
    if (!expected.empty()) return expected;
  } else if (it->second != expected) {
    return it->second;
  }
  put_locked(key, desired);
  return desired;
}

bool KeyValueStore::erase(const std::string& key) {
  std::lock_guard lk(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  bytes_ -= it->second.size();
  values_.erase(it);
  return true;
}

bool KeyValueStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lk(mu_);
  return all_exist_locked(keys);
}

int64_t KeyValueStore::size() {
  std::lock_guard lk(mu_);
  return static_cast<int64_t>(values_.size());
}

bool KeyValueStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  return changed_.wait_for(lk, timeout, [&] { return closed_ || all_exist_locked(keys); }) && !closed_;
}

void KeyValueStore::close() {
  std::lock_guard lk(mu_);
  closed_ = true;
  changed_.notify_all();
}

// ------------------------------------------------------------------ rank 0 serves it

KeyValueServer::KeyValueServer(std::shared_ptr<KeyValueStore> store, const std::string& host, int port,
                               int world_size, std::string secret)
    : store_(std::move(store)), world_size_(world_size), secret_(std::move(secret)) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  SWARM_REQUIRE(rc == 0 && res != nullptr, ErrorKind::INVALID_ARGUMENT,
                "cannot resolve the master address '" + host + "': " + gai_strerror(rc));
  sockaddr_in addr{};
  std::memcpy(&addr, res->ai_addr, sizeof(addr));
  ::freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SWARM_REQUIRE(listener_ >= 0, ErrorKind::UNAVAILABLE,
                std::string("socket failed: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener_, max_connections(world_size)) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listener_);
    throw SwarmError(ErrorKind::UNAVAILABLE, "rank 0 cannot host the rendezvous store on " + host + ":" +
                                                 std::to_string(port) + ": " + why);
  }
  acceptor_ = std::thread([this] { accept_loop(); });
}

KeyValueServer::~KeyValueServer() {
  stopping_ = true;
  store_->close();
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard lk(mu_);
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
  }
  for (Worker& w : workers_) w.thread.join();
  ::close(listener_);
}

void KeyValueServer::accept_loop() {
  while (!stopping_) {
    pollfd p{listener_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;  // a reply is several writes: no waiting for acknowledgements between them
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard lk(mu_);
    if (static_cast<int>(connections_.size()) >= max_connections(world_size_)) {
      spdlog::warn("rank 0: the rendezvous store refused a connection: {} are open already",
                   connections_.size());
      ::close(fd);
      continue;
    }
    std::erase_if(workers_, [](Worker& w) {
      if (!w.done->load()) return false;
      w.thread.join();
      return true;
    });
    connections_.push_back(fd);
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers_.push_back(Worker{std::thread([this, fd, done] {
                                serve(fd);
                                *done = true;
                              }),
                              done});
  }
}

void KeyValueServer::serve(int fd) {
  std::string why;
  const int rank = accept_rank_handshake(fd, secret_, world_size_, why);
  if (rank < 0 && !stopping_) spdlog::warn("rank 0: the rendezvous store refused a connection: {}", why);
  try {
    while (rank > 0 && !stopping_) {
      std::optional<RankMessage> m = read_rank_frame(fd);
      if (!m) break;
      const json& h = m->header;
      const std::string op = h.value("op", "");
      std::vector<std::string> keys;
      for (const json& k : h.value("keys", json::array())) keys.push_back(k.get<std::string>());
      const std::string key = keys.empty() ? std::string() : keys.front();
      const int64_t n = h.value("n", int64_t{0});
      json reply{{"ok", true}};
      std::string payload;
      try {
        if (op == "set") {
          store_->set(key, m->payload);
        } else if (op == "get") {
          std::optional<std::string> v = store_->get(key, millis(n));
          reply["found"] = v.has_value();
          if (v) payload = std::move(*v);
        } else if (op == "add") {
          reply["n"] = store_->add(key, n);
        } else if (op == "compare_set") {
          SWARM_REQUIRE(m->payload.size() >= 8, ErrorKind::INVALID_ARGUMENT, "compare_set: truncated");
          uint64_t len = 0;
          std::memcpy(&len, m->payload.data(), 8);
          SWARM_REQUIRE(len <= m->payload.size() - 8, ErrorKind::INVALID_ARGUMENT, "compare_set: truncated");
          payload = store_->compare_set(key, m->payload.substr(8, len), m->payload.substr(8 + len));
        } else if (op == "erase") {
          reply["found"] = store_->erase(key);
        } else if (op == "check") {
          reply["found"] = store_->check(keys);
        } else if (op == "size") {
          reply["n"] = store_->size();
        } else if (op == "wait") {
          reply["found"] = store_->wait(keys, millis(n));
        } else {
          throw SwarmError(ErrorKind::INVALID_ARGUMENT, "unknown operation '" + op + "'");
        }
      } catch (const SwarmError& e) {
        reply = json{{"ok", false}, {"error", e.what()}};
        payload.clear();
      }
      write_rank_frame(fd, RankMessage{std::move(reply), std::move(payload)});
    }
  } catch (const std::exception& e) {
    if (!stopping_)
      spdlog::warn("rank 0: the rendezvous store's connection from rank {} failed: {}", rank, e.what());
  }
  std::lock_guard lk(mu_);
  std::erase(connections_, fd);
  ::close(fd);
}

// ------------------------------------------------------------------ a rank's connection

struct KeyValueClient::Reply {
  json header;
  std::string payload;
};

KeyValueClient::KeyValueClient(const std::string& host, int port, int rank, std::chrono::milliseconds timeout,
                               const std::string& secret)
    : fd_(RankFollower::connect(host, port, rank, timeout, secret)->take_connection()) {}

KeyValueClient::~KeyValueClient() {
  if (fd_ >= 0) ::close(fd_);
}

KeyValueClient::Reply KeyValueClient::call(const std::string& op, const std::vector<std::string>& keys,
                                           const std::string& payload, int64_t number) {
  write_rank_frame(fd_, RankMessage{json{{"op", op}, {"keys", keys}, {"n", number}}, payload});
  std::optional<RankMessage> m = read_rank_frame(fd_);
  SWARM_REQUIRE(m.has_value(), ErrorKind::UNAVAILABLE, "the rendezvous store (rank 0) closed the connection");
  SWARM_REQUIRE(m->header.value("ok", false), ErrorKind::UNAVAILABLE,
                "rendezvous store: " + m->header.value("error", std::string("failed")));
  return Reply{std::move(m->header), std::move(m->payload)};
}

void KeyValueClient::set(const std::string& key, const std::string& value) { call("set", {key}, value); }

std::optional<std::string> KeyValueClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  Reply r = call("get", {key}, {}, timeout.count());
  if (!r.header.value("found", false)) return std::nullopt;
  return std::move(r.payload);
}

int64_t KeyValueClient::add(const std::string& key, int64_t delta) {
  return call("add", {key}, {}, delta).header.value("n", int64_t{0});
}

std::string KeyValueClient::compare_set(const std::string& key, const std::string& expected,
                                        const std::string& desired) {
  std::string payload(8, '\0');
  const uint64_t len = expected.size();
  std::memcpy(payload.data(), &len, 8);
  payload += expected;
  payload += desired;
  return call("compare_set", {key}, payload).payload;
}

bool KeyValueClient::erase(const std::string& key) {
  return call("erase", {key}, {}).header.value("found", false);
}

bool KeyValueClient::check(const std::vector<std::string>& keys) {
  return call("check", keys, {}).header.value("found", false);
}

int64_t KeyValueClient::size() { return call("size", {}, {}).header.value("n", int64_t{0}); }

bool KeyValueClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return call("wait", keys, {}, timeout.count()).header.value("found", false);
}

}  // namespace swarm
