#!/usr/bin/env bash
# Learning test for AT-GRPO: from RANDOM initialisation, the two-role example
# (examples/at_grpo_agent: a proposer answers, a checker says y/n, one shared policy, a turn
# reward per call, group_by task_agent_turn) must teach both roles: the proposer's score and the
# checker's rate of right verdicts each rise by a margin (mean of the last 10 steps minus the
# first 10).
#
# Usage: learn_at_grpo.sh <swarm-server> <swarm-model> <at_grpo_agent> <steps> <proposer_margin> <checker_margin> [seed]
#
# Recipe: swarm-model init --preset tiny-char, swarm-server on the torch engine, task family
# base at difficulty 1, 16 tasks x 16 episodes per step, AdamW lr 1e-3, proposer replies of at
# most 4 tokens. Thresholds: tests/CMakeLists.txt.
set -euo pipefail
server_bin="$1" model_bin="$2" agent_bin="$3" steps="$4" proposer_margin="$5" checker_margin="$6" seed="${7:-1}"
source "$(dirname "${BASH_SOURCE[0]}")/../support/learning.sh"
cd "$work"

"$model_bin" init --preset tiny-char --out model --seed "$seed" >/dev/null || fail "swarm-model init --preset tiny-char"
start_server
"$agent_bin" --url "http://127.0.0.1:$port" --model model --steps "$steps" --seed "$seed" --tasks base \
  --difficulty 1 --batch-size 16 --num-repeat 16 --workers 64 --learning-rate 1e-3 --max-tokens 4 >agent.log 2>&1 ||
  { tail -20 agent.log >&2; fail "at_grpo_agent failed"; }
stop_server

cat >check.py <<'EOF'
import re, sys
pm, cm = float(sys.argv[1]), float(sys.argv[2])
rows = [l for l in open("agent.log") if l.startswith("step ")]
k = 10
if len(rows) < 2 * k:
    print(f"only {len(rows)} steps"); sys.exit(1)
def series(name):
    return [float(re.search(name + r"=([0-9.]+)", l).group(1)) for l in rows]
ok = True
for name, margin in (("proposer_reward", pm), ("checker_right", cm)):
    s = series(name)
    first, last = sum(s[:k]) / k, sum(s[-k:]) / k
    good = last - first >= margin
    ok &= good
    print(f"{name:16s} first {k} steps {first:.3f} -> last {k} steps {last:.3f}: rise {last - first:+.3f} "
          f"(needs >= {margin}) {'ok' if good else 'TOO SMALL'}")
sys.exit(0 if ok else 1)
EOF
"$python" check.py "$proposer_margin" "$checker_margin" || fail "a role did not learn enough (above)"
echo "learning: ok"
