#!/usr/bin/env bash
# The churn soak of BENCHMARKS.md: N agents (default 10,000 Sensu; KIND=consul
# for Consul) against `agent-sim serve` in another process with --churn
# (default 5%/30s) for SECONDS (default 600). Samples the RSS of agent-sim
# and its live session count (/metrics) every 10 s into $OUT/rss.csv, and
# reports the first sample after the ramp against the last, and the part
# after every agent has reconnected at least once (churn takes agents in
# turn; the allocator keeps part of the first generation's freed memory).
#
#   bash benches/scripts/soak-churn.sh [AGENTS] [SECONDS] [CHURN]
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-10000}
SECONDS_RUN=${2:-600}
CHURN=${3:-5%/30s}
KIND=${KIND:-sensu}
RAMP=${RAMP:-1000/s}
EVERY=${EVERY:-10}
SENSU_PORT=${SENSU_PORT:-18081}
RPC=${RPC:-18300}
HTTP=${HTTP:-18500}
METRICS=${METRICS:-127.0.0.1:19090}
OUT=${OUT:-target/bench-soak-churn}
mkdir -p "$OUT"
cargo build --release -p agent-sim ${FEATURES:+--features "$FEATURES"} 2>/dev/null   # FEATURES=jemalloc: see BENCHMARKS.md
BIN=target/release/agent-sim

"$BIN" serve --sensu 127.0.0.1:$SENSU_PORT --consul-rpc 127.0.0.1:$RPC \
  --consul-http 127.0.0.1:$HTTP --stats-every 0 2>"$OUT/serve.log" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
sleep 1

if [ "$KIND" = sensu ]; then
  target=(--target 127.0.0.1:$SENSU_PORT --keepalive-interval 20s)
else
  target=(--kind consul --target 127.0.0.1:$RPC --http-target 127.0.0.1:$HTTP
          --upstreams web --session-ttl 30s --probe off)
fi
"$BIN" --agents "$AGENTS" "${target[@]}" --ramp "$RAMP" --churn "$CHURN" \
  --duration "${SECONDS_RUN}s" --metrics-addr "$METRICS" --summary "$OUT/summary.json" \
  ${SIM_ARGS:-} --progress-every 30s >"$OUT/table.txt" 2>"$OUT/progress.log" &
SIM=$!

echo "t_s,rss_kib,sessions" >"$OUT/rss.csv"
start=$(date +%s)
while kill -0 $SIM 2>/dev/null; do
  rss=$(awk '/VmRSS/{print $2}' /proc/$SIM/status 2>/dev/null || true)
  [ -n "$rss" ] || break
  sessions=$(python3 -c "
import urllib.request
try:
    t = urllib.request.urlopen('http://$METRICS/metrics', timeout=2).read().decode()
    print(next(l.split()[1] for l in t.splitlines() if l.startswith('agent_sim_sessions ')))
except Exception:
    print('')
")
  echo "$(( $(date +%s) - start )),$rss,$sessions" >>"$OUT/rss.csv"
  sleep "$EVERY"
done
wait $SIM || true

python3 - "$OUT/rss.csv" "$OUT/summary.json" "$AGENTS" "$RAMP" "$CHURN" <<'PY'
import csv, json, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["rss_kib"]]
s = json.load(open(sys.argv[2]))
agents, ramp = int(sys.argv[3]), float(sys.argv[4].split("/")[0])
ramp_s = agents / ramp + 10
steady = [r for r in rows if int(r["t_s"]) >= ramp_s] or rows
first, last = steady[0], steady[-1]
f, l = int(first["rss_kib"]), int(last["rss_kib"])
print(f"agents {s['agents']['requested']} connected at the end {s['agents']['connected']} exit {s['outcome']['exit_code']}")
print(f"churned sessions {s['sessions_lost'].get('scenario_churn', 0)} errors { {k: v['count'] for k, v in s['errors'].items()} }")
print(f"RSS first after the ramp (t={first['t_s']}s) {f/1024:.1f} MiB, last (t={last['t_s']}s) {l/1024:.1f} MiB: "
      f"{(l - f)/1024:+.1f} MiB ({(l - f)/f*100:+.1f} %)")
print(f"RSS min/max over the steady part {min(int(r['rss_kib']) for r in steady)/1024:.1f} / "
      f"{max(int(r['rss_kib']) for r in steady)/1024:.1f} MiB; samples in {sys.argv[1]}")
# Churn picks agents in turn, so by (100 % / share) periods every agent has
# reconnected at least once; the allocator keeps some of the first
# generation's freed memory, so the flatness that counts is after that point.
share, period = sys.argv[5].split("/")
share = float(share.rstrip("%")) / 100
period_s = float(period.rstrip("smh")) * {"s": 1, "m": 60, "h": 3600}[period[-1]]
cycled = ramp_s + period_s / share
after = [r for r in steady if int(r["t_s"]) >= cycled]
if len(after) >= 2:
    a, b = int(after[0]["rss_kib"]), int(after[-1]["rss_kib"])
    print(f"RSS once every agent reconnected at least once (t={after[0]['t_s']}s) {a/1024:.1f} MiB, "
          f"last {b/1024:.1f} MiB: {(b - a)/1024:+.1f} MiB ({(b - a)/a*100:+.1f} %)")
else:
    print(f"the run ended before every agent had reconnected once (t={cycled:.0f}s): "
          f"run longer or churn more to see the flat part")
sess = [int(float(r["sessions"])) for r in steady if r["sessions"]]
if sess:
    print(f"live sessions over the steady part: min {min(sess)} max {max(sess)} of {agents}")
for d in s.get("disruptions", []):
    l = d["reconnect_us"]
    print(f"{d['cause']}: lost {d['sessions_lost']} back {d['back']} reconnect p50 {l['p50']/1e3:.0f}ms p99 {l['p99']/1e3:.0f}ms max {l['max']/1e3:.0f}ms")
PY
