#!/usr/bin/env bash
# What one wakeup costs a process on this box, with its core otherwise idle and
# with other tasks keeping the cores awake (BENCHMARKS.md, "Steady state: a
# fresh server per fleet, both orders, the same box for both"). A process pinned to core 0 sleeps 1.2 ms and does
# a few microseconds of work, ROUNDS times; its CPU time per wakeup is printed
# for three backgrounds, REPEAT times each: none; T threads waking every 10 ms
# pinned to core 1 (the other core); the same threads unpinned (sharing core 0).
#
#   bash benches/scripts/wake-cost.sh [ROUNDS] [REPEAT] [T]
#
# A server that sleeps between small requests (a Consul server in steady state
# switches ~780 times a second) pays each wakeup's idle exit when nothing else
# keeps its core busy; 100 real client agents on the same box keep it busy with
# their own timers, agent-sim's one process hardly does.
set -euo pipefail
ROUNDS=${1:-3000}
REPEAT=${2:-3}
T=${3:-20}

wake() {
  python3 - "$ROUNDS" <<'PY'
import os, sys, time
os.sched_setaffinity(0, {0})
n = int(sys.argv[1])
t0 = time.process_time()
for _ in range(n):
    time.sleep(0.0012)
    x = 0
    for i in range(300):
        x += i
print(f"{(time.process_time() - t0) / n * 1e6:.1f}")
PY
}

# T threads waking every 10 ms (on core $1 when given), for $2 seconds.
background() {
  python3 - "$T" "$2" "${1:-}" <<'PY' &
import os, sys, threading, time
threads, secs, core = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if core:
    os.sched_setaffinity(0, {int(core)})
def tick():
    while True:
        time.sleep(0.01)
        x = 0
        for i in range(200):
            x += i
for _ in range(threads):
    threading.Thread(target=tick, daemon=True).start()
time.sleep(secs)
PY
  bg=$!
  sleep 0.5
}

secs=$(python3 -c "print($ROUNDS * 0.0016 + 3)")
printf '%-34s %s\n' "background" "CPU per wakeup on core 0 (µs), each run"
for _ in $(seq "$REPEAT"); do
  none=$(wake)
  background 1 "$secs"; other=$(wake); wait "$bg"
  background "" "$secs"; shared=$(wake); wait "$bg"
  rows+=("$none $other $shared")
done
for label in "none (core 0 idle between wakeups)" "$T threads on core 1" "$T threads unpinned (on core 0 too)"; do
  i=$(( ${i:-0} + 1 ))
  printf '%-34s' "$label"
  for r in "${rows[@]}"; do printf ' %6s' "$(echo "$r" | cut -d' ' -f"$i")"; done
  echo
done
