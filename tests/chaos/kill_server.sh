#!/usr/bin/env bash
# Chaos (a): 32 agents on the torch engine (tiny model); the server is killed with SIGKILL in the
# middle of collecting a batch and restarted with --resume on the same port. The episodes it
# had acknowledged come back from the episode store (none is lost), the agents carry on through
# the SDK's retry, and the run reaches further steps.
# Usage: kill_server.sh <swarm-server> <swarm-model> <chaos_agent>
set -euo pipefail
server_bin="$1" model_bin="$2" agent_bin="$3"
work="$(mktemp -d)"
source "$(dirname "${BASH_SOURCE[0]}")/chaos_common.sh"
trap chaos_cleanup EXIT
cd "$work"

chaos_setup "$work/exp"
start_server server1.log 0
url="http://127.0.0.1:$port"
start_agents 5 240

# Kill in the middle of step 3's collection: some episodes acknowledged, the batch not complete.
wait_step 2 120
for _ in $(seq 1 400); do
  pool_json pool_before.json 2>/dev/null || true
  n="$($PY -c "import json; print(json.load(open('pool_before.json'))['progress']['finished_episodes'])" 2>/dev/null || echo 0)"
  [ "$n" -ge 3 ] && break
  sleep 0.02
done
kill -9 "$server_pid"
wait "$server_pid" 2>/dev/null || true
killed_at_step="$($PY -c "import json; print(json.load(open('pool_before.json'))['global_step'])")"
acked_at_kill="$(wc -l <acked.txt)"
echo "killed the server (SIGKILL) while collecting (last seen: step $killed_at_step, $n finished episodes in the pool); $acked_at_kill episodes acknowledged so far"
ls "$exp/checkpoints" >/dev/null || fail "no checkpoints before the kill"

sleep 1  # the agents now fail and retry
t0=$(date +%s.%N)
start_server server2.log "$port" --resume "$exp"
pool_json pool_after.json
restored="$($PY -c "import json; print(json.load(open('pool_after.json'))['counters']['restored'])")"
resumed_step="$(sed -n 's/.*resuming from .* (step \([0-9]*\)).*/\1/p' server2.log)"
echo "restarted with --resume in $($PY -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s: step $resumed_step, $restored episode(s) restored from the store"
[ "$restored" -ge 1 ] || fail "nothing was restored from the episode store"
grep -q "back in the pool" server2.log || fail "the restart did not say what it restored"

wait "${agent_pids[0]}" || fail "the agents did not reach step 5 after the restart"
agent_pids=()
cat agent.log
pool_json pool_end.json
check_nothing_lost acked.txt pool_end.json "$exp/samples.jsonl" || fail "acknowledged episodes were lost"
echo "ok: SIGKILL mid-rollout lost nothing acknowledged; the run went on to step $(engine_field global_step)"
