#!/usr/bin/env bash
# What the load box's kernel does for N Consul agents on the default wire
# (client RPC over yamux, streaming, gossip) against `agent-sim serve`: the
# agents' process's syscalls counted by strace over a window of steady state,
# and its CPU over the whole run (from the summary).
#
#   bash benches/scripts/wire-syscalls.sh [N] [RUN_SECONDS] [WINDOW_SECONDS]
#
# Needs strace. Ports 18300, 18301 and 18500 on 127.0.0.1 must be free. The
# window starts 40 s after the agents' start (all connected and joined by then
# at N = 1,000 on two cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-1000}
RUN=${2:-100}
WINDOW=${3:-25}
OUT=${OUT:-target/bench-wire-syscalls}
rm -rf "$OUT" && mkdir -p "$OUT"
command -v strace >/dev/null || { echo "strace is needed (apt-get install strace)" >&2; exit 1; }
nice cargo build --release -p agent-sim 2>/dev/null
BIN=$PWD/target/release/agent-sim
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
"$BIN" serve --consul-rpc 127.0.0.1:18300 --consul-http 127.0.0.1:18500 \
  --consul-serf 127.0.0.1:18301 --stats-every 0 >"$OUT/serve.log" 2>&1 &
pids+=($!)
sleep 1
"$BIN" --kind consul --agents "$N" --target 127.0.0.1:18300 --http-target 127.0.0.1:18500 \
  --gossip-join 127.0.0.1:18301 --upstreams web --duration "${RUN}s" --quiet \
  --summary "$OUT/summary.json" >"$OUT/run.log" 2>&1 &
fleet=$!
pids+=($fleet)
sleep 40
timeout "$WINDOW" strace -c -f -p "$fleet" -o "$OUT/strace.txt" || true
wait "$fleet" || true
echo "syscalls of the agents' process over ${WINDOW} s of steady state, $N agents:"
head -12 "$OUT/strace.txt"
python3 - "$OUT/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
p = s.get("process", {})
print(f"agents connected at the end {s['agents']['connected']}; "
      f"CPU over the run: user {p.get('cpu_user_s')} s, system {p.get('cpu_sys_s')} s")
PY
