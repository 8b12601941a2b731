// `swarm-server start --nproc N`: starts ranks 1..N-1 of a local multi-rank job as copies of
// this program (torchrun's convention: RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT in their environment) and reaps them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "dist/dist_config.hpp"

namespace swarm {

/// The follower processes of a local job. Thread-compatible (the main thread owns it).
class LocalRanks {
 public:
  /// Re-executes this program (/proc/self/exe) with `argv` for ranks 1..nproc-1, the job's
  /// variables set in their environment. The children die with this process (PDEATHSIG) and
  /// start with SIGINT/SIGTERM blocked: a Ctrl-C in the terminal reaches the whole process
  /// group, and the followers must stay alive until rank 0 has written its last checkpoint
  /// (they exit when rank 0 closes the control channel). Throws SwarmError(UNAVAILABLE) when a
  /// process cannot be started.
  /// `self` is the process that starts them: local rank 0 of its machine, global rank
  /// self.rank; the children are ranks self.rank + 1 .. self.rank + self.local_world_size - 1
  /// of a job of self.world_size ranks, told rank 0's address and the rendezvous secret.
  explicit LocalRanks(const DistConfig& self, const std::vector<std::string>& argv);
  /// wait_all(30 s).
  ~LocalRanks();
  LocalRanks(const LocalRanks&) = delete;
  LocalRanks& operator=(const LocalRanks&) = delete;

  /// "rank 1 (pid P) exited with status S; ..." for children that already exited ("" if none).
  std::string exited();
  /// Waits up to `grace` for every child to exit, then kills what is left.
  void wait_all(std::chrono::milliseconds grace);

 private:
  struct Child {
    int rank;
    pid_t pid;
    bool reaped = false;
    int status = 0;
  };
  void reap(Child& c, bool block);
  std::vector<Child> children_;
};

}  // namespace swarm
