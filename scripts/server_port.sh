#!/usr/bin/env bash
# Prints the port of a swarm-server started with `--port 0` (any free port), read from its log
# once it says "listening on ...". Waits up to 120 s; fails with the server's error when it
# stops first. Usage: PORT=$(scripts/server_port.sh server.log)
set -uo pipefail
log="${1:-}"
[ -n "$log" ] || { echo "usage: scripts/server_port.sh SERVER_LOG" >&2; exit 2; }
for _ in $(seq 1 1200); do
  port="$(sed -n 's/.*listening on https\{0,1\}:\/\/.*:\([0-9][0-9]*\) (engine.*/\1/p' "$log" 2>/dev/null | head -1)"
  if [ -n "$port" ]; then echo "$port"; exit 0; fi
  if error="$(grep -m1 -E '\[(error|critical)\]' "$log" 2>/dev/null)"; then
    echo "server_port: the server did not start: $error" >&2
    exit 1
  fi
  sleep 0.1
done
echo "server_port: $log names no port after 120 s (is the server starting? is that its log?)" >&2
exit 1
