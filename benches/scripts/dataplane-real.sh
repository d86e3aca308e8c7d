#!/usr/bin/env bash
# N dataplane sidecars on a real Consul server, one run per entry of ORDER,
# each on a fresh `-dev` server pinned to core 0 with agent-sim on core 1:
# what the server's CPU costs for each of two agent-sim builds (a change to
# the sidecars' client before and after), in the order given, so both
# orders and repeats are in one call.
#
#   CONSUL_BIN=/path/to/consul BEFORE=/path/to/old/agent-sim [AFTER=…] \
#     bash benches/scripts/dataplane-real.sh [N] [ORDER] [-- agent-sim flags]
#
# ORDER is a list of `before` and `after` (default "after before before
# after"); AFTER defaults to a release build of this checkout. Each run
# holds N sidecars (default 2000) with WatchServers and a catalog probe
# every 15 s for 120 s; the server's CPU (utime + stime, /proc) is read at
# 50 s and 110 s (the steady window) and at the end. PPROF=1 also takes a
# 50 s CPU profile of the server inside the window (the same for every run).
# Prints one line per run and the ratio of the means; OUT (default a
# temporary folder, kept) holds each run's summary, output and profile.
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/real-consul.sh
N=${1:-2000}
ORDER=${2:-after before before after}
shift $(($# > 2 ? 2 : $#))
[ "${1:-}" = "--" ] && shift
: "${CONSUL_BIN:?set CONSUL_BIN to a Consul 1.20.1 binary}"
: "${BEFORE:?set BEFORE to the agent-sim binary to compare against}"
AFTER=${AFTER:-$(agent_sim_bin)}
OUT=${OUT:-$(mktemp -d /tmp/dataplane-real.XXXXXX)}
SERVER_IP=${SERVER_IP:-127.0.0.81}
HTTP=http://$SERVER_IP:8500
mkdir -p "$OUT"
server_hcl "$OUT/server.hcl"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run_one() { # $1: before|after, $2: run number, then agent-sim flags
  local which=$1 tag=$1-$2 bin
  shift 2
  [ "$which" = before ] && bin=$BEFORE || bin=$AFTER
  local d=$OUT/$tag
  rm -rf "$d" && mkdir -p "$d"
  taskset -c 0 "$CONSUL_BIN" agent -dev -bind "$SERVER_IP" -client "$SERVER_IP" \
    -config-file "$OUT/server.hcl" -data-dir "$d/data" >"$d/server.log" 2>&1 &
  local server=$!
  for _ in $(seq 60); do
    curl -fsS "$HTTP/v1/status/leader" 2>/dev/null | grep -q 8300 && break
    sleep 0.5
  done
  sleep 3
  local c0 c1 c2 c3
  c0=$(ticks "$server")
  taskset -c 1 "$bin" --kind consul-dataplane --agents "$N" --target "$SERVER_IP:8502" \
    --http-target "$SERVER_IP:8500" --watch-servers --probe catalog --probe-every 15s \
    --duration 120s --summary "$d/summary.json" --quiet "$@" >"$d/run.out" 2>&1 &
  local sim=$!
  sleep 50
  c1=$(ticks "$server")
  if [ "${PPROF:-0}" = 1 ]; then
    (sleep 3; curl -s "$HTTP/debug/pprof/profile?seconds=50" >"$d/cpu.pprof") &
  fi
  sleep 60
  c2=$(ticks "$server")
  local rc=0
  wait "$sim" || rc=$?
  c3=$(ticks "$server")
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  # CLK_TCK is 100: ticks are hundredths of a CPU-second.
  echo "$which ${tag#*-} rc=$rc steady_ticks=$((c2 - c1)) whole_ticks=$((c3 - c0))" | tee -a "$OUT/runs.txt"
}

: >"$OUT/runs.txt"
i=0
for which in $ORDER; do
  i=$((i + 1))
  run_one "$which" "$i" "$@"
done
python3 - "$OUT/runs.txt" "$N" <<'PY'
import sys
runs = [dict(kv.split("=") for kv in l.split()[2:]) | {"which": l.split()[0]} for l in open(sys.argv[1])]
n = int(sys.argv[2])
mean = lambda w, k: sum(int(r[k]) for r in runs if r["which"] == w) / max(1, sum(1 for r in runs if r["which"] == w))
for k in ("steady_ticks", "whole_ticks"):
    b, a = mean("before", k), mean("after", k)
    print(f"{k}: before {b / 100:.2f} s, after {a / 100:.2f} s, after/before {a / b if b else float('nan'):.2f}x")
print(f"steady µs per sidecar-second: before {mean('before', 'steady_ticks') * 1e4 / (60 * n):.1f}, after {mean('after', 'steady_ticks') * 1e4 / (60 * n):.1f}")
PY
echo "runs and logs: $OUT"
