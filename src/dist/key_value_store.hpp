// The rendezvous store of a multi-rank job, authenticated: what c10d's collectives (Gloo,
// NCCL) exchange at each boot — addresses, ids, barriers — through a key-value store that rank
// 0 hosts. c10d's TCPStore accepts any connection; this one accepts only ranks that prove the
// job's rendezvous secret (the join handshake of rank_channel.hpp), so a process without it
// can neither read nor write a key. The c10d::Store over it is in collectives_torch.cpp; this
// part is torch-free.
//
// Semantics follow c10d's stores: values are bytes; `add` keeps a decimal integer; reading a
// key waits until it exists (up to a timeout); `wait` waits for several.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace swarm {

/// The data, in rank 0's process. Thread-safe. Bounded: at most kMaxKeys keys and kMaxBytes of
/// values (a set beyond that fails).
class KeyValueStore {
 public:
  static constexpr size_t kMaxKeys = size_t{1} << 16;
  static constexpr size_t kMaxBytes = size_t{256} << 20;

  void set(const std::string& key, std::string value);
  /// The value once the key exists; nullopt after `timeout` or once closed.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  /// Adds `delta` to the key's integer (0 when missing) and returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  /// Sets `desired` when the key holds `expected` (or is missing and `expected` is empty);
  /// returns what the key holds afterwards (`expected` when it was missing and not set).
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired);
  bool erase(const std::string& key);
  bool check(const std::vector<std::string>& keys);
  int64_t size();
  /// True once every key exists; false after `timeout` or once closed.
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Wakes every waiter (they fail) and refuses waiting from now on.
  void close();

 private:
  void put_locked(const std::string& key, std::string value);
  bool all_exist_locked(const std::vector<std::string>& keys) const;
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
  size_t bytes_ = 0;
  bool closed_ = false;
};

/// Serves a KeyValueStore to the other ranks on host:port (a thread per authenticated
/// connection; strangers are refused and logged). Stops and joins on destruction.
class KeyValueServer {
 public:
  KeyValueServer(std::shared_ptr<KeyValueStore> store, const std::string& host, int port, int world_size,
                 std::string secret);
  ~KeyValueServer();
  KeyValueServer(const KeyValueServer&) = delete;
  KeyValueServer& operator=(const KeyValueServer&) = delete;

 private:
  void accept_loop();
  void serve(int fd);

  std::shared_ptr<KeyValueStore> store_;
  const int world_size_;
  const std::string secret_;
  int listener_ = -1;
  std::atomic<bool> stopping_{false};
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex mu_;  // connections_, workers_
  std::vector<int> connections_;
  std::vector<Worker> workers_;  // finished ones are joined as new connections come
  std::thread acceptor_;
};

/// A rank's connection to the store. Not thread-safe (the c10d store over it serialises).
class KeyValueClient {
 public:
  /// Connects and joins as `rank` (retrying while rank 0 is not listening yet); throws
  /// SwarmError(UNAVAILABLE) when that fails within `timeout`.
  KeyValueClient(const std::string& host, int port, int rank, std::chrono::milliseconds timeout,
                 const std::string& secret);
  ~KeyValueClient();
  KeyValueClient(const KeyValueClient&) = delete;
  KeyValueClient& operator=(const KeyValueClient&) = delete;

  void set(const std::string& key, const std::string& value);
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta);
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  bool erase(const std::string& key);
  bool check(const std::vector<std::string>& keys);
  int64_t size();
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

 private:
  struct Reply;
  Reply call(const std::string& op, const std::vector<std::string>& keys, const std::string& payload,
             int64_t number = 0);
  int fd_ = -1;
};

}  // namespace swarm
