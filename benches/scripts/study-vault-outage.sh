#!/usr/bin/env bash
# The vault-outage study against one real Consul 1.20.1 server whose raft log
# lives on this box's disk (not `-dev`, which keeps raft in memory): each
# commit is written and fsynced there, as on the outage's servers. The server
# is pinned to core 0 and agent-sim to core 1. Prints the run's table, which
# ends with the study's section (the published figures beside ours).
#
#   CONSUL_BIN=/path/to/consul bash benches/scripts/study-vault-outage.sh [SCALE] [-- agent-sim flags]
#
# SCALE: the study's --scale (default 0.1). CONSUL_BIN is a Consul 1.20.1
# binary you built (docs/real-servers.md); nothing of Consul is in this
# repository. DATA: the server's data directory (default OUT/data, on the
# disk OUT is on). SERVER_IP (default 127.0.0.72: ports 8300, 8301, 8500
# there must be free). AGENT_SIM: an agent-sim binary to run instead of
# building one.
set -euo pipefail
cd "$(dirname "$0")/../.."
SCALE=${1:-0.1}
shift $(($# < 1 ? $# : 1))
[ "${1:-}" = "--" ] && shift
SIM_FLAGS=("$@")
SERVER_IP=${SERVER_IP:-127.0.0.72}
CONSUL_BIN=${CONSUL_BIN:?set CONSUL_BIN to a consul 1.20.1 binary}
OUT=$(realpath -m "${OUT:-target/bench-study-vault}")
DATA=${DATA:-$OUT/data}
rm -rf "$OUT" "$DATA" && mkdir -p "$OUT" "$DATA"
. benches/scripts/real-consul.sh
BIN=$(agent_sim_bin)
cat >"$OUT/server.hcl" <<HCL
datacenter = "dc1"
data_dir = "$DATA"
node_name = "vault-outage-server"
server = true
bootstrap_expect = 1
bind_addr = "$SERVER_IP"
client_addr = "$SERVER_IP"
advertise_addr = "$SERVER_IP"
ports { dns = -1  grpc = -1 }
limits { rpc_max_conns_per_client = 0  http_max_conns_per_client = 0 }
telemetry { prometheus_retention_time = "900s"  disable_hostname = true }
log_level = "info"
HCL
start_pinned_consul "$OUT/server.hcl" "$OUT/server.log"
echo "data directory: $DATA ($(df -h "$DATA" | awk 'NR==2 {print $1, $6}'))"
taskset -c 1 "$BIN" study vault-outage --scale "$SCALE" \
  --target "$SERVER_IP:8300" --http-target "$SERVER_IP:8500" \
  --observe consul --observe-pid "$server_pid" \
  --summary "$OUT/summary.json" --report-html "$OUT/report.html" "${SIM_FLAGS[@]}" \
  >"$OUT/table.txt" 2>"$OUT/progress.txt" || true
cat "$OUT/table.txt"
echo "raft log on disk: $(du -sh "$DATA/raft" 2>/dev/null | cut -f1)"
