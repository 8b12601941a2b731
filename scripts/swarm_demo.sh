#!/usr/bin/env bash
# A swarm of two servers on this machine (SAPO, docs/sapo.md): one nats-server with JetStream
# on 127.0.0.1, two swarm-servers on the torch engine that start from the same tiny-char model,
# and two train_agents. Each policy step of each node trains on 4 of its own task groups and 4
# drawn from the other node. Every port is a free one the servers pick themselves (a server
# already on 10086 is left alone). At the end it prints each node's reward and what the nodes
# shared; each node's run is in experiments/swarm-demo/node-a and node-b (server.log,
# agent.log, metrics.jsonl, checkpoints). Builds only what is missing (installing first).
# Usage: scripts/swarm_demo.sh [--steps 120] [--no-build]   (env: BUILD_DIR, default build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
steps=120 build_missing=1
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --no-build) build_missing=0; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "swarm_demo: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "swarm_demo: --steps takes a positive number, not '$steps'" >&2; exit 2; }

build="${BUILD_DIR:-build}"
missing=()
for b in swarm-server swarm-model train_agent; do [ -x "$build/$b" ] || missing+=("$b"); done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$build_missing" -eq 0 ]; then
    echo "swarm_demo: --no-build, but $build lacks ${missing[*]} (build them, or leave out --no-build)" >&2
    exit 2
  fi
  bash scripts/setup.sh
  echo "==> building ${missing[*]} in $build"
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build.configure.log" 2>&1 \
      || { cat "$build.configure.log"; exit 1; }
  fi
  cmake --build "$build" --target "${missing[@]}" -j "$(nproc)"
fi
command -v nats-server >/dev/null || {
  [ "$build_missing" -eq 1 ] && bash scripts/setup.sh
  command -v nats-server >/dev/null || { echo "swarm_demo: nats-server is missing (scripts/setup.sh)" >&2; exit 2; }
}
build="$(cd "$build" && pwd)"
model="$build/models/tiny-char-2x192"
[ -f "$model/model.safetensors" ] || "$build/swarm-model" init --preset tiny-char --set hidden_size=192 \
  --set num_hidden_layers=2 --out "$model" --seed 1 >/dev/null

work="$root/experiments/swarm-demo"
rm -rf "$work"
mkdir -p "$work/nats-ports"
source "$root/tests/support/server_port.sh"
pids=()
# Disowned before the kill: the shell then reports no "Killed ..." line for them.
stop_all() {
  for p in "${pids[@]}"; do disown "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
}
trap stop_all EXIT
nats-server -js -sd "$work/nats" -a 127.0.0.1 -p -1 --ports_file_dir "$work/nats-ports" -l "$work/nats.log" &
pids+=($!)
nats_port=""
for _ in $(seq 1 200); do
  nats_port="$(cat "$work"/nats-ports/*.ports 2>/dev/null | sed -n 's/.*127.0.0.1:\([0-9]*\).*/\1/p' | head -1 || true)"
  [ -n "$nats_port" ] && break
  sleep 0.05
done
[ -n "$nats_port" ] || { echo "swarm_demo: nats-server did not start ($work/nats.log)" >&2; exit 1; }
echo "==> nats-server (JetStream) on 127.0.0.1:$nats_port"
declare -A node_port
for node in a b; do
  dir="$work/node-$node"
  mkdir -p "$dir"
  # The run's files go to this directory itself: experiments/swarm-demo/node-<x>.
  printf 'model: %s\nexperiment_dir: %s\nproject_name: swarm-demo\nexperiment_name: node-%s\nengine_threads: 1\nexchange_url: nats://127.0.0.1:%s\nswarm_name: demo\nnode_id: node-%s\nsapo_external_groups: 4\n' \
    "$model" "$root/experiments" "$node" "$nats_port" "$node" >"$dir/job.yaml"
  (cd "$dir" && exec "$build/swarm-server" start --port 0 --engine torch >server.log 2>&1) &
  spid=$!
  pids+=("$spid")
  wait_for_port "$dir/server.log" "$spid" 600 0.1 || {
    echo "swarm_demo: node-$node: $server_problem; its log:" >&2
    tail -n 20 "$dir/server.log" >&2
    exit 1
  }
  node_port[$node]="$port"
done
echo "==> node-a on 127.0.0.1:${node_port[a]}, node-b on 127.0.0.1:${node_port[b]}: $steps steps of 4 local + 4 external groups each"
echo "    watch one: $build/swarm-overwatch --url http://127.0.0.1:${node_port[a]}"
agents=()
for node in a b; do
  seed=$([ "$node" = a ] && echo 101 || echo 102)
  (cd "$work/node-$node" && exec "$build/train_agent" --url "http://127.0.0.1:${node_port[$node]}" --job job.yaml \
    --tasks base --steps "$steps" --batch-size 4 --num-repeat 8 --workers 32 --learning-rate 5e-4 \
    --ppo-mini-batch-size 4 --partial-credit shaped --partial-weight 0.5 --max-tokens 0 --max-token-slack 0 \
    --seed "$seed" >agent.log 2>&1) &
  agents+=($!)
done
for a in "${agents[@]}"; do
  wait "$a" || { echo "swarm_demo: an agent failed; the end of its log:" >&2; tail -n 20 "$work"/node-*/agent.log >&2; exit 1; }
done
for node in a b; do
  echo "node-$node: $(grep '^summary: ' "$work/node-$node/agent.log" | head -1 | sed 's/^summary: //')"
  /usr/bin/python3 - "$work/node-$node/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1]
local = [r["local_reward_mean"] for r in rows if r.get("local_reward_mean") is not None]
k = max(1, min(10, len(local) // 2))
print("  shared: published %d groups, accepted %d of the other node's, trained on %d external groups in %d steps"
      % (last.get("exchange_published", 0), last.get("exchange_accepted", 0),
         sum(r.get("external_groups", 0) for r in rows), len(rows)))
if local:
    print("  its own episodes' reward: %.3f over the first %d steps, %.3f over the last %d"
          % (sum(local[:k]) / k, k, sum(local[-k:]) / k, k))
PY
done
cat <<EOF
==> each node's run: $work/node-a and $work/node-b (metrics.jsonl, checkpoints, server.log, agent.log)
    Did sharing help? One run of one seed cannot say: seeds differ more than sharing moves the
    reward. scripts/sapo_experiment.sh runs the comparison (sharing splits against training
    alone, the same steps, 5 seeds); docs/sapo.md has its figures.
EOF
