#!/usr/bin/env bash
# The scale run of BENCHMARKS.md "10,000 faithful Consul agents": N Consul
# agents at the default wire (the client RPC connection, Subscribe streams
# for web, api and the probe service, a TTL session, gossip) against
# `agent-sim serve` with its serf LAN port; the server pinned to core 0 and
# agent-sim to core 1 (taskset), joins at RAMP (default 200/s). While it
# runs, /v1/agent/members is timed every 2 s. Prints what the issue asks:
# connected and alive, exit code, memory per agent (peak RSS summed over the
# local processes the run started, above 20 MiB), CPU per agent-second,
# probe_overhead p99 against propagation p99, the members' acks to the
# server's probes (from the ping's kernel arrival), the members answers, and
# the server's CPU.
#
#   bash benches/scripts/consul-scale.sh [AGENTS] [STEADY_SECONDS]
#   SERVERS=5 SHARDS=5 RAMP=40/s bash benches/scripts/consul-scale.sh 40000 60
#   FOLLOWERS=2 bash benches/scripts/consul-scale.sh 10000 60
#
# One server process holds 2 descriptors per agent (the RPC and the
# streaming connection, as a real server does): under a 20,000 hard limit
# that is 9,9xx agents at most. SERVERS=K starts K serve processes (RPC
# ports 18300.., HTTP 18500..) and gives the agents all of them as targets:
# each agent stays on the one its router puts in front. Their catalogs are
# apart, so with K > 1 gossip and the propagation probe are off (a change
# on one would reach only that server's watchers): a run for the fleet's own
# memory and CPU, not for propagation.
#
# FOLLOWERS=F instead starts one leader (RPC 18300, HTTP 18500, serf 18301)
# and F followers (`serve --consul-leader`, RPC 18310..) that relay the
# agents' connections to it over a few links: the agents dial the
# followers, join the leader's gossip, and one catalog serves them all, so
# gossip and the probe stay on. Each follower holds its share's two
# descriptors per agent; the leader holds links. GOSSIP=0 leaves gossip off
# (the probe stays on).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-9900}
STEADY=${2:-60}
RAMP=${RAMP:-200/s}
OUT=${OUT:-target/bench-consul-scale}
mkdir -p "$OUT"
cargo build --release -p agent-sim 2>/dev/null
BIN=$PWD/target/release/agent-sim
K=${SERVERS:-1}
F=${FOLLOWERS:-0}
HTTP=127.0.0.1:18500 SERF=127.0.0.1:18301
TARGETS=() PIDS=()
if [ "$F" -gt 0 ] && [ "$K" != 1 ]; then
    echo "FOLLOWERS and SERVERS > 1 do not go together" >&2
    exit 64
fi
for i in $(seq 0 $((K - 1))); do
    rpc=127.0.0.1:$((18300 + i)) http=127.0.0.1:$((18500 + i))
    serf=()
    [ "$K" = 1 ] && serf=(--consul-serf $SERF)
    taskset -c 0 "$BIN" serve --consul-rpc $rpc --consul-http $http "${serf[@]}" \
        --stats-every 0 >"$OUT/serve-$i.log" 2>&1 &
    PIDS+=($!)
    TARGETS+=("$rpc")
done
if [ "$F" -gt 0 ]; then
    TARGETS=()
    for i in $(seq 0 $((F - 1))); do
        rpc=127.0.0.1:$((18310 + i))
        taskset -c 0 "$BIN" serve --consul-rpc $rpc --consul-leader 127.0.0.1:18300 \
            --stats-every 0 >"$OUT/follower-$i.log" 2>&1 &
        PIDS+=($!)
        TARGETS+=("$rpc")
    done
fi
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://$HTTP/v1/status/leader" >/dev/null && break; sleep 0.2; done
sleep 1
ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
S0=$(ticks "${PIDS[@]}")
L0=$(ticks "${PIDS[0]}")
if [ "$K" = 1 ] && [ "${GOSSIP:-1}" = 0 ]; then
    MODE=(--gossip=false)
elif [ "$K" = 1 ]; then
    MODE=(--gossip-join $SERF)
else
    MODE=(--gossip=false --probe off)
fi

# Each shard starts N/S agents at RAMP.
RAMP_S=$(python3 -c "print(int($N/${SHARDS:-1}/float('${RAMP%/s}'))+5)")
DURATION=$((RAMP_S + STEADY))
TARGET_LIST=$(IFS=,; echo "${TARGETS[*]}")
# SHARDS=S: S agent-sim commands (--shard i/S), as on S boxes: past 4 local
# processes (2 per core) a run refuses to start more by itself, and a shard
# starts none, so each shard must fit one process's descriptors.
S=${SHARDS:-1}
SIMS=()
for i in $(seq 0 $((S - 1))); do
    shard=()
    [ "$S" -gt 1 ] && shard=(--shard "$i/$S")
    taskset -c 1 "$BIN" --kind consul --agents "$N" "${shard[@]}" --target "$TARGET_LIST" \
        --http-target "http://$HTTP" "${MODE[@]}" --ramp "$RAMP" --duration "${DURATION}s" \
        --progress-every 10s --summary "$OUT/summary-$i.json" >"$OUT/table-$i.txt" 2>"$OUT/progress-$i.log" &
    SIMS+=($!)
done
SIM=${SIMS[0]}
: >"$OUT/members.txt"
while kill -0 $SIM 2>/dev/null; do
    curl -s -o /dev/null -m 10 -w '%{http_code} %{time_total}\n' "http://$HTTP/v1/agent/members" \
        >>"$OUT/members.txt" || echo "000 10" >>"$OUT/members.txt"
    sleep 2
done
for p in "${SIMS[@]}"; do wait "$p" || true; done
S1=$(ticks "${PIDS[@]}")
L1=$(ticks "${PIDS[0]}")
# The servers print their counters as they stop.
kill "${PIDS[@]}" 2>/dev/null || true
for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
if [ "$S" -gt 1 ]; then
    "$BIN" report merge "$OUT"/summary-*.json --summary "$OUT/summary.json" >"$OUT/merged.txt"
else
    cp "$OUT/summary-0.json" "$OUT/summary.json"
fi

python3 - "$OUT/summary.json" "$N" "$DURATION" "$((S1 - S0))" "$OUT/members.txt" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
n, dur, server_ticks = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
polls = [l.split() for l in open(sys.argv[5]) if l.strip()]
slow = [p for p in polls if p[0] != "200" or float(p[1]) > 1.0]
a, o, c, p = s["agents"], s["outcome"], s["counters"], s["process"]
lat = s["latency_us"]
print(f"connected {a['connected']}/{a['requested']} (never {a['never_connected']}, lost {a['lost_not_back']}), exit {o['exit_code']}")
print(f"gossip joins {c.get('gossip_joins', 0)}, acks sent {c.get('gossip_acks_sent', 0)}; errors { {k: v['count'] for k, v in s['errors'].items()} }")
print(f"memory: peak RSS {p['peak_rss_bytes']/2**20:.1f} MiB = {(p['peak_rss_bytes'] - 20*2**20)/n/1024:.2f} KiB per agent above 20 MiB")
cpu = p["cpu_user_s"] + p["cpu_sys_s"]
print(f"CPU: {p['cpu_user_s']:.1f} user + {p['cpu_sys_s']:.1f} sys s over {dur} s = {cpu/(n*dur)*1e6:.1f} µs per agent-second")
prop, over = lat.get("propagation", {}), lat.get("probe_overhead", {})
if prop.get("count") and over.get("count"):
    print(f"propagation p99 {prop['p99']/1e3:.1f} ms, probe_overhead p99 {over['p99']/1e3:.1f} ms = {100*over['p99']/prop['p99']:.1f} %")
ack = lat.get("gossip_ack_delay", {})
if ack.get("count"):
    late = s["warnings"].get("gossip_acked_late", {}).get("count", 0)
    print(f"acks to the server's probes: {ack['count']}, p99 {ack['p99']/1e3:.1f} ms, max {ack['max']/1e3:.1f} ms (kernel arrival to send), warned late {late}")
print(f"/v1/agent/members: {len(polls)} polls, slowest {max(float(x[1]) for x in polls):.2f} s, {len(slow)} over 1 s or failed")
print(f"server CPU {server_ticks/100:.1f} s over the run (all serve processes)")
PY
if [ "$K" = 1 ]; then
    # The server's side of the members' acks (its probes, those acked after
    # its 500 ms as it saw them: its own delay in reading them included).
    grep -o '"serf_probes_sent":[0-9]*\|"serf_acks_late":[0-9]*\|"serf_probes_failed":[0-9]*' "$OUT/serve-0.log" | tr '\n' ' '
    echo
fi
if [ "$F" -gt 0 ]; then
    # The leader's CPU and connections (the followers' links), and each relay's counts.
    echo "leader CPU $(((L1 - L0) / 100)) s of the servers' $(((S1 - S0) / 100)) s"
    grep -o '"rpc_connections":[0-9]*' "$OUT/serve-0.log" | tail -1
    for i in $(seq 0 $((F - 1))); do grep 'relay {' "$OUT/follower-$i.log" | tail -1; done
fi
