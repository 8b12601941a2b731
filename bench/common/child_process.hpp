// Helpers shared by the benchmarks that run swarm-server as a child process: spawning and
// stopping it, waiting for /health, free ports, and /proc readings (CPU time, RSS).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "http/http_client.hpp"
#include "swarm/errors.hpp"

extern char** environ;

namespace swarm::bench {

using namespace std::chrono_literals;
using ProcClock = std::chrono::steady_clock;

inline std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "stopped (wait status " + std::to_string(status) + ")";
}

/// A child process started with posix_spawn. Not thread-safe. The destructor stops it.
class ChildProcess {
 public:
  ChildProcess(std::string name, std::vector<std::string> argv)
      : name_(std::move(name)), argv_(std::move(argv)) {
    std::vector<char*> args;
    for (auto& a : argv_) args.push_back(a.data());
    args.push_back(nullptr);
    int rc = posix_spawn(&pid_, args[0], nullptr, nullptr, args.data(), environ);
    if (rc != 0) throw std::runtime_error("cannot start " + name_ + " (" + argv_[0] + "): " + strerror(rc));
  }
  ~ChildProcess() { stop(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  /// If the child has exited, reaps it and says how; otherwise nullopt.
  std::optional<std::string> exited() {
    if (done_) return how_;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      done_ = true;
      how_ = describe_wait_status(status);
      return how_;
    }
    return std::nullopt;
  }

  /// SIGTERM, then SIGKILL after `grace`. Returns how it ended.
  std::string stop(std::chrono::milliseconds grace = 10s) {
    if (done_) return how_;
    kill(pid_, SIGTERM);
    const auto until = ProcClock::now() + grace;
    while (ProcClock::now() < until) {
      if (auto how = exited()) return *how;
      std::this_thread::sleep_for(10ms);
    }
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    done_ = true;
    how_ = describe_wait_status(status) + " (did not stop within the grace period after SIGTERM)";
    return how_;
  }

 private:
  std::string name_;
  std::vector<std::string> argv_;
  pid_t pid_ = -1;
  bool done_ = false;
  std::string how_;
};

/// utime + stime of a process, in seconds (resolution: one clock tick, usually 10 ms).
inline double proc_cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos)
    throw std::runtime_error("cannot read /proc/" + std::to_string(pid) + "/stat");
  std::istringstream fields(line.substr(paren + 2));
  std::vector<std::string> f;
  for (std::string s; fields >> s;) f.push_back(s);
  // Fields after the command: state(3) ... utime(14) stime(15), 1-based in proc(5).
  if (f.size() < 13) throw std::runtime_error("short /proc/" + std::to_string(pid) + "/stat");
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::stod(f[11]) + std::stod(f[12])) / ticks;
}

/// VmRSS of a process, in KiB.
inline long proc_rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  throw std::runtime_error("no VmRSS in /proc/" + std::to_string(pid) + "/status");
}

/// A free loopback port (bound and released; the child binds it right after).
inline uint16_t pick_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error(std::string("cannot pick a free port: ") + strerror(errno));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

inline void wait_until_answering(const std::string& url, ChildProcess& child, std::chrono::seconds timeout) {
  const auto until = ProcClock::now() + timeout;
  while (ProcClock::now() < until) {
    if (auto how = child.exited()) throw std::runtime_error(child.name() + " " + *how + " before answering");
    try {
      swarm::HttpClient http(url, 500ms);
      if (http.request("GET", "/health").status == 200) return;
    } catch (const swarm::TransportError&) {}
    std::this_thread::sleep_for(20ms);
  }
  throw std::runtime_error(child.name() + " did not answer GET /health on " + url);
}

}  // namespace swarm::bench
