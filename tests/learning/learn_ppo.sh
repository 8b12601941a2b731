#!/usr/bin/env bash
# Learning test for dense credit: from RANDOM initialisation, PPO with a critic
# and GAE on per-token rewards (every answer character written in its place earns its share,
# `train_agent --token-credit`) must learn faster than GRPO on the outcome alone (1 for an exact
# answer, else 0) on the same task family, seed and budget: a higher exact-answer rate averaged
# over every step of the run (the area under the learning curve).
#
# Usage: learn_ppo.sh <swarm-server> <swarm-model> <train_agent> <family> <steps> <margin> [seed]
#   margin  required lead of PPO's mean exact rate over outcome GRPO's
#
# Both runs: swarm-model init --preset tiny-char (same seed), swarm-server on the torch engine,
# 16 tasks x 16 episodes per step, AdamW lr 1e-3, replies capped at the family's longest answer.
# PPO: algorithm ppo, lam 0.95, critic lr 1e-3. Thresholds: tests/CMakeLists.txt.
set -euo pipefail
server_bin="$1" model_bin="$2" agent_bin="$3" family="$4" steps="$5" margin="$6" seed="${7:-1}"
source "$(dirname "${BASH_SOURCE[0]}")/../support/learning.sh"

# run NAME [train_agent flags...]: one training run in $work/NAME, metrics in NAME/metrics.jsonl.
run() {
  local name="$1"
  shift
  mkdir -p "$work/$name"
  cd "$work/$name"
  "$model_bin" init --preset tiny-char --out model --seed "$seed" >/dev/null || fail "swarm-model init --preset tiny-char"
  start_server
  local start
  start=$(date +%s)
  "$agent_bin" --url "http://127.0.0.1:$port" --model model --tasks "$family:1" --steps "$steps" \
    --batch-size 16 --num-repeat 16 --workers 64 --learning-rate 1e-3 --max-tokens 0 --max-token-slack 0 \
    --temperature 1 --seed "$seed" --metrics-out metrics.jsonl "$@" >agent.log 2>&1 ||
    { tail -20 agent.log >&2; fail "$name: train_agent failed"; }
  echo "$name: $(( $(date +%s) - start ))s"
  stop_server
}

run ppo --algorithm ppo --lam 0.95 --critic-learning-rate 1e-3 --token-credit --partial-credit position
run outcome --partial-credit none

cat >"$work/check.py" <<'EOF'
import json, sys
margin, work = float(sys.argv[1]), sys.argv[2]
def exact(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if l.strip()]
    e = [r["exact_rate"] for r in rows]
    return sum(e) / len(e), sum(e[-10:]) / 10
(pm, pl), (om, ol) = exact("ppo"), exact("outcome")
lead = pm - om
print(f"exact rate, mean over the run (last 10 steps): ppo+gae on token rewards {pm:.3f} ({pl:.3f}); "
      f"grpo on the outcome {om:.3f} ({ol:.3f}); lead {lead:+.3f} (needs >= {margin}) {'ok' if lead >= margin else 'TOO SMALL'}")
sys.exit(0 if lead >= margin else 1)
EOF
"$python" "$work/check.py" "$margin" "$work" || fail "PPO with token rewards did not beat outcome GRPO by the margin (above)"
echo "learning: ok"
