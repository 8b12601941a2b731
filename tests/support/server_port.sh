# Sourced by the shell tests that start `swarm-server start --port 0 ...` in the background.
#
# wait_for_port LOG PID TRIES INTERVAL
#   Waits until the server's log LOG names the port it listens on and sets $port to it
#   (polling TRIES times, INTERVAL seconds apart). Returns 1 with the reason in
#   $server_problem when process PID exits first ("server exited early") or the port never
#   shows ("server did not report its port").
wait_for_port() {
  local log="$1" server_pid="$2" tries="$3" interval="$4"
  port=""
  server_problem=""
  for _ in $(seq 1 "$tries"); do
    port="$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log" | head -1)"
    [ -n "$port" ] && return 0
    if ! kill -0 "$server_pid" 2>/dev/null; then
      server_problem="server exited early"
      return 1
    fi
    sleep "$interval"
  done
  server_problem="server did not report its port"
  return 1
}
