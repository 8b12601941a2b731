#!/usr/bin/env bash
# examples/python_agent (standard-library Python, raw HTTP) end to end on the mock engine, with
# access tokens on: a missing token and an unreachable server fail with clear messages; with the
# tokens (from the environment) it boots the engine, drives three policy steps on two workers,
# prints a line per step, and its log_metrics reach the server's metrics.jsonl; --no-start joins
# the running engine.
# Usage: python_agent_smoke.sh <swarm-server> <agent.py>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
server_bin="$(realpath "$1")" agent="$(realpath "$2")"
python=/usr/bin/python3
work="$(mktemp -d)"
trap 'kill -9 "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$work/agent.log" >&2 2>/dev/null || true; exit 1; }
cd "$work"
unset SWARM_ADMIN_TOKEN SWARM_CLIENT_TOKEN

# Bad input: refused before any request, or named in the error.
if "$python" "$agent" --steps 0 >bad.log 2>&1; then fail "--steps 0 accepted"; fi
grep -q "at least 1" bad.log || fail "--steps 0 error: $(cat bad.log)"
if "$python" "$agent" --server 127.0.0.1:1 >bad.log 2>&1; then fail "a URL without http:// accepted"; fi
grep -q "http:// or https://" bad.log || fail "bad URL error: $(cat bad.log)"
if "$python" "$agent" --server http://127.0.0.1:1 --retry-seconds 0.5 >bad.log 2>&1; then
  fail "an unreachable server gave exit 0"
fi
grep -q "cannot reach the swarm server at http://127.0.0.1:1/" bad.log || fail "unreachable: $(cat bad.log)"

echo admin-token-for-the-smoke-test >admin.token
echo client-token-for-the-smoke-test >client.token
"$server_bin" start --port 0 --engine mock --admin-token-file admin.token --client-token-file client.token \
  >server.log 2>&1 &
pid=$!
wait_for_port server.log "$pid" 100 0.05 || fail "$server_problem"
url="http://127.0.0.1:$port"

# No admin token: the server's 401 message is shown.
if "$python" "$agent" --server "$url" --steps 1 >bad.log 2>&1; then fail "ran without the admin token"; fi
grep -q "sync_train_config: HTTP 401: .*admin token" bad.log || fail "401 error: $(cat bad.log)"
# --no-start on an engine nobody starts (the run above started nothing): waits, then says so.
if "$python" "$agent" --server "$url" --no-start --step-timeout 1 >bad.log 2>&1; then
  fail "--no-start on an OFFLINE engine gave exit 0"
fi
grep -q "still ENGINE.OFFLINE after 1 s" bad.log || fail "--no-start timeout error: $(cat bad.log)"

start=$SECONDS
SWARM_ADMIN_TOKEN=admin-token-for-the-smoke-test SWARM_CLIENT_TOKEN=client-token-for-the-smoke-test \
  timeout 90 "$python" "$agent" --server "$url" --steps 3 --workers 2 --batch-size 2 --num-repeat 2 \
  --step-timeout 30 >agent.log 2>&1 || fail "python_agent failed"
echo "python_agent: 3 steps in $((SECONDS - start)) s"
for s in 1 2 3; do
  grep -Eq "^step $s  episodes=[0-9]+  reward_mean=" agent.log || fail "no line for step $s"
done
grep -q "^python_agent: done at global_step" agent.log || fail "no final line"

# The server aggregates each step's log_metrics into metrics.jsonl (docs/protocol.md).
"$python" - <<'PY' || fail "metrics.jsonl"
import json
rows = [json.loads(l) for l in open("experiments/python_agent/default/metrics.jsonl")]
assert len(rows) >= 3, f"{len(rows)} lines, want at least 3"  # the agent may finish a step more
for i, r in enumerate(rows[:3], 1):
    assert r["step"] == i and r["episodes"] >= 4, r
    assert 0.0 <= r["reward_mean"] <= 1.0, r
    chars = r.get("log_metrics", {}).get("answer_chars")
    assert chars is not None, f"step {i}: no log_metrics.answer_chars in {r}"
    assert chars["episodes"] == r["episodes"], (chars, r["episodes"])  # every episode sent it
    assert 0 < chars["min"] <= chars["mean"] <= chars["max"], chars
    assert "completion_tokens" in r["log_metrics"], r["log_metrics"]
PY

# --no-start joins the running engine (it keeps its config) and drives it one step further.
next_step="$("$python" -c 'import json, sys, urllib.request
print(json.load(urllib.request.urlopen(sys.argv[1] + "/get_engine_status"))["global_step"] + 1)' "$url")"
SWARM_CLIENT_TOKEN=client-token-for-the-smoke-test timeout 60 "$python" "$agent" --server "$url" --no-start \
  --steps "$next_step" --workers 2 --step-timeout 30 >agent.log 2>&1 || fail "python_agent --no-start failed"
grep -q "keeping its config" agent.log || fail "--no-start did not join the running engine"
grep -q "^step $next_step  episodes=" agent.log || fail "--no-start: no line for step $next_step"

kill -TERM "$pid"
wait "$pid" || true
echo "python_agent smoke: ok"
