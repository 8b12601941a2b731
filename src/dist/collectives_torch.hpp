// Collective operations for sharded data-parallel training: an interface, a single-process
// implementation, and one over torch c10d (Gloo for CPU tensors, NCCL for CUDA tensors).
// The c10d headers stay inside collectives_torch.cpp.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist/dist_config.hpp"

namespace swarm {

/// Collective operations across the ranks of a job. All ranks must call the same operations in
/// the same order with tensors of the same shape and dtype. Tensors are contiguous. Every
/// failure (a peer died, a timeout, a mismatch) throws SwarmError(UNAVAILABLE) with a message
/// saying which operation failed, on which rank, and why — never a hang past the timeout.
/// After such a failure the object is unusable: every later call throws UNAVAILABLE too.
/// Arguments that are wrong locally (sizes that do not fit, a non-contiguous tensor, a bad
/// root) throw SwarmError(INVALID_ARGUMENT) before anything is sent.
/// Not thread-safe: one thread issues the collectives of a job, in program order.
class Collectives {
 public:
  virtual ~Collectives() = default;
  /// This process's rank, in [0, world_size()).
  virtual int rank() const = 0;
  /// Number of ranks in the job.
  virtual int world_size() const = 0;
  /// "single", "gloo" or "nccl".
  virtual std::string backend_name() const = 0;
  /// Sums `t` over ranks, in place.
  virtual void all_reduce_sum(torch::Tensor& t) = 0;
  /// `full` has world_size * shard.numel() elements; rank r receives in `shard` the sum over
  /// ranks of full[r*n : (r+1)*n] (n = shard.numel(), both viewed flat). `full` is unchanged.
  virtual void reduce_scatter_sum(const torch::Tensor& full, torch::Tensor& shard) = 0;
  /// Concatenates every rank's `shard` (rank order) into `full` (world_size * shard.numel()).
  virtual void all_gather(const torch::Tensor& shard, torch::Tensor& full) = 0;
  /// Copies `t` of rank `root` into `t` on every rank.
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  /// Returns once every rank has entered the barrier.
  virtual void barrier() = 0;
};

/// Sums `values` over the ranks of `comm` as one fp64 tensor on `device`, the training device
/// (NCCL takes CUDA tensors only, Gloo CPU ones: statistics built on the host would fail there),
/// and returns the sums. One rank: `values` unchanged.
std::vector<double> all_reduce_sum_values(Collectives& comm, const std::vector<double>& values,
                                          const torch::Device& device);
/// Every rank's `values` (the same count on each), in rank order, gathered as one fp64 tensor on
/// `device`.
std::vector<double> all_gather_values(Collectives& comm, const std::vector<double>& values,
                                      const torch::Device& device);

/// One rank, no communication (copies where the shapes say so).
std::unique_ptr<Collectives> make_single_process_collectives();

/// c10d over an authenticated rendezvous store at master_addr:master_port (rank 0 hosts it; only
/// ranks proving config.secret get in: key_value_store.hpp): Gloo for
/// CPU tensors, or NCCL for CUDA tensors when `cuda` (needs a build with SWARM_WITH_CUDA; a
/// CPU-only build throws INVALID_ARGUMENT). Blocks until every rank has joined; a rendezvous
/// not complete within config.timeout throws SwarmError(UNAVAILABLE). world_size 1 returns the
/// single-process implementation. Gloo binds to GLOO_SOCKET_IFNAME when set, to loopback when
/// master_addr is a loopback address, and otherwise to the address of this host's name.
std::unique_ptr<Collectives> make_collectives(const DistConfig& config, bool cuda = false);

}  // namespace swarm
