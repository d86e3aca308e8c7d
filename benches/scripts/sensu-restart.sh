#!/usr/bin/env bash
# A Sensu backend restart, as a real fleet meets it: N Sensu agents
# (default 2,000) against `agent-sim serve`, whose listeners close at
# RESTART_AT (default 20 s after it starts) for DOWN seconds (default 5),
# once per reconnect policy: `sensu-agent` (Sensu's default: a real
# sensu-agent 6.12's retry, 1 s to 2 m, at once after a held session, then
# doubling with up to 100 % jitter) and `exponential` with 500 ms / 30 s
# (the default before it). Prints, per run, when 50/90/99/100 % of the
# lost sessions were back, the per-agent reconnect times and the attempts;
# writes each summary to $OUT/restart-<policy>.json.
#
#   bash benches/scripts/sensu-restart.sh [AGENTS]
#
# Env: RESTART_AT, DOWN (s), RECOVER (s after the restart before the run
# ends, default 60), RAMP (default 1000/s), MAX_DIALING (default: the fleet),
# BIN (an agent-sim binary to use instead of building one).
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-2000}
RESTART_AT=${RESTART_AT:-20}
DOWN=${DOWN:-5}
RECOVER=${RECOVER:-60}
RAMP=${RAMP:-1000/s}
PORT=${SENSU_PORT:-18081}
OUT=${OUT:-target/bench-sensu-restart}
mkdir -p "$OUT"
if [ -z "${BIN:-}" ]; then   # BIN=path: an agent-sim built before
  cargo build --release -p agent-sim 2>/dev/null
  BIN=target/release/agent-sim
fi

for policy in sensu-agent exponential; do
  case $policy in
    sensu-agent) delays=() ;;
    exponential) delays=(--reconnect-min 500ms --reconnect-max 30s) ;;
  esac
  "$BIN" serve --sensu 127.0.0.1:$PORT --check-interval 1h --stats-every 0 \
    --faults "restart@at:${RESTART_AT}s,down:${DOWN}s,state:keep" 2>"$OUT/serve-$policy.log" &
  SERVE=$!
  sleep 0.5
  summary="$OUT/restart-$policy.json"
  echo "== $AGENTS Sensu agents, backend down at ${RESTART_AT}s for ${DOWN}s, --reconnect $policy ${delays[*]:-}"
  "$BIN" --agents "$AGENTS" --target 127.0.0.1:$PORT --keepalive-interval 20s --ramp "$RAMP" \
    --reconnect "$policy" "${delays[@]}" --max-dialing "${MAX_DIALING:-$AGENTS}" \
    --duration "$((RESTART_AT + RECOVER))s" --summary "$summary" \
    --progress-every 5s >"$OUT/restart-$policy.txt" 2>"$OUT/restart-$policy.log" || true
  kill $SERVE 2>/dev/null || true
  wait $SERVE 2>/dev/null || true
  python3 benches/scripts/disruptions.py "$summary"
done
