#!/usr/bin/env bash
# What one real Consul server spends on N client agents: N real Consul client
# agents, then N agent-sim agents, each against a fresh `-dev` server on
# 127.0.0.1, the same steady-state window measured at the server (its
# Prometheus counters and its /proc CPU). Prints one row per fleet and the
# ratio agent-sim / real (the fidelity table of BENCHMARKS.md).
#
#   CONSUL_BIN=/path/to/consul bash benches/scripts/consul-fidelity.sh [N] [SECONDS] [FLEETS] [-- agent-sim flags]
#
# FLEETS: "real sim" (default), or one of them. CONSUL_BIN is a Consul 1.20.1
# binary you built (docs/real-servers.md); nothing of Consul is in this
# repository. Real agents run on 127.0.0.11 upward, one service each
# ({"service":{"name":"app","port":8080}}), ~100 MiB of RSS apiece. The
# window starts WARMUP seconds (default 45) after the last agent joined.
# Extra flags after `--` go to agent-sim (e.g. `--consul-agent api`).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-100}
WINDOW=${2:-60}
FLEETS=${3:-"real sim"}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
SIM_FLAGS=("$@")
WARMUP=${WARMUP:-45}
CONSUL_BIN=${CONSUL_BIN:?set CONSUL_BIN to a consul 1.20.1 binary}
OUT=${OUT:-target/bench-consul-fidelity}
rm -rf "$OUT" && mkdir -p "$OUT"
cargo build --release -p agent-sim 2>/dev/null
BIN=$PWD/target/release/agent-sim
cat >"$OUT/server.hcl" <<'HCL'
limits { rpc_max_conns_per_client = 0  http_max_conns_per_client = 0 }
telemetry { prometheus_retention_time = "120s"  disable_hostname = true }
HCL
# EXTRA_HCL: more server configuration (e.g. a telemetry prefix_filter), in a second
# file (Consul merges files; the same block twice in one file is refused).
printf '%s\n' "${EXTRA_HCL:-}" >"$OUT/extra.hcl"
echo '{"service":{"name":"app","port":8080}}' >"$OUT/svc.json"

server_pid=
stop_all() {
  pkill -TERM -f "consul agent -data-dir $OUT/" 2>/dev/null || true
  [ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null || true
  for _ in $(seq 50); do
    pgrep -f "$OUT/" >/dev/null || break
    sleep 0.2
  done
  pkill -KILL -f "$OUT/" 2>/dev/null || true
  server_pid=
}
trap stop_all EXIT

start_server() {
  "$CONSUL_BIN" agent -dev -client 127.0.0.1 -bind 127.0.0.1 -log-level warn \
    -config-file "$OUT/server.hcl" -config-file "$OUT/extra.hcl" -data-dir "$OUT/server" >"$OUT/server-$1.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    curl -sf 127.0.0.1:8500/v1/status/leader | grep -q 8300 && return 0
    sleep 0.2
  done
  echo "the dev server did not elect itself" >&2
  exit 1
}

# Counters and process CPU of the server at one moment, as JSON.
# The whole exposition is kept in the file named by $1.
snapshot() {
  python3 - "$server_pid" "$1" <<'PY'
import json, os, sys, urllib.request
pid = int(sys.argv[1])
body = urllib.request.urlopen(
    "http://127.0.0.1:8500/v1/agent/metrics?format=prometheus", timeout=10).read().decode()
open(sys.argv[2], "w").write(body)
want = ("consul_rpc_request", "consul_rpc_query", "consul_raft_apply",
        "consul_raft_commitTime_count", "consul_fsm_coordinate_batch_update_count",
        "consul_memberlist_udp_received", "consul_memberlist_udp_sent",
        "consul_memberlist_tcp_accept", "consul_memberlist_probeNode_count",
        "consul_serf_coordinate_adjustment_ms_count", "consul_api_http_count",
        "consul_catalog_register_count", "consul_rpc_accept_conn")
out = {}
for line in body.splitlines():
    if line.startswith("#"):
        continue
    name, _, value = line.rpartition(" ")
    base = name.split("{")[0]
    if base in want:
        out[base] = out.get(base, 0.0) + float(value)
ticks = os.sysconf("SC_CLK_TCK")
f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
out["cpu_s"] = (int(f[11]) + int(f[12])) / ticks
print(json.dumps(out))
PY
}

measure() {
  snapshot "$OUT/$1-start.prom" >"$OUT/$1-start.json"
  sleep "$WINDOW"
  snapshot "$OUT/$1-end.prom" >"$OUT/$1-end.json"
}

members_alive() {
  curl -sf 127.0.0.1:8500/v1/catalog/service/app | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'
}

for fleet in $FLEETS; do
  start_server "$fleet"
  case "$fleet" in
  real)
    for i in $(seq 1 "$N"); do
      a=$((10 + i))
      ip="127.0.$((a / 250)).$((a % 250 + 1))"
      "$CONSUL_BIN" agent -data-dir "$OUT/a$i" -node "real-$i" -bind "$ip" -client "$ip" \
        -retry-join 127.0.0.1 -config-file "$OUT/svc.json" -log-level warn >"$OUT/a$i.log" 2>&1 &
    done
    for _ in $(seq 300); do
      [ "$(members_alive 2>/dev/null || echo 0)" -ge "$N" ] && break
      sleep 1
    done
    echo "real: $(members_alive) of $N registered" >&2
    sleep "$WARMUP"
    measure real
    ;;
  sim)
    "$BIN" --kind consul --agents "$N" --target 127.0.0.1:8300 --http-target 127.0.0.1:8500 \
      --upstreams web --probe off --session-ttl off --services-per-agent 1 --ramp 50/s \
      --duration "$((WARMUP + WINDOW + 30))s" --quiet --summary "$OUT/sim.json" \
      "${SIM_FLAGS[@]}" >"$OUT/sim.txt" 2>&1 &
    sim_pid=$!
    sleep "$((WARMUP + N / 50 + 2))"
    measure sim
    wait "$sim_pid" || true
    ;;
  *) echo "unknown fleet $fleet (real or sim)" >&2; exit 64 ;;
  esac
  stop_all
  sleep 2
done

python3 - "$OUT" "$WINDOW" "$FLEETS" <<'PY'
import json, sys
d, window, fleets = sys.argv[1], float(sys.argv[2]), sys.argv[3].split()
rows = [("server CPU (s over the window)", "cpu_s", 1.0),
        ("rpc requests /s", "consul_rpc_request", window),
        ("rpc queries /s", "consul_rpc_query", window),
        ("raft applies /s", "consul_raft_apply", window),
        ("raft commits /s", "consul_raft_commitTime_count", window),
        ("coordinate batch updates /s", "consul_fsm_coordinate_batch_update_count", window),
        ("memberlist UDP in (B/s)", "consul_memberlist_udp_received", window),
        ("memberlist UDP out (B/s)", "consul_memberlist_udp_sent", window),
        ("memberlist probes /s", "consul_memberlist_probeNode_count", window),
        ("serf coordinate adjustments /s", "consul_serf_coordinate_adjustment_ms_count", window),
        ("HTTP API requests /s", "consul_api_http_count", window)]
delta = {}
for f in fleets:
    a = json.load(open(f"{d}/{f}-start.json"))
    b = json.load(open(f"{d}/{f}-end.json"))
    delta[f] = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in set(a) | set(b)}
print(f"{'the server saw':<34}" + "".join(f"{f:>12}" for f in fleets)
      + (f"{'sim/real':>10}" if len(fleets) == 2 else ""))
for label, key, div in rows:
    vals = [delta[f].get(key, 0.0) / div for f in fleets]
    line = f"{label:<34}" + "".join(f"{v:>12.2f}" for v in vals)
    if len(fleets) == 2:
        line += f"{(vals[1] / vals[0]) if vals[0] else float('nan'):>10.2f}"
    print(line)
PY
