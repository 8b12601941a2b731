// Injectable clock so timeouts can be tested without sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

namespace swarm {

using Duration = std::chrono::steady_clock::duration;
using TimePoint = std::chrono::steady_clock::time_point;

/// Source of monotonic time. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
};

/// The real steady clock.
class SteadyClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  static std::shared_ptr<Clock> shared() {
    static std::shared_ptr<Clock> c = std::make_shared<SteadyClock>();
    return c;
  }
};

/// A clock that only moves when told to (tests). Thread-safe.
class FakeClock final : public Clock {
 public:
  TimePoint now() const override { return TimePoint(Duration(ticks_.load())); }
  void advance(Duration d) { ticks_ += d.count(); }
  template <class Rep, class Period>
  void advance(std::chrono::duration<Rep, Period> d) {
    advance(std::chrono::duration_cast<Duration>(d));
  }

 private:
  std::atomic<Duration::rep> ticks_{std::chrono::duration_cast<Duration>(std::chrono::hours(1)).count()};
};

inline double seconds_between(TimePoint a, TimePoint b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace swarm
