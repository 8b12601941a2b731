#!/usr/bin/env bash
# Chaos (b): four agent processes of 8 threads each (32 agents, 200 ms of "work" per episode) on
# the torch engine; every second one of them is killed with SIGKILL and a fresh one takes its
# place, until the run has reached step 6 and at least 4 agents died. The episodes the dead
# agents held are reclaimed after their discard_episode_timeout (3 s), the steps complete, and
# nothing the server acknowledged is lost.
# Usage: kill_agents.sh <swarm-server> <swarm-model> <chaos_agent>
set -euo pipefail
server_bin="$1" model_bin="$2" agent_bin="$3"
work="$(mktemp -d)"
source "$(dirname "${BASH_SOURCE[0]}")/chaos_common.sh"
trap chaos_cleanup EXIT
cd "$work"

target=6
# Dead agents leave incomplete task groups behind; a cache big enough that the safety valve
# (which drops such groups, counted) never fires keeps the "nothing lost" check exact.
chaos_setup "$work/exp" "max_cached_episodes: 4096"
start_server server.log 0
url="http://127.0.0.1:$port"
spawn() {  # spawn SLOT: a fresh agent process in slot SLOT
  "$agent_bin" --url "$url" --acked acked.txt --workers 8 --num-repeat 4 --until-step "$target" --deadline 240 \
    --discard-timeout 3 --think-ms 200 --tag "a$RANDOM$1" >>"agent$1.log" 2>&1 &
  agent_pids[$1]=$!
}
for i in 0 1 2 3; do spawn "$i"; done

kills=0
RANDOM=7
deadline=$(($(date +%s) + 240))
while :; do
  step="$(engine_field global_step)"
  [ -n "$step" ] && [ "$step" -ge "$target" ] && [ "$kills" -ge 4 ] && break
  [ "$(date +%s)" -lt "$deadline" ] || fail "the run did not reach step $target with agents dying (at step $step)"
  sleep 1
  victim=$((RANDOM % 4))
  kill -9 "${agent_pids[$victim]}" 2>/dev/null && kills=$((kills + 1))
  wait "${agent_pids[$victim]}" 2>/dev/null || true
  spawn "$victim"
done
for i in 0 1 2 3; do wait "${agent_pids[$i]}" 2>/dev/null || true; done
agent_pids=()
# The dead agents' last episodes are reclaimed once idle for their 3 s timeout.
for _ in $(seq 1 100); do
  pool_json pool_end.json
  timed_out="$($PY -c "import json; print(json.load(open('pool_end.json'))['counters']['timed_out'])")"
  [ "$timed_out" -ge 1 ] && break
  sleep 0.1
done
echo "figures: $kills agent processes killed with SIGKILL; $timed_out episode(s) they held were reclaimed; step $(engine_field global_step) reached"
[ "$kills" -ge 1 ] || fail "no agent was killed"
[ "$timed_out" -ge 1 ] || fail "no episode of a killed agent was reclaimed"
check_nothing_lost acked.txt pool_end.json "$exp/samples.jsonl" || fail "acknowledged episodes were lost"
echo "ok: agents killed at random; their episodes were reclaimed and $target steps completed"
