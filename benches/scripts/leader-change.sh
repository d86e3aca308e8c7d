#!/usr/bin/env bash
# What the survivors of a leader loss serve: three real Consul 1.20.1 servers
# (127.0.3.1-3), N client agents (real Consul agents or agent-sim's), the leader
# killed with -9 once every agent is in the catalog and the cluster has been
# quiet for QUIET seconds. Prints, per survivor and summed, the RPCs it served
# in the AFTER seconds after the kill (its consul_rpc_server_call_count by
# method): the anti-entropy reads (Catalog.NodeServiceList + Health.NodeChecks)
# and every other method, the calls that failed, and how long the survivors
# took to elect a leader (the first "entering leader state" in their logs).
#
#   CONSUL_BIN=/path/to/consul bash benches/scripts/leader-change.sh N FLEET [-- agent-sim flags]
#
# FLEET: `real` (N Consul client agents on 127.0.3.11 upward, one service each,
# ~100 MiB of RSS apiece) or `sim` (one agent-sim run with N agents, the options
# consul-fidelity.sh gives it). CONSUL_BIN is a Consul 1.20.1 binary you built
# (docs/real-servers.md); nothing of Consul is in this repository. Env: QUIET
# (default 60), AFTER (45), OUT (target/bench-leader-change; logs, expositions
# and the result as JSON). The servers keep their data in a temporary folder,
# removed at the end; every process started here is stopped on exit.
#
# The servers' telemetry keeps a series 60 s after its last update
# (prometheus_retention_time), so a method idle for a minute leaves the
# exposition and starts again from zero: the survivors are read every 5 s
# and a series that went missing or went down counts from zero.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:?usage: leader-change.sh N real|sim [-- agent-sim flags]}
FLEET=${2:?usage: leader-change.sh N real|sim [-- agent-sim flags]}
shift 2
[ "${1:-}" = "--" ] && shift
SIM_FLAGS=("$@")
case "$FLEET" in real | sim) ;; *) echo "unknown fleet $FLEET (real or sim)" >&2; exit 64 ;; esac
QUIET=${QUIET:-60}
AFTER=${AFTER:-45}
CONSUL_BIN=${CONSUL_BIN:?set CONSUL_BIN to a consul 1.20.1 binary}
OUT=${OUT:-target/bench-leader-change}
SERVERS=(127.0.3.1 127.0.3.2 127.0.3.3)
rm -rf "$OUT" && mkdir -p "$OUT"
if [ "$FLEET" = sim ]; then
  nice cargo build --release -p agent-sim 2>/dev/null
  BIN=$PWD/target/release/agent-sim
fi

printf '%s\n' 'limits { rpc_max_conns_per_client = 0  http_max_conns_per_client = 0 }' \
  'telemetry {' '  prefix_filter = ["+consul.rpc.server.call"]' \
  '  prometheus_retention_time = "60s"' '  disable_hostname = true' '}' >"$OUT/server.hcl"
echo '{"service":{"name":"app","port":8080}}' >"$OUT/svc.json"

server_pids=()
fleet_pids=()
# Ends what this script started, by process id: TERM, then KILL after 20 s.
stop_pids() {
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 100); do
    local alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.2
  done
  kill -KILL "$@" 2>/dev/null || true
}
stop_all() {
  stop_pids "${fleet_pids[@]}"
  fleet_pids=()
  stop_pids "${server_pids[@]}"
  server_pids=()
  [ -n "${DATA:-}" ] && rm -rf "$DATA"
  true
}
trap stop_all EXIT
DATA=$(mktemp -d "${TMPDIR:-/tmp}/leader-change.XXXXXX")

joins=()
for ip in "${SERVERS[@]}"; do joins+=(-retry-join "$ip"); done
for i in 1 2 3; do
  ip=${SERVERS[$((i - 1))]}
  "$CONSUL_BIN" agent -server -bootstrap-expect 3 -node "srv-$i" -bind "$ip" -client "$ip" \
    -data-dir "$DATA/srv-$i" "${joins[@]}" -config-file "$OUT/server.hcl" -log-level info \
    >"$OUT/srv-$i.log" 2>&1 &
  server_pids+=($!)
  disown $!   # no "Killed" notice from the shell when the leader goes
done

leader_of() { curl -sf --max-time 2 "http://$1:8500/v1/status/leader" | tr -d '"' | cut -d: -f1; }
leader=
for _ in $(seq 300); do
  leader=$(leader_of "${SERVERS[0]}" 2>/dev/null || true)
  [ -n "$leader" ] && break
  sleep 0.2
done
[ -n "$leader" ] || { echo "the servers elected no leader in 60 s" >&2; exit 1; }
echo "servers up, leader $leader" >&2

case "$FLEET" in
real)
  a=10
  for i in $(seq 1 "$N"); do
    while :; do
      a=$((a + 1))
      [ $((a % 256)) -ne 0 ] && [ $((a % 256)) -ne 255 ] && break
    done
    ip="127.0.$((3 + a / 256)).$((a % 256))"
    "$CONSUL_BIN" agent -data-dir "$DATA/a$i" -node "real-$i" -bind "$ip" -client "$ip" \
      -retry-join "${SERVERS[0]}" -config-file "$OUT/svc.json" -log-level warn \
      >"$OUT/a$i.log" 2>&1 &
    fleet_pids+=($!)
  done
  ;;
sim)
  # The HTTP target is left to agent-sim's default (the first target's host).
  targets=$(printf '%s:8300,' "${SERVERS[@]}")
  "$BIN" --kind consul --agents "$N" --target "${targets%,}" --gossip-join "${SERVERS[0]}:8301" \
    --upstreams web --probe off --session-ttl off --services-per-agent 1 --ramp 50/s \
    --duration "$((N / 50 + QUIET + AFTER + 360))s" --quiet --summary "$OUT/sim.json" \
    "${SIM_FLAGS[@]}" >"$OUT/sim.txt" 2>&1 &
  fleet_pids=($!)
  ;;
esac

nodes() {
  curl -sf --max-time 5 "http://$1:8500/v1/catalog/nodes" |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'
}
t0=$SECONDS
for _ in $(seq 300); do
  [ "$(nodes "$leader" 2>/dev/null || echo 0)" -ge $((N + 3)) ] && break
  sleep 1
done
echo "$FLEET: $(($(nodes "$leader") - 3)) of $N nodes in the catalog after $((SECONDS - t0)) s; $QUIET s of quiet" >&2
sleep "$QUIET"

leader=$(leader_of "${SERVERS[0]}")
lpid=
for i in 0 1 2; do [ "${SERVERS[$i]}" = "$leader" ] && lpid=${server_pids[$i]}; done
[ -n "$lpid" ] || { echo "no leader to kill ($leader)" >&2; exit 1; }

# Reads the survivors, kills the leader (-9), reads their call counts every 5 s
# for AFTER seconds, finds the election in their logs, prints the table.
python3 - "$OUT" "$leader" "$lpid" "$AFTER" "$N" "$FLEET" "${SERVERS[@]}" <<'PY'
import datetime, json, os, signal, sys, time, urllib.request
out, leader, lpid, after, n, fleet = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
servers = sys.argv[7:]
names = {ip: f"srv-{i + 1}" for i, ip in enumerate(servers)}
survivors = [ip for ip in servers if ip != leader]
AE = ("Catalog.NodeServiceList", "Health.NodeChecks")

def get(ip, path, timeout=3):
    return urllib.request.urlopen(f"http://{ip}:8500{path}", timeout=timeout).read().decode()

def calls(ip, tag):
    """consul_rpc_server_call_count of one server, series (label set) -> count."""
    body = get(ip, "/v1/agent/metrics?format=prometheus", timeout=10)
    open(f"{out}/{names[ip]}-{tag}.prom", "w").write(body)
    series = {}
    for line in body.splitlines():
        if line.startswith("consul_rpc_server_call_count{"):
            labels, _, value = line.rpartition(" ")
            series[labels] = float(value)
    return series

def method_of(labels):
    for part in labels[labels.index("{") + 1:-1].split(","):
        k, _, v = part.partition("=")
        if k == "method":
            return v.strip('"')
    return "?"

prev = {ip: calls(ip, "before") for ip in survivors}
got = {ip: {} for ip in survivors}
errored = {ip: 0.0 for ip in survivors}
resets = {ip: 0 for ip in survivors}

def fold(ip, cur):
    """Adds what each series gained since the last read (a new or lower series: all of it)."""
    for labels, v in cur.items():
        p = prev[ip].get(labels)
        inc = v - p if p is not None and v >= p else v
        if p is not None and v < p:
            resets[ip] += 1
        m = method_of(labels)
        got[ip][m] = got[ip].get(m, 0.0) + inc
        if 'errored="true"' in labels:
            errored[ip] += inc
    prev[ip] = cur

os.kill(lpid, signal.SIGKILL)
t_kill, wall_kill = time.monotonic(), time.time()
next_read = t_kill + 5
while time.monotonic() - t_kill < after:
    if time.monotonic() >= next_read:
        for ip in survivors:
            fold(ip, calls(ip, f"t{next_read - t_kill:.0f}"))
        next_read += 5
    time.sleep(0.1)
for ip in survivors:
    fold(ip, calls(ip, "after"))

# The election, from the survivors' logs (polling /v1/status/leader would be
# Status.Leader RPCs counted among the calls): the first "entering leader state".
new_leader, elected_s = None, None
for ip in survivors:
    for line in open(f"{out}/{names[ip]}.log", errors="replace"):
        if "entering leader state" not in line:
            continue
        try:
            ts = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f")
        except ValueError:
            continue
        t = ts.replace(tzinfo=datetime.timezone.utc).timestamp() - wall_kill
        if t >= 0 and (elected_s is None or t < elected_s):
            new_leader, elected_s = ip, t

res = {"fleet": fleet, "agents": int(n), "killed": names[leader], "after_s": after,
       "new_leader": names.get(new_leader), "election_s": elected_s,
       "calls": {names[ip]: got[ip] for ip in survivors},
       "errored": {names[ip]: errored[ip] for ip in survivors},
       "series_restarted": {names[ip]: resets[ip] for ip in survivors}}
json.dump(res, open(f"{out}/result.json", "w"), indent=1)

cols = [names[ip] for ip in survivors]
tot = {}
for ip in survivors:
    for m, v in got[ip].items():
        tot[m] = tot.get(m, 0.0) + v
def row(label, vals):
    print(f"{label:<40}" + "".join(f"{v:>10.0f}" for v in vals))
print(f"{fleet}: {n} agents; leader {names[leader]} ({leader}) killed with -9; "
      f"the survivors' RPCs in the {after:.0f} s after")
el = f"{elected_s:.2f} s ({names[new_leader]})" if elected_s is not None else f"none in {after:.0f} s"
print(f"new leader after {el}")
print(f"{'':<40}" + "".join(f"{c:>10}" for c in cols) + f"{'sum':>10}")
ae = [sum(got[ip].get(m, 0.0) for m in AE) for ip in survivors]
row("AE reads (NodeServiceList+NodeChecks)", ae + [sum(ae)])
for m in AE:
    row(f"  {m}", [got[ip].get(m, 0.0) for ip in survivors] + [tot.get(m, 0.0)])
others = sorted((m for m in tot if m not in AE), key=lambda m: -tot[m])
if others:
    print("other methods:")
for m in others:
    row(f"  {m}", [got[ip].get(m, 0.0) for ip in survivors] + [tot[m]])
rest = [sum(v for m, v in got[ip].items() if m not in AE) for ip in survivors]
row("all other methods", rest + [sum(rest)])
row("calls that failed (errored=true)", [errored[ip] for ip in survivors] + [sum(errored.values())])
if any(resets.values()):
    print(f"series that restarted from zero: {res['series_restarted']}")
PY
