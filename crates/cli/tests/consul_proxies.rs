//! End to end: proxies behind Consul agents (`--proxies-per-agent`) against
//! the in-process reference target: the probe is timed at each proxy's
//! hand-off, no later subscription is made for them, and the summary and
//! table carry `propagation_proxy` beside `propagation`.

use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};

use crate::common::assert_exit;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_is_timed_at_every_proxy_behind_every_agent() {
    let outcome = RunBuilder::new(Kind::Consul)
        .agents(10)
        .ramp(Ramp::All)
        .duration(Duration::from_secs(5))
        .args(|a| {
            a.upstreams = Some("web".parse().unwrap());
            a.proxies_per_agent = Some(3);
            a.probe_every = Some("1500ms".parse().unwrap());
            a.probe_timeout = Some("1s".parse().unwrap());
        })
        .assert("probes.delivered_ratio == 1".parse().unwrap())
        .assert("errors.total == 0".parse().unwrap())
        .run()
        .await
        .expect("run");
    assert_exit(&outcome, 0);
    let s = &outcome.summary;
    // web and the probe service: the proxies share the agents' streams.
    assert_eq!(s.counters["subscriptions"], 20);
    let (agents, proxies) = (
        &s.latency_us["propagation"],
        &s.latency_us["propagation_proxy"],
    );
    assert!(agents.count >= 20, "{agents:?}");
    assert_eq!(proxies.count, 3 * agents.count);
    assert!(proxies.min >= 200_000, "coalesced: {proxies:?}");
    // At least one send per proxy (their snapshots), one per probe after.
    assert!(s.counters["proxy_updates"] >= 30 + 30 * 2);
    // Each probe: the agents' entry, then the proxies' entry.
    assert!(s.probes.len() >= 4, "{:?}", s.probes);
    for pair in s.probes.chunks(2) {
        let [a, p] = pair else {
            panic!("{:?}", s.probes)
        };
        assert_eq!(
            (a.fleet.as_deref(), p.fleet.as_deref()),
            (None, Some("proxy"))
        );
        assert_eq!((a.id, a.kind.as_str()), (p.id, p.kind.as_str()));
        assert_eq!((a.delivered, a.expected), (10, 10), "{a:?}");
        assert_eq!((p.delivered, p.expected), (30, 30), "{p:?}");
        assert_eq!(p.change_id, a.change_id);
        // Nothing else changes the agents' views: each of their 3 proxies
        // gets the change exactly one coalescing window after its agent
        // (the limiter's 4 ms per token stays within the window).
        let (al, pl) = (&a.latency_us, &p.latency_us);
        assert_eq!((pl.min, pl.max), (al.min + 200_000, al.max + 200_000));
    }
    let table = agent_sim_metrics::report::render(s);
    assert!(table.contains("propagation_proxy"), "{table}");
    assert!(table.contains("register proxy"), "{table}");
}

#[tokio::test]
async fn proxies_need_a_client_agent() {
    let refused = RunBuilder::new(Kind::Consul)
        .agents(1)
        .duration(Duration::from_secs(1))
        .args(|a| {
            a.proxies_per_agent = Some(2);
            a.consul_agent = Some("api".parse().unwrap());
        })
        .run()
        .await
        .expect_err("refused");
    let words = refused.to_string();
    assert!(words.starts_with("--proxies-per-agent: "), "{words}");
    assert!(words.contains("--consul-agent api"), "{words}");
}

#[test]
fn the_flags_and_their_defaults_reach_the_consul_config() {
    use agent_sim::args::RunArgs;
    use agent_sim::plan::Protocol;
    let proxies = |f: fn(&mut RunArgs)| {
        let mut a = RunArgs {
            kind: Some(Kind::Consul),
            ..RunArgs::default()
        };
        f(&mut a);
        let cfg = agent_sim::config::resolve(a, &|_| None).expect("resolves");
        let Protocol::Consul(c) = &cfg.fleets[0].protocol else {
            panic!("a consul fleet")
        };
        *c.proxies
    };
    let d = proxies(|_| {});
    assert_eq!(d.per_agent, 0);
    assert_eq!(d.coalesce, Duration::from_millis(200));
    assert_eq!(d.update_rate.as_per_second(), 250.0);
    let p = proxies(|a| {
        a.proxies_per_agent = Some(18);
        a.proxy_coalesce = Some("50ms".parse().unwrap());
        a.proxy_update_rate = Some("1000/s".parse().unwrap());
    });
    assert_eq!(p.per_agent, 18);
    assert_eq!(p.coalesce, Duration::from_millis(50));
    assert_eq!(p.update_rate.as_per_second(), 1000.0);
}
