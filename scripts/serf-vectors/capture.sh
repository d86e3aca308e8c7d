#!/usr/bin/env bash
# One capture of serf user messages between a real Consul 1.20.1 server
# (127.0.0.2) and one real client agent (127.0.0.11).
#   bash capture.sh plain|encrypted WORKDIR
# encrypted: gossip encryption on, then keyring list/install/use/remove and a
# user event; plain: user events only. Writes WORKDIR/<set>.pcap, the keys to
# WORKDIR/<set>.keys, the commands' output to WORKDIR/<set>.cmds.
set -euo pipefail
SET=$1
W=$2
C=${CONSUL_BIN:-/work/scratch/consul/bin/consul}
rm -rf "$W/$SET" && mkdir -p "$W/$SET"
D=$W/$SET
: >"$D/gossip.hcl"
KEY=
if [ "$SET" = encrypted ]; then
  KEY=$("$C" keygen)
  printf 'encrypt = "%s"\n' "$KEY" >"$D/gossip.hcl"
fi
echo '{"service":{"name":"app","port":8080}}' >"$D/svc.json"
pids=()
cleanup() {
  [ ${#pids[@]} -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null
  sleep 3
  [ ${#pids[@]} -gt 0 ] && kill -KILL "${pids[@]}" 2>/dev/null
  [ -n "${TCPDUMP:-}" ] && kill -INT "$TCPDUMP" 2>/dev/null
  true
}
trap cleanup EXIT

tcpdump -i lo -U -w "$W/$SET.pcap" 'port 8301' >"$D/tcpdump.log" 2>&1 &
TCPDUMP=$!
sleep 1
"$C" agent -server -bootstrap-expect 1 -bind 127.0.0.2 -client 127.0.0.2 -node srv \
  -data-dir "$D/srv" -config-file "$D/gossip.hcl" -log-level debug >"$D/srv.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf http://127.0.0.2:8500/v1/status/leader | grep -q 8300 && break; sleep 0.2; done
"$C" agent -data-dir "$D/c11" -node real-11 -bind 127.0.0.11 -client 127.0.0.11 \
  -retry-join 127.0.0.2 -config-file "$D/svc.json" -config-file "$D/gossip.hcl" \
  -log-level debug >"$D/c11.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  [ "$(curl -sf http://127.0.0.2:8500/v1/catalog/nodes | grep -o '"Node":' | wc -l)" -ge 2 ] && break
  sleep 0.2
done
sleep 5
H=(-http-addr 127.0.0.2:8500)
run() { echo "\$ consul $*" >>"$D/../$SET.cmds"; echo "# at $(date +%s.%N)" >>"$D/../$SET.cmds"; "$C" "$@" >>"$D/../$SET.cmds" 2>&1 || echo "exit $?" >>"$D/../$SET.cmds"; sleep 4; }
: >"$W/$SET.cmds"
run event "${H[@]}" -name deploy v1
run event "${H[@]}" -name deploy
if [ "$SET" = encrypted ]; then
  NEW=$("$C" keygen)
  printf '%s\n%s\n' "$KEY" "$NEW" >"$W/$SET.keys"
  run keyring "${H[@]}" -list
  run keyring "${H[@]}" -install "$NEW"
  run keyring "${H[@]}" -use "$NEW"
  run keyring "${H[@]}" -remove "$KEY"
  run keyring "${H[@]}" -list
  run event "${H[@]}" -name deploy v2
fi
curl -s "http://127.0.0.11:8500/v1/event/list?name=deploy" >"$W/$SET.client-events.json"
sleep 2
kill -TERM "${pids[@]}"
wait "${pids[@]}" || true
pids=()
sleep 1
kill -INT "$TCPDUMP"
wait "$TCPDUMP" || true
TCPDUMP=
