//! The series a sizing run keeps, read from what real servers exposed
//! under load (`testdata/vectors/*/metrics/`): a Consul 1.20.1 server with
//! 1,000 agent-sim agents (its Prometheus text and its JSON) and a Sensu Go
//! 6.12.0 backend with 500. Values are the captured ones; units are the
//! servers' (milliseconds for their summaries, seconds for etcd's).

use agent_sim_observe::figures::{RunState, sample};
use agent_sim_observe::kinds::{self, ServerKind};
use agent_sim_observe::reading::{Reading, Value, parse_consul_json, parse_prometheus};

fn vector(path: &str) -> String {
    let dir = agent_sim_testkit::hostile::vectors_dir();
    std::fs::read_to_string(dir.join(path)).unwrap()
}

fn defaults(kind: ServerKind, name: &str) -> bool {
    kinds::kept(kind, name, &[])
}

fn at(t_s: f64) -> RunState {
    RunState {
        t_s,
        agents: 1000,
        ramp_done: true,
        ending: false,
    }
}

#[test]
fn a_consul_server_under_load() {
    let r = parse_prometheus(
        &vector("consul/metrics/server-1.20.1-1000-agents.prom"),
        &defaults,
    );
    assert_eq!(r.kind, Some(ServerKind::Consul));
    assert_eq!(r.scalar(kinds::CPU), Some(2.31));
    assert_eq!(r.scalar(kinds::RSS), Some(268_730_368.0));
    assert_eq!(r.scalar(kinds::GOROUTINES), Some(5220.0));
    assert_eq!(r.scalar(kinds::FDS), Some(1045.0));
    // Label sets added: 0 + 7 in-process + 2,000 internal.
    assert_eq!(r.scalar("consul_grpc_server_streams"), Some(2007.0));
    assert_eq!(r.scalar("consul_rpc_queries_blocking"), Some(2.0));
    assert_eq!(r.scalar("consul_session_ttl_active"), Some(1000.0));
    let Some(Value::Summary(sets)) = r.series.get("consul_raft_commitTime") else {
        panic!("{:?}", r.series.keys().collect::<Vec<_>>())
    };
    let set = &sets[""];
    assert_eq!(set.count, 1301.0);
    assert!((set.quantiles[0].1 - 0.023_414_999).abs() < 1e-6);
    // Kept: the kind's defaults and the process's; not the other ~260.
    assert!(!r.series.contains_key("consul_raft_barrier"));
    // Raft transactions, a counter kept by default: 1,299 at this scrape.
    assert_eq!(r.scalar("consul_raft_apply"), Some(1299.0));
    assert!(r.exposed > 200, "{}", r.exposed);

    // One scrape alone: the summary's window quantiles, in µs.
    let s = sample(None, &r, at(30.0));
    let q = &s.latencies["consul_raft_commit_time"];
    assert!((q.p50.unwrap() - 23.415).abs() < 1e-2, "{q:?}");
    assert_eq!(s.values["consul_grpc_server_streams"], 2007.0);
    assert_eq!(s.goroutines, Some(5220));
}

/// What writes move on a 1.20.1 server (KV sets, a lock, transactions,
/// sessions, leaf certificates signed): each kept by default, under the
/// name the server exposes, with the captured counts.
#[test]
fn a_consul_server_after_writes() {
    let r = parse_prometheus(
        &vector("consul/metrics/server-1.20.1-writes.prom"),
        &defaults,
    );
    assert_eq!(r.kind, Some(ServerKind::Consul));
    let count = |name: &str| -> f64 {
        let Some(Value::Summary(sets)) = r.series.get(name) else {
            panic!("{name}: {:?}", r.series.get(name))
        };
        sets.values().map(|s| s.count).sum()
    };
    assert_eq!(count("consul_kvs_apply"), 151.0);
    assert_eq!(count("consul_txn_apply"), 21.0);
    assert_eq!(count("consul_txn_read"), 1.0);
    assert_eq!(count("consul_raft_fsm_apply"), 203.0);
    // Per `op` label: 150 sets and 1 lock; 7 leaves signed.
    assert_eq!(count("consul_fsm_kvs"), 151.0);
    assert_eq!(count("consul_fsm_txn"), 21.0);
    assert_eq!(count("consul_fsm_ca_leaf"), 7.0);
    assert_eq!(count("consul_fsm_session"), 4.0);
    assert_eq!(count("consul_session_ttl_invalidate"), 1.0);
    assert_eq!(r.scalar("consul_rpc_rate_limit_exceeded"), Some(0.0));

    // The busiest label set gives the quantiles: the KV sets', in µs.
    let s = sample(None, &r, at(30.0));
    let q = &s.latencies["consul_fsm_kvs"];
    assert!((q.p50.unwrap() - 48.162).abs() < 1e-2, "{q:?}");
    assert!((s.latencies["consul_kvs_apply"].p99.unwrap() - 243.044).abs() < 1e-2);
}

#[test]
fn the_same_consul_server_in_its_json_format() {
    let r = parse_consul_json(
        &vector("consul/metrics/server-1.20.1-1000-agents.json"),
        &defaults,
    );
    assert_eq!(r.kind, Some(ServerKind::Consul));
    assert!(r.scalar(kinds::CPU).is_none() && r.scalar(kinds::RSS).is_none());
    assert!(r.scalar(kinds::HEAP).unwrap() > 0.0);
    assert!(r.scalar(kinds::GOROUTINES).unwrap() > 0.0);
    assert_eq!(
        r.series["consul_raft_commitTime"],
        Value::Window {
            mean: 0.029_929_500_073_194_504,
            max: 0.036_444_000_899_791_72,
            count: 2.0
        }
    );
    assert_eq!(r.scalar("consul_rpc_request"), Some(0.5));
    let s = sample(None, &r, at(30.0));
    let q = &s.latencies["consul_raft_commit_time"];
    assert!(
        (q.mean.unwrap() - 29.9295).abs() < 1e-3 && q.p50.is_none(),
        "{q:?}"
    );
    assert_eq!(s.values["consul_rpc_request_per_s"], 0.5);
}

#[test]
fn a_sensu_backend_under_load() {
    let text = vector("sensu/metrics/backend-6.12.0-500-agents.prom");
    let r = parse_prometheus(&text, &defaults);
    assert_eq!(r.kind, Some(ServerKind::Sensu));
    assert_eq!(r.scalar(kinds::CPU), Some(31.49));
    assert_eq!(r.scalar("sensu_go_keepalives"), Some(1122.0));
    assert_eq!(r.scalar("sensu_go_events_processed"), Some(1112.0));
    assert_eq!(r.scalar("etcd_server_proposals_pending"), Some(4.0));
    let Some(Value::Histogram { buckets, count, .. }) =
        r.series.get("etcd_disk_wal_fsync_duration_seconds")
    else {
        panic!()
    };
    assert_eq!(*count, 609.0);
    assert_eq!(buckets.first(), Some(&(0.001, 383.0)));
    assert_eq!(buckets.last(), Some(&(f64::INFINITY, 609.0)));

    // The backend 5 s later, with 100 more fsyncs all under 1 ms and 500
    // more keepalives: an interval of rates and bucket quantiles.
    let later = text
        .replace(
            "etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"} 383",
            "etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"} 483",
        )
        .replace(
            "etcd_disk_wal_fsync_duration_seconds_count 609",
            "etcd_disk_wal_fsync_duration_seconds_count 709",
        )
        .replace(
            "sensu_go_keepalives{status=\"alive\"} 1122",
            "sensu_go_keepalives{status=\"alive\"} 1622",
        );
    let later = bump_all_buckets(&later, "etcd_disk_wal_fsync_duration_seconds_bucket", 100);
    let r2: Reading = parse_prometheus(&later, &defaults);
    let s = sample(Some((&r, 30.0)), &r2, at(35.0));
    assert_eq!(s.values["sensu_go_keepalives_per_s"], 100.0);
    let q = &s.latencies["etcd_disk_wal_fsync_duration_seconds"];
    assert_eq!(q.count, 100.0);
    // All in (0, 1 ms]: the median half-way, in µs.
    assert!((q.p50.unwrap() - 500.0).abs() < 1e-6, "{q:?}");
    // The eventd summary's busiest label set (`success`), milliseconds.
    let e = &s.latencies["sensu_go_eventd_update_event_duration"];
    assert!((e.p50.unwrap() - 22_946.966).abs() < 1e-3, "{e:?}");
}

/// Adds `n` to every bucket above the first of a histogram (observations
/// that fell into the first bucket count in every cumulative one).
fn bump_all_buckets(text: &str, bucket: &str, n: u64) -> String {
    let mut first = true;
    text.lines()
        .map(|l| {
            if let Some(rest) = l.strip_prefix(bucket) {
                if first {
                    first = false;
                    return l.to_string();
                }
                let (labels, v) = rest.rsplit_once(' ').unwrap();
                let v: u64 = v.parse().unwrap();
                format!("{bucket}{labels} {}", v + n)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}
