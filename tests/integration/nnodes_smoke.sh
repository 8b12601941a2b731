#!/usr/bin/env bash
# Two "machines" on loopback: `swarm-server start --nnodes 2 --node-rank K --nproc 1` twice (one
# rank each, Gloo), through the real binaries:
#  1. --nnodes 2 without a rendezvous secret is refused before anything starts;
#  2. a node with the wrong secret is refused by node 0 (its log says so) and exits saying why;
#  3. the right node 1 joins: two policy steps, a checkpoint with both optimizer shards, the
#     status reporting both ranks' memory;
#  4. node 1 killed: the next step fails naming rank 1 and node 0 keeps answering; both nodes
#     restarted with --resume on node 0 continue at step 3.
# Usage: nnodes_smoke.sh <swarm-server> <swarm-model> <echo_agent> <fixtures dir>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
server_bin="$1" model_bin="$2" agent_bin="$3" fixtures="$4"
work="$(mktemp -d)"
pid="" node1=""
cleanup() {
  for p in $pid $node1; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -30 "$work/node0.log" >&2 2>/dev/null || true; tail -10 "$work/node1.log" >&2 2>/dev/null || true; exit 1; }
cd "$work"

"$model_bin" init --from "$fixtures/models/smollm2-135m-instruct-noweights" --out "$work/model" --dtype f32 --seed 3 \
  --set hidden_size=64 --set intermediate_size=128 --set num_hidden_layers=2 --set num_attention_heads=4 \
  --set num_key_value_heads=2 >/dev/null || fail "swarm-model init"
echo "the job's secret $RANDOM$RANDOM" >secret
echo "another job's secret" >wrong
master_port="$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
node_args() { echo --engine torch --nnodes 2 --nproc 1 --master-addr 127.0.0.1 --master-port "$master_port" --node-rank "$1"; }
agent() { "$agent_bin" --url "http://127.0.0.1:$port" --workers 4 --batch-size 2 --num-repeat 4 --model "$work/model" "$@"; }

# ---- 1. no secret across machines: refused at once
if "$server_bin" start --port 0 $(node_args 0) >nosecret.log 2>&1; then fail "--nnodes 2 started without a secret"; fi
grep -q "need a shared rendezvous secret" nosecret.log || fail "unclear refusal: $(cat nosecret.log)"

# start_node0 [extra]: node 0 (serves HTTP) in the background; sets $pid (its port comes once all joined)
start_node0() {
  : >node0.log
  "$server_bin" start --port 0 --log-level info $(node_args 0) --rendezvous-secret-file secret "$@" >node0.log 2>&1 &
  pid=$!
}
start_node1() {
  "$server_bin" start --log-level info $(node_args 1) --rendezvous-secret-file secret >node1.log 2>&1 &
  node1=$!
}

# ---- 2. the wrong secret: node 0 refuses it and keeps waiting; the impostor says why
start_node0
if timeout 60 "$server_bin" start $(node_args 1) --rendezvous-secret-file wrong >impostor.log 2>&1; then
  fail "a node with the wrong secret joined"
fi
grep -q "does not know this job's rendezvous secret" impostor.log || fail "the impostor's error: $(cat impostor.log)"
grep -q "refused a connection from 127.0.0.1" node0.log || fail "node 0 did not log the refusal"
refusal="$(grep -m1 "refused a connection" node0.log | sed 's/.*\] //')"

# ---- 3. the right node 1 joins; two steps; both shards; both ranks' memory
start_node1
wait_for_port node0.log "$pid" 900 0.1 || fail "node 0: $server_problem"
grep -q "all 2 ranks joined" node0.log || fail "node 0 did not report both ranks"
agent --steps 2 >agent1.log 2>&1 || { cat agent1.log >&2; fail "echo_agent on 2 nodes failed"; }
curl -sf "http://127.0.0.1:$port/get_engine_status" >status.json || fail "no engine status"
/usr/bin/python3 - status.json <<'PY' || fail "the memory report: $(cat status.json)"
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
assert [r["rank"] for r in m] == [0, 1], m
PY
kill -TERM "$pid"
wait "$pid" || fail "node 0 exited with $? after SIGTERM"
pid=""
for _ in $(seq 1 100); do kill -0 "$node1" 2>/dev/null || break; sleep 0.1; done
kill -0 "$node1" 2>/dev/null && fail "node 1 outlived node 0's end of the job"
node1=""
cp=experiments/echo/echo-agent/checkpoints/step-2/trainer_state
for r in 0 1; do [ -f "$cp/optimizer-rank$r-of-2.safetensors" ] || fail "no rank $r shard in $cp"; done

# ---- 4. node 1 dies mid-run; then both restart and the run continues
start_node0 --resume experiments/echo/echo-agent
start_node1
wait_for_port node0.log "$pid" 900 0.1 || fail "node 0 (resume): $server_problem"
agent --steps 1 >agent2.log 2>&1 || { cat agent2.log >&2; fail "echo_agent after resume failed"; }
grep -q "global_step=3" agent2.log || fail "the resumed run did not continue at step 3: $(cat agent2.log)"
kill -9 "$node1"
node1=""
if agent --steps 1 --step-timeout 120 >agent3.log 2>&1; then fail "a step succeeded without node 1"; fi
grep -q "rank 1" agent3.log || fail "the failure does not name rank 1: $(cat agent3.log)"
curl -sf "http://127.0.0.1:$port/get_engine_status" >/dev/null || fail "node 0 stopped answering"
kill -TERM "$pid"
wait "$pid" || true
pid=""
echo "nnodes smoke: ok ($refusal; $(grep -m1 "rank 1" agent3.log))"
