#!/usr/bin/env bash
# What authentication costs a Sensu backend restart: N Sensu agents against
# `agent-sim serve` checking every connect's password with bcrypt at a real
# backend's cost (10), then the same fleet presenting client certificates
# (no password check), the backend's listener closed at RESTART_AT for DOWN
# seconds. The server pinned to core 0 and the fleet to core 1 (taskset).
# Prints per way in: when 50/90/99/100 % of the lost sessions were back,
# the serve process's CPU over the run, its bcrypt checks and their CPU.
#
#   bash benches/scripts/sensu-auth-cost.sh [AGENTS]
#
# Env: COST (bcrypt cost, default 10), RESTART_AT (default 60 s: after the
# ramp's checks), DOWN (default 5 s), RECOVER (s after the restart, default
# 120), RAMP (default 50/s), BIN (an agent-sim binary). Needs openssl (the
# test PKI is made in $OUT).
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-1000}
COST=${COST:-10}
RESTART_AT=${RESTART_AT:-60}
DOWN=${DOWN:-5}
RECOVER=${RECOVER:-120}
RAMP=${RAMP:-50/s}
PORT=${SENSU_PORT:-18083}
OUT=${OUT:-target/bench-sensu-auth}
mkdir -p "$OUT"
if [ -z "${BIN:-}" ]; then
  cargo build --release -p agent-sim 2>/dev/null
  BIN=target/release/agent-sim
fi

# A CA, the backend's certificate for 127.0.0.1 and one agent certificate.
pki() {
  local d=$OUT/pki
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca \
    -keyout "$d/ca-key.pem" -out "$d/ca.pem" 2>/dev/null
  for who in server agent; do
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$who" \
      -keyout "$d/$who-key.pem" -out "$d/$who.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\n' >"$d/$who.ext"
    openssl x509 -req -in "$d/$who.csr" -CA "$d/ca.pem" -CAkey "$d/ca-key.pem" \
      -CAcreateserial -days 2 -extfile "$d/$who.ext" -out "$d/$who.pem" 2>/dev/null
  done
}
pki
P=$OUT/pki
tls=(--sensu-tls-cert-file "$P/server.pem" --sensu-tls-key-file "$P/server-key.pem")

for way in password certificate; do
  case $way in
    password) agent=() ;;
    certificate) tls+=(--sensu-agent-ca-file "$P/ca.pem")
      agent=(--cert-file "$P/agent.pem" --key-file "$P/agent-key.pem") ;;
  esac
  taskset -c 0 "$BIN" serve --sensu 127.0.0.1:$PORT --check-interval 1h --stats-every 0 \
    --sensu-password-cost "$COST" "${tls[@]}" \
    --faults "restart@at:${RESTART_AT}s,down:${DOWN}s,state:keep" 2>"$OUT/serve-$way.log" &
  SERVE=$!
  sleep 1
  summary="$OUT/auth-$way.json"
  echo "== $AGENTS Sensu agents by $way (bcrypt cost $COST), backend down at ${RESTART_AT}s for ${DOWN}s"
  taskset -c 1 "$BIN" --agents "$AGENTS" --target "wss://127.0.0.1:$PORT/" --ca-file "$P/ca.pem" \
    "${agent[@]}" --ramp "$RAMP" --max-dialing "$AGENTS" \
    --duration "$((RESTART_AT + RECOVER))s" --summary "$summary" \
    --progress-every 10s >"$OUT/auth-$way.txt" 2>"$OUT/auth-$way.log" || true
  cpu=$(awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' /proc/$SERVE/stat)
  kill $SERVE 2>/dev/null || true
  wait $SERVE 2>/dev/null || true
  echo "serve CPU over the run: ${cpu} s"
  grep -o '"bcrypt_checks":[0-9]*\|"bcrypt_cpu_us":[0-9]*\|"upgrades_accepted_by_auth":{[^}]*}' \
    "$OUT/serve-$way.log" | tail -3 || true
  python3 benches/scripts/disruptions.py "$summary"
done
