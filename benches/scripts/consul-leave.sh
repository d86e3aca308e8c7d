#!/usr/bin/env bash
# How N agent-sim Consul agents leave a real Consul server that writes its
# raft log to disk (a server, not `-dev`): they join with gossip on, hold
# HOLD seconds, and end by Ctrl-C (SIGINT); the server's log then says how
# each went: `EventMemberLeave` (left, as a real agent that leaves), or
# `EventMemberFailed` (failed: its dead message was handled before its leave
# intent; a later `EventMemberLeave (forced)` is that intent arriving after).
#
#   CONSUL_BIN=/path/to/consul bash benches/scripts/consul-leave.sh [N] [HOLD] [-- agent-sim flags]
#
# Prints one line: members, left, failed, forced, the server's handler queue
# drops ("handler queue full"), how long the fleet's end took, and the
# gossip packets agent-sim could not read (`gossip_bad_packet`) and the
# streams a server cut short (`gossip_stream_cut`), with their samples.
# PIN=1: the server on core 0 alone, agent-sim on core 1 (as the 2026-12-02
# report of 78 failed of 200). DEV=1: a `-dev` server instead (raft in
# memory, its gossip 10x faster). AGENT_SIM: a binary to run (default: build).
# OUT: where the logs go (default a temporary folder, kept).
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/real-consul.sh
N=${1:-200}
HOLD=${2:-30}
shift $(($# > 2 ? 2 : $#))
[ "${1:-}" = "--" ] && shift
: "${CONSUL_BIN:?set CONSUL_BIN to a Consul 1.20.1 binary}"
OUT=${OUT:-$(mktemp -d /tmp/consul-leave.XXXXXX)}
mkdir -p "$OUT"
BIN=$(agent_sim_bin)
SERVER_CPU=() FLEET_CPU=()
if [ "${PIN:-0}" = 1 ]; then
  SERVER_CPU=(taskset -c 0) FLEET_CPU=(taskset -c 1)
fi
HTTP=http://127.0.0.1:8500

cat >"$OUT/limits.hcl" <<'EOF'
limits {
  rpc_max_conns_per_client  = 0
  http_max_conns_per_client = 0
}
EOF
rm -rf "$OUT/server"
MODE=(-server -bootstrap-expect 1 -data-dir "$OUT/server")
[ "${DEV:-0}" = 1 ] && MODE=(-dev)
"${SERVER_CPU[@]}" "$CONSUL_BIN" agent "${MODE[@]}" -node leave-server \
  -bind 127.0.0.1 -client 127.0.0.1 -log-level info \
  -config-file "$OUT/limits.hcl" >"$OUT/server.log" 2>&1 &
server_pid=$!
sim_pid=
cleanup() {
  [ -n "$sim_pid" ] && kill -INT "$sim_pid" 2>/dev/null && wait "$sim_pid" 2>/dev/null
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 150); do
  curl -sf "$HTTP/v1/status/leader" | grep -q 8300 && break
  sleep 0.2
done
curl -sf "$HTTP/v1/status/leader" | grep -q 8300 || { echo "the server did not elect itself" >&2; exit 1; }

"${FLEET_CPU[@]}" "$BIN" --kind consul --agents "$N" --target 127.0.0.1:8300 --http-target 127.0.0.1:8500 \
  --upstreams '' --probe off --session-ttl off --ramp 50/s --quiet --summary "$OUT/sim.json" "$@" \
  >"$OUT/sim.txt" 2>&1 &
sim_pid=$!
alive() { curl -sf "$HTTP/v1/agent/members" | python3 -c 'import json,sys; print(sum(1 for m in json.load(sys.stdin) if m["Status"] == 1) - 1)'; }
for _ in $(seq $((N / 10 + 120))); do
  [ "$(alive)" -ge "$N" ] && break
  kill -0 "$sim_pid" 2>/dev/null || { sim_pid=; echo "agent-sim ended:" >&2; tail -5 "$OUT/sim.txt" >&2; exit 1; }
  sleep 1
done
[ "$(alive)" -ge "$N" ] || { echo "only $(alive) of $N members joined" >&2; exit 1; }
sleep "$HOLD"
start=$(date +%s.%N)
kill -INT "$sim_pid"
wait "$sim_pid" || true
sim_pid=
took=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
count() { grep -c "serf.lan: serf: $1" "$OUT/server.log" || true; }
for _ in $(seq 60); do
  [ $(($(count 'EventMemberLeave: ') + $(count 'EventMemberFailed: '))) -ge "$N" ] && break
  sleep 1
done
# Each unreadable packet and each stream a server cut short, with its sample.
read -r bad cut words < <(python3 -c '
import json, sys
e = json.load(open(sys.argv[1])).get("errors", {})
b, c = e.get("gossip_bad_packet", {}), e.get("gossip_stream_cut", {})
print(b.get("count", 0), c.get("count", 0), " | ".join(x.get("sample") or "" for x in (b, c) if x))' "$OUT/sim.json")
printf 'members %s  left %s  failed %s  forced %s  handler-queue-full lines %s  fleet end %s s  bad packets %s  streams cut %s  (logs: %s)\n' \
  "$N" "$(count 'EventMemberLeave: ')" "$(count 'EventMemberFailed: ')" \
  "$(count 'EventMemberLeave (forced)')" "$(grep -c 'handler queue full' "$OUT/server.log" || true)" \
  "$took" "$bad" "$cut" "$OUT"
[ -z "$words" ] || echo "  samples: $words"
