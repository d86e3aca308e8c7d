#!/usr/bin/env bash
# The RPCs by method a real Consul 1.20.1 server with ACLs on (default deny)
# receives from N real client agents, each with its own node-identity and
# service-identity token (`acl.tokens.agent` and `default`), then from N
# agent-sim agents with `--acl-tokens node-identity`, over the same window
# (WIN seconds, 30 s after all registered). The server's
# consul_rpc_server_call_count by method (telemetry prefix_filter).
#
#   CONSUL_BIN=/path/to/consul N=5 WIN=120 bash benches/scripts/acl-rpc-mix.sh
#
# CONSUL_BIN is a Consul 1.20.1 binary you built (docs/real-servers.md).
# Server on 127.0.3.1 (ports 8300, 8301, 8500, 8502, 8600 free); real agents
# on 127.0.0.12 upward. OUT: where files go (default target/bench-acl-rpc-mix).
set -u
cd "$(dirname "$0")/../.."
C=${CONSUL_BIN:?set CONSUL_BIN to a consul 1.20.1 binary}; O=${OUT:-$PWD/target/bench-acl-rpc-mix}; IP=127.0.3.1; H=$IP:8500
mkdir -p "$O"
cargo build --release -p agent-sim 2>/dev/null
N=${N:-5}; WIN=${WIN:-120}
MGMT=$(python3 -c 'import uuid; print(uuid.uuid4())')
printf 'acl {\n enabled = true\n default_policy = "deny"\n tokens { initial_management = "%s" }\n}\ntelemetry {\n prometheus_retention_time = "900s"\n disable_hostname = true\n prefix_filter = ["+consul.rpc.server.call"]\n}\nlimits { rpc_max_conns_per_client = 0\n http_max_conns_per_client = 0 }\n' "$MGMT" > $O/server.hcl
api() { curl -sf -H "X-Consul-Token: $MGMT" "$@"; }
calls() { api "http://$H/v1/agent/metrics?format=prometheus" | python3 -c '
import sys, json, re
out = {}
for l in sys.stdin:
    if l.startswith("consul_rpc_server_call_count{"):
        m = re.search(r"method=\"([^\"]+)\"", l).group(1)
        out[m] = out.get(m, 0) + float(l.rsplit(" ", 1)[1])
print(json.dumps(out))'; }
for fleet in real sim; do
  rm -rf $O/srv $O/$fleet; mkdir -p $O/$fleet
  $C agent -dev -client $IP -bind $IP -config-file $O/server.hcl -data-dir $O/srv > $O/server-$fleet.log 2>&1 &
  SRV=$!
  for _ in $(seq 100); do api http://$H/v1/status/leader | grep -q 8300 && break; sleep 0.2; done
  pids=()
  if [ $fleet = real ]; then
    for i in $(seq 1 $N); do
      ip=127.0.0.$((11 + i))
      tok=$(api -X PUT http://$H/v1/acl/token -d "{\"Description\":\"real-$i\",\"NodeIdentities\":[{\"NodeName\":\"real-$i\",\"Datacenter\":\"dc1\"}],\"ServiceIdentities\":[{\"ServiceName\":\"app\"}]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["SecretID"])')
      printf 'acl {\n enabled = true\n default_policy = "deny"\n tokens { agent = "%s"\n default = "%s" }\n}\nservice { name = "app"\n port = 8080 }\n' "$tok" "$tok" > $O/real/a$i.hcl
      $C agent -data-dir $O/real/d$i -node real-$i -bind $ip -client $ip -retry-join $IP -config-file $O/real/a$i.hcl -log-level warn > $O/real/a$i.log 2>&1 &
      pids+=($!)
    done
  else
    target/release/agent-sim --kind consul --agents $N --target $IP:8300 --http-target $H --token $MGMT \
      --acl-tokens node-identity --upstreams web --probe off --session-ttl off --services-per-agent 1 --ramp all \
      --duration 600s --quiet --summary $O/sim/summary.json > $O/sim/out.txt 2>&1 &
    pids+=($!)
  fi
  for _ in $(seq 120); do
    n=$(api http://$H/v1/catalog/service/app | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null || echo 0)
    [ "$n" -ge $N ] && break; sleep 1
  done
  echo "$fleet: $n registered"
  sleep 30
  calls > $O/$fleet-start.json; sleep $WIN; calls > $O/$fleet-end.json
  kill -INT "${pids[@]}"; sleep 8; kill -TERM $SRV; sleep 3
done
python3 - $O <<'PY'
import json, sys
o = sys.argv[1]
d = {}
for f in ("real", "sim"):
    a, b = (json.load(open(f"{o}/{f}-{k}.json")) for k in ("start", "end"))
    d[f] = {m: b[m] - a.get(m, 0) for m in b}
for m in sorted(set(d["real"]) | set(d["sim"])):
    print(f"{m:<40} real {d['real'].get(m, 0):>6.0f}  sim {d['sim'].get(m, 0):>6.0f}")
PY
