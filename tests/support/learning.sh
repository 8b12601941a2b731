# Sourced by tests/learning/*.sh after they set server_bin: a scratch directory ($work, removed
# on exit, with any server left running killed), /usr/bin/python3 as $python, fail(), and
# start_server / stop_server for swarm-server on the torch engine in the current directory.
source "$(dirname "${BASH_SOURCE[0]}")/server_port.sh"
python=/usr/bin/python3
work="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT

# fail MESSAGE: prints it and the end of the server's log, and exits 1.
fail() {
  echo "FAIL: $*" >&2
  if [ -f server.log ]; then tail -30 server.log >&2; else tail -30 "$work"/*/server.log >&2 2>/dev/null || true; fi
  exit 1
}

# start_server: swarm-server on a free port, logging to ./server.log; sets $pid and $port.
start_server() {
  "$server_bin" start --port 0 --engine torch >server.log 2>&1 &
  pid=$!
  wait_for_port server.log "$pid" 300 0.1 || fail "$server_problem"
}

# stop_server: SIGTERM (the server writes its checkpoint) and wait for it.
stop_server() {
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
}
