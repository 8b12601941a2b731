// Where this process sits in a multi-rank job (the torchrun convention). No torch: the server
// reads it before it knows whether it will load a model.
#pragma once

#include <chrono>
#include <string>

namespace swarm {

struct DistConfig {
  int rank = 0;
  int world_size = 1;
  int local_world_size = 1;  // ranks sharing this machine (they split its cores)
  int local_rank = 0;        // this rank's index on its machine (LOCAL_RANK; picks its GPU)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds timeout{60000};  // any collective or the rendezvous waiting longer fails
  /// The rendezvous secret every rank of the job proves it knows when it joins (the control
  /// channel's handshake, src/dist/rank_channel.cpp). SWARM_RENDEZVOUS_SECRET; --nproc on one
  /// machine makes a random one; several machines must share one (--rendezvous-secret-file).
  std::string secret;

  /// From RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_WORLD_SIZE, LOCAL_RANK (default:
  /// RANK modulo LOCAL_WORLD_SIZE), SWARM_RENDEZVOUS_SECRET (and optionally
  /// SWARM_DIST_TIMEOUT_SECONDS). Unset WORLD_SIZE -> single process (RANK, if set, must then
  /// be 0). With WORLD_SIZE > 1, RANK is required; MASTER_ADDR / MASTER_PORT default to the
  /// values above; LOCAL_WORLD_SIZE defaults to WORLD_SIZE (every rank on this machine).
  /// Bad values -> SwarmError(INVALID_ARGUMENT) naming the variable.
  static DistConfig from_env();
};

}  // namespace swarm
