#!/usr/bin/env bash
# swarm-server on the torch engine bounds OpenMP's busy-wait (common/openmp_wait.hpp): it sets
# GOMP_SPINCOUNT=3000 and re-executes itself (same pid) when neither GOMP_SPINCOUNT nor
# OMP_WAIT_POLICY is set, so libgomp reads the bound when it loads; a user's setting is kept;
# the mock engine starts once. Its start-up line names the CPU level and the libraries' levels.
# Usage: openmp_spin_bound.sh <swarm-server>
set -euo pipefail
server_bin="$1"
work="$(mktemp -d)"
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; cat "$work/log" >&2 2>/dev/null || true; exit 1; }

# run_server ENGINE [VAR=value ...]: starts the server with OMP_DISPLAY_ENV (libgomp prints its
# settings each time it loads), waits until it listens, and leaves its environment in
# $work/environ and libgomp's reports in $work/log.
run_server() {
  local engine="$1"
  shift
  env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=verbose "$@" \
    "$server_bin" start --engine "$engine" --port 0 >"$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    grep -q "listening on" "$work/log" && break
    kill -0 "$pid" 2>/dev/null || fail "server exited"
    sleep 0.1
  done
  grep -q "listening on" "$work/log" || fail "server did not start"
  # The pid started is the one serving: the re-execution keeps it.
  tr '\0' '\n' <"/proc/$pid/environ" >"$work/environ"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
}
spincounts() { grep -o "GOMP_SPINCOUNT = '[^']*'" "$work/log" | tr '\n' ' ' || true; }

run_server torch
grep -qx "GOMP_SPINCOUNT=3000" "$work/environ" || fail "torch engine: GOMP_SPINCOUNT=3000 not in the server's environment"
[ "$(spincounts)" = "GOMP_SPINCOUNT = '300000' GOMP_SPINCOUNT = '3000' " ] ||
  fail "torch engine: libgomp should load with its default, then with 3000 after the restart; saw: $(spincounts)"

# The start-up line names the CPU level and the paths picked, and follows the
# switches that make the machine behave as AVX2.
grep -Eq "kernel level (base|avx2|avx512|avx512bf16); bf16 matmuls .*ATen kernels [A-Z0-9 ]+, oneDNN " "$work/log" ||
  fail "torch engine: no start-up line with the kernel level, the bf16 path and the libraries' levels"

run_server torch GOMP_SPINCOUNT=77 SWARM_CPU_LEVEL=avx2 DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
grep -q "kernel level avx2 (SWARM_CPU_LEVEL=avx2); bf16 matmuls on the packed bf16 GEMM" "$work/log" ||
  fail "SWARM_CPU_LEVEL=avx2: the start-up line should say level avx2 and the packed bf16 GEMM"
grep -Eq "ATen kernels AVX2, oneDNN (avx2|not loaded)\)" "$work/log" ||
  fail "ATEN_CPU_CAPABILITY=avx2 / DNNL_MAX_CPU_ISA=AVX2: the start-up line should say ATen AVX2 and oneDNN avx2"
grep -qx "GOMP_SPINCOUNT=77" "$work/environ" || fail "a user's GOMP_SPINCOUNT was not kept"
[ "$(spincounts)" = "GOMP_SPINCOUNT = '77' " ] || fail "with GOMP_SPINCOUNT set the server must start once; saw: $(spincounts)"

run_server torch OMP_WAIT_POLICY=passive
! grep -q "^GOMP_SPINCOUNT=" "$work/environ" || fail "OMP_WAIT_POLICY set by the user, yet GOMP_SPINCOUNT was added"

run_server mock
! grep -q "^GOMP_SPINCOUNT=" "$work/environ" || fail "the mock engine should not restart with GOMP_SPINCOUNT"
[ "$(spincounts)" = "GOMP_SPINCOUNT = '300000' " ] || fail "the mock engine should start once; saw: $(spincounts)"
echo "openmp_spin_bound: ok"
