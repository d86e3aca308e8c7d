#!/usr/bin/env bash
# What ACLs cost a real Consul server: the same agent-sim fleet of N agents
# against a fresh `-dev` server without ACLs, then with ACLs on
# (`default_policy = "deny"`) and each agent carrying its own node-identity
# token (`--acl-tokens node-identity`, created by the run with the initial
# management token and deleted at its end). The server's CPU over the same
# steady-state window, its RPC calls by kind, its ACL token resolutions, the
# calls denied, and what the run left behind (tokens, policies, nodes).
#
#   CONSUL_BIN=/path/to/consul bash benches/scripts/acl-cost.sh [N] [SECONDS] [MODES] [-- agent-sim flags]
#
# MODES: "off on" (default), or one of them. CONSUL_BIN is a Consul 1.20.1
# binary you built (docs/real-servers.md); nothing of Consul is in this
# repository. The window starts WARMUP seconds (default 45) after the last
# agent registered. PIN=1 pins the server to core 0 and agent-sim to core 1
# (taskset), so the fleet's own CPU does not slow the server. SERVER_IP: the
# server's address (default 127.0.3.1; ports 8300, 8301, 8500, 8502, 8600
# there must be free). SIM_RAMP: agent-sim's --ramp (default 100/s).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-1000}
WINDOW=${2:-120}
MODES=${3:-"off on"}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
SIM_FLAGS=("$@")
WARMUP=${WARMUP:-45}
SIM_RAMP=${SIM_RAMP:-100/s}
SERVER_IP=${SERVER_IP:-127.0.3.1}
CONSUL_BIN=${CONSUL_BIN:?set CONSUL_BIN to a consul 1.20.1 binary}
OUT=${OUT:-target/bench-acl-cost}
HTTP=$SERVER_IP:8500
MGMT=$(python3 -c 'import uuid; print(uuid.uuid4())')
rm -rf "$OUT" && mkdir -p "$OUT"
nice cargo build --release -p agent-sim 2>/dev/null
BIN=$PWD/target/release/agent-sim
SERVER_CPU=() SIM_CPU=()
if [ -n "${PIN:-}" ]; then SERVER_CPU=(taskset -c 0) SIM_CPU=(taskset -c 1); fi
printf '%s\n' 'limits { rpc_max_conns_per_client = 0  http_max_conns_per_client = 0 }' \
  'telemetry { prometheus_retention_time = "900s"  disable_hostname = true }' >"$OUT/server.hcl"
printf 'acl {\n  enabled = true\n  default_policy = "deny"\n  tokens { initial_management = "%s" }\n}\n' \
  "$MGMT" >"$OUT/acl-on.hcl"
: >"$OUT/acl-off.hcl"

server_pid=
sim_pid=
stop_pid() {
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$1" 2>/dev/null || true
}
stop_all() { stop_pid "$sim_pid"; sim_pid=; stop_pid "$server_pid"; server_pid=; }
trap stop_all EXIT

api() { curl -sf -H "X-Consul-Token: $MGMT" "$HTTP$1"; }

start_server() {
  rm -rf "$OUT/server"
  "${SERVER_CPU[@]}" "$CONSUL_BIN" agent -dev -client "$SERVER_IP" -bind "$SERVER_IP" -log-level info \
    -config-file "$OUT/server.hcl" -config-file "$OUT/acl-$1.hcl" \
    -data-dir "$OUT/server" >"$OUT/server-$1.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    api /v1/status/leader 2>/dev/null | grep -q 8300 && return 0
    sleep 0.2
  done
  echo "the dev server did not elect itself" >&2
  exit 1
}

# The server's counters (summed over labels; a summary's _count and _sum)
# and its process CPU, as JSON.
snapshot() {
  python3 - "$server_pid" "$HTTP" "$MGMT" <<'PY'
import json, os, sys, urllib.request
pid, http, token = int(sys.argv[1]), sys.argv[2], sys.argv[3]
req = urllib.request.Request(f"http://{http}/v1/agent/metrics?format=prometheus",
                             headers={"X-Consul-Token": token})
body = urllib.request.urlopen(req, timeout=10).read().decode()
out = {}
for line in body.splitlines():
    if line.startswith("#") or "quantile=" in line:
        continue
    name, _, value = line.rpartition(" ")
    base = name.split("{")[0]
    if base == "consul_rpc_request" or base.startswith("consul_rpc_server_call"):
        # by method, when labelled so
        m = name.split('method="')[1].split('"')[0] if 'method="' in name else ""
        if m:
            out[f"{base}:{m}"] = out.get(f"{base}:{m}", 0.0) + float(value)
    if base.startswith(("consul_", "process_")):
        try:
            out[base] = out.get(base, 0.0) + float(value)
        except ValueError:
            pass
ticks = os.sysconf("SC_CLK_TCK")
f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
out["cpu_s"] = (int(f[11]) + int(f[12])) / ticks
print(json.dumps(out))
PY
}

registered() {
  api /v1/catalog/service/app | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'
}

for mode in $MODES; do
  start_server "$mode"
  flags=(--kind consul --agents "$N" --target "$SERVER_IP:8300" --http-target "$HTTP"
    --ramp "$SIM_RAMP" --duration 1h --name-prefix acl --quiet --summary "$OUT/sim-$mode.json" "${SIM_FLAGS[@]}")
  if [ "$mode" = on ]; then flags+=(--token "$MGMT" --acl-tokens node-identity); fi
  "${SIM_CPU[@]}" "$BIN" "${flags[@]}" >"$OUT/sim-$mode.out" 2>"$OUT/sim-$mode.err" &
  sim_pid=$!
  t0=$SECONDS
  for _ in $(seq 600); do
    [ "$(registered 2>/dev/null || echo 0)" -ge "$N" ] && break
    kill -0 "$sim_pid" 2>/dev/null || break
    sleep 1
  done
  echo "$mode: $(registered) of $N registered after $((SECONDS - t0)) s" >&2
  sleep "$WARMUP"
  snapshot >"$OUT/$mode-start.json"
  sleep "$WINDOW"
  snapshot >"$OUT/$mode-end.json"
  kill -INT "$sim_pid" 2>/dev/null || true
  wait "$sim_pid" || echo "$mode: agent-sim exit $?" >&2
  sim_pid=
  # What the run left: tokens beyond the management and anonymous ones,
  # policies beyond global-management, nodes beyond the server (the
  # members' leave takes their nodes out; waited for up to 60 s).
  for _ in $(seq 60); do
    [ "$(api /v1/catalog/nodes | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" -le 1 ] && break
    sleep 1
  done
  api /v1/acl/tokens >"$OUT/$mode-tokens.json" || echo '[]' >"$OUT/$mode-tokens.json"
  api /v1/acl/policies >"$OUT/$mode-policies.json" || echo '[]' >"$OUT/$mode-policies.json"
  api /v1/catalog/nodes >"$OUT/$mode-nodes.json"
  python3 - "$mode" "$OUT" >"$OUT/$mode-left.json" <<'PY'
import json, sys
mode, out = sys.argv[1], sys.argv[2]
tokens, policies, nodes = (json.load(open(f"{out}/{mode}-{k}.json")) for k in ("tokens", "policies", "nodes"))
print(json.dumps({
    "tokens": len(tokens) - (2 if mode == "on" else 0),
    "policies": len(policies) - (2 if mode == "on" else 0),  # global-management, builtin/global-read-only
    "nodes": len(nodes) - 1,
}))
PY
  stop_pid "$server_pid"
  server_pid=
done

python3 - "$OUT" "$WINDOW" "$N" $MODES <<'PY'
import json, sys
out, window, n, modes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = {}
for m in modes:
    a = json.load(open(f"{out}/{m}-start.json"))
    b = json.load(open(f"{out}/{m}-end.json"))
    d = {k: b[k] - a.get(k, 0.0) for k in b}
    s = json.load(open(f"{out}/sim-{m}.json"))
    left = json.load(open(f"{out}/{m}-left.json"))
    rows[m] = {
        "server CPU s/min": d["cpu_s"] * 60 / window,
        "RPC calls/min": d.get("consul_rpc_request", 0) * 60 / window,
        "ACL token resolutions/min": d.get("consul_acl_ResolveToken_count", 0) * 60 / window,
        "ACL resolve ms (mean)": (d.get("consul_acl_ResolveToken_sum", 0)
                                  / max(d.get("consul_acl_ResolveToken_count", 0), 1)),
        "agents connected at end": s["agents"]["connected"],
        "denied": sum(s.get("denied", {}).values()),
        "errors": sum(e["count"] for e in s["errors"].values()),
        "exit": s["outcome"].get("exit_code"),
        "left: tokens/policies/nodes": f'{left["tokens"]}/{left["policies"]}/{left["nodes"]}',
    }
names = list(next(iter(rows.values())))
print(f"{'figure':<30}" + "".join(f"{'ACLs ' + m:>16}" for m in modes)
      + ("     on/off" if modes == ["off", "on"] else ""))
for k in names:
    vals = [rows[m][k] for m in modes]
    cells = "".join(f"{v:>16.2f}" if isinstance(v, float) else f"{str(v):>16}" for v in vals)
    ratio = ""
    if modes == ["off", "on"] and all(isinstance(v, float) for v in vals) and vals[0]:
        ratio = f"{vals[1] / vals[0]:>10.2f}x"
    print(f"{k:<30}{cells}{ratio}")
print(f"({n} agents, a {window:.0f} s window after every agent registered)")
PY
