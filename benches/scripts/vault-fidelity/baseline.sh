#!/usr/bin/env bash
# baseline.sh RATE SECONDS — real Vault 1.18.3 (3 nodes, consul storage) on a real Consul 1.20.1 -dev.
# Starts consul + 3 vaults on 127.0.0.215, init/unseals, then:
#   idle   : IDLE seconds with no load (default 60)
#   create : first TTL seconds of load (tokens created, none expired yet)
#   steady : next SECONDS of load (creates + expiries at the same rate)
#   drain  : TTL+15 s after load stops (only expiries/revocations)
# Prints per-minute Consul figures for each window and stops everything it started.
# Env: TTL (60s token ttl, seconds), IDLE (60), PROXY (1: per-node logging proxy; 0: direct to :8500),
#      PROXYLOG (1 = keep per-request JSON log; needed for per-token op counts), CONC (64 in-flight).
set -u
RATE=${1:?rate}; SECS=${2:?seconds}
TTL=${TTL:-60}; IDLE=${IDLE:-60}; CONC=${CONC:-64}
export PROXYLOG=${PROXYLOG:-1}
[ "${PROXY:-1}" = 1 ] || PROXYLOG=
RUN=${RUN:-${RUNS:-/tmp/vault-fidelity}/real${RATE}-$(date -u +%m%dT%H%M%S)}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
trap 'stop_all' EXIT INT TERM

snap() {  # snap NAME TAG
  local n=$1 t=$2
  consul_metrics "$RUN/m-$n-$t"
  { echo "consul $(awk '{print $14+$15}' /proc/$CONSUL_PID/stat 2>/dev/null)"
    for i in 0 1 2; do echo "vault-v$i $(awk '{print $14+$15}' /proc/$(cat "$RUN/v$i/pid")/stat 2>/dev/null)"; done
    if [ "$PROXY" = 1 ]; then for i in 0 1 2; do echo "proxy-v$i $(awk '{print $14+$15}' /proc/$(cat "$RUN/proxy-v$i.pid")/stat 2>/dev/null)"; done; fi
    echo "loadavg $(cut -d' ' -f1 /proc/loadavg)"
  } >"$RUN/cpu-$n-$t"
  if [ "$PROXY" = 1 ]; then
    if [ -n "$PROXYLOG" ]; then
      : >"$RUN/off-$n-$t"; for i in 0 1 2; do echo "v$i $(wc -l <"$RUN/proxy-v$i.jsonl")" >>"$RUN/off-$n-$t"; done
    fi
    proxy_counts; for i in 0 1 2; do tail -1 "$RUN/proxy-v$i.out"; done >"$RUN/bytes-$n-$t"
  fi
}
sampler() {  # sampler NAME SECONDS: metrics every 5 s (summary quantiles cover ~10 s)
  local n=$1 end=$(( $(date +%s) + $2 )) k=0
  while [ "$(date +%s)" -lt "$end" ]; do sleep 5; k=$((k+1)); curl -s "http://$IP:8500/v1/agent/metrics?format=prometheus" >"$RUN/s-$n-$(printf %03d $k)"; done
}
window() {  # window NAME SECONDS: snapshot, sample, snapshot
  snap "$1" before; sampler "$1" "$2"; snap "$1" after
}

start_consul || exit 1
start_vaults
init_unseal
ACTIVE=$(active_port); [ "$ACTIVE" = none ] && { log "no active vault"; exit 1; }
log "run dir $RUN; active vault :$ACTIVE; rate $RATE/s; ttl ${TTL}s; steady ${SECS}s; proxy=$PROXY"
sleep 10
[ "$IDLE" -gt 0 ] && window idle "$IDLE"

VAULT_TOKEN=$(jq -r .root_token "$RUN/init.json") "$BIN/tokload" -addr http://$IP:$ACTIVE \
  -rate "$RATE" -dur "$((TTL + SECS))s" -ttl "${TTL}s" -conc "$CONC" >"$RUN/tokload.out" 2>"$RUN/tokload.err" &
LOADPID=$!; PIDS+=($LOADPID)
window create "$TTL"
window steady "$SECS"
wait $LOADPID
window drain "$((TTL + 15))"
VAULT_TOKEN=$(jq -r .root_token "$RUN/init.json") VAULT_ADDR=http://$IP:$ACTIVE "$VAULT_BIN" read -format=json sys/internal/counters/tokens >"$RUN/token-counters.json" 2>&1
curl -s "http://$IP:8500/v1/kv/vaultreal/?keys" | jq -r '.[]' | awk -F/ '{print $1"/"$2"/"$3"/"$4}' | sort | uniq -c | sort -rn >"$RUN/keys-at-end.txt"

{
  echo "# baseline RATE=$RATE SECS=$SECS TTL=$TTL PROXY=$PROXY run=$RUN"
  cat "$RUN/tokload.out"
  for w in idle create steady drain; do [ -f "$RUN/m-$w-after" ] && { echo; TTL=$TTL python3 "$D/analyze.py" "$RUN" $w; }; done
  echo; echo "keys under vaultreal/ at end (first 4 path parts):"; head -20 "$RUN/keys-at-end.txt"
} | tee "$RUN/report.txt"
