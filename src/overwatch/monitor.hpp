// The monitor's memory between polls: the last good snapshot, a bounded history of
// per-step rewards, request rates, and how long the server has been unreachable.
// Produces a FrameInput, which is everything the renderer needs (render.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "overwatch/snapshot.hpp"

namespace swarm::overwatch {

/// Whether the server answered and, if not, for how long it has not.
struct ConnectionState {
  bool reachable = false;
  bool ever_reached = false;
  double down_seconds = 0.0;           // since the first failure of the current outage
  int64_t failed_polls = 0;            // consecutive failures
  std::string last_error;              // of the latest failure
  double seconds_since_last_ok = 0.0;  // meaningful when ever_reached
};

/// The renderer's whole input: a pure value, so frames are reproducible in tests.
struct FrameInput {
  std::string url;
  double interval_seconds = 1.0;
  std::string clock;  // wall-clock time for the header, e.g. "14:03:07" (may be empty)
  ConnectionState connection;
  std::optional<Snapshot> snapshot;     // the last good one (kept while unreachable)
  std::vector<StepPoint> step_history;  // the monitor's own, oldest first
  std::optional<double> requests_per_second;
  std::optional<double> errors_per_second;
};

/// Accumulates polls. NOT thread-safe: the polling loop owns it. Time is passed in, so
/// tests drive it with fixed time points.
class Monitor {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kDefaultMaxSteps = 1024;

  explicit Monitor(std::string url, double interval_seconds = 1.0, size_t max_steps = kDefaultMaxSteps);

  void on_poll_ok(Snapshot snapshot, Clock::time_point now);
  void on_poll_failed(std::string error, Clock::time_point now);

  /// The frame as of `now`; the engine's time in state is extrapolated from the last poll.
  FrameInput frame(Clock::time_point now) const;

  bool reachable() const { return reachable_; }
  const std::deque<StepPoint>& step_history() const { return steps_; }

 private:
  void merge_steps(const PoolInfo& pool);

  std::string url_;
  double interval_seconds_;
  size_t max_steps_;
  std::deque<StepPoint> steps_;
  std::string run_id_;  // of the steps kept
  std::optional<Snapshot> last_;
  std::optional<Clock::time_point> last_ok_;
  std::optional<Clock::time_point> down_since_;
  bool reachable_ = false;
  int64_t failed_polls_ = 0;
  std::string last_error_;
  // For rates: the previous request totals and when they were read.
  std::optional<RequestStats> prev_requests_;
  Clock::time_point prev_requests_at_{};
  std::optional<double> requests_per_second_;
  std::optional<double> errors_per_second_;
};

}  // namespace swarm::overwatch
