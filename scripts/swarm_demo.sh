#!/usr/bin/env bash
# A swarm of two servers on this machine (SAPO, docs/sapo.md): one nats-server with JetStream
# on 127.0.0.1, two swarm-servers on the torch engine (ports 10086 and 10087) that start from
# the same tiny-char model, and two train_agents. Each policy step of each node trains on 4 of
# its own task groups and 4 drawn from the other node. At the end it prints each node's reward
# (its own episodes) and what the nodes shared. Installs and builds what is missing first.
# Watch a node meanwhile: build/swarm-overwatch --url http://127.0.0.1:10087
# Usage: scripts/swarm_demo.sh [--steps 120] [--port 10086] [--nats-port 4222]   (env: BUILD_DIR)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
steps=120 port=10086 nats_port=4222
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --nats-port) nats_port="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "swarm_demo: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
build="${BUILD_DIR:-build}"
echo "==> building swarm-server, swarm-model, train_agent in $build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" --target swarm-server swarm-model train_agent -j "$(nproc)"
build="$(cd "$build" && pwd)"
model="$build/models/tiny-char-2x192"
[ -f "$model/model.safetensors" ] || "$build/swarm-model" init --preset tiny-char --set hidden_size=192 \
  --set num_hidden_layers=2 --out "$model" --seed 1 >/dev/null

work="$root/experiments/swarm-demo"
rm -rf "$work"
mkdir -p "$work"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
echo "==> nats-server (JetStream) on 127.0.0.1:$nats_port, store in $work/nats"
nats-server -js -sd "$work/nats" -a 127.0.0.1 -p "$nats_port" -l "$work/nats.log" &
pids+=($!)
for node in a b; do
  p=$([ "$node" = a ] && echo "$port" || echo $((port + 1)))
  mkdir -p "$work/node-$node"
  (cd "$work/node-$node" && exec "$build/swarm-server" start --port "$p" --engine torch >server.log 2>&1) &
  pids+=($!)
  printf 'model: %s\nengine_threads: 1\nexchange_url: nats://127.0.0.1:%s\nswarm_name: demo\nnode_id: node-%s\nsapo_external_groups: 4\n' \
    "$model" "$nats_port" "$node" >"$work/node-$node/job.yaml"
done
for p in "$port" $((port + 1)); do
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$p/health" >/dev/null 2>&1 && break; sleep 0.1; done
done
echo "==> node-a on :$port and node-b on :$((port + 1)): $steps steps of 4 local + 4 external groups each"
agents=()
for node in a b; do
  p=$([ "$node" = a ] && echo "$port" || echo $((port + 1)))
  seed=$([ "$node" = a ] && echo 101 || echo 102)
  (cd "$work/node-$node" && exec "$build/train_agent" --url "http://127.0.0.1:$p" --model "$model" --job job.yaml \
    --tasks base --steps "$steps" --batch-size 4 --num-repeat 8 --workers 32 --learning-rate 5e-4 \
    --ppo-mini-batch-size 4 --partial-credit shaped --partial-weight 0.5 --max-tokens 0 --max-token-slack 0 \
    --seed "$seed" --project swarm-demo --experiment "node-$node" >agent.log 2>&1) &
  agents+=($!)
done
for a in "${agents[@]}"; do wait "$a" || { tail -n 20 "$work"/node-*/agent.log; exit 1; }; done
for node in a b; do
  echo "node-$node: $(grep '^summary: ' "$work/node-$node/agent.log" | head -1 | sed 's/^summary: //')"
  /usr/bin/python3 - "$work/node-$node/experiments/swarm-demo/node-$node/metrics.jsonl" <<'PY2'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1]
print("  shared: published %d groups, accepted %d of the other node's, trained on %d external groups in %d steps"
      % (last.get("exchange_published", 0), last.get("exchange_accepted", 0),
         sum(r.get("external_groups", 0) for r in rows), len(rows)))
PY2
done
echo "==> logs, metrics and checkpoints in $work (each node: experiments/swarm-demo/node-*/metrics.jsonl)"
