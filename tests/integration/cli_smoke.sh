#!/usr/bin/env bash
# The real binaries: swarm-server starts on an ephemeral port, echo_agent drives three
# weight-sync cycles against it, SIGTERM stops the server gracefully with exit 0.
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

"$server_bin" start --port 0 --log-level info >"$work/server.log" 2>&1 &
pid=$!
wait_for_port "$work/server.log" "$pid" 100 0.05 || fail "$server_problem"

"$agent_bin" --url "http://127.0.0.1:$port" --steps 3 --workers 4 --batch-size 2 --num-repeat 2 >"$work/agent.log" 2>&1 \
  || { cat "$work/agent.log" >&2; fail "echo_agent failed"; }
grep -q "step 3/3" "$work/agent.log" || fail "agent did not report step 3: $(cat "$work/agent.log")"
[ "$(grep -c 'WEIGHT_SYNCING -> ROLLING' "$work/server.log")" -ge 3 ] || fail "fewer than 3 weight-sync cycles in the server log"

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || fail "server exit code $rc after SIGTERM"
grep -q "swarm-server: stopped" "$work/server.log" || fail "no graceful stop message"
echo "cli smoke: ok (port $port)"
