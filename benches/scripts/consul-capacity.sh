#!/usr/bin/env bash
# The capacity run of BENCHMARKS.md "Where a real Consul 1.20.1 breaks": a
# real `consul agent -dev` pinned to core 0, agent-sim pinned to core 1,
# Consul agents at the default wire (RPC connection, Subscribe streams,
# TTL session, gossip) stepped by --steps and judged over each step's
# window by SLOs on propagation p99 and the server's raft commit p99
# (--observe consul). Then two fixed-size runs, each on a fresh server:
# one at the last step that held and one at the step that broke, each a
# single step of its size held FIXED (default 120 s) and judged by the same
# SLOs over its steady window (a whole run's figures would include the
# boot's join storm), to check the knee.
#
#   CONSUL_BIN=/path/to/consul bash benches/scripts/consul-capacity.sh [STEPS] [HOLD]
#   CONSUL_BIN=... bash benches/scripts/consul-capacity.sh 500,1000,2000,4000,6000 60s
#   ONLY_FIXED="2000 4000" ...: the fixed-size runs alone
#
# Prints the stepped run's table and answer, then each fixed run's verdicts.
# Everything lands in target/bench-consul-capacity/.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/real-consul.sh
STEPS=${1:-1000,2000,4000,6000,8000}
HOLD=${2:-60s}
SETTLE=${SETTLE:-15s}
RAMP=${RAMP:-200/s}
FIXED=${FIXED:-120s}
CONSUL_BIN=${CONSUL_BIN:?set CONSUL_BIN to a consul 1.20.1 binary}
OUT=${OUT:-target/bench-consul-capacity}
[ -n "${ONLY_FIXED:-}" ] || rm -rf "$OUT"
mkdir -p "$OUT"
BIN=$(agent_sim_bin)
server_hcl "$OUT/server.hcl"
SLOS=('propagation.p99 < 1s' 'server.consul_raft_commit_time.p99 < 50ms'
  'agents.connected == requested' 'errors.total == 0')

server_pid=
stop_server() {
  [ -n "$server_pid" ] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$server_pid" 2>/dev/null || true
  server_pid=
}
trap stop_server EXIT
# A fresh -dev server on core 0 (its state and members gone with the last).
start_server() {
  rm -rf "$OUT/data"
  taskset -c 0 "$CONSUL_BIN" agent -dev -client 127.0.0.1 -bind 127.0.0.1 -log-level warn \
    -config-file "$OUT/server.hcl" -data-dir "$OUT/data" >"$OUT/server-$1.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    curl -sf 127.0.0.1:8500/v1/status/leader | grep -q 8300 && return 0
    sleep 0.2
  done
  echo "the dev server did not elect itself" >&2
  exit 1
}
sim() {
  taskset -c 1 "$BIN" --kind consul --target 127.0.0.1:8300 --http-target 127.0.0.1:8500 \
    --ramp "$RAMP" --probe-every 10s --observe consul --observe-every 5s "$@"
}

slo_flags=()
for s in "${SLOS[@]}"; do slo_flags+=(--slo "$s"); done
if [ -z "${ONLY_FIXED:-}" ]; then
  start_server stepped
  sim --steps "$STEPS" --step-hold "$HOLD" --step-settle "$SETTLE" "${slo_flags[@]}" \
    --summary "$OUT/stepped.json" --report-html "$OUT/stepped.html" >"$OUT/stepped.txt" 2>"$OUT/stepped.err" || true
  stop_server
  sed -n '/^Capacity/,$p' "$OUT/stepped.txt"
fi

HELD=0 BROKE=0
[ -n "${ONLY_FIXED:-}" ] || read -r HELD BROKE < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["capacity"]
print(c.get("capacity") or 0, c.get("broke_at") or 0)' "$OUT/stepped.json")
for n in ${ONLY_FIXED:-$HELD $BROKE}; do
  [ "$n" -gt 0 ] || continue
  start_server "fixed-$n"
  echo "--- fixed run: $n agents, one step held $FIXED"
  sim --steps "$n" --step-hold "$FIXED" --step-settle "$SETTLE" "${slo_flags[@]}" \
    --summary "$OUT/fixed-$n.json" >"$OUT/fixed-$n.txt" 2>"$OUT/fixed-$n.err" || true
  stop_server
  sed -n '/^Capacity/,$p' "$OUT/fixed-$n.txt" | tail -n +3
done
