# Sourced by the chaos scenarios (tests/chaos/*.sh): a tiny random model, the job, starting and
# killing the server, and reading what it holds. Every scenario runs in its own scratch dir.
# shellcheck shell=bash
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
PY=/usr/bin/python3
server_pid=""
agent_pids=()
chaos_cleanup() {
  for p in "${agent_pids[@]}" $server_pid; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/server*.log "$work"/agent*.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }
  done
  exit 1
}

# make_model DIR: the tiny-char preset, small and random (checkpoints of ~1 MB).
make_model() {
  "$model_bin" init --preset tiny-char --out "$1" --seed 1 >/dev/null || fail "swarm-model init"
}

# chaos_setup EXPERIMENT_ROOT [extra yaml]: the model in ./model, ./job.yaml for it, and $exp
# (the experiment directory the server will write).
chaos_setup() {
  make_model model
  write_job job.yaml "$work/model" "$1" "${2:-}"
  exp="$1/swarm/default"
}

# start_agents UNTIL_STEP DEADLINE [flags...]: one chaos_agent process of 32 agents against $url,
# recording acknowledged episodes in acked.txt, logging to agent.log (pid in agent_pids).
start_agents() {
  local until="$1" deadline="$2"
  shift 2
  "$agent_bin" --url "$url" --acked acked.txt --workers 32 --num-repeat 4 --until-step "$until" \
    --deadline "$deadline" --discard-timeout 20 "$@" >agent.log 2>&1 &
  agent_pids+=($!)
}

# write_job FILE MODEL EXPERIMENT_DIR [extra yaml]
write_job() {
  cat >"$1" <<YAML
model: $2
experiment_dir: $3
batch_size: 4
num_repeat: 4
max_parallel_episodes: 40
max_response_length: 16
learning_rate: 1.0e-4
save_freq: 1
record_samples: true
seed: 1
${4:-}
YAML
}

# start_server LOG PORT [flags...]: starts swarm-server on the torch engine (PORT 0 = any) with
# the job, boots the engine and waits for ROLLING. Sets $server_pid and $port.
start_server() {
  local log="$1" want_port="$2"
  shift 2
  "$server_bin" start --port "$want_port" --engine torch --config "$work/job.yaml" --log-level info "$@" >"$log" 2>&1 &
  server_pid=$!
  wait_for_port "$log" "$server_pid" 600 0.1 || fail "$server_problem"
  curl -fsS -X POST "http://127.0.0.1:$port/start_engine" -H 'content-type: application/json' -d '{}' >/dev/null ||
    fail "start_engine"
  for _ in $(seq 1 600); do
    [ "$(engine_field engine_status)" = "ENGINE.ROLLING" ] && return 0
    kill -0 "$server_pid" 2>/dev/null || fail "server died while booting"
    sleep 0.1
  done
  fail "engine never reached ROLLING"
}

# engine_field NAME: a field of /get_engine_status ("" when the server does not answer).
engine_field() {
  curl -fsS --max-time 5 "http://127.0.0.1:$port/get_engine_status" 2>/dev/null |
    $PY -c "import json,sys; print(json.load(sys.stdin).get('$1',''))" 2>/dev/null || true
}

# pool_json FILE: saves /get_current_batch_rollout_pool_information.
pool_json() {
  curl -fsS --max-time 5 "http://127.0.0.1:$port/get_current_batch_rollout_pool_information" >"$1"
}

# wait_step N SECONDS: until global_step >= N.
wait_step() {
  for _ in $(seq 1 $(($2 * 10))); do
    local s
    s="$(engine_field global_step)"
    [ -n "$s" ] && [ "$s" -ge "$1" ] && return 0
    sleep 0.1
  done
  fail "global_step did not reach $1 within $2 s (at '$(engine_field global_step)')"
}

# check_nothing_lost ACKED POOL_JSON SAMPLES_JSONL: every acknowledged episode was trained
# (samples.jsonl) or is still in the pool; prints the figures.
check_nothing_lost() {
  $PY - "$@" <<'PYEOF'
import json, sys
acked_file, pool_file, samples_file = sys.argv[1:4]
acked = [l.split()[0] for l in open(acked_file) if l.strip()]
trained = set()
for line in open(samples_file):
    try:
        trained.add(json.loads(line)["episode_uuid"])
    except Exception:
        pass  # a line cut by the kill
pool = json.load(open(pool_file))
pooled = {u for uuids in pool.get("completed_tasks_details", {}).values() for u in uuids}
lost = [u for u in acked if u not in trained and u not in pooled]
c = pool.get("counters", {})
print(f"figures: {len(acked)} episodes acknowledged, {len(set(acked) & trained)} trained, "
      f"{len(set(acked) & pooled - trained)} waiting in the pool, {len(lost)} lost "
      f"(safety valve drops {c.get('valve_dropped_episodes')}, stale drops {c.get('stale_dropped_episodes')})")
if lost:
    print("lost:", lost[:10])
    sys.exit(1)
PYEOF
}
