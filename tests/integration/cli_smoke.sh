#!/usr/bin/env bash
# The real binaries: swarm-server starts on an ephemeral port, echo_agent drives three
# weight-sync cycles against it, SIGTERM stops the server gracefully with exit 0. The server
# runs with an admin token: the agent passes it through SWARM_ADMIN_TOKEN (the SDK sends it),
# a request without it gets 401.
# Usage: cli_smoke.sh <swarm-server> <echo_agent>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
server_bin="$1" agent_bin="$2"
work="$(mktemp -d)"
trap 'kill -9 "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; cat "$work/server.log" >&2 2>/dev/null || true; exit 1; }

"$server_bin" --help >/dev/null || fail "--help"
"$server_bin" start --help | grep -q -- "--engine" || fail "start --help lacks --engine"
if "$server_bin" start --engine banana >/dev/null 2>&1; then fail "--engine banana accepted"; fi
if "$server_bin" start --config /nonexistent.yaml >/dev/null 2>&1; then fail "missing --config accepted"; fi

# A config file with an unknown key must be refused with the key named.
printf 'algorithm: grpo\nmodel: m\nbatch_sise: 2\n' >"$work/bad.yaml"
if "$server_bin" start --port 0 --config "$work/bad.yaml" >"$work/bad.log" 2>&1; then fail "bad config accepted"; fi
grep -q "batch_sise" "$work/bad.log" || fail "bad config error does not name the key: $(cat "$work/bad.log")"

# An empty token file is refused at start, naming the problem.
: >"$work/empty.token"
if "$server_bin" start --port 0 --admin-token-file "$work/empty.token" >"$work/tok.log" 2>&1; then fail "empty token file accepted"; fi
grep -q "is empty" "$work/tok.log" || fail "empty token file: $(cat "$work/tok.log")"

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/admin.token"
"$server_bin" start --port 0 --log-level info --admin-token-file "$work/admin.token" >"$work/server.log" 2>&1 &
pid=$!
wait_for_port "$work/server.log" "$pid" 100 0.05 || fail "$server_problem"
grep -q "control routes need the admin token" "$work/server.log" || fail "the log does not say the control routes are protected"
code="$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$port/stop_engine")"
[ "$code" = 401 ] || fail "stop_engine without the admin token answered $code"

SWARM_ADMIN_TOKEN="$(cat "$work/admin.token")" "$agent_bin" --url "http://127.0.0.1:$port" --steps 3 --workers 4 --batch-size 2 --num-repeat 2 >"$work/agent.log" 2>&1 \
  || { cat "$work/agent.log" >&2; fail "echo_agent failed"; }
grep -q "step 3/3" "$work/agent.log" || fail "agent did not report step 3: $(cat "$work/agent.log")"
[ "$(grep -c 'WEIGHT_SYNCING -> ROLLING' "$work/server.log")" -ge 3 ] || fail "fewer than 3 weight-sync cycles in the server log"

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || fail "server exit code $rc after SIGTERM"
grep -q "swarm-server: stopped" "$work/server.log" || fail "no graceful stop message"
echo "cli smoke: ok (port $port)"
