#!/usr/bin/env bash
# Streaming vs blocking vs HTTP long polls on one Consul server (issue:
# watchers without streaming): configs/streaming-vs-blocking.toml run once
# per mode, one after the other, with the same N watchers of a seeded
# 5,000-instance service whose probe instance gets new metadata every
# second; the server is observed (--observe consul). Prints one row per
# mode: bytes received per watcher (whole run, and per change), responses
# decoded, the simulator's CPU and peak RSS, propagation p50/p99 with
# delivered/expected, and the server's CPU (steady state, cores) and RSS.
#
#   bash benches/scripts/streaming-vs-blocking.sh [WATCHERS] [SECONDS] [MODES]
#
# CONSUL=host (default 127.0.0.1: RPC 8300, HTTP 8500, with telemetry
# prometheus_retention_time set, see docs/observe.md), INSTANCES=5000.
set -euo pipefail
cd "$(dirname "$0")/../.."
WATCHERS=${1:-20}
SECONDS_RUN=${2:-60}
MODES=${3:-"streaming blocking http"}
CONSUL=${CONSUL:-127.0.0.1}
INSTANCES=${INSTANCES:-5000}
OUT=${OUT:-target/bench-streaming-vs-blocking}
rm -rf "$OUT" && mkdir -p "$OUT"
cargo build --release -p agent-sim 2>/dev/null
BIN=target/release/agent-sim

for mode in $MODES; do
  "$BIN" --config configs/streaming-vs-blocking.toml --watch "$mode" \
    --target "$CONSUL:8300" --http-target "$CONSUL:8500" \
    --seed-service "big=$INSTANCES" --agents "$WATCHERS" --ramp 20/s \
    --duration "${SECONDS_RUN}s" --quiet --summary "$OUT/$mode.json" >"$OUT/$mode.txt" 2>&1 || true
  sleep 5 # the server settles between modes
done

python3 - "$OUT" "$MODES" <<'PY'
import json, sys
d, modes = sys.argv[1], sys.argv[2].split()
mib = lambda b: f"{b / 2**20:.1f}"
print(f"{'mode':<10} {'held':>5} {'MiB rx/watcher':>15} {'KiB/change':>11} {'responses':>9} "
      f"{'client cpu s':>12} {'client RSS':>10} {'prop p50':>9} {'p99':>8} {'delivered':>11} "
      f"{'server cores':>12} {'server RSS':>10}")
for m in modes:
    s = json.load(open(f"{d}/{m}.json"))
    c = s["counters"]
    n = max(s["agents"]["connected"], 1)
    probes = s.get("probes") or []
    changes = max(len(probes), 1)
    delivered = sum(p["delivered"] for p in probes)
    expected = sum(p["expected"] for p in probes)
    rx = c.get("watch_bytes_received", 0)
    lat = s["latency_us"].get("propagation", {})
    ms = lambda us: f"{us / 1000:.1f}ms" if us else "-"
    cpu = s["process"]["cpu_user_s"] + s["process"]["cpu_sys_s"]
    srv = (s.get("server") or [{}])[0].get("sizing", {})
    cores = srv.get("cpu_cores", {}).get("mean")
    rss = srv.get("rss_bytes", {}).get("mean")
    # Streaming: events received; otherwise whole results decoded.
    responses = c.get("events_received", 0) if m == "streaming" else c.get("watch_responses", 0)
    print(f"{m:<10} {s['agents']['connected']:>5} {mib(rx / n):>15} {rx / n / changes / 1024:>11.1f} "
          f"{responses:>9} {cpu:>12.1f} {mib(s['process']['peak_rss_bytes']) + ' MiB':>10} "
          f"{ms(lat.get('p50')):>9} {ms(lat.get('p99')):>8} {f'{delivered}/{expected}':>11} "
          f"{(f'{cores:.2f}' if cores is not None else '-'):>12} {(mib(rss) + ' MiB') if rss else '-':>10}")
PY
