#!/usr/bin/env bash
# Learning test: from RANDOM initialisation, the real loop (swarm-model init --preset tiny-char,
# swarm-server on the torch engine, examples/train_agent through the public SDK) must raise the
# reward of each task family it trains on, within a bounded number of steps.
#
# Usage: learn_tasks.sh <swarm-server> <swarm-model> <train_agent> <families> <steps> <margin> [seed] [flags]
#   families  a train_agent task mix, e.g. "sort:1,base:1"
#   margin    required rise of each family's mean reward, last 15 steps minus first 15 steps
#   flags     more train_agent flags, e.g. "--max-staleness 2 --think-ms 20" (asynchronous training)
#
# Thresholds (tests/CMakeLists.txt) come from repeated runs of this recipe on the 2-core CI
# machine; see the table there. The recipe is the demo's (scripts/demo.sh): tiny-char widened to
# 2 layers x 192, shaped partial credit (a dense signal for a model that starts from noise),
# replies capped at the family's longest answer, 16 tasks x 16 episodes per step, AdamW lr 5e-4,
# 4 optimizer steps per policy step (4 tasks per mini-batch).
set -euo pipefail
server_bin="$1" model_bin="$2" agent_bin="$3" families="$4" steps="$5" margin="$6" seed="${7:-1}"
read -r -a extra_flags <<<"${8:-}"
source "$(dirname "${BASH_SOURCE[0]}")/../support/learning.sh"
cd "$work"

"$model_bin" init --preset tiny-char --set hidden_size=192 --set num_hidden_layers=2 --out model \
  --seed "$seed" >/dev/null || fail "swarm-model init --preset tiny-char"

start_server

start=$(date +%s)
"$agent_bin" --url "http://127.0.0.1:$port" --model model --tasks "$families" --steps "$steps" \
  --batch-size 16 --num-repeat 16 --workers 64 --learning-rate 5e-4 --ppo-mini-batch-size 4 --partial-credit shaped \
  --partial-weight 0.5 --max-tokens 0 --max-token-slack 0 --temperature 1 --seed "$seed" \
  --metrics-out metrics.jsonl "${extra_flags[@]}" >agent.log 2>&1 || { tail -20 agent.log >&2; fail "train_agent failed"; }
elapsed=$(( $(date +%s) - start ))
stop_server

# Per family: mean reward over the first and the last 15 steps.
cat >check.py <<'EOF'
import json, sys
margin, mix, elapsed = float(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in open("metrics.jsonl") if l.strip()]
families = [f.split(":")[0] for f in mix.split(",")]
k = 15
ok = True
if len(rows) < 2 * k:
    print(f"only {len(rows)} steps recorded"); sys.exit(1)
for fam in families:
    series = [r["reward_by_family"][fam] for r in rows if fam in r.get("reward_by_family", {})]
    first, last = sum(series[:k]) / k, sum(series[-k:]) / k
    rise = last - first
    good = rise >= margin
    ok &= good
    print(f"{fam:8s} reward first {k} steps {first:.3f} -> last {k} steps {last:.3f}: rise {rise:+.3f} "
          f"(needs >= {margin}) {'ok' if good else 'TOO SMALL'}")
print(f"{len(rows)} steps in {elapsed}s")
sys.exit(0 if ok else 1)
EOF
if ! "$python" check.py "$margin" "$families" "$elapsed"; then
  [ -n "${SWARM_LEARNING_KEEP:-}" ] && cp metrics.jsonl agent.log "$SWARM_LEARNING_KEEP"/
  echo "FAIL: the reward did not rise enough (above)" >&2
  exit 1
fi
echo "learning: ok"
