# Shared functions of the Vault-on-Consul comparison (sourced by baseline.sh and ours.sh).
# Needs CONSUL_BIN (a Consul 1.20.1 binary) and, for baseline.sh, VAULT_BIN (a Vault 1.18.3 server);
# go (to build tools/ once), curl, jq, python3. Runs go under $RUNS (default /tmp/vault-fidelity).
# Everything runs on 127.0.0.215: Consul -dev HTTP :8500, Vault nodes :8200/:8210/:8220
# (cluster :8201/:8211/:8221). With PROXY=1 each Vault talks to Consul through its own
# logging proxy (bin/kvproxy on :8700/:8710/:8720; :8600 is consul DNS) so calls and bytes are attributed per node.
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUNS=${RUNS:-/tmp/vault-fidelity}
BIN=$RUNS/bin
mkdir -p "$BIN"
for t in kvproxy tokload; do
  [ -x "$BIN/$t" ] || (cd "$D/tools" && go build -o "$BIN/$t" ./$t) || exit 1
done
IP=127.0.0.215
CONSUL_BIN=${CONSUL_BIN:?set CONSUL_BIN to a Consul 1.20.1 binary}
VAULT_BIN=${VAULT_BIN:-vault}
PROXY=${PROXY:-1}
RUN=${RUN:-$RUNS/$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$RUN"
PIDS=()

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

start_consul() {
  rm -rf "$RUNS/consul-data"; mkdir -p "$RUNS/consul-data"
  "$CONSUL_BIN" agent -dev -bind $IP -client $IP -node srv215 \
    -hcl 'telemetry { prometheus_retention_time = "60s"  disable_hostname = true }' \
    -hcl 'limits { rpc_max_conns_per_client = 0  http_max_conns_per_client = 0 }' -data-dir "$RUNS/consul-data" >"$RUN/consul.log" 2>&1 &
  CONSUL_PID=$!; PIDS+=($CONSUL_PID); echo $CONSUL_PID >"$RUN/consul.pid"
  for i in $(seq 1 50); do
    [ "$(curl -s http://$IP:8500/v1/status/leader)" = "\"$IP:8300\"" ] && { log "consul up pid=$CONSUL_PID"; return 0; }
    sleep 0.3
  done
  log "consul did not come up"; return 1
}

start_vaults() {
  for i in 0 1 2; do
    local api=$((8200 + 10*i)) clu=$((8201 + 10*i)) cport=8500
    if [ "$PROXY" = 1 ]; then
      cport=$((8700 + 10*i))
      "$BIN/kvproxy" -listen $IP:$cport -target http://$IP:8500 -node v$i \
        ${PROXYLOG:+-log "$RUN/proxy-v$i.jsonl"} >"$RUN/proxy-v$i.out" 2>&1 &
      PIDS+=($!); echo $! >"$RUN/proxy-v$i.pid"
    fi
    mkdir -p "$RUN/v$i"
    cat >"$RUN/v$i/vault.hcl" <<HCL
storage "consul" {
  address = "$IP:$cport"
  path    = "vaultreal/"
}
listener "tcp" {
  address         = "$IP:$api"
  cluster_address = "$IP:$clu"
  tls_disable     = true
}
api_addr      = "http://$IP:$api"
cluster_addr  = "https://$IP:$clu"
disable_mlock = true
ui            = false
log_level     = "${VAULT_LOG_LEVEL:-info}"
HCL
    "$VAULT_BIN" server -config "$RUN/v$i/vault.hcl" >"$RUN/v$i/vault.log" 2>&1 &
    PIDS+=($!); echo $! >"$RUN/v$i/pid"
  done
  for i in 0 1 2; do
    local api=$((8200 + 10*i))
    for t in $(seq 1 400); do
      curl -s -o /dev/null http://$IP:$api/v1/sys/seal-status && break; sleep 0.3
    done
  done
  log "vault servers listening"
}

init_unseal() {
  export VAULT_ADDR=http://$IP:8200
  "$VAULT_BIN" operator init -key-shares=1 -key-threshold=1 -format=json >"$RUN/init.json"
  UNSEAL_KEY=$(jq -r '.unseal_keys_b64[0]' "$RUN/init.json")
  ROOT_TOKEN=$(jq -r '.root_token' "$RUN/init.json")
  export VAULT_TOKEN=$ROOT_TOKEN
  for i in 0 1 2; do
    VAULT_ADDR=http://$IP:$((8200 + 10*i)) "$VAULT_BIN" operator unseal "$UNSEAL_KEY" >/dev/null
    # node 0 first so it becomes active
    [ $i = 0 ] && wait_active 8200
  done
  sleep 2
  log "unsealed; active=$(active_port)"
}

# print port of the active node
active_port() {
  for i in 0 1 2; do
    local p=$((8200 + 10*i))
    [ "$(curl -s http://$IP:$p/v1/sys/leader | jq -r .is_self 2>/dev/null)" = true ] && { echo $p; return; }
  done
  echo none
}

wait_active() {
  for t in $(seq 1 200); do
    [ "$(curl -s http://$IP:$1/v1/sys/leader | jq -r .is_self 2>/dev/null)" = true ] && return 0; sleep 0.2
  done
  return 1
}

consul_metrics() { curl -s "http://$IP:8500/v1/agent/metrics?format=prometheus" >"$1"; cat /proc/$CONSUL_PID/io >"$1.io" 2>/dev/null; date +%s.%N >"$1.ts"; }

proxy_counts() {  # SIGUSR1 makes each proxy print its byte counters
  [ "$PROXY" = 1 ] || return 0
  for i in 0 1 2; do kill -USR1 "$(cat "$RUN/proxy-v$i.pid")" 2>/dev/null; done; sleep 0.3
}

stop_all() {
  log "stopping pids ${PIDS[*]}"
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do
    for t in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$p" 2>/dev/null
  done
  PIDS=()
}
