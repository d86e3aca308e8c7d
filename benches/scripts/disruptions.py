"""Prints a run's outcome and each disruption of its summary (when 50/90/99/100 %
of the lost sessions were back, the per-agent reconnect times, the attempts):
what the reconvergence scripts print after each run.

    python3 benches/scripts/disruptions.py SUMMARY.json
"""
import json
import sys


def secs(v):
    return "never" if v is None else f"{v:.2f}s"


def main(path):
    s = json.load(open(path))
    a = s["agents"]
    print(f"  agents {a['requested']} connected at the end {a['connected']} exit {s['outcome']['exit_code']}"
          f"  reconnect_attempts {s['counters'].get('reconnect_attempts')}"
          f"  errors { {k: v['count'] for k, v in s['errors'].items()} }")
    for d in s.get("disruptions", []):
        b, l = d["back_after_s"], d["reconnect_us"]
        print(f"  #{d['id']} {d['cause']} ({d['fleet']}) at {d['began_s']:.1f}s: lost {d['sessions_lost']}, "
              f"back {d['back']}, attempts {d['attempts']}, missing {sum(d['missing_at_end'].values())} "
              f"{d['missing_at_end'] or ''}")
        print(f"     back after: 50% {secs(b['p50'])}  90% {secs(b['p90'])}  99% {secs(b['p99'])}  100% {secs(b['p100'])}")
        print(f"     reconnect per agent: min {l['min']/1e3:.0f}ms p50 {l['p50']/1e3:.0f}ms p90 {l['p90']/1e3:.0f}ms "
              f"p99 {l['p99']/1e3:.0f}ms max {l['max']/1e3:.0f}ms")
        if d["snapshots"] + d["resumes"] + d["resumes_silent"]:
            print(f"     resynced: snapshots {d['snapshots']} resumes {d['resumes']} silent {d['resumes_silent']}")
    p = s["process"]
    print(f"  peak RSS {p['peak_rss_bytes']/2**20:.1f} MiB, cpu {p['cpu_user_s'] + p['cpu_sys_s']:.1f}s")


if __name__ == "__main__":
    main(sys.argv[1])
