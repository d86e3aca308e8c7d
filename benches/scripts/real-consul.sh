# Sourced by the scripts that run a study against one real Consul server:
# what they share. Nothing of Consul is in this repository; CONSUL_BIN is a
# binary you built (docs/real-servers.md).

# The agent-sim binary to run: $AGENT_SIM, or a release build of this checkout.
agent_sim_bin() {
  if [ -n "${AGENT_SIM:-}" ]; then
    echo "$AGENT_SIM"
  else
    nice cargo build --release -p agent-sim 2>/dev/null
    echo "$PWD/target/release/agent-sim"
  fi
}

# Writes the server settings every measured run shares to file $1: no
# per-client connection limit (every agent of one box is one client address),
# and counters kept for the whole run (a counter go-metrics has not touched
# for the retention time leaves the exposition: serf's member joins, for one).
server_hcl() {
  printf '%s\n' 'limits { rpc_max_conns_per_client = 0  http_max_conns_per_client = 0 }' \
    'telemetry { prometheus_retention_time = "900s"  disable_hostname = true }' >"$1"
}

# Starts the server from config file $1 (its log in $2) pinned to core 0,
# sets server_pid, stops it when the script exits, and waits (at most 60 s)
# until it has a leader at $SERVER_IP.
start_pinned_consul() {
  taskset -c 0 "$CONSUL_BIN" agent -config-file "$1" >"$2" 2>&1 &
  server_pid=$!
  trap 'kill -TERM $server_pid 2>/dev/null; wait $server_pid 2>/dev/null || true' EXIT
  for _ in $(seq 60); do
    curl -fsS "http://$SERVER_IP:8500/v1/status/leader" 2>/dev/null | grep -q 8300 && return 0
    sleep 1
  done
  echo "the server at $SERVER_IP elected no leader in 60 s" >&2
  exit 1
}
