#!/usr/bin/env bash
# The main job: build swarm, create a small model (SmolLM2's tokenizer and chat template,
# random weights), start swarm-server on the torch engine, run the example agent through
# several weight-sync cycles, stop the server. Installs what is missing first.
# Usage: scripts/demo.sh [--steps N] [--workers N] [--port P] [--engine torch|mock]
#   (env: BUILD_DIR, default build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

steps=3 workers=8 port=10086 engine=torch
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --engine) engine="$2"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "demo: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
build_dir="${BUILD_DIR:-build}"
echo "==> building swarm-server, swarm-model and echo_agent in $build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build_dir.configure.log" 2>&1 \
  || { cat "$build_dir.configure.log"; exit 1; }
cmake --build "$build_dir" --target swarm-server swarm-model echo_agent -j "$(nproc)"

model="mock-echo"
if [ "$engine" = torch ]; then
  model="$build_dir/models/tiny-smollm2"
  shared="${SWARM_SHARED_DIR:-../shared}"
  if [ ! -f "$model/model.safetensors" ]; then
    [ -d "$shared/models/smollm2-135m-instruct-noweights" ] \
      || { echo "demo: the model fixtures are missing at $shared/models (set SWARM_SHARED_DIR)" >&2; exit 1; }
    echo "==> creating $model: SmolLM2's tokenizer and chat template, 2 layers x 64 wide, random weights"
    "$build_dir/swarm-model" init --from "$shared/models/smollm2-135m-instruct-noweights" \
      --out "$model" --dtype f32 --seed 1 --set hidden_size=64 --set intermediate_size=128 \
      --set num_hidden_layers=2 --set num_attention_heads=4 --set num_key_value_heads=2
  fi
fi

log="$build_dir/swarm-server.log"
echo "==> starting swarm-server on 127.0.0.1:$port ($engine engine), log: $log"
"$build_dir/swarm-server" start --port "$port" --engine "$engine" >"$log" 2>&1 &
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
"$build_dir/echo_agent" --url "http://127.0.0.1:$port" --steps "$steps" --workers "$workers" --model "$model"

echo "==> stopping swarm-server"
cleanup
trap - EXIT
echo "==> engine transitions seen by the server:"
grep -E "engine: .* -> |torch engine: " "$log" | sed 's/^/    /'
echo "done. Server log: $log"
