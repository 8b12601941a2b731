#!/usr/bin/env bash
# swarm-overwatch full screen, for real: the mock swarm-server on an ephemeral port,
# echo_agent driving two policy steps, swarm-overwatch inside a detached tmux session
# (120x40). Checks the frame (engine state, step, batch, a running episode, traffic),
# that q and Ctrl-C end it cleanly (exit 0, main screen restored), and that killing the
# server brings up the unreachable screen while overwatch keeps retrying.
# Usage: overwatch_tmux.sh <swarm-overwatch> <swarm-server> <echo_agent>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_port.sh"
overwatch_bin="$(realpath "$1")" server_bin="$(realpath "$2")" agent_bin="$(realpath "$3")"

if ! command -v tmux >/dev/null 2>&1; then
  echo "SKIP: tmux is not installed (scripts/setup.sh installs it)"
  exit 77
fi

unset TMUX  # a private tmux server below, even when the tests run inside tmux
work="$(mktemp -d)"
# A private tmux server (its own socket), so nothing here touches the user's sessions.
sock="$work/tmux.sock"
tm() { tmux -S "$sock" "$@"; }
cleanup() {
  tm kill-server 2>/dev/null || true
  if [ -n "${server_pid:-}" ]; then
    kill -9 "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  echo "---- pane" >&2
  tm capture-pane -p -t ow 2>/dev/null >&2 || true
  echo "---- server log" >&2
  cat "$work/server.log" >&2 2>/dev/null || true
  exit 1
}

# Waits until the pane shows every given pattern (grep -E), or fails after $2 seconds.
wait_for_pane() {
  local what="$1" seconds="$2"
  shift 2
  local deadline=$((SECONDS + seconds)) screen ok
  while :; do
    screen="$(tm capture-pane -p -t ow 2>/dev/null || true)"
    ok=1
    for pat in "$@"; do
      grep -qE -- "$pat" <<<"$screen" || { ok=0; break; }
    done
    [ "$ok" -eq 1 ] && return 0
    [ "$SECONDS" -ge "$deadline" ] && fail "timed out waiting for $what (missing: $pat)"
    sleep 0.1
  done
}

start_server() {
  "$server_bin" start --port 0 --log-level info >"$work/server.log" 2>&1 &
  server_pid=$!
  wait_for_port "$work/server.log" "$server_pid" 200 0.05 || fail "$server_problem"
  url="http://127.0.0.1:$port"
}

# Starts a detached tmux session (name, then the rest of new-session's arguments), trying
# again up to 5 times, 0.2 s apart, when the tmux client fails; fails the test with tmux's
# message after the last try. CI once saw a bare "server exited unexpectedly" from the
# tmux client (tmux 3.3a, under load), which under set -e ended the test with no hint.
new_session() {
  local name="$1" err=""
  shift
  for _ in 1 2 3 4 5; do
    tm kill-session -t "$name" 2>/dev/null || true
    if err="$(tm -u new-session -d -s "$name" "$@" 2>&1)"; then return 0; fi
    sleep 0.2
  done
  fail "tmux could not start the session $name: $err"
}

# Sends keys to the overwatch pane (once: a repeated Ctrl-C would end the pane's sleep).
send_keys() {
  tm send-keys -t ow "$@" || fail "tmux could not send $*"
}

# A session that lives as long as the test keeps the private tmux server up, so killing
# "ow" below never leaves the server without sessions (it would exit, racing the next
# new-session).
start_tmux_server() {
  new_session keep "sleep 3600"
}

# Runs overwatch in the tmux session "ow"; when it exits the pane prints its exit code
# and stays open, so the test can read both.
start_overwatch() {
  new_session ow -x 120 -y 40 \
    "env LANG=C.UTF-8 TERM=xterm-256color '$overwatch_bin' --url '$url' --interval 0.2; echo \"OVERWATCH-EXIT=\$?\"; sleep 600"
}

cd "$work"  # the mock engine writes its experiment files under the working directory
start_server

# --once against the live server, and its failure mode.
"$overwatch_bin" --once --no-color --url "$url" >"$work/once.txt" || fail "--once failed against a live server"
grep -q "ENGINE.OFFLINE" "$work/once.txt" || fail "--once frame lacks the engine state: $(cat "$work/once.txt")"
if grep -q $'\x1b' "$work/once.txt"; then fail "--once --no-color printed escape sequences"; fi
if "$overwatch_bin" --once --url "http://127.0.0.1:1" >"$work/down.txt" 2>"$work/down.err"; then
  fail "--once exited 0 with no server"
fi
grep -q "cannot reach the swarm server" "$work/down.err" || fail "--once without server: $(cat "$work/down.err")"

"$agent_bin" --url "$url" --steps 2 --workers 4 --batch-size 2 --num-repeat 2 >"$work/agent.log" 2>&1 \
  || { cat "$work/agent.log" >&2; fail "echo_agent failed"; }

# A claimed episode that stays open: it must show in the running-episodes panel.
claim="$(curl -sf -X POST "$url/claim_episode" -H 'Content-Type: application/json' \
  -d '{"client_uuid": "ow-test-client", "episode_type": "train", "discard_episode_timeout": 600}')" \
  || fail "claim_episode failed"
grep -q '"success":true' <<<"$claim" || fail "claim_episode: $claim"

export LANG=C.UTF-8  # tmux draws UTF-8 only when the locale says so
start_tmux_server
start_overwatch
wait_for_pane "the dashboard" 20 "swarm-overwatch +http://127.0.0.1:$port" "ENGINE\.ROLLING" "step 2 · policy v2" \
  "claims open" "tasks +\[.*\] +0/2" "Running episodes \(1\)" "ow-test-" "train" "per step" \
  "step 2: [0-9.]+ ± " "requests [0-9]+ \([0-9.]+/s\)" "claimed [0-9]+" "q quit"

# q quits cleanly: exit 0 and the main screen is back (the exit line is visible).
send_keys q
wait_for_pane "exit after q" 10 "OVERWATCH-EXIT=0"
if tm capture-pane -p -t ow | grep -q "Running episodes"; then fail "the dashboard is still on screen after q"; fi

# Ctrl-C (SIGINT) quits cleanly too.
start_overwatch
wait_for_pane "the dashboard again" 20 "ENGINE\.ROLLING"
send_keys C-c
wait_for_pane "exit after Ctrl-C" 10 "OVERWATCH-EXIT=0"

# The server goes away: the unreachable screen, and overwatch keeps retrying.
start_overwatch
wait_for_pane "the dashboard before the kill" 20 "ENGINE\.ROLLING"
kill -9 "$server_pid"
wait "$server_pid" 2>/dev/null || true
server_pid=""
wait_for_pane "the unreachable screen" 20 "SERVER UNREACHABLE" "down for" "failed poll" "last error: .+" \
  "last seen .* ago: ENGINE\.ROLLING"
# Still running (no exit line) and still counting failed polls.
first="$(tm capture-pane -p -t ow | sed -n 's/.* \([0-9]*\) failed polls\{0,1\}.*/\1/p' | head -1)"
wait_for_pane "more failed polls" 10 "failed polls"
deadline=$((SECONDS + 10))
while :; do
  now="$(tm capture-pane -p -t ow | sed -n 's/.* \([0-9]*\) failed polls\{0,1\}.*/\1/p' | head -1)"
  [ -n "$now" ] && [ -n "$first" ] && [ "$now" -gt "$first" ] && break
  [ "$SECONDS" -ge "$deadline" ] && fail "overwatch stopped retrying (failed polls stuck at ${now:-?})"
  sleep 0.1
done
if tm capture-pane -p -t ow | grep -q "OVERWATCH-EXIT"; then fail "overwatch exited while the server was down"; fi

# A new server on the same port: overwatch recovers by itself.
"$server_bin" start --port "$port" >"$work/server.log" 2>&1 &
server_pid=$!
wait_for_pane "recovery after the restart" 20 "ENGINE\.OFFLINE" "step 0 · policy v0"

send_keys q
wait_for_pane "exit after q" 10 "OVERWATCH-EXIT=0"
kill -TERM "$server_pid"
wait "$server_pid" || fail "server exit code $? after SIGTERM"
server_pid=""
echo "overwatch tmux: ok (port $port)"
