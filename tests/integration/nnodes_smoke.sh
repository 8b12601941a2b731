#!/usr/bin/env bash
# Two "machines" on loopback: `swarm-server start --nnodes 2 --node-rank K --nproc 1` twice (one
# rank each, Gloo), through the real binaries:
#  1. --nnodes 2 without a rendezvous secret is refused before anything starts;
#  2. a node with the wrong secret is refused by node 0 (its log says so) and exits saying why;
#  2b. a node that does not see the experiment directory (a mount namespace) fails the boot with
#     an error naming it and the directory;
#  3. the right node 1 joins: both ranks serve (node 0 routes), two policy steps, a checkpoint
#     with both optimizer shards, the status reporting both ranks' memory and requests;
#  4. node 1 killed: the next step fails naming rank 1 and node 0 keeps answering; both nodes
#     restarted with --resume on node 0 continue at step 3;
#  5. the same seeded run on two nodes and on one node of two ranks trains the same weights
#     (the model and both optimizer shards after two steps).
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
agent() { "$agent_bin" --url "http://127.0.0.1:$port" --workers "${workers:-4}" --batch-size 2 --num-repeat 4 --model "$work/model" "$@"; }

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

# ---- 2b. a node that does not see the experiment directory: the boot fails saying so (node 1
# runs in a mount namespace where ./experiments is an empty tmpfs: another machine's view)
mkdir -p experiments
if unshare -m true 2>/dev/null; then
  unshare -m bash -c "mount -t tmpfs none '$work/experiments' && exec '$server_bin' start --log-level info $(node_args 1) --rendezvous-secret-file secret" >node1.log 2>&1 &
  node1=$!
  wait_for_port node0.log "$pid" 900 0.1 || fail "node 0: $server_problem"
  if agent --steps 1 >agent0.log 2>&1; then fail "a node without the experiment directory booted"; fi
  grep -q "rank 1 (on .*) cannot see the experiment directory $work/experiments/echo/echo-agent" agent0.log node0.log \
    || fail "unclear boot error without a shared directory: $(tail -3 agent0.log)"
  unshared="$(grep -m1 -o "rank 1 (on [^)]*) cannot see the experiment directory [^ ]*" node0.log)"
  kill -TERM "$pid"
  wait "$pid" || true
  for _ in $(seq 1 100); do kill -0 "$node1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$node1" 2>/dev/null || true
  node1=""
  rm -rf experiments
  start_node0
else
  unshared="skipped: no mount namespaces here"
fi

# ---- 3. the right node 1 joins; two steps; both shards; both ranks' memory
start_node1
wait_for_port node0.log "$pid" 900 0.1 || fail "node 0: $server_problem"
grep -q "all 2 ranks joined" node0.log || fail "node 0 did not report both ranks"
agent --steps 2 >agent1.log 2>&1 || { cat agent1.log >&2; fail "echo_agent on 2 nodes failed"; }
curl -sf "http://127.0.0.1:$port/get_engine_status" >status.json || fail "no engine status"
/usr/bin/python3 - status.json <<'PY' || fail "the memory report: $(cat status.json)"
import json, sys
st = json.load(open(sys.argv[1]))
m = st["memory"]
assert [r["rank"] for r in m] == [0, 1], m
s = st["serving"]  # node 1's rank served through node 0's router
assert [r["rank"] for r in s] == [0, 1] and all(r["requests"] > 0 for r in s), s
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
# ---- 5. the same seeded run (one worker and one thread per rank: every request repeats exactly)
# on two nodes of one rank and on one node of two ranks trains the same weights
same_run() {  # same_run OUT: two steps of the seeded agent, the step-2 checkpoint moved to OUT
  workers=1 agent --seed 11 --engine-threads 1 --steps 2 >"$1.log" 2>&1 || { cat "$1.log" >&2; fail "seeded run $1"; }
  kill -TERM "$pid"
  wait "$pid" || fail "node 0 exited with $? after SIGTERM ($1)"
  pid=""
  mv experiments/echo/echo-agent/checkpoints/step-2 "$1"
  rm -rf experiments
}
rm -rf experiments
start_node0
start_node1
wait_for_port node0.log "$pid" 900 0.1 || fail "node 0 (seeded run): $server_problem"
same_run two-nodes
for _ in $(seq 1 100); do kill -0 "$node1" 2>/dev/null || break; sleep 0.1; done
node1=""
: >node0.log
"$server_bin" start --port 0 --log-level info --engine torch --nproc 2 >node0.log 2>&1 &
pid=$!
wait_for_port node0.log "$pid" 900 0.1 || fail "one node of two ranks: $server_problem"
same_run one-node
/usr/bin/python3 - two-nodes one-node <<'PY' || fail "two nodes and one node of two ranks trained differently"
import json, struct, sys, pathlib
import numpy as np
def tensors(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        data = raw[8 + n + a:8 + n + b]
        if t["dtype"] == "BF16":
            x = np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16
            out[name] = x.view(np.float32)
        else:
            out[name] = np.frombuffer(data, dtype={"F32": np.float32, "F64": np.float64, "I64": np.int64}[t["dtype"]]).astype(np.float64)
    return out
two, one = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
files = ["model.safetensors"] + [f"trainer_state/optimizer-rank{r}-of-2.safetensors" for r in (0, 1)]
worst = 0.0
for f in files:
    a, b = tensors(two / f), tensors(one / f)
    assert a.keys() == b.keys(), f
    for k in a:
        scale = max(float(np.abs(b[k]).max()), 1e-30)
        worst = max(worst, float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) / scale)
print(f"two nodes vs one node of two ranks: largest difference {worst:.3g} of the largest value")
assert worst <= 1e-5, worst
PY
same="$(cmp -s two-nodes/model.safetensors one-node/model.safetensors && echo "the same weights, bit for bit" || echo "the same weights within 1e-5")"
echo "nnodes smoke: ok ($refusal; $unshared; $(grep -m1 "rank 1" agent3.log); seeded run: $same)"
