#!/usr/bin/env bash
# The Sensu capacity run of BENCHMARKS.md "Where a real Sensu Go 6.12.0
# backend breaks": against a backend you started yourself (agent port
# TARGET, its API on 8080 for --observe sensu, its pid for --observe-pid),
# pinned to its own core; agent-sim pinned to CORE. Sensu agents each
# sending EVENT_RATE agent-side events besides their keepalives, stepped by
# --steps and judged over each step's window: every agent connected, no
# errors, keepalives on time, and the backend's own mean event update time
# (sensu_go_eventd_update_event_duration: its sum over its count within the
# window; the summary's quantiles are the backend's own over a sliding ten
# minutes, which would carry an earlier step's ramp into a later window).
#
#   BACKEND_PID=$(pgrep -f 'sensu-backend start') bash benches/scripts/sensu-capacity.sh [STEPS] [HOLD]
#
# Agents deregister when they leave (--deregister), so the backend is left
# without this run's entities. Everything lands in target/bench-sensu-capacity/.
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${1:-500,1000,2000,3000,4000}
HOLD=${2:-60s}
SETTLE=${SETTLE:-15s}
RAMP=${RAMP:-20/s}
EVENT_RATE=${EVENT_RATE:-1/s}
TARGET=${TARGET:-127.0.0.1:8081}
CORE=${CORE:-1}
UPDATE_MEAN_US=${UPDATE_MEAN_US:-50000}
PAST=${PAST:-1}
BACKEND_PID=${BACKEND_PID:?set BACKEND_PID to the running sensu-backend}
OUT=${OUT:-target/bench-sensu-capacity}
BIN=${AGENT_SIM:-target/release/agent-sim}
mkdir -p "$OUT"
taskset -c "$CORE" "$BIN" --kind sensu --target "$TARGET" --ramp "$RAMP" \
  --event-rate "$EVENT_RATE" --deregister \
  --steps "$STEPS" --step-hold "$HOLD" --step-settle "$SETTLE" \
  --slo 'agents.connected == requested' --slo 'errors.total == 0' \
  --slo 'keepalive_lateness.p99 < 1s' \
  --slo "server.sensu_go_eventd_update_event_duration.mean < $UPDATE_MEAN_US" --steps-past "$PAST" \
  --observe sensu --observe-pid "$BACKEND_PID" --observe-every 5s \
  --summary "$OUT/stepped.json" --report-html "$OUT/stepped.html" \
  >"$OUT/stepped.txt" 2>"$OUT/stepped.err" || true
sed -n '/^Capacity/,$p' "$OUT/stepped.txt"
