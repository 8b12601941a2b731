// Kernel by kernel against ggml (bench_anchor --kernels): our CPU kernels and the ggml ops
// llama.cpp runs for the same work, on the CPU backend bench_anchor loaded, the same shapes
// (SmolLM2-135M's), the same thread count, each side's best time per call with its inputs
// reused (so from the caches where they fit, on both sides alike). Compiled only with
// llama.cpp's headers (SWARM_ANCHOR_WITH_LLAMA), like llama_runner.cpp. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "anchor/llama_runner.hpp"

namespace swarm::bench {

/// One shape on both sides. Times are microseconds per call; 0 = not run on that side.
struct KernelComparison {
  std::string kernel;  // ours
  std::string shape;
  std::string ggml_ops;  // the ggml graph timed against it
  double swarm_fp32_us = 0, swarm_bf16_us = 0;
  double ggml_f32_us = 0, ggml_f16_us = 0, ggml_bf16_us = 0;  // F16 / BF16: weights, or attention's K/V
  std::string note;                                           // what differs between the two sides
};

/// Runs every comparison. The elementwise kernels take `rows_per_op` rows (0: 16384, a
/// prefill's worth over all layers, from memory; quick: 4096); quick also repeats less. Throws
/// std::runtime_error when ggml's functions or its CPU backend cannot be found.
std::vector<KernelComparison> compare_kernels(const LlamaLibrary& lib, int threads, bool quick,
                                              int64_t rows_per_op = 0);

}  // namespace swarm::bench
