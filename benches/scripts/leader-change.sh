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
# KILL=follower kills a follower instead of the leader (default `leader`): no
# election, the agents only lose a server. BACK=S starts the killed server again
# S seconds after the kill (same data dir and flags, its log in srv-I-back.log)
# and prints a second table: the RPCs the survivors and the returned server
# served in the AFTER seconds after its return. The first table then covers
# min(AFTER, S) seconds. result.json keeps the kill's and the return's wall
# clock (epoch seconds) and when the survivors' serf saw the server fail and
# join again, to line up with agent-sim's summary timeline.
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
KILL=${KILL:-leader}
BACK=${BACK:-}
case "$KILL" in leader | follower) ;; *) echo "unknown KILL=$KILL (leader or follower)" >&2; exit 64 ;; esac
case "$BACK" in '' | *[!0-9]*) [ -z "$BACK" ] || { echo "BACK=$BACK is not a number of seconds" >&2; exit 64; } ;; esac
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
  # The server started again after BACK seconds (its pid written by the reader below).
  [ -s "$OUT/back.pid" ] && server_pids+=("$(cat "$OUT/back.pid")") && rm -f "$OUT/back.pid"
  stop_pids "${server_pids[@]}"
  server_pids=()
  [ -n "${DATA:-}" ] && rm -rf "$DATA"
  true
}
trap stop_all EXIT
DATA=$(mktemp -d "${TMPDIR:-/tmp}/leader-change.XXXXXX")

joins=()
for ip in "${SERVERS[@]}"; do joins+=(-retry-join "$ip"); done
# The command line of server I (1-3), the same when BACK starts it again.
server_cmd() {
  local ip=${SERVERS[$(($1 - 1))]}
  printf '%s\0' "$CONSUL_BIN" agent -server -bootstrap-expect 3 -node "srv-$1" -bind "$ip" \
    -client "$ip" -data-dir "$DATA/srv-$1" "${joins[@]}" -config-file "$OUT/server.hcl" \
    -log-level info
}
for i in 1 2 3; do
  mapfile -d '' cmd < <(server_cmd "$i")
  "${cmd[@]}" >"$OUT/srv-$i.log" 2>&1 &
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
victim=
for i in 0 1 2; do
  [ -z "$victim" ] || break
  if [ "$KILL" = leader ]; then
    [ "${SERVERS[$i]}" = "$leader" ] && victim=$i
  elif [ -n "$leader" ] && [ "${SERVERS[$i]}" != "$leader" ]; then
    victim=$i
  fi
done
[ -n "$victim" ] || { echo "no $KILL to kill (leader: $leader)" >&2; exit 1; }
lpid=${server_pids[$victim]}
mapfile -d '' back_cmd < <(server_cmd $((victim + 1)))

# Reads the survivors, kills the chosen server (-9), reads their call counts
# every 5 s for AFTER seconds, finds the election in their logs, prints the
# table; with BACK, starts the server again and does the same once more.
python3 - "$OUT" "${SERVERS[$victim]}" "$lpid" "$AFTER" "$N" "$FLEET" "$KILL" "${BACK:-0}" \
  "${SERVERS[*]}" "${back_cmd[@]}" <<'PY'
import datetime, json, os, signal, subprocess, sys, time, urllib.request
out, victim, vpid, after, n, fleet = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
kill, back = sys.argv[7], float(sys.argv[8])
servers, back_cmd = sys.argv[9].split(), sys.argv[10:]
names = {ip: f"srv-{i + 1}" for i, ip in enumerate(servers)}
survivors = [ip for ip in servers if ip != victim]
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

def read_for(span, t_from, ips, prefix=""):
    """Reads the servers' call counts every 5 s for span seconds after t_from, then once more.
    A server that does not answer (one starting again) is read at the next turn."""
    next_read = t_from + 5
    while time.monotonic() - t_from < span:
        if time.monotonic() >= next_read:
            for ip in ips:
                try:
                    fold(ip, calls(ip, f"{prefix}t{next_read - t_from:.0f}"))
                except OSError:
                    pass
            next_read += 5
        time.sleep(0.1)
    for ip in ips:
        fold(ip, calls(ip, f"{prefix}after"))

def log_times(ip, needle, wall_from, log=None):
    """Seconds after wall_from of the lines of a server's log that hold needle."""
    ts_all = []
    for line in open(log or f"{out}/{names[ip]}.log", errors="replace"):
        if needle not in line:
            continue
        try:
            ts = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f")
        except ValueError:
            continue
        t = ts.replace(tzinfo=datetime.timezone.utc).timestamp() - wall_from
        if t >= 0:
            ts_all.append(t)
    return ts_all

os.kill(vpid, signal.SIGKILL)
t_kill, wall_kill = time.monotonic(), time.time()
first = min(after, back) if back else after
read_for(first, t_kill, survivors)
after_kill = {ip: dict(got[ip]) for ip in survivors}
errored_kill = dict(errored)

# The election, from the survivors' logs (polling /v1/status/leader would be
# Status.Leader RPCs counted among the calls): the first "entering leader state".
new_leader, elected_s = None, None
for ip in survivors:
    for t in log_times(ip, "entering leader state", wall_kill):
        if elected_s is None or t < elected_s:
            new_leader, elected_s = ip, t
failed_seen = {names[ip]: min(log_times(ip, f"EventMemberFailed: {names[victim]} ", wall_kill), default=None)
               for ip in survivors}

def row(label, vals):
    print(f"{label:<40}" + "".join(f"{v:>10.0f}" for v in vals))

def table(ips, got, errored):
    """One column per server and the sum: AE reads, every other method, failed calls."""
    tot = {}
    for ip in ips:
        for m, v in got[ip].items():
            tot[m] = tot.get(m, 0.0) + v
    print(f"{'':<40}" + "".join(f"{names[ip]:>10}" for ip in ips) + f"{'sum':>10}")
    ae = [sum(got[ip].get(m, 0.0) for m in AE) for ip in ips]
    row("AE reads (NodeServiceList+NodeChecks)", ae + [sum(ae)])
    for m in AE:
        row(f"  {m}", [got[ip].get(m, 0.0) for ip in ips] + [tot.get(m, 0.0)])
    others = sorted((m for m in tot if m not in AE), key=lambda m: -tot[m])
    if others:
        print("other methods:")
    for m in others:
        row(f"  {m}", [got[ip].get(m, 0.0) for ip in ips] + [tot[m]])
    rest = [sum(v for m, v in got[ip].items() if m not in AE) for ip in ips]
    row("all other methods", rest + [sum(rest)])
    row("calls that failed (errored=true)", [errored[ip] for ip in ips] + [sum(errored[ip] for ip in ips)])

res = {"fleet": fleet, "agents": int(n), "killed": names[victim], "kill": kill, "after_s": after,
       "killed_at_epoch": wall_kill, "first_window_s": first,
       "new_leader": names.get(new_leader), "election_s": elected_s,
       "failed_seen_s": failed_seen,
       "calls": {names[ip]: after_kill[ip] for ip in survivors},
       "errored": {names[ip]: errored_kill[ip] for ip in survivors},
       "series_restarted": {names[ip]: resets[ip] for ip in survivors}}
json.dump(res, open(f"{out}/result.json", "w"), indent=1)

print(f"{fleet}: {n} agents; {kill} {names[victim]} ({victim}) killed with -9; "
      f"the survivors' RPCs in the {first:.0f} s after")
el = f"{elected_s:.2f} s ({names[new_leader]})" if elected_s is not None else f"none in {first:.0f} s"
print(f"new leader after {el}")
seen = ", ".join(f"{k} {v:.2f} s" if v is not None else f"{k} never" for k, v in failed_seen.items())
print(f"the survivors' serf saw {names[victim]} fail after: {seen}")
table(survivors, after_kill, errored_kill)
if any(resets.values()):
    print(f"series that restarted from zero: {res['series_restarted']}")
if not back:
    sys.exit(0)

# The return: the survivors read on until BACK, the server started again with
# its own command line, then every server read for AFTER seconds.
read_for(back - first, t_kill + first, survivors, "pre-back-")
log = f"{out}/{names[victim]}-back.log"
proc = subprocess.Popen(back_cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL)
t_back, wall_back = time.monotonic(), time.time()
open(f"{out}/back.pid", "w").write(str(proc.pid))
everyone = survivors + [victim]
prev[victim] = {}
got = {ip: {} for ip in everyone}
errored = {ip: 0.0 for ip in everyone}
resets[victim] = 0
read_for(after, t_back, everyone, "back-")
joined_seen = {names[ip]: min(log_times(ip, f"EventMemberJoin: {names[victim]} ", wall_back), default=None)
               for ip in survivors}
res.update({"back_s": back, "back_at_epoch": wall_back, "join_seen_s": joined_seen,
            "calls_after_back": {names[ip]: got[ip] for ip in everyone},
            "errored_after_back": {names[ip]: errored[ip] for ip in everyone},
            "series_restarted": {names[ip]: resets[ip] for ip in everyone}})
json.dump(res, open(f"{out}/result.json", "w"), indent=1)
print()
print(f"{names[victim]} started again {back:.0f} s after the kill; every server's RPCs in the {after:.0f} s after")
seen = ", ".join(f"{k} {v:.2f} s" if v is not None else f"{k} never" for k, v in joined_seen.items())
print(f"the survivors' serf saw {names[victim]} join again after: {seen}")
table(everyone, got, errored)
PY
