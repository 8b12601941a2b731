#!/usr/bin/env bash
# sapo_experiment: does sharing experience across a swarm beat training alone? (SAPO, docs/sapo.md)
#
# For each seed and each split I/J (I local task groups + J external ones per policy step, I + J
# fixed) it starts one nats-server (JetStream, a fresh store) and N swarm-servers on the torch
# engine, each with its own copy of one tiny-char base model (2 x 192, random weights from the
# seed: every node starts from the same model, as in the paper), and N train_agents (task and
# sampling seeds differ per node). Every node publishes its groups and draws J of the others'
# per step; I/J = G/0 is the no-sharing baseline (no exchange at all). It records each node's
# reward per step (its own episodes only) and reports, per split, the cumulative reward (the
# sum over steps of a node's mean reward, averaged over nodes) with its spread across seeds,
# writes curves/<I>_<J>.jsonl (mean over nodes and seeds per step, std across seeds) and draws
# them with swarm-plot into sapo_reward.png.
#
# Usage: scripts/sapo_experiment.sh [--build DIR] [--out DIR] [--nodes 4] [--groups 8]
#          [--splits "8/0 6/2 4/4 2/6"] [--seeds "1 2 3 4 5"] [--steps 150] [--num-repeat 8]
#          [--tasks base] [--learning-rate 5e-4] [--job-extra "record_samples: true"]
# Needs a build with torch (swarm-server, swarm-model, train_agent, swarm-plot) and nats-server
# (scripts/setup.sh). With 4 nodes on 2 cores a split and seed of 150 steps took ~40 s (the
# defaults: ~15 minutes in all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build" out="" nodes=4 groups=8 splits="8/0 6/2 4/4 2/6" seeds="1 2 3 4 5" steps=150 repeat=8
family=base lr=5e-4 extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    --groups) groups="$2"; shift 2 ;;
    --splits) splits="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --num-repeat) repeat="$2"; shift 2 ;;
    --tasks) family="$2"; shift 2 ;;
    --learning-rate) lr="$2"; shift 2 ;;
    --job-extra) extra="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "sapo_experiment: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
for b in swarm-server swarm-model train_agent swarm-plot; do
  [ -x "$build/$b" ] || { echo "sapo_experiment: $build/$b is missing (cmake --build $build)" >&2; exit 2; }
done
command -v nats-server >/dev/null || { echo "sapo_experiment: nats-server is missing (scripts/setup.sh)" >&2; exit 2; }
for split in $splits; do
  i="${split%/*}" j="${split#*/}"
  [[ "$i" =~ ^[0-9]+$ && "$j" =~ ^[0-9]+$ && "$i" -ge 1 && $((i + j)) -eq "$groups" ]] ||
    { echo "sapo_experiment: split '$split' must be I/J with I >= 1 and I + J = --groups ($groups)" >&2; exit 2; }
done
[ -n "$out" ] || out="$root/experiments/sapo-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
source "$root/tests/support/server_port.sh"
python=/usr/bin/python3
pids=()
# Disowned before the kill: the shell then prints no "Killed nats-server ..." line for them.
cleanup() {
  for p in "${pids[@]}"; do disown "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  done
}
trap cleanup EXIT

for seed in $seeds; do
  base="$out/seed$seed/base-model"
  mkdir -p "$out/seed$seed"
  [ -d "$base" ] || "$build/swarm-model" init --preset tiny-char --set hidden_size=192 --set num_hidden_layers=2 \
    --out "$base" --seed "$seed" >/dev/null
  for split in $splits; do
    i="${split%/*}" j="${split#*/}"
    run="$out/seed$seed/${i}_${j}"
    if [ -f "$run/done" ]; then echo "sapo_experiment: seed $seed split $split already done" >&2; continue; fi
    rm -rf "$run"
    mkdir -p "$run/ports"
    echo "sapo_experiment: seed $seed, split $i/$j, $nodes nodes x $steps steps ..." >&2
    nats-server -js -sd "$run/nats-store" -a 127.0.0.1 -p -1 --ports_file_dir "$run/ports" -l "$run/nats.log" &
    nats_pid=$!
    pids=("$nats_pid")
    nats_port=""
    for _ in $(seq 1 200); do
      nats_port="$(cat "$run"/ports/*.ports 2>/dev/null | sed -n 's/.*127.0.0.1:\([0-9]*\).*/\1/p' | head -1 || true)"
      [ -n "$nats_port" ] && break
      sleep 0.05
    done
    [ -n "$nats_port" ] || { echo "sapo_experiment: nats-server did not start ($run/nats.log)" >&2; exit 1; }
    agents=()
    for n in $(seq 1 "$nodes"); do
      dir="$run/node$n"
      mkdir -p "$dir"
      (cd "$dir" && exec "$build/swarm-server" start --port 0 --engine torch >server.log 2>&1) &
      spid=$!
      pids+=("$spid")
      wait_for_port "$dir/server.log" "$spid" 600 0.1 || { echo "sapo_experiment: node $n: $server_problem" >&2; exit 1; }
      {
        echo "model: $base"
        echo "engine_threads: 1"
        [ -n "$extra" ] && printf '%s\n' "$extra"
        if [ "$j" -gt 0 ]; then
          echo "exchange_url: nats://127.0.0.1:$nats_port"
          echo "swarm_name: sapo"
          echo "node_id: node$n"
          echo "sapo_external_groups: $j"
          # About one round of the others' groups: the draw is from what they shared lately.
          echo "exchange_buffer_groups: $(( (nodes - 1) * i > j ? (nodes - 1) * i : j ))"
        fi
      } >"$dir/job.yaml"
      (cd "$dir" && exec "$build/train_agent" --url "http://127.0.0.1:$port" --model "$base" --job job.yaml \
        --tasks "$family" --steps "$steps" --batch-size "$i" --num-repeat "$repeat" --workers $((i * repeat)) \
        --learning-rate "$lr" --ppo-mini-batch-size 4 --partial-credit shaped --partial-weight 0.5 --max-tokens 0 \
        --max-token-slack 0 --temperature 1 --seed $((seed * 100 + n)) --project sapo --experiment "node$n" \
        --metrics-out agent_metrics.jsonl >agent.log 2>&1) &
      agents+=($!)
    done
    status=0
    for a in "${agents[@]}"; do wait "$a" || status=1; done
    cleanup
    pids=()
    wait 2>/dev/null || true
    [ "$status" -eq 0 ] || { echo "sapo_experiment: an agent failed (see $run/node*/agent.log)" >&2; exit 1; }
    touch "$run/done"
  done
done

"$python" - "$out" "$nodes" "$steps" "$root" "$splits" "$seeds" <<'PY'
import json, math, os, subprocess, sys
out, nodes, steps, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
splits, seeds = sys.argv[5].split(), sys.argv[6].split()

def mean(v): return sum(v) / len(v) if v else float("nan")
def std(v):
    if len(v) < 2: return 0.0
    m = mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))

def cpu():
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return f"{model}, {os.cpu_count()} CPUs"

commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
os.makedirs(os.path.join(out, "curves"), exist_ok=True)
summary, rows = {}, []
for split in splits:
    i, j = split.split("/")
    per_seed_cum, per_seed_curve, per_seed_final, ext = [], [], [], []
    for seed in seeds:
        run = os.path.join(out, f"seed{seed}", f"{i}_{j}")
        curves = []
        for n in range(1, nodes + 1):
            lines = [json.loads(l) for l in open(os.path.join(run, f"node{n}", "agent_metrics.jsonl")) if l.strip()]
            curves.append([r["reward_mean"] for r in lines][:steps])
            server = os.path.join(run, f"node{n}", "experiments", "sapo", f"node{n}", "metrics.jsonl")
            if os.path.exists(server):
                ext += [json.loads(l).get("external_groups", 0) for l in open(server) if l.strip()]
        length = min(len(c) for c in curves)
        node_mean = [mean([c[s] for c in curves]) for s in range(length)]
        per_seed_curve.append(node_mean)
        per_seed_cum.append(mean([sum(c[:length]) for c in curves]))
        per_seed_final.append(mean(node_mean[-5:]))
    length = min(len(c) for c in per_seed_curve)
    with open(os.path.join(out, "curves", f"{i}_{j}.jsonl"), "w") as f:
        for s in range(length):
            vals = [c[s] for c in per_seed_curve]
            f.write(json.dumps({"step": s + 1, "reward_mean": mean(vals), "reward_std": std(vals)}) + "\n")
    summary[split] = {"cumulative_mean": mean(per_seed_cum), "cumulative_std": std(per_seed_cum),
                      "cumulative_per_seed": per_seed_cum, "final_mean": mean(per_seed_final),
                      "external_groups_per_step": mean(ext) if ext else 0.0, "steps": length}
base = summary[splits[0]]["cumulative_mean"]
print(f"SAPO experiment: commit {commit}, {cpu()}, {nodes} nodes, {steps} steps, seeds {' '.join(seeds)}")
print(f"{'split I/J':>10} {'cumulative reward':>22} {'vs ' + splits[0]:>10} {'final (last 5)':>15} {'J used/step':>12}  per seed")
for split in splits:
    r = summary[split]
    gain = 100.0 * (r["cumulative_mean"] / base - 1.0) if base else float("nan")
    print(f"{split:>10} {r['cumulative_mean']:>13.2f} ± {r['cumulative_std']:<6.2f} {gain:>+9.1f}% {r['final_mean']:>15.3f} "
          f"{r['external_groups_per_step']:>12.2f}  {' '.join(f'{x:.2f}' for x in r['cumulative_per_seed'])}")
json.dump({"commit": commit, "machine": cpu(), "nodes": nodes, "steps": steps, "seeds": seeds, "splits": summary},
          open(os.path.join(out, "summary.json"), "w"), indent=2)
PY
args=()
for split in $splits; do
  i="${split%/*}" j="${split#*/}"
  label="$i local / $j external"
  [ "$j" -eq 0 ] && label="$i local (no sharing)"
  args+=(--metrics "$out/curves/${i}_${j}.jsonl" --label "$label")
done
"$build/swarm-plot" "${args[@]}" --out "$out/sapo_reward.png" --width 900 --height 500 \
  --title "SAPO on tiny-char: mean reward per step ($nodes nodes, mean over seeds)" >/dev/null
echo "sapo_experiment: results in $out (summary.json, curves/, sapo_reward.png)" >&2
