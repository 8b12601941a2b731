#include "server/verbose_log.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>

namespace swarm {
namespace {

class RecentSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<VerboseLogEntry> entries() {
    std::lock_guard lk(mutex_);  // base_sink's own mutex also guards sink_it_
    return {entries_.begin(), entries_.end()};
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::info) return;
    VerboseLogEntry e;
    e.timestamp = std::chrono::duration<double>(msg.time.time_since_epoch()).count();
    std::string text(msg.payload.data(), msg.payload.size());
    // "engine: ROLLING -> ROLLING_POST ..." → tag "engine"
    const auto colon = text.find(": ");
    if (colon != std::string::npos && colon > 0 && colon <= 24 && text.find(' ') > colon) {
      e.tag = text.substr(0, colon);
      text = text.substr(colon + 2);
    } else {
      const auto level = spdlog::level::to_string_view(msg.level);
      e.tag.assign(level.data(), level.size());
    }
    e.message = std::move(text);
    entries_.push_back(std::move(e));
    while (entries_.size() > kVerboseLogCapacity) entries_.pop_front();
  }
  void flush_() override {}

 private:
  std::deque<VerboseLogEntry> entries_;
};

std::shared_ptr<RecentSink>& sink_instance() {
  static std::shared_ptr<RecentSink> sink;
  return sink;
}

std::once_flag install_once;

}  // namespace

void install_verbose_log_sink() {
  std::call_once(install_once, [] {
    sink_instance() = std::make_shared<RecentSink>();
    sink_instance()->set_level(spdlog::level::info);
    spdlog::default_logger()->sinks().push_back(sink_instance());
  });
}

std::vector<VerboseLogEntry> recent_log_entries() {
  install_verbose_log_sink();
  return sink_instance()->entries();
}

}  // namespace swarm
