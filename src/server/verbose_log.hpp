// Recent log entries for GET /get_verbose_logs (AgentJet's overwatch shows the newest one):
// an spdlog sink on the default logger keeping the last entries at info level and above.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace swarm {

struct VerboseLogEntry {
  double timestamp = 0.0;  // unix seconds
  std::string tag;         // the message's "component:" prefix, or its level
  std::string message;
};

/// The process's recent log entries, oldest first (at most `capacity()` of them). The sink is
/// installed on spdlog's default logger on first use; it is process-wide, like the logger.
std::vector<VerboseLogEntry> recent_log_entries();
/// Installs the sink now (a server does this when it starts). Idempotent and thread-safe.
void install_verbose_log_sink();
constexpr size_t kVerboseLogCapacity = 50;

}  // namespace swarm
