#!/usr/bin/env bash
# Thousands of gossip members in one process: N Consul agents with the
# client wire and blocking watches (one RPC connection each, so 10,000 fit
# the 20,000 descriptors) against `agent-sim serve` in another process with
# its serf LAN port, once with gossip on and once off. Prints, per run, the
# members the server saw by status (its /v1/agent/members, polled every 5 s:
# the worst poll for failed), whether every member left, the load box's
# peak RSS and what gossip added per agent (BENCHMARKS.md "Gossip at scale").
#
#   bash benches/scripts/gossip-scale.sh [N] [SECONDS]
#
# MODES="on" runs only the gossiping fleet (the memory line then needs an
# earlier run's off.rss in OUT).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-10000}
SECS=${2:-120}
OUT=${OUT:-target/bench-gossip-scale}
mkdir -p "$OUT"
cargo build --release -p agent-sim 2>/dev/null
BIN=$PWD/target/release/agent-sim
RPC=127.0.0.1:18300 HTTP=127.0.0.1:18500 SERF=127.0.0.1:18301

"$BIN" serve --consul-rpc $RPC --consul-http $HTTP --consul-serf $SERF >"$OUT/serve.log" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://$HTTP/v1/status/leader" >/dev/null && break; sleep 0.2; done

# Members of prefix $1 by serf status (1 alive, 2 leaving, 3 left, 4 failed).
census() {
    curl -sf "http://$HTTP/v1/agent/members" | python3 -c '
import json, sys, collections
p = sys.argv[1] + "-"
c = collections.Counter(m["Status"] for m in json.load(sys.stdin) if m["Name"].startswith(p))
print(c.get(1, 0), c.get(2, 0), c.get(3, 0), c.get(4, 0))' "$1"
}

printf '%-7s %8s %8s %8s %10s %12s %12s %10s\n' gossip joined alive_max failed_max left_after rss_MiB sec_wall cpu_s
for mode in ${MODES:-on off}; do
    prefix=scale-$mode
    /usr/bin/time -f '%M %e %U %S' -o "$OUT/$mode.time" \
        "$BIN" --kind consul --agents "$N" --target $RPC --http-target "http://$HTTP" \
        --watch blocking --upstreams web --gossip=$([ $mode = on ] && echo true || echo false) \
        --gossip-join $SERF --name-prefix $prefix --duration "${SECS}s" --quiet \
        --summary "$OUT/$mode.json" >"$OUT/$mode.log" 2>&1 &
    RUN=$!
    alive_max=0 failed_max=0
    while kill -0 $RUN 2>/dev/null; do
        read -r a l g f < <(census $prefix || echo "0 0 0 0")
        [ "$a" -gt "$alive_max" ] && alive_max=$a
        [ "$f" -gt "$failed_max" ] && failed_max=$f
        echo "$(date +%T) alive $a leaving $l left $g failed $f" >>"$OUT/$mode.census"
        sleep 5
    done
    wait $RUN || true
    sleep 2
    read -r a l g f < <(census $prefix)
    read -r rss wall user sys <"$OUT/$mode.time"
    joined=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["counters"].get("gossip_joins", 0))' "$OUT/$mode.json")
    printf '%-7s %8s %8s %8s %10s %12.1f %12s %10.1f\n' $mode "$joined" "$alive_max" "$failed_max" "$g" \
        "$(echo "$rss/1024" | bc -l)" "$wall" "$(echo "$user+$sys" | bc -l)"
    echo "$rss" >"$OUT/$mode.rss"
done
[ -f "$OUT/on.rss" ] && [ -f "$OUT/off.rss" ] || exit 0
on=$(cat "$OUT/on.rss") off=$(cat "$OUT/off.rss")
echo "gossip adds $(echo "($on-$off)/$N" | bc -l | cut -c1-5) KiB per agent (peak RSS, $N agents)"
