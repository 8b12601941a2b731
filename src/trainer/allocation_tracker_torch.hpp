// How much tensor memory a device holds now and at most since a mark: what the memory report's
// activations_peak_bytes is measured with (the peak of a training step above what the step
// started with: activations, their gradients, temporaries).
//
// On a GPU, the CUDA caching allocator's own statistics (allocated bytes). On the CPU libtorch
// keeps none, so track_cpu_allocations() installs a counting CPU allocator: the same allocation
// as libtorch's default (c10::alloc_cpu), and every block allocated afterwards adds the bytes
// malloc reserved for it, its release subtracts them (an atomic add each).
#pragma once

#include <cstdint>

#include <torch/types.h>

namespace swarm {

/// Installs the counting CPU allocator (process-wide, once; tensors allocated before are not
/// counted, their release neither). Returns false where another allocator of a higher priority
/// is installed (then nothing is counted).
bool track_cpu_allocations();

struct AllocationStats {
  int64_t current = -1;  // bytes held now; -1 = not tracked on this device
  int64_t peak = -1;     // most bytes held since the last mark_allocation_peak
};
AllocationStats allocation_stats(const torch::Device& device);
/// Starts a new peak at what is held now.
void mark_allocation_peak(const torch::Device& device);

}  // namespace swarm
