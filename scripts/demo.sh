#!/usr/bin/env bash
# The main job: build swarm, start swarm-server, run the example agent through several
# weight-sync cycles, stop the server. Installs what is missing first.
# Usage: scripts/demo.sh [--steps N] [--workers N] [--port P]
#   (env: BUILD_DIR, default build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

steps=3 workers=8 port=10086
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "demo: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
build_dir="${BUILD_DIR:-build}"
echo "==> building swarm-server and echo_agent in $build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build_dir.configure.log" 2>&1 \
  || { cat "$build_dir.configure.log"; exit 1; }
cmake --build "$build_dir" --target swarm-server echo_agent -j "$(nproc)"

log="$build_dir/swarm-server.log"
echo "==> starting swarm-server on 127.0.0.1:$port (mock engine), log: $log"
"$build_dir/swarm-server" start --port "$port" --engine mock >"$log" 2>&1 &
server_pid=$!
cleanup() {
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

for _ in $(seq 1 100); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then echo "swarm-server exited; see $log" >&2; cat "$log" >&2; exit 1; fi
  sleep 0.1
done

echo "==> running echo_agent: $steps policy steps with $workers workers"
"$build_dir/echo_agent" --url "http://127.0.0.1:$port" --steps "$steps" --workers "$workers"

echo "==> stopping swarm-server"
cleanup
trap - EXIT
echo "==> engine transitions seen by the server:"
grep -E "engine: .* -> " "$log" | sed 's/^/    /'
echo "done. Server log: $log"
