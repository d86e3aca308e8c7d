#!/usr/bin/env bash
# The documented multi-process run (issue: results for pipelines): 2 shards x
# 5,000 Sensu agents against 2 `agent-sim serve --reuse-port` processes that
# share one port, merged into one 10,000-agent report. Checks that the merged
# counts equal the sum of the shards.
#
#   bash benches/scripts/sensu-shards.sh [AGENTS_TOTAL] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${1:-10000}
SECONDS_RUN=${2:-30}
PORT=${PORT:-18181}
OUT=${OUT:-target/bench-shards}
rm -rf "$OUT" && mkdir -p "$OUT"
cargo build --release -p agent-sim ${FEATURES:+--features "$FEATURES"} 2>/dev/null   # FEATURES=jemalloc: see BENCHMARKS.md
BIN=target/release/agent-sim

"$BIN" serve --sensu 127.0.0.1:$PORT --reuse-port --check-interval 10s --stats-every 0 2>"$OUT/serve-a.log" &
A=$!
"$BIN" serve --sensu 127.0.0.1:$PORT --reuse-port --check-interval 10s --stats-every 0 2>"$OUT/serve-b.log" &
B=$!
trap 'kill $A $B 2>/dev/null || true' EXIT
sleep 1

for i in 0 1; do
  "$BIN" --agents "$AGENTS" --shard "$i/2" --target 127.0.0.1:$PORT --keepalive-interval 20s \
    --ramp 1000/s --duration "${SECONDS_RUN}s" --quiet \
    --summary "$OUT/shard-$i.json" --hlog "$OUT/shard-$i.hlog" >"$OUT/shard-$i.txt" 2>&1 &
  eval "S$i=\$!"
done
wait "$S0" "$S1"
kill -INT $A $B; wait $A $B 2>/dev/null || true

"$BIN" report merge "$OUT/shard-0.json" "$OUT/shard-1.json" --summary "$OUT/merged.json" \
  --assert 'agents.connected == requested' >"$OUT/merged.txt"
cat "$OUT/merged.txt"
echo "--- serve processes (each got part of the connections):"
grep -ho '"upgrades_accepted":[0-9]*' "$OUT"/serve-*.log | tail -2
python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
a, b, m = (json.load(open(f"{d}/{n}.json")) for n in ("shard-0", "shard-1", "merged"))
for k in ("requested", "connected", "never_connected"):
    assert m["agents"][k] == a["agents"][k] + b["agents"][k], k
for k, v in m["counters"].items():
    if k != "errors":
        assert v == a["counters"].get(k, 0) + b["counters"].get(k, 0), k
for k, l in m["latency_us"].items():
    assert l["count"] == a["latency_us"][k]["count"] + b["latency_us"][k]["count"], k
print(f"merged: requested {m['agents']['requested']} connected {m['agents']['connected']} = "
      f"{a['agents']['connected']} + {b['agents']['connected']}; keepalives_sent {m['counters']['keepalives_sent']} = "
      f"{a['counters']['keepalives_sent']} + {b['counters']['keepalives_sent']}; every counter and histogram count is the sum")
PY
