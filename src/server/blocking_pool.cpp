#include "server/blocking_pool.hpp"

#include <spdlog/spdlog.h>

namespace swarm {

BlockingPool::BlockingPool(size_t threads, size_t max_queued) : max_queued_(max_queued) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

BlockingPool::~BlockingPool() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool BlockingPool::submit(std::function<void()> job) {
  {
    std::lock_guard lk(mu_);
    if (stopping_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void BlockingPool::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      job();
    } catch (const std::exception& e) {
      spdlog::error("blocking pool: a job threw: {}", e.what());
    } catch (...) {
      spdlog::error("blocking pool: a job threw a non-standard exception");
    }
  }
}

}  // namespace swarm
