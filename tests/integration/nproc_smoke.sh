#!/usr/bin/env bash
# `swarm-server start --nproc 2` end to end on the torch engine, through the real binaries:
#  1. two ranks serve the agents' requests (rank 0 routes them; /metrics counts each rank's) and
#     train two policy steps; the checkpoint on SIGTERM holds both optimizer shards (each about
#     half of the state) and the follower exits with rank 0;
#  2. --resume with 2 ranks continues at step 3; resuming that checkpoint on 1 rank is refused
#     with a clear boot error;
#  3. a follower killed mid-run fails the next policy step with an error that names it, within
#     a bounded time; the requests it was serving fail naming it, the status shows it down, and
#     the server keeps answering.
# Usage: nproc_smoke.sh <swarm-server> <swarm-model> <echo_agent> <fixtures dir>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
server_bin="$1" model_bin="$2" agent_bin="$3" fixtures="$4"
work="$(mktemp -d)"
pid=""
cleanup() {
  # The followers die with rank 0 (PDEATHSIG).
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -40 "$work/server.log" >&2 2>/dev/null || true; exit 1; }
cd "$work"

"$model_bin" init --from "$fixtures/models/smollm2-135m-instruct-noweights" --out "$work/model" --dtype f32 --seed 3 \
  --set hidden_size=64 --set intermediate_size=128 --set num_hidden_layers=2 --set num_attention_heads=4 \
  --set num_key_value_heads=2 >/dev/null || fail "swarm-model init"

# start_server LOG [extra args]: starts the server (rank 0 + followers) and sets $pid and $port.
start_server() {
  local log="$1"
  shift
  : >"$log"
  "$server_bin" start --port 0 --engine torch --log-level info "$@" >"$log" 2>&1 &
  pid=$!
  if ! wait_for_port "$log" "$pid" 600 0.1; then
    [ "$server_problem" = "server exited early" ] && cp "$log" server.log
    fail "$server_problem"
  fi
}
stop_server() {
  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  pid=""
  [ "$rc" -eq 0 ] || fail "server exit code $rc after SIGTERM"
}
followers_of() { pgrep -P "$1" -f "swarm-server" || true; }
agent() { "$agent_bin" --url "http://127.0.0.1:$port" --workers 4 --batch-size 2 --num-repeat 4 --model "$work/model" "$@"; }

# ---- 1. two ranks, two steps, checkpoint on stop
start_server server.log --nproc 2
grep -q "all 2 ranks joined" server.log || fail "rank 0 did not report the ranks joining"
follower="$(followers_of "$pid")"
[ -n "$follower" ] || fail "no follower process under rank 0"
agent --steps 2 >agent1.log 2>&1 || { cat agent1.log >&2; fail "echo_agent on 2 ranks failed"; }
grep -q "2 ranks (gloo collectives) booted" server.log || fail "the engine did not boot 2 ranks"
grep -q "\[rank 1\] rank 1: loaded" server.log || fail "rank 1 did not load the model"
# The status reports both ranks' memory (each holds half the optimizer state and a KV cache)
# and what each served: rank 0 routed the agents' requests to both.
curl -sf "http://127.0.0.1:$port/get_engine_status" >status.json || fail "no engine status"
/usr/bin/python3 - status.json <<'PY' || fail "the memory or serving report is wrong: $(cat status.json)"
import json, sys
st = json.load(open(sys.argv[1]))
m = st["memory"]
assert [r["rank"] for r in m] == [0, 1], m
assert abs(m[0]["optimizer_bytes"] - m[1]["optimizer_bytes"]) <= 64, m
assert m[0]["kv_cache_bytes"] > 0 and m[1]["kv_cache_bytes"] == m[0]["kv_cache_bytes"], m
assert all(r["peak_bytes"] > r["weights_bytes"] > 0 for r in m), m
s = st["serving"]
assert [r["rank"] for r in s] == [0, 1], s
assert all(r["up"] and r["requests"] > 0 and r["generated_tokens"] > 0 for r in s), s
PY
curl -sf "http://127.0.0.1:$port/metrics" >metrics.txt || fail "no /metrics"
grep -Eq '^swarm_rank_requests_total\{rank="1"\} [1-9]' metrics.txt || fail "/metrics: $(grep swarm_rank metrics.txt)"
grep -Eq '^swarm_rank_generated_tokens_total\{rank="0"\} [1-9]' metrics.txt || fail "/metrics: $(grep swarm_rank metrics.txt)"
grep -q "memory after the first step on rank 1" server.log || fail "rank 1's memory was not logged after step 1"
stop_server
if kill -0 "$follower" 2>/dev/null; then fail "the follower (pid $follower) outlived rank 0"; fi
cp=experiments/echo/echo-agent/checkpoints/step-2
for r in 0 1; do
  [ -f "$cp/trainer_state/optimizer-rank$r-of-2.safetensors" ] || fail "checkpoint lacks rank $r's optimizer shard"
done
s0=$(stat -c %s "$cp/trainer_state/optimizer-rank0-of-2.safetensors")
s1=$(stat -c %s "$cp/trainer_state/optimizer-rank1-of-2.safetensors")
weights=$(stat -c %s "$cp/model.safetensors")
# Each shard holds master weights + 2 moments (3 fp32 values per parameter) for half the parameters.
awk -v a="$s0" -v b="$s1" -v w="$weights" 'BEGIN { exit !(a == b && a > 1.4 * w && a < 1.6 * w) }' \
  || fail "optimizer shards are $s0 and $s1 bytes; expected each about 1.5x the fp32 weights ($weights)"
cp server.log server1.log

# ---- 2. resume on 2 ranks; resuming on 1 rank is refused
start_server server.log --nproc 2 --resume experiments/echo/echo-agent
agent --steps 1 >agent2.log 2>&1 || { cat agent2.log >&2; fail "echo_agent after resume failed"; }
grep -q "global_step=3" agent2.log || fail "the resumed run did not continue at step 3: $(cat agent2.log)"
stop_server
[ -f experiments/echo/echo-agent/checkpoints/step-3/trainer_state/optimizer-rank1-of-2.safetensors ] \
  || fail "no 2-rank checkpoint of step 3"

start_server server.log --resume experiments/echo/echo-agent
if agent --steps 1 >agent3.log 2>&1; then fail "a 2-rank checkpoint resumed on 1 rank"; fi
grep -q "another number of ranks" agent3.log || fail "unclear error resuming on 1 rank: $(cat agent3.log)"
stop_server

# ---- 3. a follower dies: the next step fails naming it, the server keeps serving
rm -rf experiments
start_server server.log --nproc 2
agent --steps 1 >agent4.log 2>&1 || { cat agent4.log >&2; fail "echo_agent before the kill failed"; }
follower="$(followers_of "$pid")"
kill -9 "$follower"
# Its serving link breaks at once: rank 0 routes nothing more to it, and says so.
down=""
for _ in $(seq 1 50); do
  curl -sf "http://127.0.0.1:$port/get_engine_status" >status.json || fail "the server stopped answering"
  if /usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["serving"]; sys.exit(0 if s[1]["up"] is False else 1)' status.json; then
    down=1
    break
  fi
  sleep 0.1
done
[ -n "$down" ] || fail "rank 1 is not shown down: $(cat status.json)"
grep -q "rank 1 stopped serving" server.log || fail "rank 0 did not log rank 1 leaving"
start=$(date +%s)
if agent --steps 1 --step-timeout 120 >agent5.log 2>&1; then fail "a step succeeded with a dead rank"; fi
elapsed=$(( $(date +%s) - start ))
grep -q "rank 1" agent5.log || fail "the failure does not name rank 1: $(cat agent5.log)"
[ "$elapsed" -le 100 ] || fail "the failure took ${elapsed}s"
curl -sf "http://127.0.0.1:$port/get_engine_status" >/dev/null || fail "the server stopped answering"
stop_server
echo "nproc smoke: ok (dead rank detected in ${elapsed}s: $(grep -m1 "rank 1" agent5.log))"
