#!/usr/bin/env bash
# ours.sh RATE SECONDS — agent-sim's simulated Vault servers (3 nodes) on the same real Consul 1.20.1 -dev,
# measured with the same windows and analyze.py as baseline.sh (PROXY=0): create (first TTL s), steady (next SECONDS).
set -u
RATE=${1:?rate}; SECS=${2:?seconds}
TTL=${TTL:-60}
export PROXY=0 PROXYLOG=
RUN=${RUN:-${RUNS:-/tmp/vault-fidelity}/ours${RATE}-$(date -u +%m%dT%H%M%S)}
AGENT_SIM=${AGENT_SIM:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/target/release/agent-sim}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
trap 'stop_all' EXIT INT TERM
snap() {
  local n=$1 t=$2
  consul_metrics "$RUN/m-$n-$t"
  { echo "consul $(awk '{print $14+$15}' /proc/$CONSUL_PID/stat 2>/dev/null)"
    echo "vault-v0 $(awk '{print $14+$15}' /proc/$SIMPID/stat 2>/dev/null)"
    echo "loadavg $(cut -d' ' -f1 /proc/loadavg)"
  } >"$RUN/cpu-$n-$t"
}
sampler() { local n=$1 end=$(( $(date +%s) + $2 )) k=0
  while [ "$(date +%s)" -lt "$end" ]; do sleep 5; k=$((k+1)); curl -s "http://$IP:8500/v1/agent/metrics?format=prometheus" >"$RUN/s-$n-$(printf %03d $k)"; done; }
window() { snap "$1" before; sampler "$1" "$2"; snap "$1" after; }
start_consul || exit 1
sleep 5
"$AGENT_SIM" --kind consul --agents 1 --target $IP:8300 --http-target $IP:8500 --gossip=false --quiet \
  --name-prefix ours --vault-nodes 3 --vault-tokens "$RATE/s" --vault-token-ttl "${TTL}s" --vault-renew=false \
  --duration "$((TTL + SECS + 5))s" --summary "$RUN/summary.json" >"$RUN/agent-sim.out" 2>"$RUN/agent-sim.err" &
SIMPID=$!; PIDS+=($SIMPID)
sleep 0.3
window create "$TTL"
window steady "$SECS"
wait $SIMPID; echo "agent-sim rc=$?" >>"$RUN/agent-sim.out"
curl -s "http://$IP:8500/v1/kv/ours/?keys" >"$RUN/keys-at-end.txt"
{ echo "# ours RATE=$RATE SECS=$SECS TTL=$TTL run=$RUN"
  for w in create steady; do echo; TTL=$TTL python3 "$D/analyze.py" "$RUN" $w; done
  echo; echo "keys under ours/ at end: $(cat "$RUN/keys-at-end.txt" | head -c 200)"
} | tee "$RUN/report.txt"
