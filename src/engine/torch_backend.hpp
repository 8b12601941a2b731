// The torch backend: a Hugging Face model served by the in-process ServingEngine (continuous
// batching over a paged KV cache). Only built with libtorch; the header itself needs no torch.
#pragma once

#include <memory>
#include <string>

#include "dist/dist_config.hpp"
#include "engine/backend.hpp"

namespace swarm {

class RankLeader;

/// A new, unbooted torch backend.
std::unique_ptr<Backend> make_torch_backend();
/// Registers "torch" with make_backend (call once at start-up in programs that link swarm_engine_torch).
void register_torch_backend();

/// Multi-rank training (torchrun convention, see DistConfig): rank 0 serves HTTP and drives
/// `followers`, the other ranks, through the control channel. Registers "torch" so that each
/// boot loads the model on every rank, each policy step trains every rank on its share of the
/// batch (sharded optimizer state, gradients reduce-scattered over c10d), and each checkpoint
/// holds every rank's optimizer shard.
void register_torch_backend(std::shared_ptr<RankLeader> followers, const DistConfig& dist);

/// The loop of a follower rank (RANK > 0): connects to rank 0's control channel at
/// dist.master_addr:dist.master_port and does what it is told until rank 0 closes the channel
/// (returns 0). Throws SwarmError(UNAVAILABLE) when rank 0 cannot be reached or goes away
/// mid-message.
int run_torch_follower(const DistConfig& dist);

/// One line for the start-up log: the CPU, the instruction-set level the CPU kernels run at
/// (base / avx2 / avx512 / avx512bf16, lowered by SWARM_CPU_LEVEL), the path of bf16 matmuls
/// (native bf16 dot products, or widened to fp32 GEMM), and the libtorch version.
std::string compute_paths_summary();

}  // namespace swarm
