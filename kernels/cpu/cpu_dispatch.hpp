// Picking an instruction set for the hand-written CPU kernels at run time.
//
// A kernel is compiled three times, for AVX-512, for AVX2 + FMA and for baseline x86-64, and
// called through the best copy this CPU supports (cpu_pick). GCC's
// target_clones("arch=skylake-avx512", "arch=haswell", "default") is not used on purpose: its
// resolver tests __builtin_cpu_is, which names Intel micro-architectures, so on an AMD CPU with
// AVX-512 both "arch=" clones were skipped and the baseline SSE2 copy ran (measured on this
// machine's EPYC: the decode attention and small-row linear kernels ran their SSE2 copies).
// What matters is the instruction set, and that is what is checked here.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/env.hpp"

namespace swarm {

/// AVX512_BF16 adds the bf16 dot-product instruction (VDPBF16PS) to AVX512; the kernels that
/// use it have one extra copy, picked by cpu_has_avx512_bf16().
enum class CpuLevel { BASE = 0, AVX2 = 1, AVX512 = 2, AVX512_BF16 = 3 };

/// The best level this CPU supports (GCC's cpu feature checks include the OS's saved register
/// state), lowered by the environment variable SWARM_CPU_LEVEL=base|avx2|avx512 when set (to
/// test the other copies); computed once per process.
inline CpuLevel cpu_level() noexcept {
  static const CpuLevel level = [] {
    CpuLevel best = CpuLevel::BASE;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool avx2 =
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
    best = bf16 ? CpuLevel::AVX512_BF16 : avx512 ? CpuLevel::AVX512 : avx2 ? CpuLevel::AVX2 : CpuLevel::BASE;
#endif
    const std::string want = env_value("SWARM_CPU_LEVEL").value_or("");
    CpuLevel cap = best;
    if (want == "base") cap = CpuLevel::BASE;
    if (want == "avx2") cap = CpuLevel::AVX2;
    if (want == "avx512") cap = CpuLevel::AVX512;
    return static_cast<int>(cap) < static_cast<int>(best) ? cap : best;
  }();
  return level;
}

/// "avx512bf16", "avx512", "avx2" or "base".
inline const char* cpu_level_name(CpuLevel level) noexcept {
  switch (level) {
    case CpuLevel::AVX512_BF16:
      return "avx512bf16";
    case CpuLevel::AVX512:
      return "avx512";
    case CpuLevel::AVX2:
      return "avx2";
    default:
      return "base";
  }
}

/// Whether the AVX512_BF16 copies may run (the CPU has VDPBF16PS and SWARM_CPU_LEVEL allows it).
inline bool cpu_has_avx512_bf16() noexcept { return cpu_level() == CpuLevel::AVX512_BF16; }

/// Floats per vector in the copy cpu_pick chooses (the W of SWARM_KERNEL_COPIES): 16 on
/// AVX-512, 8 otherwise.
inline int cpu_vector_floats() noexcept {
  return static_cast<int>(cpu_level()) >= static_cast<int>(CpuLevel::AVX512) ? 16 : 8;
}

/// The copy of a kernel for this CPU's level (the AVX-512 copy on AVX512_BF16 CPUs).
template <class Fn>
Fn cpu_pick(Fn avx512, Fn avx2, Fn base) noexcept {
  switch (cpu_level()) {
    case CpuLevel::AVX512_BF16:
    case CpuLevel::AVX512:
      return avx512;
    case CpuLevel::AVX2:
      return avx2;
    default:
      return base;
  }
}

}  // namespace swarm

// Attributes for the AVX-512 and AVX2 copies (empty off x86-64 GCC/Clang, where the three
// copies are the same code).
#if defined(__x86_64__) && defined(__GNUC__)
#define SWARM_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi2")))
#define SWARM_TARGET_AVX2 __attribute__((target("avx2,fma,bmi2")))
#define SWARM_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,bmi2")))
#define SWARM_HAVE_X86_KERNELS 1
#else
#define SWARM_TARGET_AVX512
#define SWARM_TARGET_AVX2
#define SWARM_HAVE_X86_KERNELS 0
#endif

/// The three copies of a kernel body `impl<T, W>(const Args&, int64_t begin, int64_t end)` for
/// each of fp32 and bf16 (W: 16 floats per vector on AVX-512, 8 otherwise), and `name(bf16)`,
/// the copy for this CPU. Needs <c10/util/BFloat16.h>.
#define SWARM_KERNEL_COPIES(name, Args, impl)                                                              \
  SWARM_TARGET_AVX512 void name##_f32_avx512(const Args& a, int64_t b, int64_t e) {                        \
    impl<float, 16>(a, b, e);                                                                              \
  }                                                                                                        \
  SWARM_TARGET_AVX2 void name##_f32_avx2(const Args& a, int64_t b, int64_t e) { impl<float, 8>(a, b, e); } \
  void name##_f32_base(const Args& a, int64_t b, int64_t e) { impl<float, 8>(a, b, e); }                   \
  SWARM_TARGET_AVX512 void name##_bf16_avx512(const Args& a, int64_t b, int64_t e) {                       \
    impl<c10::BFloat16, 16>(a, b, e);                                                                      \
  }                                                                                                        \
  SWARM_TARGET_AVX2 void name##_bf16_avx2(const Args& a, int64_t b, int64_t e) {                           \
    impl<c10::BFloat16, 8>(a, b, e);                                                                       \
  }                                                                                                        \
  void name##_bf16_base(const Args& a, int64_t b, int64_t e) { impl<c10::BFloat16, 8>(a, b, e); }          \
  using name##_fn = void (*)(const Args&, int64_t, int64_t);                                               \
  name##_fn name(bool bf16) {                                                                              \
    return bf16 ? ::swarm::cpu_pick<name##_fn>(name##_bf16_avx512, name##_bf16_avx2, name##_bf16_base)     \
                : ::swarm::cpu_pick<name##_fn>(name##_f32_avx512, name##_f32_avx2, name##_f32_base);       \
  }
