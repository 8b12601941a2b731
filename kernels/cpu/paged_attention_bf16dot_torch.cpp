// The bf16 decode-attention kernel with its scores as VDPBF16PS dot products: the templates of
// paged_attention_kernels.inc, defined here under an AVX512_BF16 target pragma. Every header
// is included before the pragma, so only the kernel templates (internal linkage) get that
// target: an inline function of a library header compiled for it could be the copy the linker
// keeps for the whole program. Called only where cpu_has_avx512_bf16() (paged_attention_torch.cpp).
#if defined(__x86_64__) && defined(__GNUC__)
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_vec.hpp"
#include "kernels/cpu/paged_attention_torch.hpp"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,bmi2")
#define SWARM_ATTENTION_DOT 1
#include "kernels/cpu/paged_attention_kernels.inc"

namespace swarm::paged_attention_detail {

void run_range_bf16_dot(const Args& a, int64_t begin, int64_t end) {
  run_range<c10::BFloat16, 16, true>(a, begin, end);
}

}  // namespace swarm::paged_attention_detail
#pragma GCC pop_options
#endif
