// An observer of one generation that records what the engine reports (streamed text, the
// result or the error) and lets a test wait for the end or cancel it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "inference/generation.hpp"

namespace swarm::testing {

class GenerationCollector : public GenerationObserver {
 public:
  void on_text(int64_t choice, const std::string& delta) override {
    std::lock_guard lk(mu_);
    streamed[choice] += delta;
    ++text_calls;
    ++text_events;
    if (cancel_on_text) cancel = true;
  }
  void on_complete(GenerationResult r) override {
    std::lock_guard lk(mu_);
    ++ends;
    result = std::move(r);
    cv_.notify_all();
  }
  void on_error(ErrorKind kind, const std::string& message) override {
    std::lock_guard lk(mu_);
    ++ends;
    error_kind = kind;
    error = message;
    cv_.notify_all();
  }
  bool cancelled() const override { return cancel.load(); }

  /// Blocks until on_complete or on_error (false on timeout).
  bool wait(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return ends > 0; });
  }

  std::map<int64_t, std::string> streamed;
  int text_calls = 0;
  std::atomic<int> text_events{0};  // text_calls, readable while the engine runs
  int ends = 0;
  std::optional<GenerationResult> result;
  std::optional<ErrorKind> error_kind;
  std::string error;
  std::atomic<bool> cancel{false};
  bool cancel_on_text = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace swarm::testing
