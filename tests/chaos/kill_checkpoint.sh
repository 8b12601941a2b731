#!/usr/bin/env bash
# Chaos (c): the server dies by SIGKILL in the middle of saving checkpoint step-3 (after the
# weights were written, before anything was renamed: SWARM_TEST_KILL_DURING_CHECKPOINT, a fault
# injection point in write_checkpoint). checkpoints/latest still names step-2, which resumes;
# the half-written directory is swept away by the next save; the run reaches step 5 and nothing
# acknowledged is lost.
# Usage: kill_checkpoint.sh <swarm-server> <swarm-model> <chaos_agent>
set -euo pipefail
server_bin="$1" model_bin="$2" agent_bin="$3"
work="$(mktemp -d)"
source "$(dirname "${BASH_SOURCE[0]}")/chaos_common.sh"
trap chaos_cleanup EXIT
cd "$work"

chaos_setup "$work/exp"
SWARM_TEST_KILL_DURING_CHECKPOINT=3 start_server server1.log 0
url="http://127.0.0.1:$port"
start_agents 5 240
for _ in $(seq 1 1200); do
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$server_pid" 2>/dev/null && fail "the server did not die while saving step-3"
wait "$server_pid" 2>/dev/null || true
latest="$(cat "$exp/checkpoints/latest")"
half="$(ls -a "$exp/checkpoints" | grep -c '^\.step-3\.tmp-' || true)"
echo "the server died saving step-3: latest names $latest; $half half-written step-3 directory left"
[ "$latest" = "step-2" ] || fail "latest names '$latest', not step-2"
[ "$half" -eq 1 ] || fail "expected the half-written step-3 directory"
[ ! -e "$exp/checkpoints/step-3" ] || fail "a half-written step-3 became visible"

start_server server2.log "$port" --resume "$exp"
resumed="$(sed -n 's/.*resuming from .* (step \([0-9]*\)).*/\1/p' server2.log)"
echo "resumed at step $resumed"
[ "$resumed" = "2" ] || fail "resumed at step $resumed, not 2"
grep -q "resuming from .*step-2" server2.log || fail "the restart did not name the checkpoint it resumed"

wait "${agent_pids[0]}" || fail "the agents did not reach step 5 after the restart"
agent_pids=()
cat agent.log
[ "$(ls -a "$exp/checkpoints" | grep -c '\.tmp-' || true)" -eq 0 ] || fail "the half-written directory was not swept away"
pool_json pool_end.json
check_nothing_lost acked.txt pool_end.json "$exp/samples.jsonl" || fail "acknowledged episodes were lost"
echo "ok: a SIGKILL during a checkpoint save left step-2 loadable; the run resumed from it and reached step $(engine_field global_step)"
