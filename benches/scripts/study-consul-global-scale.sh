#!/usr/bin/env bash
# The consul-global-scale study against one real Consul 1.20.1 server with TLS,
# Connect and auto_encrypt on (as the published benchmark's servers), the
# server pinned to core 0 and agent-sim to core 1. Prints the run's table,
# which ends with the study's section (the published figures beside ours).
#
#   CONSUL_BIN=/path/to/consul bash benches/scripts/study-consul-global-scale.sh [SCALE] [-- agent-sim flags]
#
# SCALE: the study's --scale (default 0.1: 1,000 agents booting over 156 s,
# then 2 minutes). CONSUL_BIN is a Consul 1.20.1 binary you built
# (docs/real-servers.md); nothing of Consul is in this repository. The
# server's CA and certificate are made with `consul tls` in OUT; the server
# listens on SERVER_IP (default 127.0.0.71: ports 8300, 8301, 8500, 8502 there
# must be free). AGENT_SIM: an agent-sim binary to run instead of building one.
set -euo pipefail
cd "$(dirname "$0")/../.."
SCALE=${1:-0.1}
shift $(($# < 1 ? $# : 1))
[ "${1:-}" = "--" ] && shift
SIM_FLAGS=("$@")
SERVER_IP=${SERVER_IP:-127.0.0.71}
CONSUL_BIN=${CONSUL_BIN:?set CONSUL_BIN to a consul 1.20.1 binary}
OUT=$(realpath -m "${OUT:-target/bench-study-cgs}")
rm -rf "$OUT" && mkdir -p "$OUT/data"
. benches/scripts/real-consul.sh
BIN=$(agent_sim_bin)
(cd "$OUT" && "$CONSUL_BIN" tls ca create >/dev/null && "$CONSUL_BIN" tls cert create -server -dc dc1 >/dev/null)
cat >"$OUT/server.hcl" <<EOF
datacenter = "dc1"
data_dir = "$OUT/data"
node_name = "cgs-server"
server = true
bootstrap_expect = 1
bind_addr = "$SERVER_IP"
client_addr = "$SERVER_IP"
advertise_addr = "$SERVER_IP"
ports { dns = -1 }
connect { enabled = true }
auto_encrypt { allow_tls = true }
tls {
  defaults {
    ca_file = "$OUT/consul-agent-ca.pem"
    cert_file = "$OUT/dc1-server-consul-0.pem"
    key_file = "$OUT/dc1-server-consul-0-key.pem"
    verify_incoming = false
    verify_outgoing = true
  }
  internal_rpc { verify_server_hostname = true }
}
limits { rpc_max_conns_per_client = 0  http_max_conns_per_client = 0 }
telemetry { prometheus_retention_time = "900s"  disable_hostname = true }
log_level = "info"
EOF
start_pinned_consul "$OUT/server.hcl" "$OUT/server.log"
taskset -c 1 "$BIN" study consul-global-scale --scale "$SCALE" \
  --target "$SERVER_IP:8300" --http-target "$SERVER_IP:8500" \
  --ca-file "$OUT/consul-agent-ca.pem" --tls-server-name server.dc1.consul \
  --observe consul --observe-pid "$server_pid" \
  --summary "$OUT/summary.json" --report-html "$OUT/report.html" "${SIM_FLAGS[@]}" \
  >"$OUT/table.txt" 2>"$OUT/progress.txt" || true
cat "$OUT/table.txt"
echo "handler queue / push-pull overflow lines: $(grep -c -E 'handler queue full|Too many pending push/pull' "$OUT/server.log" || true)"
echo "rate-limited CSRs (server log): $(grep -c -i 'rate limit' "$OUT/server.log" || true)"
