#include "dist/rank_launcher.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.hpp"

namespace swarm {

LocalRanks::LocalRanks(const DistConfig& self, const std::vector<std::string>& argv) {
  const int nproc = self.local_world_size;
  SWARM_REQUIRE(nproc >= 1 && !argv.empty() && self.rank + nproc <= self.world_size,
                ErrorKind::INVALID_ARGUMENT, "bad rank launch");
  // Everything the child needs is prepared before fork: only async-signal-safe calls after it.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_WORLD_SIZE" || key == "LOCAL_RANK" ||
        key == "MASTER_ADDR" || key == "MASTER_PORT" || key == "SWARM_RENDEZVOUS_SECRET")
      continue;
    env_strings.push_back(kv);
  }
  env_strings.push_back("WORLD_SIZE=" + std::to_string(self.world_size));
  env_strings.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
  env_strings.push_back("MASTER_ADDR=" + self.master_addr);
  env_strings.push_back("MASTER_PORT=" + std::to_string(self.master_port));
  env_strings.push_back("SWARM_RENDEZVOUS_SECRET=" + self.secret);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();

  for (int local = 1; local < nproc; ++local) {
    const int rank = self.rank + local;
    std::vector<std::string> env = env_strings;
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("LOCAL_RANK=" + std::to_string(local));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    const pid_t pid = fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      wait_all(std::chrono::seconds(5));
      throw SwarmError(ErrorKind::UNAVAILABLE,
                       "cannot start rank " + std::to_string(rank) + ": fork: " + why);
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the parent died before prctl
      sigset_t stop_signals;
      sigemptyset(&stop_signals);
      sigaddset(&stop_signals, SIGINT);
      sigaddset(&stop_signals, SIGTERM);
      sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
      execve("/proc/self/exe", args.data(), envp.data());
      _exit(127);
    }
    children_.push_back(Child{rank, pid});
  }
}

LocalRanks::~LocalRanks() { wait_all(std::chrono::seconds(30)); }

void LocalRanks::reap(Child& c, bool block) {
  if (c.reaped) return;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(c.pid, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == c.pid || (r < 0 && errno == ECHILD)) {
    c.reaped = true;
    c.status = status;
  }
}

std::string LocalRanks::exited() {
  std::string out;
  for (auto& c : children_) {
    reap(c, false);
    if (!c.reaped) continue;
    std::string how = WIFEXITED(c.status) ? "exited with status " + std::to_string(WEXITSTATUS(c.status))
                      : WIFSIGNALED(c.status)
                          ? std::string("was killed by signal ") + strsignal(WTERMSIG(c.status))
                          : "ended";
    out += (out.empty() ? "" : "; ") +
           ("rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ") ") + how;
  }
  return out;
}

void LocalRanks::wait_all(std::chrono::milliseconds grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    bool all = true;
    for (auto& c : children_) {
      reap(c, false);
      all = all && c.reaped;
    }
    if (all) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& c : children_)
    if (!c.reaped) {
      kill(c.pid, SIGKILL);
      reap(c, true);
    }
}

}  // namespace swarm
