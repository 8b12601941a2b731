#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs every test except the `gpu` label.
# Usage: scripts/test.sh [extra ctest args]     (env: BUILD_DIR, SWARM_CMAKE_ARGS, JOBS)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh

build_dir="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"
echo "==> configure ($build_dir)"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWARM_BUILD_TESTS=ON \
  ${SWARM_CMAKE_ARGS:-} >"$build_dir.configure.log" 2>&1 || { cat "$build_dir.configure.log"; exit 1; }
echo "==> build"
cmake --build "$build_dir" -j "$jobs"
echo "==> test"
cd "$build_dir"
ctest --output-on-failure --label-exclude gpu -j "$jobs" --timeout 600 "$@"
