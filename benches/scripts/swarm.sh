#!/usr/bin/env bash
# A fleet on Docker Swarm on this box (issue 31): SHARDS shards of one
# AGENTS-agent Sensu fleet as one Swarm service (configs/swarm/agent-sim.yaml:
# host network, the shard index from the task slot) against `agent-sim serve
# --reuse-port` processes on the host. The shards' summaries and hlogs land in
# a bind mount; the merge step (configs/swarm/agent-sim-merge.yaml) runs as a
# Swarm task too and its table is printed; the fleet's page is written; then
# every merged count is checked to be the sum of the shards'.
#
#   bash benches/scripts/swarm.sh [SHARDS] [AGENTS] [SECONDS]     # default 3 30000 60
#
# Needs a dockerd (Debian: apt-get install docker.io; in a container with no
# init system, start it by hand: dockerd &). A host in no swarm gets
# a one-node swarm (docker swarm init --advertise-addr 127.0.0.1) that is left
# at the end; a manager's swarm is used and kept. The image is built here with
# no registry (scripts/image.sh). AGENT_SIM_BIN=PATH runs that binary instead
# of building the release; OUT is where results go (target/bench-swarm);
# RAMP is each shard's (500/s). Exit: the merge's (0: every agent connected,
# no error), 1 when something could not run.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARDS=${1:-3}
AGENTS=${2:-30000}
SECONDS_RUN=${3:-60}
PORT=${PORT:-18481}
STACK=${STACK:-agent-sim}
IMAGE=${AGENT_SIM_IMAGE:-agent-sim:swarm}
mkdir -p "${OUT:-target/bench-swarm}"
OUT=$(cd "${OUT:-target/bench-swarm}" && pwd)
say() { echo "swarm.sh: $*" >&2; }

if ! timeout 20 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; then
    say "no dockerd answers (docker info): install and start one (Debian: apt-get install docker.io; no init system: dockerd &)"
    exit 1
fi
if docker stack ls --format '{{.Name}}' 2>/dev/null | grep -qx -e "$STACK" -e "$STACK-merge"; then
    say "this swarm already has a stack $STACK: set STACK to another name"
    exit 1
fi

# --- the swarm, left as found --------------------------------------------
STARTED_SWARM=""
SERVES=()
cleanup() {
    set +e
    docker stack rm "$STACK" "$STACK-merge" >/dev/null 2>&1
    for _ in $(seq 60); do
        [ -z "$(docker ps -q --filter "label=com.docker.stack.namespace=$STACK" \
            --filter "label=com.docker.stack.namespace=$STACK-merge")" ] && break
        sleep 0.5
    done
    for p in "${SERVES[@]}"; do kill -INT "$p" 2>/dev/null; done
    for p in "${SERVES[@]}"; do wait "$p" 2>/dev/null; done
    if [ -n "$STARTED_SWARM" ]; then
        docker swarm leave --force >/dev/null && say "left the one-node swarm it started"
    fi
}
trap cleanup EXIT
case "$(docker info --format '{{.Swarm.LocalNodeState}}')" in
    inactive)
        docker swarm init --advertise-addr 127.0.0.1 >/dev/null
        STARTED_SWARM=1
        say "started a one-node swarm (docker swarm init --advertise-addr 127.0.0.1)"
        ;;
    active)
        if [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" != true ]; then
            say "this host is a swarm worker: run on a manager"
            exit 1
        fi
        say "using this host's swarm (kept as it is)"
        ;;
    *)
        say "swarm state $(docker info --format '{{.Swarm.LocalNodeState}}'): wait for it to settle"
        exit 1
        ;;
esac

# --- binary and image ----------------------------------------------------
if [ -z "${AGENT_SIM_BIN:-}" ]; then
    nice cargo build --release --locked -p agent-sim
fi
BIN=$(realpath "${AGENT_SIM_BIN:-target/release/agent-sim}")
AGENT_SIM_BIN=$BIN bash scripts/image.sh "$IMAGE"
IMAGE_BYTES=$(docker image inspect -f '{{.Size}}' "$IMAGE")

# --- the backend: serve processes sharing one port ------------------------
# Each holds its share of the sessions under the open-files limit (about
# 10,000 a process, the kernel spreading connections over them).
NSERVE=$(((AGENTS + 9999) / 10000))
[ "$NSERVE" -ge 2 ] || NSERVE=2
for i in $(seq "$NSERVE"); do
    "$BIN" serve --sensu "127.0.0.1:$PORT" --reuse-port --check-interval 10s --stats-every 0 \
        >"$OUT/serve-$i.log" 2>&1 &
    SERVES+=($!)
done
for _ in $(seq 100); do
    [ "$(ss -Hltn "sport = :$PORT" | wc -l)" -ge "$NSERVE" ] && break
    sleep 0.1
done
[ "$(ss -Hltn "sport = :$PORT" | wc -l)" -ge "$NSERVE" ] || {
    say "the serve processes do not listen on 127.0.0.1:$PORT: $(cat "$OUT"/serve-*.log)"
    exit 1
}

# --- the shards ----------------------------------------------------------
export RESULTS="$OUT/results"
rm -rf "$RESULTS" 2>/dev/null || {
    say "cannot remove $RESULTS (a run before wrote it as the image's user, 65532): remove it as root, or set OUT"
    exit 1
}
mkdir -p "$RESULTS"
chmod 0777 "$RESULTS" # the image's user (65532) writes here
export AGENT_SIM_IMAGE=$IMAGE AGENTS SHARDS TARGET="127.0.0.1:$PORT" DURATION="${SECONDS_RUN}s"
export RAMP=${RAMP:-500/s} KEEPALIVE_INTERVAL=${KEEPALIVE_INTERVAL:-20s} SHARDS_PER_NODE=$SHARDS

# Waits until service $1 has $2 tasks, all ended; gives up after $3 s.
wait_tasks() {
    local svc=$1 n=$2 limit=$3 start=$SECONDS states last=0
    while :; do
        states=$(docker service ps "$svc" --format '{{.CurrentState}}' 2>/dev/null | awk '{print $1}')
        ended=$(grep -c -E '^(Complete|Failed|Rejected|Shutdown|Orphaned)$' <<<"$states" || true)
        [ "$ended" -ge "$n" ] && return 0
        if ((SECONDS - start >= last + 15)); then
            last=$((SECONDS - start))
            say "$svc at ${last}s: $(tr '\n' ' ' <<<"$states")"
        fi
        if ((SECONDS - start > limit)); then
            say "$svc: not ended after ${limit}s"
            return 1
        fi
        sleep 0.5
    done
}

T0=$(date +%s.%N)
docker stack deploy --resolve-image never -c configs/swarm/agent-sim.yaml "$STACK" >"$OUT/deploy.log" 2>&1
wait_tasks "${STACK}_shard" "$SHARDS" $((SECONDS_RUN + 300)) || true
T1=$(date +%s.%N)
docker service ps "${STACK}_shard" --no-trunc --format '{{.Name}} {{.CurrentState}} {{.Error}}' >"$OUT/tasks.txt"
docker service logs --raw "${STACK}_shard" >"$OUT/shards.log" 2>&1 || true
say "shard tasks:"
sed 's/^/    /' "$OUT/tasks.txt" >&2

# --- the merge, as a Swarm task --------------------------------------------
docker stack deploy --resolve-image never -c configs/swarm/agent-sim-merge.yaml "$STACK-merge" \
    >>"$OUT/deploy.log" 2>&1
wait_tasks "$STACK-merge_merge" 1 180 || true
T2=$(date +%s.%N)
MERGE_STATE=$(docker service ps "$STACK-merge_merge" --no-trunc --format '{{.CurrentState}} {{.Error}}' | head -1)
docker service logs --raw "$STACK-merge_merge" >"$OUT/merged.txt" 2>&1 || true
cat "$OUT/merged.txt"
case "$MERGE_STATE" in
    Complete*) CODE=0 ;;
    *'non-zero exit ('*) CODE=$(sed 's/.*non-zero exit (\([0-9]*\)).*/\1/' <<<"$MERGE_STATE") ;;
    *) CODE=1 ;;
esac

# The serve processes print their counters when they stop.
for p in "${SERVES[@]}"; do kill -INT "$p" 2>/dev/null || true; done
for p in "${SERVES[@]}"; do wait "$p" 2>/dev/null || true; done
SERVES=()

"$BIN" report html --out "$OUT/fleet.html" "$RESULTS"/summary-*.json "$RESULTS"/run-*.hlog >&2 || CODE=1
echo "--- serve processes (the kernel spread the connections over them):"
for i in $(seq "$NSERVE"); do
    echo "serve-$i: $(grep -o '"upgrades_accepted":[0-9]*' "$OUT/serve-$i.log" | tail -1)"
done
python3 - "$RESULTS" <<'PY' || CODE=1
import glob, json, sys
d = sys.argv[1]
parts = [json.load(open(p)) for p in sorted(glob.glob(f"{d}/summary-*.json"))]
m = json.load(open(f"{d}/merged.json"))
for k in ("requested", "connected", "never_connected"):
    assert m["agents"][k] == sum(p["agents"][k] for p in parts), k
for k, v in m["counters"].items():
    if k != "errors":
        assert v == sum(p["counters"].get(k, 0) for p in parts), k
for k, l in m["latency_us"].items():
    assert l["count"] == sum(p["latency_us"][k]["count"] for p in parts), k
print(f"merged: {len(parts)} shards, requested {m['agents']['requested']}, connected "
      f"{m['agents']['connected']} = {' + '.join(str(p['agents']['connected']) for p in parts)}; "
      f"keepalives_sent {m['counters'].get('keepalives_sent', 0)}; every counter and histogram "
      f"count is the sum of the shards'")
for p in parts:
    print(f"  {p.get('shard')} from {p.get('shard_from')}: {p['agents']['connected']} connected")
PY
awk -v a="$T0" -v b="$T1" -v c="$T2" -v img="$IMAGE_BYTES" -v name="$IMAGE" 'BEGIN {
    printf "wall: %.1f s from deploy to the last shard ended, %.1f s with the merge task; image %s %.1f MB\n",
        b - a, c - a, name, img / 1e6 }'
echo "results: $OUT (results/, fleet.html, tasks.txt, shards.log, merged.txt)"
exit "$CODE"
