#!/usr/bin/env python3
"""Summarise one measurement window of the Vault-on-Consul baseline.

usage: analyze.py RUN NAME
  RUN/m-NAME-before(.io,.ts), RUN/m-NAME-after(...): Consul /v1/agent/metrics?format=prometheus
  RUN/s-NAME-*: samples taken during the window (for summary quantiles, which cover ~10 s each)
  RUN/off-NAME-before / -after: line offsets of proxy logs (optional)
  RUN/tokload.err: tokload ticks (optional) for tokens created in the window
"""
import glob, json, os, re, sys, statistics
from collections import Counter, defaultdict

run, name = sys.argv[1], sys.argv[2]

def parse(path):
    out = {}
    for line in open(path):
        if not line or line[0] == '#':
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)', line)
        if not m:
            continue
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or '')))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            pass
    return out

def readts(p):
    return float(open(p).read().strip())

def io(p):
    d = {}
    try:
        for l in open(p):
            k, v = l.split(':'); d[k.strip()] = int(v)
    except OSError:
        pass
    return d

b = parse(f'{run}/m-{name}-before'); a = parse(f'{run}/m-{name}-after')
t0 = readts(f'{run}/m-{name}-before.ts'); t1 = readts(f'{run}/m-{name}-after.ts')
secs = t1 - t0; pm = 60.0 / secs

def delta(key):
    va = a.get(key, 0.0); vb = b.get(key, 0.0)
    d = va - vb
    if d < 0:  # metric expired (prometheus_retention_time) and restarted from zero
        d = va
    return d

def lbl(labels):
    return ','.join(f'{k}={v}' for k, v in labels if k != 'quantile')

# tokens created in the window, from tokload ticks
tokens = None
tp = f'{run}/tokload.err'
if os.path.exists(tp):
    ticks = [(float(m.group(1)), int(m.group(2))) for m in
             (re.match(r'tick (\S+) ok=(\d+)', l) for l in open(tp)) if m]
    def at(t):
        best = 0
        for ts, n in ticks:
            if ts <= t: best = n
        return best
    if ticks:
        tokens = at(t1) - at(t0)
        if name == 'drain':
            ttl = float(os.environ.get('TTL', '60'))
            last = max(ts for ts, _ in ticks)
            tokens = at(last) - at(last - ttl)
            print(f'(drain: per-token figures use the {tokens} tokens created in the last {ttl:.0f} s of load, which expire in this window)')

print(f'== window {name}: {secs:.1f} s; figures are per minute (x{pm:.3f}) unless noted')
if tokens is not None:
    print(f'tokens created in window (tokload ok): {tokens}  ({tokens/secs:.1f}/s)')
cpu = delta(('process_cpu_seconds_total', ()))
print(f'consul process CPU: {cpu:.2f} s in window = {cpu*pm:.2f} s/min ({100*cpu/secs:.1f}% of one core)')
ib, ia = io(f'{run}/m-{name}-before.io'), io(f'{run}/m-{name}-after.io')
if ib and ia:
    print(f'consul /proc io: rchar {(ia["rchar"]-ib["rchar"])*pm/1e6:.2f} MB/min, wchar {(ia["wchar"]-ib["wchar"])*pm/1e6:.2f} MB/min (all sockets+files; -dev has no raft disk)')

cb, ca = f'{run}/cpu-{name}-before', f'{run}/cpu-{name}-after'
if os.path.exists(cb) and os.path.exists(ca):
    def rd(p):
        return {l.split()[0]: float(l.split()[1]) for l in open(p) if len(l.split()) == 2}
    xb, xa = rd(cb), rd(ca)
    hz = os.sysconf('SC_CLK_TCK')
    parts = [f'{k} {(xa[k]-xb[k])/hz*pm:.2f}' for k in xa if k in xb and k != 'loadavg']
    print('process CPU s/min (from /proc/PID/stat): ' + ', '.join(parts) + f'; box loadavg {xb.get("loadavg",0):.1f} -> {xa.get("loadavg",0):.1f} (2 cores)')
want = re.compile(r'^consul_(kvs_apply|txn_apply|txn_read|fsm_kvs|fsm_txn|fsm_session|fsm_register|fsm_deregister|fsm_tombstone|session_apply|session_renew|raft_fsm_apply|raft_apply|raft_commitTime|raft_commitNumLogs|rpc_request|rpc_request_error|rpc_query|rpc_queries_blocking|api_http|kvs_get|txn_get|catalog_register|catalog_deregister|leader_reapTombstones|session_ttl_invalidate|session_ttl_active)')
rows = []
for key in sorted(set(a) | set(b)):
    n, labels = key
    if any(k == 'quantile' for k, _ in labels):
        continue
    if not want.match(n):
        continue
    if n.endswith('_sum'):
        continue
    d = delta(key)
    if d == 0:
        continue
    rows.append((n, lbl(labels), d))
print(f'{"metric":45s} {"labels":45s} {"in window":>10s} {"per min":>10s}' + (f' {"per token":>9s}' if tokens else ''))
for n, l, d in rows:
    extra = f' {d/tokens:9.3f}' if tokens else ''
    print(f'{n:45s} {l[:45]:45s} {d:10.0f} {d*pm:10.1f}{extra}')

# mean and quantiles of commit time / fsm apply (ms)
for base in ('consul_raft_commitTime', 'consul_raft_fsm_apply', 'consul_kvs_apply', 'consul_txn_apply'):
    dc = delta((base + '_count', ())); ds = delta((base + '_sum', ()))
    q = defaultdict(list)
    for f in sorted(glob.glob(f'{run}/s-{name}-*')):
        if f.endswith('.io') or f.endswith('.ts'):
            continue
        s = parse(f)
        for qq in ('0.5', '0.99'):
            v = s.get((base, (('quantile', qq),)))
            if v is not None and v == v:
                q[qq].append(v)
    mean = ds / dc if dc else float('nan')
    qs = ''
    if q['0.5']:
        qs = (f' p50 median-of-samples {statistics.median(q["0.5"]):.2f} (range {min(q["0.5"]):.2f}-{max(q["0.5"]):.2f});'
              f' p99 median {statistics.median(q["0.99"]):.2f} max {max(q["0.99"]):.2f} [{len(q["0.5"])} samples]')
    print(f'{base} ms: mean {mean:.3f} over {dc:.0f};{qs}')

# proxy logs
offb, offa = f'{run}/off-{name}-before', f'{run}/off-{name}-after'
if os.path.exists(offb) and os.path.exists(offa):
    ob = dict(l.split() for l in open(offb)); oa = dict(l.split() for l in open(offa))
    def norm(k):
        parts = k.split('/')
        return '/'.join('*' if (len(p) >= 16 and (re.search(r'[0-9]', p) or re.fullmatch(r'[A-Za-z]{24}', p))) else p for p in parts)
    tot = Counter()
    for node in sorted(ob):
        lines = open(f'{run}/proxy-{node}.jsonl').read().splitlines()[int(ob[node]):int(oa[node])]
        calls = Counter(); ops = Counter(); byt = Counter()
        for l in lines:
            r = json.loads(l)
            qk = ','.join(sorted(set(x.split('=')[0] for x in r.get('q', '').split('&') if x)))
            p = r['p']
            if p.startswith('/v1/kv/'):
                p = '/v1/kv/' + norm(p[7:])
            elif p.startswith('/v1/session/renew/') or p.startswith('/v1/session/info/'):
                p = '/'.join(p.split('/')[:4]) + '/<id>'
            elif p.startswith('/v1/agent/check/'):
                p = '/'.join(p.split('/')[:5]) + '/<check>'
            calls[(r['m'], p, qk)] += 1
            byt['req'] += r['req']; byt['resp'] += r['resp']
            for o in r.get('ops') or []:
                f = o.split(' ')
                ops[(f[0], norm(f[1]) if len(f) > 1 else '')] += 1
            if r['m'] == 'GET' and p.startswith('/v1/kv/'):
                tot['list' if 'keys' in qk else 'get'] += 1
            for o in r.get('ops') or []:
                v = o.split(' ')[0]
                tot[{'set': 'put', 'delete': 'delete', 'check-session': 'check-session', 'get-or-empty': 'txn-get'}.get(v, v)] += 1
            if p == '/v1/txn': tot['txn-requests'] += 1
        print(f'-- proxy {node}: {len(lines)} requests in window ({len(lines)*pm:.1f}/min), body bytes req {byt["req"]*pm/1e3:.1f} kB/min resp {byt["resp"]*pm/1e3:.1f} kB/min')
        for (m, p, qk), c in calls.most_common():
            print(f'   {c:7d} {c*pm:9.1f}/min  {m:6s} {p} {"?"+qk if qk else ""}')
        for (v, k), c in ops.most_common():
            print(f'   txn-op {c:7d} {c*pm:9.1f}/min  {v} {k}')
    if tokens:
        print('per token created (all nodes, from proxy logs): ' +
              ', '.join(f'{k} {v/tokens:.2f}' for k, v in sorted(tot.items())))
    else:
        print('storage ops in window (all nodes): ' + ', '.join(f'{k} {v}' for k, v in sorted(tot.items())))
# proxy byte counters (raw TCP incl. headers)
pb = defaultdict(dict)
for tag in ('before', 'after'):
    p = f'{run}/bytes-{name}-{tag}'
    if os.path.exists(p):
        for l in open(p):
            m = re.search(r'node=(\S+) requests=(\d+) bytes_from_vault=(\d+) bytes_to_vault=(\d+)', l)
            if m:
                pb[m.group(1)][tag] = tuple(map(int, m.group(2, 3, 4)))
for node, d in sorted(pb.items()):
    if 'before' in d and 'after' in d:
        r = [x - y for x, y in zip(d['after'], d['before'])]
        print(f'port-8500 bytes via proxy {node}: requests {r[0]*pm:.0f}/min, vault->consul {r[1]*pm/1e3:.1f} kB/min, consul->vault {r[2]*pm/1e3:.1f} kB/min' +
              (f'; per token {r[1]/tokens:.0f} B up, {r[2]/tokens:.0f} B down' if tokens else ''))
