#!/usr/bin/env bash
# The Sensu session benchmark of BENCHMARKS.md: N sessions (default 19,000,
# the most one process holds under a 20,000 fd hard limit) against
# `agent-sim serve` in another process, keepalive 20 s, then a steady window.
# Prints peak RSS per agent, steady CPU, ramp rate and the summary table.
#
#   bash benches/scripts/sensu-sessions.sh [AGENTS] [STEADY_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-19000}
STEADY=${2:-60}
RAMP=${RAMP:-2500/s}
PORT=${PORT:-18081}
CHECK_INTERVAL=${CHECK_INTERVAL:-10s}   # check_request schedule of the target (1h = keepalives only)
OUT=${OUT:-target/bench-sessions}
mkdir -p "$OUT"
cargo build --release -p agent-sim ${FEATURES:+--features "$FEATURES"} 2>/dev/null   # FEATURES=jemalloc: see BENCHMARKS.md
BIN=target/release/agent-sim

"$BIN" serve --sensu 127.0.0.1:$PORT --check-interval "$CHECK_INTERVAL" --stats-every 0 2>"$OUT/serve.log" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
sleep 1

RAMP_S=$(python3 -c "print(int($AGENTS/float('${RAMP%/s}'))+5)")
DURATION=$((RAMP_S + STEADY + 5))
"$BIN" --agents "$AGENTS" ${SIM_ARGS:-} --target 127.0.0.1:$PORT --keepalive-interval 20s \
  --ramp "$RAMP" --duration "${DURATION}s" --summary "$OUT/summary.json" \
  --progress-every 10s >"$OUT/table.txt" 2>"$OUT/progress.log" &
SIM=$!

ticks() { awk '{print $14+$15}' "/proc/$SIM/stat"; }
HZ=$(getconf CLK_TCK)
sleep "$RAMP_S"
T0=$(ticks); R0=$(awk '/VmRSS/{print $2}' /proc/$SIM/status)
sleep "$STEADY"
T1=$(ticks); R1=$(awk '/VmRSS/{print $2}' /proc/$SIM/status)
wait $SIM || true

python3 - "$OUT/summary.json" "$AGENTS" "$T0" "$T1" "$HZ" "$STEADY" "$R0" "$R1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
agents, t0, t1, hz, steady = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
r0, r1 = int(sys.argv[7]), int(sys.argv[8])
peak = s["process"]["peak_rss_bytes"]
budget = 20 * 1024 * 1024 + 8 * 1024 * agents
print(f"agents requested {s['agents']['requested']} connected {s['agents']['connected']} peak {s['agents']['peak_connected']} never connected {s['agents']['never_connected']} exit {s['outcome']['exit_code']}")
print(f"errors { {k: v['count'] for k, v in s['errors'].items()} } reconnect attempts {s['counters'].get('reconnect_attempts', 0)}")
print(f"peak RSS {peak/2**20:.1f} MiB = {(peak - 20*2**20)/agents/1024:.2f} KiB/agent above 20 MiB (budget {budget/2**20:.1f} MiB: {'OK' if peak <= budget else 'OVER'})")
print(f"steady RSS {r0/1024:.1f} -> {r1/1024:.1f} MiB")
cpu = (t1 - t0) / hz / steady * 100
print(f"steady CPU {cpu:.2f} % of one core over {steady:.0f} s")
print(f"keepalives/s {s['rates_per_s'].get('keepalives_sent', 0):.1f} (whole run)")
PY
grep -E "^ramp" "$OUT/table.txt" || true
