#!/usr/bin/env bash
# examples/train_agent end to end on the mock engine (fast, no model): it boots the engine,
# drives three policy steps over every task family, prints one line per step and a summary,
# and appends one JSON line per step to --metrics-out. Bad flags fail with a clear message.
# (Whether a real model learns is the `learning` test's job.)
# Usage: train_agent_smoke.sh <swarm-server> <train_agent>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
server_bin="$(realpath "$1")" agent_bin="$(realpath "$2")"
python=/usr/bin/python3
work="$(mktemp -d)"
trap 'kill -9 "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$work/agent.log" >&2 2>/dev/null || true; exit 1; }
cd "$work"

if "$agent_bin" --model m --tasks sort,bogus >bad.log 2>&1; then fail "unknown task family accepted"; fi
grep -q "unknown task family 'bogus'" bad.log || fail "bad task mix error: $(cat bad.log)"
if "$agent_bin" --model m --difficulty 99 >bad.log 2>&1; then fail "--difficulty 99 accepted"; fi

"$server_bin" start --port 0 --engine mock >server.log 2>&1 &
pid=$!
wait_for_port server.log "$pid" 100 0.05 || fail "$server_problem"

"$agent_bin" --url "http://127.0.0.1:$port" --model mock --tasks all --steps 3 --batch-size 5 --num-repeat 2 \
  --workers 4 --show-samples 1 --metrics-out metrics.jsonl >agent.log 2>&1 || fail "train_agent failed"
grep -q "^step 3/3  global_step=3  reward=" agent.log || fail "no line for step 3"
grep -q "^summary: 3 steps" agent.log || fail "no summary"
"$python" - <<'PY' || fail "metrics.jsonl"
import json
rows = [json.loads(l) for l in open("metrics.jsonl")]
assert len(rows) == 3, rows
for i, r in enumerate(rows, 1):
    assert r["step"] == i and r["global_step"] == i, r
    assert r["episodes"] == 10, r
    assert 0.0 <= r["reward_mean"] <= 1.0, r
    assert set(r["reward_by_family"]) == {"sort", "reverse", "count", "base", "add"}, r
PY
# --job FILE is a layer under the flags: a file without `model` runs with --model; a wrong type
# in the file, or a job invalid once merged, is still refused naming the key.
printf 'learning_rate: 1.0e-4\nmax_staleness: 0\n' >layer.yaml
"$agent_bin" --url "http://127.0.0.1:$port" --model mock --job layer.yaml --tasks sort --steps 1 --batch-size 2 \
  --num-repeat 2 --workers 2 --force-restart >agent.log 2>&1 || fail "a --job file without model was refused with --model"
grep -q "^step 1/1" agent.log || fail "no step with --job"
printf 'learning_rate: fast\n' >bad.yaml
if "$agent_bin" --url "http://127.0.0.1:$port" --model mock --job bad.yaml --steps 1 >bad.log 2>&1; then
  fail "a --job file with a wrong type was accepted"
fi
grep -q "learning_rate" bad.log || fail "the wrong type is not named: $(cat bad.log)"
printf 'learning_rate: -1.0\n' >invalid.yaml
if "$agent_bin" --url "http://127.0.0.1:$port" --model mock --job invalid.yaml --steps 1 >bad.log 2>&1; then
  fail "a job invalid once merged was accepted"
fi
grep -q "learning_rate" bad.log || fail "the invalid key is not named: $(cat bad.log)"
kill -TERM "$pid"
wait "$pid" || true
echo "train_agent smoke: ok"
