#include "overwatch/monitor.hpp"

#include <utility>

namespace swarm::overwatch {
namespace {

double seconds_between(Monitor::Clock::time_point a, Monitor::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Monitor::Monitor(std::string url, double interval_seconds, size_t max_steps)
    : url_(std::move(url)), interval_seconds_(interval_seconds), max_steps_(max_steps == 0 ? 1 : max_steps) {}

void Monitor::merge_steps(const PoolInfo& pool) {
  // Another run id, or a step counter that went backwards (a server without run ids), means a
  // new run: the old history belongs to another run and would make the sparkline lie.
  if (pool.run_id != run_id_ || (!steps_.empty() && pool.global_step < steps_.back().global_step))
    steps_.clear();
  run_id_ = pool.run_id;
  for (const StepPoint& p : pool.step_history) {
    if (!steps_.empty() && p.global_step <= steps_.back().global_step) continue;
    steps_.push_back(p);
  }
  while (steps_.size() > max_steps_) steps_.pop_front();
}

void Monitor::on_poll_ok(Snapshot snapshot, Clock::time_point now) {
  merge_steps(snapshot.pool);
  requests_per_second_.reset();
  errors_per_second_.reset();
  if (snapshot.requests) {
    const RequestStats& cur = *snapshot.requests;
    if (prev_requests_ && reachable_ && cur.total >= prev_requests_->total) {
      const double dt = seconds_between(prev_requests_at_, now);
      if (dt > 1e-3) {
        requests_per_second_ = static_cast<double>(cur.total - prev_requests_->total) / dt;
        const int64_t errors = cur.client_errors + cur.server_errors;
        const int64_t prev_errors = prev_requests_->client_errors + prev_requests_->server_errors;
        if (errors >= prev_errors) errors_per_second_ = static_cast<double>(errors - prev_errors) / dt;
      }
    }
    prev_requests_ = cur;
    prev_requests_at_ = now;
  } else {
    prev_requests_.reset();
  }
  last_ = std::move(snapshot);
  last_ok_ = now;
  reachable_ = true;
  down_since_.reset();
  failed_polls_ = 0;
}

void Monitor::on_poll_failed(std::string error, Clock::time_point now) {
  if (reachable_ || !down_since_) down_since_ = now;
  reachable_ = false;
  ++failed_polls_;
  last_error_ = std::move(error);
  requests_per_second_.reset();
  errors_per_second_.reset();
}

FrameInput Monitor::frame(Clock::time_point now) const {
  FrameInput f;
  f.url = url_;
  f.interval_seconds = interval_seconds_;
  f.connection.reachable = reachable_;
  f.connection.ever_reached = last_ok_.has_value();
  f.connection.failed_polls = failed_polls_;
  f.connection.last_error = last_error_;
  if (down_since_) f.connection.down_seconds = seconds_between(*down_since_, now);
  if (last_ok_) f.connection.seconds_since_last_ok = seconds_between(*last_ok_, now);
  f.snapshot = last_;
  if (f.snapshot && reachable_ && last_ok_) {
    const double age = seconds_between(*last_ok_, now);
    if (age > 0) f.snapshot->pool.seconds_in_state += age;
  }
  f.step_history.assign(steps_.begin(), steps_.end());
  f.requests_per_second = requests_per_second_;
  f.errors_per_second = errors_per_second_;
  return f;
}

}  // namespace swarm::overwatch
