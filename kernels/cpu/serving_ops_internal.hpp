// What the serving ops' two source files share (serving_ops_torch.cpp: the ops that repeat a
// libtorch op chain rounding for rounding, compiled without multiply-add contraction;
// exp_ops_torch.cpp: the ops built on the exponential, with it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "common/error.hpp"

namespace swarm::serving_ops {

#define SWARM_INLINE inline __attribute__((always_inline))

// Rows per parallel chunk: about 16K elements of work each, so one-row decode steps stay on
// the calling thread.
inline int64_t grain_for(int64_t elements_per_row) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, elements_per_row));
}

inline void check_cpu_dtype(const at::Tensor& t, const char* what) {
  SWARM_CHECK(t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16),
              std::string(what) + ": fp32 or bf16 CPU tensors only");
}

}  // namespace swarm::serving_ops
