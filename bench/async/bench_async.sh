#!/usr/bin/env bash
# bench_async: synchronous vs asynchronous training, end to end on this machine.
#
# For each max_staleness in --etas (default 0 1 2) it starts swarm-server on the torch engine,
# creates the demo's tiny-char model (2 x 192, random weights, --seed) and runs
# examples/train_agent with streaming agents whose episodes pause for a long-tailed think time
# before they end (lognormal, median --think-ms): the agents never wait for the trainer, the
# server decides. Every mode runs until the mean reward of the last 10 policy steps reaches
# --target (or --max-steps). Prints, per mode: policy steps and wall-clock seconds to the
# target, policy steps per minute, the final reward, and where the time went (server figures:
# collection and update seconds per step, staleness, stale drops). Target (docs/benchmarks.md): η = 2 at
# >= 1.3x the synchronous steps per minute at equal final reward (within 0.05).
#
# Usage: bench/async/bench_async.sh [--build DIR] [--etas "0 1 2"] [--think-ms 100] [--target 0.9]
#                                   [--max-steps 80] [--seed 1] [--tasks base]
# Needs a build with torch (swarm-server, swarm-model, train_agent). Takes ~4-6 minutes on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$root/build" etas="0 1 2" think=100 target=0.9 max_steps=80 seed=1 family=base
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --etas) etas="$2"; shift 2 ;;
    --think-ms) think="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --max-steps) max_steps="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --tasks) family="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "bench_async: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
for b in swarm-server swarm-model train_agent; do
  [ -x "$build/$b" ] || { echo "bench_async: $build/$b is missing (cmake --build $build)" >&2; exit 2; }
done
source "$root/tests/support/server_port.sh"
python=/usr/bin/python3
work="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT

for eta in $etas; do
  dir="$work/eta$eta"
  mkdir -p "$dir"
  cd "$dir"
  "$build/swarm-model" init --preset tiny-char --set hidden_size=192 --set num_hidden_layers=2 --out model \
    --seed "$seed" >/dev/null
  "$build/swarm-server" start --port 0 --engine torch >server.log 2>&1 &
  pid=$!
  wait_for_port server.log "$pid" 300 0.1 || { echo "bench_async: $server_problem" >&2; exit 1; }
  echo "bench_async: max_staleness $eta ..." >&2
  "$build/train_agent" --url "http://127.0.0.1:$port" --model model --tasks "$family" --steps "$max_steps" \
    --batch-size 16 --num-repeat 16 --workers 64 --learning-rate 5e-4 --ppo-mini-batch-size 4 \
    --partial-credit shaped --partial-weight 0.5 --max-tokens 0 --max-token-slack 0 --seed "$seed" \
    --stream --max-staleness "$eta" --think-ms "$think" --target-reward "$target" \
    --project bench --experiment "eta$eta" --metrics-out agent_metrics.jsonl >agent.log 2>&1 \
    || { tail -20 agent.log >&2; exit 1; }
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
done

cat >"$work/table.py" <<'PY'
import glob, json, os, platform, subprocess, sys
work, etas, think, target, root = sys.argv[1], sys.argv[2].split(), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]

def cpu():
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")
    isa = "AVX-512 BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "x86-64"
    return f"{model}, {os.cpu_count()} CPUs, {isa}"

try:
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = "?"
rows = []
for eta in etas:
    d = os.path.join(work, f"eta{eta}")
    agent = [json.loads(l) for l in open(os.path.join(d, "agent_metrics.jsonl")) if l.strip()]
    server = [json.loads(l) for l in open(glob.glob(os.path.join(d, "experiments", "*", "*", "metrics.jsonl"))[0])]
    reached = None
    for i in range(10, len(agent) + 1):
        if sum(r["reward_mean"] for r in agent[i - 10:i]) / 10 >= target:
            reached = i
            break
    end = reached or len(agent)
    secs = agent[end - 1]["elapsed_seconds"]
    final = sum(r["reward_mean"] for r in agent[end - 10:end]) / min(10, end)
    n = max(1, len(server))
    get = lambda r, k: r.get(k) if isinstance(r.get(k), (int, float)) else 0.0
    rows.append(dict(eta=int(eta), reached=reached, steps=end, secs=secs, spm=60.0 * end / secs, final=final,
                     rollout=sum(get(r, "rollout_seconds") for r in server) / n,
                     update=sum(get(r, "update_seconds") for r in server) / n,
                     stale=sum(get(r, "staleness_mean") for r in server) / n,
                     drops=sum(get(r, "stale_dropped_episodes") for r in server),
                     episodes=sum(r.get("episodes", 0) for r in server) / n))
base = next((r for r in rows if r["eta"] == 0), None)
print(f"bench_async  commit {commit}  {platform.node()}  {cpu()}")
print(f"task: tiny-char 2x192 from random weights, train_agent --stream, 64 agents, "
      f"think time lognormal median {think:g} ms, target: last 10 steps' mean reward >= {target:g}")
print()
print("| max_staleness | steps to target | seconds | steps/min | x sync | final reward | collect s/step | update s/step | episodes/step | staleness mean | stale drops |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    x = r["spm"] / base["spm"] if base else float("nan")
    reach = str(r["steps"]) if r["reached"] else f">{r['steps']} (not reached)"
    print(f"| {r['eta']} | {reach} | {r['secs']:.0f} | {r['spm']:.1f} | {x:.2f} | {r['final']:.3f} | {r['rollout']:.2f} | "
          f"{r['update']:.2f} | {r['episodes']:.0f} | {r['stale']:.2f} | {r['drops']:.0f} |")
two = next((r for r in rows if r["eta"] == 2), None)
if base and two:
    ratio = two["spm"] / base["spm"]
    equal = abs(two["final"] - base["final"]) <= 0.05 and two["reached"] is not None and base["reached"] is not None
    met = ratio >= 1.3 and equal
    print()
    print(f"target (max_staleness 2 >= 1.3x synchronous steps/min at equal final reward): "
          f"{'MET' if met else 'MISSED'} ({ratio:.2f}x, final {two['final']:.3f} vs {base['final']:.3f})")
PY
"$python" "$work/table.py" "$work" "$etas" "$think" "$target" "$root"
