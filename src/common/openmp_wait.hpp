// How long OpenMP's idle workers busy-wait, bounded for the whole process before it starts.
#pragma once

namespace swarm {

/// GOMP_SPINCOUNT swarm's programs run with unless the user set it or OMP_WAIT_POLICY.
inline constexpr const char* kOpenMpSpinCount = "3000";

/// Bound OpenMP's busy-wait. libgomp (libtorch's OpenMP pool) lets an idle worker spin
/// 300000 times (on the order of a millisecond) before it sleeps. Inside one decode step or
/// training step the next parallel region starts microseconds later, so a short spin keeps the
/// workers warm; a long one takes the core another process on the same machine needs (two
/// servers, a server beside its agents, ctest -j2: measured 2.7x to over 4x slower side by side).
/// With 3000 spins (tens of microseconds) two learning runs side by side were faster than under
/// OpenBLAS's own pool (30000 and more: slower); alone, decode stayed within noise of the default
/// and fp32 prefill lost about 20 % (docs/benchmarks.md, "One thread pool for every op"). A
/// passive wait (0) was faster still side by side but cost ~15 % at decode batch 1 alone.
///
/// libgomp reads GOMP_SPINCOUNT only when it loads, before main, so when OpenMP is in this
/// process and neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set, this sets
/// GOMP_SPINCOUNT=kOpenMpSpinCount and re-executes the program (/proc/self/exe, same argv, same
/// pid). Call it first thing in main, before any thread or file is opened. Returns normally
/// when there is nothing to do or the re-execution fails (the program then runs with libgomp's
/// default).
void bound_openmp_spin_wait(char** argv);

/// "GOMP_SPINCOUNT=3000", "OMP_WAIT_POLICY=passive", ... or "libgomp default spin", for the
/// start-up log and the bench headers.
const char* openmp_wait_setting();

}  // namespace swarm
