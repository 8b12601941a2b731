#include "trainer/allocation_tracker_torch.hpp"

#include <atomic>
#include <cstring>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <malloc.h>

#ifdef SWARM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace swarm {
namespace {

std::atomic<int64_t> g_current{0}, g_peak{0};
std::atomic<bool> g_tracking{false};

void raise_peak(int64_t now) {
  int64_t seen = g_peak.load(std::memory_order_relaxed);
  while (now > seen && !g_peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
}

// The bytes behind an allocation of c10::alloc_cpu (posix_memalign underneath): what malloc
// reserved for it, known from the pointer alone at release.
int64_t usable_bytes(void* p) { return p == nullptr ? 0 : static_cast<int64_t>(malloc_usable_size(p)); }

void release_counted(void* p) {
  g_current.fetch_sub(usable_bytes(p), std::memory_order_relaxed);
  c10::free_cpu(p);
}

// libtorch's CPU allocation (c10::alloc_cpu, as its default allocator does) with a count in
// front. The data pointer is its own context, so libtorch's raw allocations (raw_allocate, which
// some kernels use for their buffers) work through it too. Both spellings of allocate: libtorch
// before 2.3 declares it const, later ones not (and add copy_data); each build overrides the one
// it has.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const { return counted(n); }  // NOLINT(modernize-use-override)
  c10::DataPtr allocate(size_t n) { return counted(n); }        // NOLINT(modernize-use-override)
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const override { return &release_counted; }

 private:
  static c10::DataPtr counted(size_t n) {
    void* p = n == 0 ? nullptr : c10::alloc_cpu(n);
    const int64_t bytes = usable_bytes(p);
    raise_peak(g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    return c10::DataPtr(p, p, &release_counted, c10::Device(c10::DeviceType::CPU));
  }
};

}  // namespace

bool track_cpu_allocations() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingCpuAllocator counting;
    c10::SetCPUAllocator(&counting, /*priority=*/1);
    g_tracking = c10::GetCPUAllocator() == &counting;
  });
  return g_tracking;
}

AllocationStats allocation_stats(const torch::Device& device) {
#ifdef SWARM_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return {stats.allocated_bytes[0].current, stats.allocated_bytes[0].peak};
  }
#endif
  if (!device.is_cpu() || !g_tracking) return {};
  return {g_current.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed)};
}

void mark_allocation_peak(const torch::Device& device) {
#ifdef SWARM_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    return;
  }
#endif
  if (device.is_cpu()) g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // namespace swarm
