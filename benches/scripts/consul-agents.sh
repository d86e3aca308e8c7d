#!/usr/bin/env bash
# The Consul benchmark of BENCHMARKS.md: N agents (default 10,000), each with
# one RPC connection, 3 Subscribe streams (web, api and the run's own probe
# service agent-sim-probe; SIM_ARGS="--probe-service web" for 2), a node + service
# registration and a TTL session, against `agent-sim serve` in another
# process, with a catalog propagation probe every 10 s.
#
#   bash benches/scripts/consul-agents.sh [AGENTS] [STEADY_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-10000}
STEADY=${2:-60}
RAMP=${RAMP:-1000/s}
RPC=${RPC:-18300}
HTTP=${HTTP:-18500}
OUT=${OUT:-target/bench-consul}
mkdir -p "$OUT"
cargo build --release -p agent-sim ${FEATURES:+--features "$FEATURES"} 2>/dev/null   # FEATURES=jemalloc: see BENCHMARKS.md
BIN=target/release/agent-sim

"$BIN" serve --consul-rpc 127.0.0.1:$RPC --consul-http 127.0.0.1:$HTTP --stats-every 0 2>"$OUT/serve.log" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
sleep 1

RAMP_S=$(python3 -c "print(int($AGENTS/float('${RAMP%/s}'))+5)")
DURATION=$((RAMP_S + STEADY + 5))
"$BIN" --kind consul --agents "$AGENTS" --target 127.0.0.1:$RPC --http-target 127.0.0.1:$HTTP \
  --upstreams web,api --session-ttl 30s --probe catalog --probe-every 10s --probe-timeout 8s \
  --ramp "$RAMP" --duration "${DURATION}s" --summary "$OUT/summary.json" ${SIM_ARGS:-} \
  --progress-every 10s >"$OUT/table.txt" 2>"$OUT/progress.log" &
SIM=$!
sleep "$RAMP_S"
R0=$(awk '/VmRSS/{print $2}' /proc/$SIM/status)
wait $SIM || true

python3 - "$OUT/summary.json" "$AGENTS" "$R0" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
agents, r0 = int(sys.argv[2]), int(sys.argv[3])
peak = s["process"]["peak_rss_bytes"]
budget = 20 * 2**20 + 40 * 1024 * agents
c = s["counters"]
print(f"agents requested {s['agents']['requested']} connected {s['agents']['connected']} never connected {s['agents']['never_connected']} exit {s['outcome']['exit_code']}")
print(f"subscriptions {c.get('subscriptions')} snapshots {c.get('snapshots')} sessions_created {c.get('sessions_created')} renewed {c.get('sessions_renewed')} registrations {c.get('registrations')} errors { {k: v['count'] for k, v in s['errors'].items()} }")
print(f"peak RSS {peak/2**20:.1f} MiB = {(peak - 20*2**20)/agents/1024:.2f} KiB/agent above 20 MiB (budget {budget/2**20:.1f} MiB: {'OK' if peak <= budget else 'OVER'}); RSS after ramp {r0/1024:.1f} MiB")
for p in s.get("probes", []):
    l = p["latency_us"]
    print(f"probe #{p['id']} {p['kind']:<10} {p['delivered']}/{p['expected']} p50 {l['p50']/1e3:.1f}ms p90 {l['p90']/1e3:.1f}ms p99 {l['p99']/1e3:.1f}ms max {l['max']/1e3:.1f}ms 99% at {(p['time_to_99pct_us'] or 0)/1e3:.1f}ms")
lat = s["latency_us"]
for name in ["propagation", "probe_overhead", "connect", "subscribe_snapshot", "session_renew"]:
    if name in lat and lat[name]["count"]:
        l = lat[name]
        print(f"{name:<20} n={l['count']:<7} p50 {l['p50']}us p99 {l['p99']}us p99.9 {l['p999']}us max {l['max']}us")
PY
