#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs every test except the `gpu` label.
# Warnings in swarm's own code are errors here (SWARM_WERROR). Unless ctest args were given, the
# format and clang-tidy checks (scripts/lint.sh; SWARM_LINT=0 skips) run after the build, and
# after the tests (SWARM_ASAN=0 skips) the shutdown check under AddressSanitizer
# (docs/reliability.md, "Shutdown with work in flight") in $BUILD_DIR-asan.
# Usage: scripts/test.sh [extra ctest args]
#        (env: BUILD_DIR, SWARM_CMAKE_ARGS, JOBS, SWARM_LINT, SWARM_ASAN)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh

build_dir="${BUILD_DIR:-build}"
# One cache for both build trees: the libtorch-based libraries of the AddressSanitizer build
# are compiled exactly as in the main one, so they come from the cache.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
jobs="${JOBS:-$(nproc)}"
echo "==> configure ($build_dir)"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWARM_BUILD_TESTS=ON -DSWARM_WERROR=ON \
  ${SWARM_CMAKE_ARGS:-} >"$build_dir.configure.log" 2>&1 || { cat "$build_dir.configure.log"; exit 1; }
echo "==> build"
cmake --build "$build_dir" -j "$jobs"
if [ "${SWARM_LINT:-1}" != 0 ] && [ $# -eq 0 ]; then
  echo "==> lint"
  bash scripts/lint.sh "$build_dir"
fi
echo "==> test"
(cd "$build_dir" && ctest --output-on-failure --label-exclude gpu -j "$jobs" --timeout 600 "$@")

if [ "${SWARM_ASAN:-1}" != 0 ] && [ $# -eq 0 ]; then
  asan_dir="$build_dir-asan"
  echo "==> AddressSanitizer: configure and build swarm-server ($asan_dir)"
  cmake -S . -B "$asan_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWARM_BUILD_TESTS=OFF \
    -DSWARM_BUILD_BENCH=OFF -DSWARM_SANITIZE=address -DSWARM_SANITIZE_TORCH=OFF ${SWARM_CMAKE_ARGS:-} \
    >"$asan_dir.configure.log" 2>&1 || { cat "$asan_dir.configure.log"; exit 1; }
  cmake --build "$asan_dir" -j "$jobs" --target swarm-server
  echo "==> AddressSanitizer: SIGTERM with work in flight"
  /usr/bin/python3 tests/asan/shutdown_in_flight.py --server "$asan_dir/swarm-server" --engine mock
  if grep -q "torch backend ON" "$asan_dir.configure.log"; then
    /usr/bin/python3 tests/asan/shutdown_in_flight.py --server "$asan_dir/swarm-server" --engine torch \
      --model-bin "$build_dir/swarm-model"
  fi
fi
