#!/usr/bin/env bash
# The reconvergence benchmark of BENCHMARKS.md: a full drop of N Sensu
# sessions (default 10,000) and of M Consul agents (default 5,000) at
# STORM_AT (default 20 s) against `agent-sim serve` in another process,
# once with the default reconnect policy (exponential, equal jitter) and
# once with `--reconnect none` (the synchronized burst). Prints, per run,
# when 50/90/99/100 % of the lost sessions were back, the spread of the
# per-agent reconnect times, attempts and the missing at the end; writes
# each summary to $OUT/<kind>-<policy>.json.
#
#   bash benches/scripts/reconverge.sh [SENSU_AGENTS] [CONSUL_AGENTS]
#
# Env: STORM_AT (s), RAMP, RECONNECT_MIN, SENSU_RECOVER / CONSUL_RECOVER
# (seconds after the storm before the run ends: Consul's sync after a
# reconnect is staggered over 3 s x its anti-entropy scale, 21 s at 5,000
# agents), POLICIES (default "exponential none"), KINDS ("sensu consul"),
# MAX_DIALING (handshakes in flight; default: the fleet's size, so that
# `none` is the whole fleet at once and not 256 at a time).
set -euo pipefail
cd "$(dirname "$0")/../.."
SENSU_AGENTS=${1:-10000}
CONSUL_AGENTS=${2:-5000}
STORM_AT=${STORM_AT:-20}
RAMP=${RAMP:-1000/s}
RECONNECT_MIN=${RECONNECT_MIN:-2s}
SENSU_RECOVER=${SENSU_RECOVER:-20}
CONSUL_RECOVER=${CONSUL_RECOVER:-40}
POLICIES=${POLICIES:-exponential none}
KINDS=${KINDS:-sensu consul}
SENSU_PORT=${SENSU_PORT:-18081}
RPC=${RPC:-18300}
HTTP=${HTTP:-18500}
OUT=${OUT:-target/bench-reconverge}
mkdir -p "$OUT"
cargo build --release -p agent-sim ${FEATURES:+--features "$FEATURES"} 2>/dev/null   # FEATURES=jemalloc: see BENCHMARKS.md
BIN=target/release/agent-sim

"$BIN" serve --sensu 127.0.0.1:$SENSU_PORT --consul-rpc 127.0.0.1:$RPC \
  --consul-http 127.0.0.1:$HTTP --check-interval 1h --stats-every 0 2>"$OUT/serve.log" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
sleep 1

for kind in $KINDS; do
  for policy in $POLICIES; do
    if [ "$kind" = sensu ]; then
      agents=$SENSU_AGENTS; recover=$SENSU_RECOVER
      target=(--target 127.0.0.1:$SENSU_PORT --keepalive-interval 20s)
    else
      agents=$CONSUL_AGENTS; recover=$CONSUL_RECOVER
      target=(--kind consul --target 127.0.0.1:$RPC --http-target 127.0.0.1:$HTTP
              --upstreams web --session-ttl 30s --probe off)
    fi
    summary="$OUT/$kind-$policy.json"
    echo "== $kind: $agents agents, storm at ${STORM_AT}s, --reconnect $policy, --max-dialing ${MAX_DIALING:-$agents}"
    "$BIN" --agents "$agents" "${target[@]}" --ramp "$RAMP" \
      --storm "at=${STORM_AT}s,drop=100%" --reconnect "$policy" --reconnect-min "$RECONNECT_MIN" \
      --max-dialing "${MAX_DIALING:-$agents}" \
      --duration "$((STORM_AT + recover))s" --summary "$summary" ${SIM_ARGS:-} \
      --progress-every 5s >"$OUT/$kind-$policy.txt" 2>"$OUT/$kind-$policy.log" || true
    python3 benches/scripts/disruptions.py "$summary"
  done
done
