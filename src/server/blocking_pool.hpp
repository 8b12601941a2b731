// Threads for request work that may block (end_episode waits for the episode store's commit):
// run here, never on an HTTP I/O thread, so one slow disk cannot stall every connection, and
// concurrent requests wait together (they share the store's commits). Bounded queue.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace swarm {

class BlockingPool {
 public:
  BlockingPool(size_t threads, size_t max_queued);
  ~BlockingPool();  // runs what is queued, then joins
  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  /// Queues `job`; false (and `job` is not run) when max_queued jobs already wait.
  bool submit(std::function<void()> job);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t max_queued_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace swarm
