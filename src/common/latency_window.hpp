// A bounded window of the most recent samples (latencies in seconds) with percentiles, for
// /metrics. Memory is fixed at construction; not thread-safe (callers hold their own lock).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace swarm {

class LatencyWindow {
 public:
  explicit LatencyWindow(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {
    samples_.reserve(capacity_);
  }

  void add(double v) {
    if (samples_.size() < capacity_) {
      samples_.push_back(v);
    } else {
      samples_[next_] = v;
    }
    next_ = (next_ + 1) % capacity_;
  }

  size_t size() const { return samples_.size(); }

  /// The nearest-rank percentile (`p` in [0, 100]) of the samples held; 0 when there are none.
  double percentile(double p) const {
    if (samples_.empty()) return 0.0;
    std::vector<double> v = samples_;
    const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size());
    size_t i = rank <= 1.0 ? 0 : static_cast<size_t>(rank + 0.999999) - 1;  // ceil(rank) - 1
    i = std::min(i, v.size() - 1);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
    return v[i];
  }

 private:
  size_t capacity_;
  size_t next_ = 0;
  std::vector<double> samples_;
};

}  // namespace swarm
