//! A Consul server's storm figures from two scrapes 10 s apart, in
//! fixtures shaped like what a 1.20.1 server writes (`tests/fixtures/`:
//! its names, `network` labels, NaN quantiles of an idle window, the
//! colon of `consul_serf_events_consul:new_leader`, the RPC summary's
//! labels): 100 members joining, 3 failing, a new leader, every agent's
//! anti-entropy reads. Series that appear only in the second scrape
//! (suspect messages, degraded probes, failed members, an errored call's
//! label set) count whole; series it never exported are absent.

use agent_sim_metrics::storm::{Count, Peak, Queue};
use agent_sim_observe::figures::{RunState, sample};
use agent_sim_observe::kinds;
use agent_sim_observe::reading::{Reading, parse_prometheus};
use agent_sim_observe::storm::record;

fn fixture(name: &str) -> Reading {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    parse_prometheus(&text, &|kind, name| kinds::kept(kind, name, &[]))
}

#[test]
fn a_join_storm_read_from_two_scrapes() {
    let (before, after) = (
        fixture("consul-storm-before.prom"),
        fixture("consul-storm-after.prom"),
    );
    let mut out = None;
    record(&mut out, Some((&before, 0.0)), &after, 10.0);
    let s = out.expect("a storm part");
    let total = |c: Count| s.total.get(&c).copied();
    assert_eq!(total(Count::GossipBytesIn), Some(345_088.0));
    assert_eq!(total(Count::GossipBytesOut), Some(122_880.0));
    assert_eq!(total(Count::TcpAccepts), Some(100.0));
    assert_eq!(total(Count::AliveMsgs), Some(1200.0));
    assert_eq!(total(Count::SuspectMsgs), Some(10.0));
    assert_eq!(total(Count::DegradedProbes), Some(35.0));
    assert_eq!(total(Count::SerfMsgs), Some(3400.0));
    assert_eq!(total(Count::MemberJoins), Some(100.0));
    assert_eq!(total(Count::MemberFailed), Some(3.0));
    assert_eq!(total(Count::SerfEvents), Some(1.0));
    assert_eq!(total(Count::NewLeaderEvents), Some(1.0));
    assert_eq!(total(Count::AeReads), Some(126.0), "62 + 62 + 2 errored");
    for absent in [Count::DeadMsgs, Count::MemberLeft, Count::HandlerDrops] {
        assert_eq!(total(absent), None, "{absent:?}");
    }
    let x = &s.samples[0];
    assert_eq!(x.t_s, 10.0);
    assert!((x.per_s[&Count::GossipBytesIn] - 34_508.8).abs() < 1e-9);
    assert!((x.per_s[&Count::AeReads] - 12.6).abs() < 1e-9);
    assert_eq!(
        s.peak_per_s[&Count::AliveMsgs],
        Peak {
            value: 120.0,
            at_s: 10.0
        }
    );
    let intent = x.queues[&Queue::Intent];
    assert_eq!((intent.p50, intent.p99), (Some(700.0), Some(2100.0)));
    assert_eq!(intent.mean, Some(2100.0), "the LAN pool's one sample");
    assert_eq!(x.queues[&Queue::Broadcasts].mean, Some(13.0));
    assert_eq!(x.queues[&Queue::Query].p99, Some(0.0));
    let high = |q: Queue| s.queue_max[&q].value;
    assert_eq!(
        [Queue::Intent, Queue::Event, Queue::Query, Queue::Broadcasts].map(high),
        [2100.0, 3.0, 0.0, 12.0]
    );
    let lines = s.table_lines();
    assert_eq!(lines.len(), 5, "{lines:#?}");
    assert_eq!(
        lines[3],
        "storm      members      100 joined (peak 10.0/s at 10.0s), 3 failed; 1 serf event; \
         1 new-leader event"
    );
}

#[test]
fn the_storm_series_stay_out_of_the_generic_values_and_latencies() {
    let run = RunState {
        t_s: 10.0,
        agents: 100,
        ramp_done: true,
        ending: false,
    };
    let (before, after) = (
        fixture("consul-storm-before.prom"),
        fixture("consul-storm-after.prom"),
    );
    let x = sample(Some((&before, 0.0)), &after, run);
    assert_eq!(x.values["consul_rpc_request_per_s"], 340.0);
    assert!(x.latencies.contains_key("consul_raft_commit_time"));
    let names: Vec<&String> = x.values.keys().chain(x.latencies.keys()).collect();
    assert!(
        names.iter().all(|n| !n.contains("memberlist_udp")
            && !n.contains("serf_")
            && !n.contains("server_call")),
        "{names:?}"
    );
}
