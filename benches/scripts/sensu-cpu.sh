#!/usr/bin/env bash
# The steady CPU of a Sensu fleet against `agent-sim serve` (BENCHMARKS.md,
# "Sensu: one wakeup for many agents"): serve pinned to core 0, the fleet
# to core 1, keepalives every 20 s, no checks; the fleet's user + system
# CPU from /proc/PID/stat over a 60 s window once every agent is up.
#
#   AGENTS=2000 RAMP=500/s WARM=15 DUR=90s SIM_ARGS="--timer-tick 0" \
#     bash benches/scripts/sensu-cpu.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-target/bench-sensu-cpu}
mkdir -p "$OUT"
BIN=${BIN:-target/release/agent-sim}
PORT=${PORT:-18081}
uptime >"$OUT/uptime.txt"
taskset -c 0 "$BIN" serve --sensu 127.0.0.1:$PORT --check-interval 1h --stats-every 0 2>"$OUT/serve.log" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
sleep 1
# shellcheck disable=SC2086
taskset -c 1 "$BIN" --agents "${AGENTS:-2000}" --target 127.0.0.1:$PORT --keepalive-interval 20s \
  --ramp "${RAMP:-500/s}" --duration "${DUR:-90s}" ${SIM_ARGS:-} --summary "$OUT/s.json" \
  >"$OUT/table.txt" 2>"$OUT/progress.log" &
SIM=$!
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
sleep "${WARM:-15}"
T0=$(ticks $SIM); S0=$(ticks $SERVE)
sleep 60
T1=$(ticks $SIM); S1=$(ticks $SERVE)
wait $SIM || true
HZ=$(getconf CLK_TCK)
echo "fleet CPU over 60 s: $(python3 -c "print(($T1-$T0)/$HZ)") s; serve: $(python3 -c "print(($S1-$S0)/$HZ)") s; $(cat "$OUT/uptime.txt")"
