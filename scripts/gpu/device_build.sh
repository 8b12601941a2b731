#!/usr/bin/env bash
# Builds swarm on a GPU machine against the PyTorch installed there (CUDA libtorch 2.x) and
# runs the main job on the GPU for a few steps. The machine reaches no package
# registry: the Debian -dev packages swarm needs travel as .deb files in DEPS_DIR (made here by
# `apt-get download`, see the list in docs/gpu.md) and are unpacked into a private prefix.
#
# Usage (repo root, on the GPU machine): OUT=<dir for logs> bash scripts/gpu/device_build.sh [DEPS_DIR]
# Writes to $OUT: configure.log, build.log, env.txt, smoke.log, server.log, metrics.jsonl (and
# run.log for RUN). Knobs: TARGETS (what to build), RUN (a command after the build), SKIP_SMOKE=1,
# STEPS, BUILD_TIMEOUT, SMOKE_TIMEOUT, RUN_TIMEOUT.
set -uo pipefail
deps_dir="${1:-.devdeps}"
out="${OUT:-/tmp/swarm-gpu-out}"
mkdir -p "$out"
prefix=/tmp/swarm-deps
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$out/steps.txt"; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print("cmake_prefix", torch.utils.cmake_prefix_path); print("cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)' 2>&1
  g++ --version 2>&1 | head -1; cmake --version 2>&1 | head -1; ninja --version 2>&1; nvcc --version 2>&1 | tail -1
  grep -o 'avx512[a-z0-9_]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; nproc; cat /etc/os-release | head -2
} >"$out/env.txt" 2>&1
log "env written"

mkdir -p "$prefix"
for f in "$deps_dir"/*.deb; do dpkg -x "$f" "$prefix"; done
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export PKG_CONFIG_PATH="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$torch_lib:$LD_LIBRARY_PATH"
log "deps unpacked into $prefix; torch at $torch_prefix"

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWARM_WITH_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$prefix/usr;$prefix/usr/lib/x86_64-linux-gnu/cmake" \
  -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf" -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/configure.log" 2>&1
log "configure rc=$?"
targets="${TARGETS:-swarm-server swarm-model train_agent}"
timeout "${BUILD_TIMEOUT:-330}" cmake --build build-gpu -j "$(nproc)" --target $targets -- -k 0 >"$out/build.log" 2>&1
log "build rc=$? ($(grep -c 'error:' "$out/build.log") error lines)"
# PyTorch's wheels export their own copies of std::filesystem functions from libtorch.so (64 of
# them in 2.11); loaded ahead of libstdc++ they win symbol lookup, and e.g.
# std::filesystem::remove_all(path, error_code&) then jumps to address 0 (every checkpoint
# test, test_safetensors_torch and the test scratch directories crashed so on the H200). Preloading
# the system libstdc++ keeps the standard library's own (verified: those tests then pass).
export LD_PRELOAD="$(g++ -print-file-name=libstdc++.so.6)"
log "LD_PRELOAD=$LD_PRELOAD (see above)"
# RUN: a command to run after the build (e.g. a test binary), its output in run.log.
if [ -n "${RUN:-}" ]; then
  timeout "${RUN_TIMEOUT:-120}" bash -c "$RUN" >"$out/run.log" 2>&1
  log "run rc=$?"
fi
[ "${SKIP_SMOKE:-0}" = 1 ] && { log "done (no smoke)"; exit 0; }
if [ ! -x build-gpu/swarm-server ] || [ ! -x build-gpu/train_agent ]; then log "no binaries: stop"; exit 0; fi

build-gpu/swarm-model init --preset tiny-char --out /tmp/tiny-char --seed 1 >/dev/null 2>&1
build-gpu/swarm-server start --port 10086 --engine torch >"$out/server.log" 2>&1 &
pid=$!
for i in $(seq 100); do grep -q "listening on" "$out/server.log" && break; sleep 0.2; done
timeout "${SMOKE_TIMEOUT:-90}" build-gpu/train_agent --url http://127.0.0.1:10086 --model /tmp/tiny-char --tasks base,count,sort \
  --steps "${STEPS:-5}" --workers 64 --batch-size 16 --num-repeat 16 --learning-rate 1e-3 --partial-credit shaped \
  --partial-weight 0.5 --max-tokens 0 --max-token-slack 0 --project gpu --experiment smoke --force-restart >"$out/smoke.log" 2>&1
log "smoke rc=$?"
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
cp experiments/gpu/smoke/metrics.jsonl "$out/" 2>/dev/null
log "done"
