#!/usr/bin/env bash
# The headline command as typed, on one box: `agent-sim --agents 40000
# --target 127.0.0.1:P --duration 90s` against three `agent-sim serve
# --reuse-port` processes sharing P. One process cannot hold 40,000
# sessions here (open-files hard limit 20,000), so agent-sim starts local
# processes by itself, spreads them over 127.0.0.x source addresses (one
# address has ~28,000 ports toward P) and writes one merged summary.
#
#   bash benches/scripts/sensu-40k.sh [AGENTS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-40000}
SECONDS_RUN=${2:-90}
PORT=${PORT:-18381}
OUT=${OUT:-target/bench-40k}
rm -rf "$OUT" && mkdir -p "$OUT"
cargo build --release -p agent-sim ${FEATURES:+--features "$FEATURES"} 2>/dev/null
BIN=target/release/agent-sim

PIDS=()
for s in a b c; do
  "$BIN" serve --sensu 127.0.0.1:$PORT --reuse-port --check-interval 10s --stats-every 0 \
    2>"$OUT/serve-$s.log" &
  PIDS+=($!)
done
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
sleep 1

/usr/bin/time -v "$BIN" --agents "$AGENTS" --target 127.0.0.1:$PORT --duration "${SECONDS_RUN}s" \
  --summary "$OUT/run.json" >"$OUT/table.txt" 2>"$OUT/stderr.txt" || true
cat "$OUT/table.txt"
grep -E "^agent-sim:|Elapsed|Maximum resident" "$OUT/stderr.txt" || true
python3 - "$OUT" "$AGENTS" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
s = json.load(open(f"{d}/run.json"))
l = s["latency_us"]["keepalive_lateness"]
p = s["process"]
print(f"connected {s['agents']['connected']}/{s['agents']['requested']}, exit {s['outcome']['exit_code']}; "
      f"client peak RSS (all local processes) {p['peak_rss_bytes']/2**20:.1f} MiB = "
      f"{p['peak_rss_bytes']/n/1024:.2f} KiB per agent; CPU {p['cpu_user_s']+p['cpu_sys_s']:.1f} s; "
      f"keepalive lateness p50 {l['p50']/1000:.1f} ms p90 {l['p90']/1000:.1f} ms p99 {l['p99']/1000:.1f} ms "
      f"max {l['max']/1000:.1f} ms; errors {sum(e['count'] for e in s['errors'].values())}")
PY
