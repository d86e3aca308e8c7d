#!/usr/bin/env bash
# The dataplane benchmark: N consul-dataplane sidecars (default 5,000), each
# with one gRPC connection carrying bootstrap params, a Delta ADS stream
# (clusters web, api and the run's own probe service agent-sim-probe, their
# endpoints) and a WatchServers stream, against `agent-sim serve` in another
# process (coalescing 200 ms, as Consul), with a catalog propagation probe
# every 10 s timed at each sidecar's EDS update. Prints the propagation
# table, KiB per sidecar (RSS after the ramp) and the CPU of both processes.
# The server does not pace updates by default here (XDS_UPDATE_RATE=off):
# at Consul's 250/s one change reaches 5,000 proxies over 20 s, longer than
# the probe period, and the ramp (500/s) outruns first configurations; set
# XDS_UPDATE_RATE=250/s to see a real server's pacing instead.
#
# PIN=1 pins the server to core 0 and agent-sim to core 1 (taskset), so
# each process's CPU is its own.
#
#   bash benches/scripts/dataplane-sidecars.sh [SIDECARS] [STEADY_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-5000}
STEADY=${2:-60}
RAMP=${RAMP:-500/s}
RPC=${RPC:-18301}
HTTP=${HTTP:-18501}
GRPC=${GRPC:-18502}
OUT=${OUT:-target/bench-dataplane}
mkdir -p "$OUT"
SERVE_PIN=() SIM_PIN=()
if [ "${PIN:-0}" = 1 ]; then SERVE_PIN=(taskset -c 0) SIM_PIN=(taskset -c 1); fi
# BIN=target/debug/agent-sim runs the script on a debug build (a smoke
# test; figures for BENCHMARKS.md come from the release build).
if [ -z "${BIN:-}" ]; then
  cargo build --release -p agent-sim ${FEATURES:+--features "$FEATURES"} 2>/dev/null   # FEATURES=jemalloc: see BENCHMARKS.md
  BIN=target/release/agent-sim
fi

"${SERVE_PIN[@]}" "$BIN" serve --consul-rpc 127.0.0.1:$RPC --consul-http 127.0.0.1:$HTTP --consul-grpc 127.0.0.1:$GRPC \
  --xds-update-rate "${XDS_UPDATE_RATE:-off}" --stats-every 0 2>"$OUT/serve.log" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
sleep 1

RAMP_S=$(python3 -c "print(int($AGENTS/float('${RAMP%/s}'))+5)")
DURATION=$((RAMP_S + STEADY + 5))
"${SIM_PIN[@]}" "$BIN" --kind consul-dataplane --agents "$AGENTS" --target 127.0.0.1:$GRPC --http-target 127.0.0.1:$HTTP \
  --upstreams web,api --watch-servers --probe catalog --probe-every 10s --probe-timeout 8s \
  --ramp "$RAMP" --duration "${DURATION}s" --summary "$OUT/summary.json" ${SIM_ARGS:-} \
  --progress-every 10s >"$OUT/table.txt" 2>"$OUT/progress.log" &
SIM=$!
sleep 0.3
R0=$(awk '/VmRSS/{print $2}' /proc/$SIM/status)
sleep "$RAMP_S"
R1=$(awk '/VmRSS/{print $2}' /proc/$SIM/status)
wait $SIM || true
# The server's CPU (user+sys clock ticks) while it served the run.
read -r SU SS < <(awk '{print $14, $15}' /proc/$SERVE/stat)
TCK=$(getconf CLK_TCK)

python3 - "$OUT/summary.json" "$AGENTS" "$R0" "$R1" "$SU" "$SS" "$TCK" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
agents, r0, r1 = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
su, ss, tck = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
c = s["counters"]
print(f"sidecars requested {s['agents']['requested']} connected {s['agents']['connected']} never connected {s['agents']['never_connected']} exit {s['outcome']['exit_code']}")
print(f"xds_streams {c.get('xds_streams')} responses {c.get('xds_responses')} acks {c.get('xds_acks')} nacks {c.get('xds_nacks')} eds_updates {c.get('eds_updates')} server_lists {c.get('server_lists')} errors { {k: v['count'] for k, v in s['errors'].items()} }")
print(f"RSS after the ramp {r1/1024:.1f} MiB: {(r1 - r0)/agents:.1f} KiB per sidecar (above the process at start, {r0/1024:.1f} MiB); peak {s['process']['peak_rss_bytes']/2**20:.1f} MiB")
print(f"CPU simulator user {s['process']['cpu_user_s']:.1f}s sys {s['process']['cpu_sys_s']:.1f}s; agent-sim serve user {su/tck:.1f}s sys {ss/tck:.1f}s (over {s['duration_s']:.0f}s)")
print("propagation at the proxies (T0 = the write sent; arrival = kernel receive time of the EDS update; the server coalesces changes for 200 ms)")
for p in s.get("probes", []):
    l = p["latency_us"]
    print(f"probe #{p['id']} {p['kind']:<10} {p['delivered']}/{p['expected']} p50 {l['p50']/1e3:.1f}ms p90 {l['p90']/1e3:.1f}ms p99 {l['p99']/1e3:.1f}ms p99.9 {l['p999']/1e3:.1f}ms max {l['max']/1e3:.1f}ms 99% at {(p['time_to_99pct_us'] or 0)/1e3:.1f}ms")
lat = s["latency_us"]
for name in ["propagation_xds", "probe_overhead", "connect", "xds_bootstrap", "xds_initial"]:
    if name in lat and lat[name]["count"]:
        l = lat[name]
        print(f"{name:<16} n={l['count']:<7} p50 {l['p50']}us p99 {l['p99']}us p99.9 {l['p999']}us max {l['max']}us")
PY
