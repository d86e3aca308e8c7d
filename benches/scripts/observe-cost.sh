#!/usr/bin/env bash
# What --observe costs the sessions (issue: the server's side of the run):
# the same Sensu fleet against `agent-sim serve` in another process, three
# times: not observing; observing `serve --metrics-addr` every second; and
# observing an endpoint that accepts and never answers (every scrape runs
# into its timeout). Prints keepalive lateness, the simulator's CPU and the
# observer's warnings for each.
#
#   bash benches/scripts/observe-cost.sh [AGENTS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-10000}
SECONDS_RUN=${2:-60}
PORT=${PORT:-18281}
METRICS=${METRICS:-19281}
STALL=${STALL:-19282}
OUT=${OUT:-target/bench-observe}
rm -rf "$OUT" && mkdir -p "$OUT"
cargo build --release -p agent-sim ${FEATURES:+--features "$FEATURES"} 2>/dev/null
BIN=target/release/agent-sim

"$BIN" serve --sensu 127.0.0.1:$PORT --metrics-addr 127.0.0.1:$METRICS --check-interval 10s \
  --stats-every 0 2>"$OUT/serve.log" &
SERVE=$!
# An endpoint that takes connections and never answers.
python3 -c "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $STALL)); s.listen(64); held = []
while True:
    c, _ = s.accept(); held.append(c)
" &
STALLER=$!
trap 'kill $SERVE $STALLER 2>/dev/null || true' EXIT
sleep 1

run() {
  local name=$1; shift
  "$BIN" --agents "$AGENTS" --target 127.0.0.1:$PORT --keepalive-interval 5s --ramp 1000/s \
    --duration "${SECONDS_RUN}s" --quiet --summary "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1 || true
}
run none
run observed --observe "http://127.0.0.1:$METRICS/metrics" --observe-every 1s
run stalled --observe "http://127.0.0.1:$STALL/metrics" --observe-every 1s

python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
print(f"{'run':<10} {'connected':>9} {'lateness p50':>13} {'p99':>9} {'p99.9':>9} {'max':>9} {'cpu s':>7} {'scrapes':>8} {'failed':>7}")
for n in ("none", "observed", "stalled"):
    s = json.load(open(f"{d}/{n}.json"))
    l = s["latency_us"]["keepalive_lateness"]
    cpu = s["process"]["cpu_user_s"] + s["process"]["cpu_sys_s"]
    srv = (s.get("server") or [{}])[0]
    ms = lambda us: f"{us/1000:.1f}ms"
    print(f"{n:<10} {s['agents']['connected']:>9} {ms(l['p50']):>13} {ms(l['p99']):>9} {ms(l['p999']):>9} "
          f"{ms(l['max']):>9} {cpu:>7.1f} {srv.get('scrapes', '-'):>8} {srv.get('failed', '-'):>7}")
PY
