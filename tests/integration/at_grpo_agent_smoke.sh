#!/usr/bin/env bash
# examples/at_grpo_agent end to end on the mock engine: two roles per episode
# (proposer, checker), each call naming its agent, turn rewards per call, group_by
# task_agent_turn; every step must print its line and the engine must train. The grouping
# itself is checked token by token in test_grpo_batch (TaskAgentTurn...) and on the wire in
# test_wire_protocol (AgentNamesTurnRewardsAndTokenRewardsReachTheBatch).
# Usage: at_grpo_agent_smoke.sh <swarm-server> <at_grpo_agent>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
server_bin="$1" agent_bin="$2"
work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -40 "$work/server.log" >&2 2>/dev/null || true; exit 1; }
cd "$work"
"$server_bin" start --port 0 --engine mock --log-level info >server.log 2>&1 &
pid=$!
wait_for_port server.log "$pid" 100 0.1 || fail "$server_problem"
"$agent_bin" --url "http://127.0.0.1:$port" --model mock --steps 2 >agent.log 2>&1 || { cat agent.log >&2; fail "at_grpo_agent failed"; }
cat agent.log
[ "$(grep -c '^step [0-9]/2 ' agent.log)" -eq 2 ] || fail "expected 2 step lines"
grep -q "global_step=2 " agent.log || fail "the engine did not reach global_step 2"
grep -q "group_by=task_agent_turn\|group_by task_agent_turn" agent.log || fail "the job is not grouped by agent and turn"
echo "ok: at_grpo_agent ran 2 steps on the mock engine"
