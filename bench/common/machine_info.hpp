// Facts about the machine and the checkout that every benchmark prints with its table: /proc
// readings (RSS, load), the CPU model, the commit (read from .git) and the time. No torch.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace swarm::bench {

namespace fs = std::filesystem;

/// A field of /proc/self/status in KiB (VmRSS, VmHWM), or -1.
inline int64_t proc_status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

/// Resets VmHWM to the current RSS (Linux: "5" into clear_refs). False when not allowed.
inline bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

inline std::string read_first_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

/// The 1, 5 and 15 minute load averages as /proc/loadavg prints them.
inline std::string load_average() {
  std::istringstream in(read_first_line("/proc/loadavg"));
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

/// The instruction-set level of the CPU kernels (kernels/cpu/cpu_dispatch.hpp) from the CPU's
/// flags: avx512bf16, avx512, avx2 or base, lowered by SWARM_CPU_LEVEL as the kernels are (the
/// variable is then named).
inline std::string cpu_level() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  int level = 0;
  if (has("avx2") && has("fma") && has("bmi2")) level = 1;
  if (level == 1 && has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq")) level = 2;
  if (level == 2 && has("avx512_bf16")) level = 3;
  static const char* kNames[] = {"base", "avx2", "avx512", "avx512bf16"};
  std::string name = kNames[level];
  if (const char* cap = std::getenv("SWARM_CPU_LEVEL")) {
    for (int l = 0; l < level; ++l)
      if (std::string(cap) == kNames[l]) name = kNames[l];
    name += std::string(" (SWARM_CPU_LEVEL=") + cap + ")";
  }
  return name;
}

/// The CPU's model name followed by its kernel level in brackets, e.g. "AMD EPYC [avx2]".
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2) + " [" + cpu_level() + "]";
    }
  }
  return "unknown [" + cpu_level() + "]";
}

/// The checked-out commit, read from .git without running git; "unknown" when not found.
inline std::string git_commit(const fs::path& source) {
  fs::path git = source / ".git";
  std::error_code ec;
  if (fs::is_regular_file(git, ec)) {  // a worktree: "gitdir: PATH"
    std::string line = read_first_line(git);
    if (line.rfind("gitdir: ", 0) != 0) return "unknown";
    git = fs::path(line.substr(8));
    if (git.is_relative()) git = source / git;
  }
  std::string head = read_first_line(git / "HEAD");
  if (head.rfind("ref: ", 0) != 0) return head.empty() ? "unknown" : head.substr(0, 12);
  const std::string ref = head.substr(5);
  for (const fs::path& dir : {git, fs::path(read_first_line(git / "commondir")).empty()
                                       ? git
                                       : git / read_first_line(git / "commondir")}) {
    std::string sha = read_first_line(dir / ref);
    if (!sha.empty()) return sha.substr(0, 12) + " (" + ref + ")";
    std::ifstream packed(dir / "packed-refs");
    std::string line;
    while (std::getline(packed, line)) {
      if (line.size() > 41 && line.compare(41, std::string::npos, ref) == 0) {
        return line.substr(0, 12) + " (" + ref + ")";
      }
    }
  }
  return "unknown";
}

inline std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

}  // namespace swarm::bench
