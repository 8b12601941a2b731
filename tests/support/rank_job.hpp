// Multi-process tests: this test binary re-executed once per rank (posix_spawn, so no fork of a
// process that already runs torch threads), each copy running one registered rank body.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace swarm::testing {

/// A loopback TCP port that was free a moment ago (bound to port 0 and released); -1 on failure.
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : -1;
}

/// The ranks of one job: `world_size` copies of this binary, each running only the tests that
/// match `gtest_filter`, with the current environment plus `env_for_rank(rank)`. Every rank
/// still running when the job goes out of scope (a failed ASSERT, an exception) is killed and
/// reaped.
class RankJob {
 public:
  using EnvForRank = std::function<std::map<std::string, std::string>(int rank)>;

  RankJob(int world_size, const std::string& gtest_filter, const EnvForRank& env_for_rank) {
    for (int rank = 0; rank < world_size; ++rank) {
      const std::map<std::string, std::string> overrides = env_for_rank(rank);
      std::vector<std::string> env;
      for (const auto& [name, value] : overrides) env.push_back(name + "=" + value);
      for (char** e = environ; *e != nullptr; ++e) {
        const std::string entry = *e;
        if (!overrides.contains(entry.substr(0, entry.find('=')))) env.push_back(entry);
      }
      std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=" + gtest_filter};
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& v : env) envp.push_back(v.data());
      envp.push_back(nullptr);
      pid_t pid = -1;
      const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
      if (rc != 0) throw std::runtime_error("posix_spawn failed: " + std::to_string(rc));
      pids_.push_back(pid);
    }
  }
  ~RankJob() {
    for (pid_t& pid : pids_) kill_and_reap(pid);
  }
  RankJob(const RankJob&) = delete;
  RankJob& operator=(const RankJob&) = delete;

  /// Each rank's exit code; -1 for a rank killed at `limit` (or by a signal). Once a rank fails,
  /// the others cannot finish their collectives: they are killed instead of waited for.
  std::vector<int> wait(std::chrono::seconds limit) {
    using Clock = std::chrono::steady_clock;
    std::vector<int> codes(pids_.size(), -1);
    const auto deadline = Clock::now() + limit;
    size_t running = pids_.size();
    bool failed = false;
    while (running > 0 && !failed && Clock::now() < deadline) {
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] <= 0) continue;
        int status = 0;
        if (::waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
        pids_[i] = -1;
        --running;
        if (WIFEXITED(status)) codes[i] = WEXITSTATUS(status);
        failed = failed || codes[i] != 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (pid_t& pid : pids_) kill_and_reap(pid);
    return codes;
  }

 private:
  static void kill_and_reap(pid_t& pid) {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
  }
  std::vector<pid_t> pids_;
};

/// In a spawned rank only: when the environment variable `role_var` names one of `bodies`,
/// registers the test <suite>.<role> that runs it, so rank bodies never appear in the normal
/// test list. Call it from a namespace-scope initializer; returns whether it registered.
inline bool register_rank_test(const char* role_var, const char* suite,
                               const std::map<std::string, void (*)()>& bodies) {
  const char* role = std::getenv(role_var);
  if (role == nullptr) return false;
  const auto it = bodies.find(role);
  if (it == bodies.end()) return false;
  struct RankTest : ::testing::Test {
    explicit RankTest(void (*body)()) : body_(body) {}
    void TestBody() override { body_(); }
    void (*body_)();
  };
  void (*body)() = it->second;
  ::testing::RegisterTest(suite, role, nullptr, nullptr, __FILE__, __LINE__,
                          [body]() -> ::testing::Test* { return new RankTest(body); });
  return true;
}

}  // namespace swarm::testing
