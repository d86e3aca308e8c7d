#!/usr/bin/env bash
# What one real Consul server spends on N client agents: N real Consul client
# agents, then N agent-sim agents, each against a fresh `-dev` server, the same
# steady-state window measured at the server (its Prometheus counters and its
# /proc CPU). Prints one row per figure, with the ratio agent-sim / real (the
# fidelity tables of BENCHMARKS.md): RPC, raft, CPU and the gossip the server
# sees (memberlist UDP and TCP, probes, serf messages and member events), then
# what became of the members: their serf status at the window's end and after
# the fleet stopped, and the members the server marked failed.
#
#   CONSUL_BIN=/path/to/consul bash benches/scripts/consul-fidelity.sh [N] [SECONDS] [FLEETS] [-- agent-sim flags]
#
# FLEETS: "real sim" (default), or one of them, or a fleet twice ("real sim sim":
# the ratio is against the first real). CONSUL_BIN is a Consul 1.20.1 binary you
# built (docs/real-servers.md); nothing of Consul is in this repository. Real
# agents run on 127.0.0.12 upward (SERVER_IP and 127.0.0.200 skipped), one
# service each ({"service":{"name":"app","port":8080}}), ~100 MiB of RSS apiece.
# The window starts WARMUP seconds (default 45) after the last agent registered.
# Extra flags after `--` go to agent-sim (e.g. `--consul-agent api`).
# SIM_RAMP: agent-sim's --ramp (default 50/s; `all` starts the fleet at once,
# as the real agents start: a join storm).
# SERVER_IP: the server's address (default 127.0.0.1; ports 8300, 8301, 8500,
# 8502, 8600 there must be free). GOSSIP_KEY: a gossip encryption key (`consul
# keygen`; "new" makes one) set as `encrypt` on the server and the real agents
# and given to agent-sim as --gossip-key. REPORT_ONLY=1: print the table again
# from the files of an earlier run in OUT (same N, SECONDS, FLEETS), run nothing.
# AGENT_SIM: an agent-sim binary to run instead of building one (no cargo build).
# SERVICES: service instances per agent in both fleets (default 1; app-1, app-2, ...).
# WATCH: what each agent of both fleets watches: "none" (default: nothing, as most
# client agents; agent-sim with --upstreams '') or a service name (agent-sim:
# --upstreams NAME; each real agent: a blocking health query of NAME looped on its
# own HTTP API, which a real agent serves from one Subscribe to its server).
# NOISE=T: the same background on the box in every fleet's warmup and window, T
# threads of one process each waking every 10 ms for a few microseconds of work
# (no traffic to the server; on FLEET_CPUS when set). On this kind of VM a wakeup
# costs a process more CPU when its core was idle than when other tasks keep the
# core awake, and 100 real agents keep the server's cores awake with their own
# timers where agent-sim's one process does not: without the same background the
# two fleets' windows are not measured on the same box (BENCHMARKS.md, "Steady
# state: a fresh server per fleet, both orders, the same box for both").
# MIRROR=IP: each fleet's warmup and window with the other fleet beside it, held
# by a second -dev server at IP that nothing measures (its real agents from
# 127.0.8.1 up): the box then carries one server with 100 real agents and one
# with agent-sim's in every window, and only which of them is measured changes.
# The fair unpinned pair on one box, where NOISE only imitates the real fleet.
# Besides the server's counters the table has the box's (TCP segments and UDP
# datagrams on loopback, both ways, from /proc/net/snmp), the server's context
# switches (every thread) and the fleet's own CPU over the window.
# PERF=1: record the server's profile over each window (perf record -g,
# OUT/<fleet><n>.perf.data; PERF_HZ, default 499), to see where its CPU goes.
# PPROF=1: the server's own CPU profile over each window (Go's pprof from its
# /debug/pprof, OUT/<fleet><n>.cpu.pprof; `go tool pprof -top CONSUL_BIN FILE`).
# SERVER_CPUS, FLEET_CPUS: taskset CPU lists (e.g. 0 and 1): the server runs on
# SERVER_CPUS, every real agent and agent-sim on FLEET_CPUS, so a fleet starting
# at once does not take the server's core (unset: no pinning). PIN_STEADY=1:
# start everything unpinned and pin the server and the fleet (every thread)
# to those CPUs once the fleet has registered, for the warmup and the window:
# the server's own core in steady state, without a real fleet's start on one
# core (100 real agents starting on one core overload it).
set -euo pipefail
cd "$(dirname "$0")/../.."
. benches/scripts/real-consul.sh
N=${1:-100}
WINDOW=${2:-60}
FLEETS=${3:-"real sim"}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
SIM_FLAGS=("$@")
WARMUP=${WARMUP:-45}
SERVICES=${SERVICES:-1}
WATCH=${WATCH:-none}
SIM_RAMP=${SIM_RAMP:-50/s}
SERVER_IP=${SERVER_IP:-127.0.0.1}
CONSUL_BIN=${CONSUL_BIN:?set CONSUL_BIN to a consul 1.20.1 binary}
OUT=${OUT:-target/bench-consul-fidelity}
HTTP=$SERVER_IP:8500
SERVER_CPU=() FLEET_CPU=()
if [ -z "${PIN_STEADY:-}" ]; then
  [ -n "${SERVER_CPUS:-}" ] && SERVER_CPU=(taskset -c "$SERVER_CPUS")
  [ -n "${FLEET_CPUS:-}" ] && FLEET_CPU=(taskset -c "$FLEET_CPUS")
fi
[ -n "${REPORT_ONLY:-}" ] && FLEETS_RUN= || FLEETS_RUN=$FLEETS
[ -n "${REPORT_ONLY:-}" ] || { rm -rf "$OUT" && mkdir -p "$OUT"; }
if [ -z "${REPORT_ONLY:-}" ]; then
  BIN=$(agent_sim_bin)
  server_hcl "$OUT/server.hcl"
  # EXTRA_HCL: more server configuration (e.g. a telemetry prefix_filter), in a second
  # file (Consul merges files; the same block twice in one file is refused).
  printf '%s\n' "${EXTRA_HCL:-}" >"$OUT/extra.hcl"
  python3 -c 'import json,sys; n=int(sys.argv[1]); print(json.dumps({"services": [
      {"name": "app", "id": f"app-{i}", "port": 8080 + i} for i in range(1, n + 1)]}))' \
    "$SERVICES" >"$OUT/svc.json"
  : >"$OUT/gossip.hcl"
  if [ -n "${GOSSIP_KEY:-}" ]; then
    [ "$GOSSIP_KEY" = new ] && GOSSIP_KEY=$("$CONSUL_BIN" keygen)
    printf 'encrypt = "%s"\n' "$GOSSIP_KEY" >"$OUT/gossip.hcl"
    SIM_FLAGS+=(--gossip-key "$GOSSIP_KEY")
  fi
fi

server_pid=
fleet_pids=()
# Ends what this script started, by process id.
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
  noise_stop
  mirror_stop
  stop_pids "${fleet_pids[@]}" ${watch_pid:+"$watch_pid"}
  fleet_pids=() watch_pid=
  [ -n "$server_pid" ] && stop_pids "$server_pid"
  server_pid=
}
trap stop_all EXIT

# A fresh -dev server: $1 its log's tag, $2 its address (default SERVER_IP);
# its pid in started_pid.
started_pid=
dev_server() {
  local ip=${2:-$SERVER_IP}
  "${SERVER_CPU[@]}" "$CONSUL_BIN" agent -dev -client "$ip" -bind "$ip" -log-level info \
    -config-file "$OUT/server.hcl" -config-file "$OUT/extra.hcl" -config-file "$OUT/gossip.hcl" \
    -data-dir "$OUT/server-$ip" >"$OUT/server-$1.log" 2>&1 &
  started_pid=$!
  for _ in $(seq 100); do
    curl -sf "$ip:8500/v1/status/leader" | grep -q 8300 && return 0
    sleep 0.2
  done
  echo "the dev server at $ip did not elect itself" >&2
  exit 1
}
start_server() {
  dev_server "$1"
  server_pid=$started_pid
}

# N real client agents of server $1 (run tag $2), addresses from 127.0.0.<$3 + 1>
# upward (SERVER_IP, MIRROR and 127.0.0.200 skipped); their pids in started,
# their addresses in started_ips.
started=() started_ips=()
real_fleet() {
  local a=$3 ip i
  started=() started_ips=()
  for i in $(seq 1 "$N"); do
    while :; do
      a=$((a + 1))
      ip="127.0.$((a / 256)).$((a % 256))"
      [ "$ip" != "$SERVER_IP" ] && [ "$ip" != "${MIRROR:-}" ] && [ "$ip" != 127.0.0.200 ] && [ $((a % 256)) -ne 0 ] && break
    done
    "${FLEET_CPU[@]}" "$CONSUL_BIN" agent -data-dir "$OUT/$2/a$i" -node "real-$i" -bind "$ip" -client "$ip" \
      -retry-join "$1" -config-file "$OUT/svc.json" -config-file "$OUT/gossip.hcl" \
      -log-level warn >"$OUT/$2-a$i.log" 2>&1 &
    started+=($!) started_ips+=("$ip")
  done
}

# agent-sim's N agents against server $1 (run tag $2), for $3 seconds; pid in started.
sim_fleet() {
  "${FLEET_CPU[@]}" "$BIN" --kind consul --agents "$N" --target "$1:8300" --http-target "$1:8500" \
    --upstreams "$([ "$WATCH" = none ] || echo "$WATCH")" --probe off --session-ttl off --services-per-agent "$SERVICES" --ramp "$SIM_RAMP" \
    --duration "$3s" --quiet --summary "$OUT/$2.json" \
    "${SIM_FLAGS[@]}" >"$OUT/$2.txt" 2>&1 &
  started=($!)
}

# MIRROR: the fleet other than $1 on a fresh -dev server at MIRROR, until stop_all.
mirror_server_pid=
mirror_pids=()
mirror_watch_pid=
mirror_start() {
  [ -n "${MIRROR:-}" ] || return 0
  dev_server "mirror-$tag" "$MIRROR"
  mirror_server_pid=$started_pid
  case "$1" in
  sim) real_fleet "$MIRROR" "mirror-$tag" $((8 * 256)) ;;
  *) sim_fleet "$MIRROR" "mirror-$tag" 3600 ;;
  esac
  mirror_pids=("${started[@]}")
  wait_registered "mirror of $tag" "$MIRROR:8500"
  if [ "$1" = sim ]; then
    watch_real "mirror-$tag" "${started_ips[@]}"
    mirror_watch_pid=$watch_pid watch_pid=
  fi
}
mirror_stop() {
  stop_pids "${mirror_pids[@]}" ${mirror_watch_pid:+"$mirror_watch_pid"}
  [ -n "$mirror_server_pid" ] && stop_pids "$mirror_server_pid"
  mirror_pids=() mirror_server_pid= mirror_watch_pid=
}

# Counters and process CPU of the server at one moment, as JSON: every
# series summed over its labels (a summary's _count and _sum, no quantiles).
# The whole exposition is kept in the file named by $1; the server log's
# length then is kept too (to tell what it logged inside the window).
snapshot() {
  python3 - "$server_pid" "$1" "$HTTP" "$OUT/server-$tag.log" "${fleet_pids[*]:-}" <<'PY'
import glob, json, os, sys, urllib.request
pid, prom, http, log = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
fleet = [int(p) for p in sys.argv[5].split()]
body = urllib.request.urlopen(
    f"http://{http}/v1/agent/metrics?format=prometheus", timeout=10).read().decode()
open(prom, "w").write(body)
out = {}
for line in body.splitlines():
    if line.startswith("#") or "quantile=" in line:
        continue
    name, _, value = line.rpartition(" ")
    base = name.split("{")[0]
    if base.startswith(("consul_", "process_", "go_memstats_")):
        try:
            out[base] = out.get(base, 0.0) + float(value)
        except ValueError:
            pass
ticks = os.sysconf("SC_CLK_TCK")
f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
out["cpu_s"] = (int(f[11]) + int(f[12])) / ticks
# Context switches of every thread of the server (the Go runtime's wakeups).
for k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
    out["server_" + k] = 0
for st in glob.glob(f"/proc/{pid}/task/*/status"):
    try:
        for line in open(st):
            k, _, v = line.partition(":")
            if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                out["server_" + k] += int(v)
    except OSError:
        pass
# The fleet's own CPU (every real agent, or agent-sim and its local children).
def cpu_of(p):
    try:
        g = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        return (int(g[11]) + int(g[12]) + int(g[13]) + int(g[14])) / ticks
    except OSError:
        return 0.0
out["fleet_cpu_s"] = sum(cpu_of(p) for p in fleet)
# Connections held at the server's RPC port (established, from /proc/net/tcp).
import socket, struct
def held(port):
    n = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        ip, _, p = f[1].partition(":")
        addr = socket.inet_ntoa(struct.pack("<I", int(ip, 16)))
        if int(p, 16) == port and f[3] == "01" and addr == http.split(":")[0]:
            n += 1
    return n
out["rpc_conns_held"] = held(8300)
# The box's loopback traffic: TCP segments and UDP datagrams, both ways.
snmp = open("/proc/net/snmp").read().splitlines()
for a, b in zip(snmp[::2], snmp[1::2]):
    proto = a.split(":")[0]
    if proto in ("Tcp", "Udp"):
        for k, v in zip(a.split()[1:], b.split()[1:]):
            if k in ("InSegs", "OutSegs", "InDatagrams", "OutDatagrams"):
                out[f"box_{proto.lower()}_{k}"] = int(v)
# The box's CPU time by state (every core, seconds): what else ran, and what
# the hypervisor took (steal).
cpu = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
out["box_busy_s"] = (sum(cpu) - cpu[3] - cpu[4]) / ticks  # all but idle and iowait
out["box_steal_s"] = cpu[7] / ticks
out["log_lines"] = sum(1 for _ in open(log, errors="replace"))
print(json.dumps(out))
PY
}

# PIN_STEADY: the server and the fleet onto their CPUs, every thread.
pin_steady() {
  [ -n "${PIN_STEADY:-}" ] || return 0
  taskset -apc "${SERVER_CPUS:?PIN_STEADY needs SERVER_CPUS}" "$server_pid" >/dev/null
  for p in "${fleet_pids[@]}"; do
    taskset -apc "${FLEET_CPUS:?PIN_STEADY needs FLEET_CPUS}" "$p" >/dev/null 2>&1 || true
  done
}

measure() {
  snapshot "$OUT/$1-start.prom" >"$OUT/$1-start.json"
  local pprof_pid=
  if [ -n "${PPROF:-}" ]; then
    curl -s "$HTTP/debug/pprof/profile?seconds=$WINDOW" >"$OUT/$1.cpu.pprof" &
    pprof_pid=$!
  fi
  if [ -n "${PERF:-}" ]; then
    perf record -F "${PERF_HZ:-499}" -g -p "$server_pid" -o "$OUT/$1.perf.data" -- sleep "$WINDOW" >/dev/null 2>&1
  else
    sleep "$WINDOW"
  fi
  [ -n "$pprof_pid" ] && wait "$pprof_pid"
  snapshot "$OUT/$1-end.prom" >"$OUT/$1-end.json"
  members_status >"$OUT/$1-members-window.json"
}

registered() {
  curl -sf "${1:-$HTTP}/v1/catalog/service/app" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'
}

# The server's serf view of the other members, by status, as JSON.
members_status() {
  curl -sf "$HTTP/v1/agent/members" | python3 -c '
import json, sys
names = {0: "none", 1: "alive", 2: "leaving", 3: "left", 4: "failed"}
out = {}
for m in json.load(sys.stdin):
    if m.get("Tags", {}).get("role") == "consul":
        continue
    s = names.get(m["Status"], str(m["Status"]))
    out[s] = out.get(s, 0) + 1
print(json.dumps(out))'
}

# Waits (at most 60 s) until no member is alive or leaving, then keeps the statuses.
after_leave() {
  local t0=$SECONDS s
  for _ in $(seq 120); do
    s=$(members_status)
    echo "$s" | grep -qE '"(alive|leaving)"' || break
    sleep 0.5
  done
  echo "$s" | python3 -c "import json,sys; d=json.load(sys.stdin); d['settled_s']=$((SECONDS - t0)); print(json.dumps(d))" \
    >"$OUT/$1-members-after.json"
}

# Waits (at most ~300 s) until every instance of N agents registered; says how long it took.
wait_registered() {
  local t0=$SECONDS
  for _ in $(seq 300); do
    [ "$(registered "${2:-}" 2>/dev/null || echo 0)" -ge $((N * SERVICES)) ] && break
    sleep 1
  done
  echo "$1: $(registered "${2:-}") of $((N * SERVICES)) instances registered after $((SECONDS - t0)) s" >&2
}

# WATCH=<service>: each real agent's local HTTP API asked a blocking health
# query of it, again as soon as it answers (one process for all of them; the
# agent serves a query with an index from a Subscribe to its server).
noise_pid=
noise_start() {
  [ -n "${NOISE:-}" ] || return 0
  "${FLEET_CPU[@]}" python3 - "$NOISE" <<'PY' &
import sys, threading, time
def tick():
    while True:
        time.sleep(0.01)
        x = 0
        for i in range(200):
            x += i
for _ in range(int(sys.argv[1])):
    threading.Thread(target=tick, daemon=True).start()
while True:
    time.sleep(3600)
PY
  noise_pid=$!
}
noise_stop() {
  [ -n "$noise_pid" ] && stop_pids "$noise_pid"
  noise_pid=
}

watch_pid=
# $1: the log's tag, then the agents' addresses (real_fleet's started_ips).
watch_real() {
  [ "$WATCH" = none ] && return 0
  local log=$1
  shift
  python3 - "$WATCH" "$@" <<'PY' >"$OUT/$log-watch.log" 2>&1 &
import sys, threading, time, urllib.request
svc, ips = sys.argv[1], sys.argv[2:]
def loop(ip):
    index = 0
    while True:
        try:
            r = urllib.request.urlopen(
                f"http://{ip}:8500/v1/health/service/{svc}?index={index}&wait=5m", timeout=330)
            r.read()
            index = max(1, int(r.headers.get("X-Consul-Index", "1")))
        except Exception as e:
            print(ip, e, flush=True)
            time.sleep(1)
for ip in ips:
    threading.Thread(target=loop, args=(ip,), daemon=True).start()
while True:
    time.sleep(3600)
PY
  watch_pid=$!
}

run=0
for fleet in $FLEETS_RUN; do
  run=$((run + 1))
  tag=$fleet$run
  mirror_start "$fleet"
  start_server "$tag"
  case "$fleet" in
  real)
    real_fleet "$SERVER_IP" "$tag" 11
    fleet_pids=("${started[@]}")
    wait_registered real
    watch_real "$tag" "${started_ips[@]}"
    noise_start
    snapshot "$OUT/$tag-joined.prom" >"$OUT/$tag-joined.json"
    pin_steady
    sleep "$WARMUP"
    measure "$tag"
    noise_stop
    stop_pids "${fleet_pids[@]}" ${watch_pid:+"$watch_pid"}
    fleet_pids=() watch_pid=
    ;;
  sim)
    sim_fleet "$SERVER_IP" "sim$run" "$((WARMUP + WINDOW + N / 50 + 20))"
    fleet_pids=("${started[@]}")
    wait_registered sim
    noise_start
    snapshot "$OUT/$tag-joined.prom" >"$OUT/$tag-joined.json"
    pin_steady
    sleep "$WARMUP"
    measure "$tag"
    noise_stop
    wait "${fleet_pids[0]}" || echo "agent-sim exited $?" >&2
    fleet_pids=()
    ;;
  *) echo "unknown fleet $fleet (real or sim)" >&2; exit 64 ;;
  esac
  after_leave "$tag"
  snapshot "$OUT/$tag-after.prom" >"$OUT/$tag-after.json"
  stop_all
  sleep 2
done

python3 - "$OUT" "$WINDOW" "$WARMUP" "$FLEETS" "$N" <<'PY'
import json, re, sys
d, window, warmup, fleets = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split()
runs = [f"{f}{i + 1}" for i, f in enumerate(fleets)]
per_s = window
span = window + warmup
# (label, series, divisor, snapshots: window = start..end, span = joined..end)
rows = [("server CPU (s over the window)", "cpu_s", 1.0, "window"),
        ("fleet CPU (s over the window)", "fleet_cpu_s", 1.0, "window"),
        ("box CPU busy, every core (s)", "box_busy_s", 1.0, "window"),
        ("box CPU stolen by the hypervisor (s)", "box_steal_s", 1.0, "window"),
        ("server context switches /s", "server_voluntary_ctxt_switches", per_s, "window"),
        ("server involuntary switches /s", "server_nonvoluntary_ctxt_switches", per_s, "window"),
        ("box TCP segments in /s", "box_tcp_InSegs", per_s, "window"),
        ("box UDP datagrams in /s", "box_udp_InDatagrams", per_s, "window"),
        ("gRPC streams held (window's end)", "consul_grpc_server_streams", 1.0, "at_end"),
        ("gRPC connections held (window's end)", "consul_grpc_server_connections", 1.0, "at_end"),
        ("RPC port connections held (window's end)", "rpc_conns_held", 1.0, "at_end"),
        ("bytes allocated (MB)", "go_memstats_alloc_bytes_total", 1e6, "window"),
        ("mallocs (thousands)", "consul_runtime_malloc_count", 1e3, "window"),
        ("GC cycles", "consul_runtime_total_gc_runs", 1.0, "window"),
        ("GC pause (ms)", "consul_runtime_total_gc_pause_ns", 1e6, "window"),
        ("leader member reconciles /s", "consul_leader_reconcileMember_count", per_s, "window"),
        ("rpc requests /s", "consul_rpc_request", per_s, "window"),
        ("rpc queries /s", "consul_rpc_query", per_s, "window"),
        ("raft applies /s", "consul_raft_apply", per_s, "window"),
        ("raft commits /s", "consul_raft_commitTime_count", per_s, "window"),
        ("coordinate batch updates /s", "consul_fsm_coordinate_batch_update_count", per_s, "window"),
        ("HTTP API requests /s", "consul_api_http_count", per_s, "window"),
        ("memberlist UDP in (B/s)", "consul_memberlist_udp_received", per_s, "window"),
        ("memberlist UDP out (B/s)", "consul_memberlist_udp_sent", per_s, "window"),
        ("memberlist probes /s", "consul_memberlist_probeNode_count", per_s, "window"),
        ("serf coordinate adjustments /s", "consul_serf_coordinate_adjustment_ms_count", per_s, "window"),
        ("memberlist gossip rounds /s", "consul_memberlist_gossip_count", per_s, "window"),
        ("serf msgs received /s", "consul_serf_msgs_received_count", per_s, "window"),
        ("serf msgs received (B/s)", "consul_serf_msgs_received_sum", per_s, "window"),
        ("serf msgs sent /s", "consul_serf_msgs_sent_count", per_s, "window"),
        ("TCP accepts (push-pulls in), window", "consul_memberlist_tcp_accept", 1.0, "window"),
        ("TCP connects (push-pulls out), window", "consul_memberlist_tcp_connect", 1.0, "window"),
        ("TCP sent (B), window", "consul_memberlist_tcp_sent", 1.0, "window"),
        ("TCP accepts /min, warmup+window", "consul_memberlist_tcp_accept", span / 60, "span"),
        ("TCP connects /min, warmup+window", "consul_memberlist_tcp_connect", span / 60, "span"),
        ("TCP sent (B/s), warmup+window", "consul_memberlist_tcp_sent", span, "span"),
        ("server push-pulls, warmup+window", "consul_memberlist_pushPullNode_count", 1.0, "span"),
        ("msg alive, warmup+window", "consul_memberlist_msg_alive", 1.0, "span"),
        ("msg suspect, warmup+window", "consul_memberlist_msg_suspect", 1.0, "span"),
        ("msg dead, warmup+window", "consul_memberlist_msg_dead", 1.0, "span"),
        ("serf member join, warmup+window", "consul_serf_member_join", 1.0, "span"),
        ("serf member failed, warmup+window", "consul_serf_member_failed", 1.0, "span"),
        ("serf member update, warmup+window", "consul_serf_member_update", 1.0, "span"),
        ("serf member left, at the leave", "consul_serf_member_left", 1.0, "leave"),
        ("join: memberlist UDP in (B)", "consul_memberlist_udp_received", 1.0, "join"),
        ("join: memberlist UDP out (B)", "consul_memberlist_udp_sent", 1.0, "join"),
        ("join: serf msgs received", "consul_serf_msgs_received_count", 1.0, "join"),
        ("join: TCP accepts", "consul_memberlist_tcp_accept", 1.0, "join"),
        ("join: serf member join", "consul_serf_member_join", 1.0, "join"),
        ("join: msg suspect", "consul_memberlist_msg_suspect", 1.0, "join"),
        # The storm's whole tail: the server's start to the window's start, less
        # the window's (steady) rate over that time; the join rows above end when
        # the catalog is full, before most of a fast fleet's gossip.
        ("storm: memberlist UDP in (B), less steady", "consul_memberlist_udp_received", 1.0, "storm"),
        ("storm: serf msgs received, less steady", "consul_serf_msgs_received_count", 1.0, "storm"),
        ("storm: msg alive", "consul_memberlist_msg_alive", 1.0, "storm")]
snaps = {}
for r in runs:
    snaps[r] = {k: json.load(open(f"{d}/{r}-{k}.json")) for k in ("joined", "start", "end", "after")}
# join: from the server's start (counters at zero) until every agent registered.
pairs = {"window": ("start", "end"), "span": ("joined", "end"), "leave": ("end", "after"),
         "join": ("zero", "joined")}
def delta(r, key, kind):
    if kind == "storm":
        return storm(r, key)
    if kind == "at_end":
        return snaps[r]["end"].get(key, 0.0)
    a, b = (snaps[r].get(p, {}) for p in pairs[kind])
    return b.get(key, 0.0) - a.get(key, 0.0)
def started(r):
    # The server log's first timestamped line: the server's start.
    import datetime
    for l in open(f"{d}/server-{r}.log", errors="replace"):
        if l.startswith("20"):
            t = datetime.datetime.strptime(l[:23], "%Y-%m-%dT%H:%M:%S.%f")
            return t.replace(tzinfo=datetime.timezone.utc).timestamp()
    return None
def storm(r, key):
    import os
    t0 = started(r)
    if t0 is None:
        return float("nan")
    to_window = os.path.getmtime(f"{d}/{r}-start.prom") - t0
    steady = (snaps[r]["end"].get(key, 0.0) - snaps[r]["start"].get(key, 0.0)) / window
    return snaps[r]["start"].get(key, 0.0) - steady * to_window
ref = runs[fleets.index("real")] if "real" in fleets else None
width = max(len(r) for r in runs) + 4
print(f"{'the server saw':<40}" + "".join(f"{r:>{max(width, 12)}}" for r in runs)
      + "".join(f"{r + '/' + ref:>{max(width, 12)}}" for r in runs if ref and r != ref))
for label, key, div, kind in rows:
    vals = [delta(r, key, kind) / div for r in runs]
    line = f"{label:<40}" + "".join(f"{v:>{max(width, 12)}.2f}" for v in vals)
    if ref:
        base = vals[runs.index(ref)]
        for r, v in zip(runs, vals):
            if r != ref:
                line += f"{(v / base) if base else float('nan'):>{max(width, 12)}.2f}"
    print(line)
# Each run's rates in the form of the embedded-backend guard's baseline
# (crates/consul/tests/steady.rs: testdata/fidelity/).
def calls_by_method(path):
    out = {}
    for line in open(path):
        m = re.match(r'consul_rpc_server_call_count\{(.*)\} (\S+)$', line)
        if m:
            method = re.search(r'method="([^"]+)"', m.group(1))
            if method:
                out[method.group(1)] = out.get(method.group(1), 0.0) + float(m.group(2))
    return out
for r in runs:
    a, b = calls_by_method(f"{d}/{r}-start.prom"), calls_by_method(f"{d}/{r}-end.prom")
    minutes = window / 60
    n = float(sys.argv[5])
    w = lambda k: delta(r, k, "window")
    rates = {
        "agents": int(n),
        "per_agent_minute": {
            **{m: (b.get(m, 0) - a.get(m, 0)) / n / minutes
               for m in ("Coordinate.Update", "Catalog.NodeServiceList", "Health.NodeChecks")
               if b},
            "gossip_udp_bytes_in": w("consul_memberlist_udp_received") / n / minutes,
            "gossip_udp_bytes_out": w("consul_memberlist_udp_sent") / n / minutes,
        },
        "per_minute": {
            "member_push_pulls": w("consul_memberlist_tcp_accept") / minutes,
            "member_events": sum(w(k) for k in ("consul_serf_member_join", "consul_serf_member_failed",
                                               "consul_serf_member_left", "consul_memberlist_msg_suspect")) / minutes,
        },
        "held_per_agent": {
            "streams": snaps[r]["end"].get("consul_grpc_server_streams", 0.0) / n,
            "rpc_connections": snaps[r]["end"].get("rpc_conns_held", 0.0) / n,
        },
    }
    json.dump(rates, open(f"{d}/{r}-rates.json", "w"), indent=1)
print()
for r in runs:
    win = json.load(open(f"{d}/{r}-members-window.json"))
    after = json.load(open(f"{d}/{r}-members-after.json"))
    lines = open(f"{d}/server-{r}.log", errors="replace").read().splitlines()
    s0, s1 = int(snaps[r]["start"]["log_lines"]), int(snaps[r]["end"]["log_lines"])
    failed = [l for l in lines if "EventMemberFailed" in l]
    failed_win = [l for l in lines[s0:s1] if "EventMemberFailed" in l]
    ml = [re.sub(r"^\S+ ", "", l) for l in lines
          if re.search(r"\[(WARN|ERROR)\].*memberlist", l)]
    print(f"{r}: members at the window's end {win}; after the fleet stopped {after}")
    print(f"{r}: EventMemberFailed in the window {len(failed_win)}, in the whole run {len(failed)}")
    for l in failed[:5]:
        print("   ", l[:160])
    kinds = {}
    for l in ml:
        k = re.sub(r"[0-9a-f.:]{6,}|real-\d+|\S+-\d+", "#", l)[:140]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"{r}: memberlist WARN/ERROR lines {len(ml)}")
    full = sum("handler queue full" in l for l in lines)
    pending = sum("Too many pending push/pull requests" in l for l in lines)
    print(f"{r}: queue overflow lines {full + pending} ({full} handler queue full, "
          f"{pending} too many pending push/pulls)")
    for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:6]:
        print(f"    {n} x {k}")
PY
