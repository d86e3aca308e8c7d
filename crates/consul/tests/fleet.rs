//! Simulated agents against the embedded Consul target, in-process on
//! 127.0.0.1:0: snapshots for a fleet, the propagation probe (also measured
//! by a second, non-controller fleet and merged), resume after a reconnect,
//! the ABORTED path, and TTL session expiry.

use std::sync::Arc;
use std::time::Duration;

use agent_sim_consul::http::HttpApi;
use agent_sim_consul::{ConsulConfig, ConsulFactory, ProbeConfig, ProbeKind};
use agent_sim_fleet::scenario::{Phase, Scenario};
use agent_sim_fleet::{
    Agent, AgentFactory, FleetConfig, FleetReport, FleetStatus, Rate, SessionCx, SessionEnd,
};
use agent_sim_metrics::{Metrics, ProbeSummary};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use agent_sim_testkit::bounded::until;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn fleet_of_200_gets_snapshots_and_a_deregister_probe_reaches_all() {
    let t = start_target().await;
    let m_owned = metrics();
    let m = &m_owned;
    let cfg = ConsulConfig {
        probe: probe(ProbeKind::Catalog, Duration::from_secs(2), ms(1500)),
        ..config(&t)
    };
    let (report, probes) = run_fleet(cfg, fleet_of(200, Some(2000.0), ms(3800)), m).await;
    let s = m.snapshot();
    assert_eq!(report.ever_connected, 200, "{s:?}");
    assert_eq!(report.connected_at_end, 200);
    assert_eq!(report.unfinished, 0);
    // web, api and the run's own probe service.
    assert_eq!(s.counter("subscriptions"), 600);
    assert_eq!(s.counter("snapshots"), 600);
    assert_eq!(s.counter("aborts"), 0);
    assert_eq!(s.counter("registrations"), 200);
    assert_eq!(s.counter("deregistrations"), 200);
    assert_eq!(s.counter("sessions_created"), 200);
    let txns = s.counter("txn_requests");
    assert!(
        txns > 0 && txns < 200,
        "registrations are batched: {txns} txns"
    );
    assert!(s.errors.is_empty(), "errors: {:?}", s.errors);

    assert!(!probes.is_empty());
    let p = &probes[0];
    assert_eq!(p.id, 1);
    assert_eq!(p.kind, "deregister");
    assert_eq!(p.expected, 200, "{p:?}");
    assert_eq!(p.delivered, 200, "{p:?}");
    assert!(p.time_to_99pct_us.is_some());
    assert!(p.latency_us.max <= 1_500_000);
    assert_eq!(p.latency_us.count, 200);
    m.collect();
    assert!(m.cumulative_of("propagation").unwrap().len() >= 200);
    assert!(m.cumulative_of("probe_overhead").unwrap().len() >= 200);
    assert_eq!(m.cumulative_of("subscribe_snapshot").unwrap().len(), 600);

    let ts = t.state.stats();
    assert!(ts.registrations >= 200, "{ts:?}");
}

/// A shard's config: catalog probe every 2 s with `timeout`, no TTL session.
fn shard_config(t: &Target, timeout: Duration) -> ConsulConfig {
    ConsulConfig {
        session_ttl: None,
        probe: probe(ProbeKind::Catalog, Duration::from_secs(2), timeout),
        ..config(t)
    }
}

/// Two shards of one run on `cfg`, each with its own metrics as two
/// processes would have: the controller runs `fleets[0]` and makes the
/// probes, the observer runs `fleets[1]` and measures them. Returns both
/// reports, metrics and probe lists.
async fn run_two_shards(
    cfg: ConsulConfig,
    [fleet0, fleet1]: [FleetConfig; 2],
) -> ([FleetReport; 2], [Metrics; 2], [Vec<ProbeSummary>; 2]) {
    let shard = |controller: bool| ConsulConfig {
        probe: ProbeConfig {
            controller,
            ..cfg.probe.clone()
        },
        ..cfg.clone()
    };
    let (m0, m1) = (metrics(), metrics());
    let f0 = ConsulFactory::new(shard(true), m0.clone()).unwrap();
    let f1 = ConsulFactory::new(shard(false), m1.clone()).unwrap();
    assert!(f0.probe_observers().is_empty());
    assert!(f1.probe_runners().is_empty());
    let stop = CancellationToken::new();
    // The run's probe and, with `--probe catalog,intentions`, the second.
    let kinds = 1 + usize::from(cfg.probe.also.is_some());
    let runners = f0.probe_runners();
    let observers = f1.probe_observers();
    assert_eq!((runners.len(), observers.len()), (kinds, kinds));
    let probes0: Vec<_> = runners
        .into_iter()
        .map(|r| tokio::spawn(r.run(stop.clone())))
        .collect();
    let probes1: Vec<_> = observers
        .into_iter()
        .map(|o| tokio::spawn(o.run(stop.clone())))
        .collect();
    let run = |fc: FleetConfig, f: ConsulFactory, m: Metrics| {
        agent_sim_fleet::run(
            fc,
            Arc::new(f),
            m,
            Arc::new(FleetStatus::default()),
            CancellationToken::new(),
        )
    };
    let (r0, r1) = tokio::join!(run(fleet0, f0, m0.clone()), run(fleet1, f1, m1.clone()));
    stop.cancel();
    let mut probes = [Vec::new(), Vec::new()];
    for (out, tasks) in probes.iter_mut().zip([probes0, probes1]) {
        for t in tasks {
            out.extend(t.await.unwrap());
        }
    }
    ([r0, r1], [m0, m1], probes)
}

/// Probes armed while a storm's agents come back count only the agents live
/// when each was armed: an agent that resubscribes later finds the change
/// in its snapshot or as the first event of its resumed stream, which is
/// not a propagation, so it is in neither `expected` nor `delivered`.
#[tokio::test(start_paused = true)]
async fn probes_during_a_storm_recovery_expect_only_the_agents_live_at_arming() {
    let t = start_target().await;
    let m = metrics();
    let n = 200;
    let cfg = ConsulConfig {
        probe: probe(ProbeKind::Catalog, Duration::from_secs(1), ms(800)),
        cluster_size: 100,
        ..config(&t)
    };
    let (report, probes) = run_fleet(
        cfg,
        FleetConfig {
            // Back 1 s to 2 s after the storm (jittered first delay).
            backoff: agent_sim_fleet::Backoff::new(Duration::from_secs(2), Duration::from_secs(30)),
            scenario: Scenario {
                phases: vec![Phase::Storm {
                    at: Duration::from_millis(2_900),
                    share: 1.0,
                }],
            },
            ..fleet_of(n, Some(2000.0), ms(9_500))
        },
        &m,
    )
    .await;
    assert_eq!(report.connected_at_end, n);
    assert_eq!(report.sessions_lost["scenario_storm"], n);
    // Probes every second from 1 s; the storm falls between the windows of
    // probes 2 and 3, the agents are back between 3.9 s and 4.9 s and
    // their streams resynced by 8 s at the latest (staggered sync).
    assert!(probes.len() >= 8, "{probes:#?}");
    let mut partial = 0;
    for p in &probes {
        assert!(p.expected <= n, "{p:?}");
        assert_eq!(p.delivered, p.expected, "{p:?}");
        assert_eq!(p.latency_us.count, p.expected, "{p:?}");
        if p.expected < n {
            partial += 1;
        }
    }
    assert_eq!((probes[0].expected, probes[1].expected), (n, n));
    assert!(partial >= 1, "a probe was armed mid-recovery: {probes:#?}");
    assert_eq!(probes.last().unwrap().expected, n, "{probes:#?}");
}

/// The same in an observer shard: a change's expected subscriptions are
/// those live when it first arrived in the shard. A storm takes half the
/// shard's agents down 0.5 s after a change; they are back 1 s to 2 s later,
/// some after the next change reached the other half: their re-sync is not
/// a delivery of it (before, it was counted, beyond `expected`).
#[tokio::test(start_paused = true)]
async fn an_observer_shard_in_a_storm_counts_only_its_expected_subscriptions() {
    let t = start_target().await;
    let cfg = ConsulConfig {
        cluster_size: 100,
        ..shard_config(&t, Duration::from_millis(1900))
    };
    let fleet = |first_index: u64, agents: u64, phases: Vec<Phase>| FleetConfig {
        first_index,
        backoff: agent_sim_fleet::Backoff::new(Duration::from_secs(2), Duration::from_secs(30)),
        scenario: Scenario { phases },
        ..fleet_of(agents, Some(2000.0), ms(9_500))
    };
    let storm = Phase::Storm {
        at: Duration::from_millis(4_500),
        share: 0.5,
    };
    let ([r0, r1], _, [probes0, probes1]) =
        run_two_shards(cfg, [fleet(0, 20, vec![]), fleet(20, 200, vec![storm])]).await;
    assert_eq!((r0.connected_at_end, r1.connected_at_end), (20, 200));
    assert_eq!(r1.sessions_lost["scenario_storm"], 100);
    assert!(probes0.len() >= 4, "{probes0:#?}");
    let mut partial = 0;
    for p in &probes0 {
        assert_eq!((p.delivered, p.expected), (20, 20), "{p:?}");
        let seen = probes1
            .iter()
            .find(|o| o.change_id == p.change_id)
            .unwrap_or_else(|| panic!("observer missed {:?}: {probes1:#?}", p.change_id));
        assert!(seen.expected <= 200, "{seen:?}");
        assert_eq!(seen.delivered, seen.expected, "{seen:?}");
        if seen.expected < 200 {
            partial += 1;
        }
    }
    assert!(partial >= 1, "a change came mid-recovery: {probes1:#?}");
    let last = probes0.last().unwrap();
    let seen = probes1.iter().find(|o| o.change_id == last.change_id);
    assert_eq!(seen.map(|s| (s.delivered, s.expected)), Some((200, 200)));
}

/// Shard 0 (controller, agents 0..50) and shard 1 (observer, agents
/// 50..100) as two fleets with their own metrics, as two processes would
/// be; their summaries merge into probes that reached 100/100.
#[tokio::test(start_paused = true)]
async fn an_observer_shard_measures_the_probe_and_merges_by_raft_index() {
    use agent_sim_metrics::SUMMARY_SCHEMA;
    use agent_sim_metrics::merge::merge_summaries;
    use agent_sim_metrics::summary::{SCHEMA_V2, Summary};
    use agent_sim_testkit::validate_json;

    let t = start_target().await;
    let fleet = |first_index: u64| FleetConfig {
        first_index,
        ..fleet_of(50, Some(1000.0), ms(3800))
    };
    let ([r0, r1], [m0, m1], [probes0, probes1]) = run_two_shards(
        shard_config(&t, Duration::from_millis(1500)),
        [fleet(0), fleet(50)],
    )
    .await;
    assert_eq!((r0.ever_connected, r1.ever_connected), (50, 50));
    // Disjoint indexes: 100 distinct nodes registered.
    assert_eq!(
        counter(&m0, "registrations") + counter(&m1, "registrations"),
        100
    );
    assert!(t.state.stats().registrations >= 100);

    assert!(!probes0.is_empty(), "the controller made a probe");
    for p in &probes0 {
        assert_eq!(p.role.as_deref(), Some("controller"));
        assert!(p.change_id.is_some() && p.t0_unix_us.is_some(), "{p:?}");
        assert_eq!((p.delivered, p.expected), (50, 50), "{p:?}");
        let seen = probes1
            .iter()
            .find(|o| o.change_id == p.change_id)
            .unwrap_or_else(|| panic!("observer missed raft index {:?}", p.change_id));
        assert_eq!(seen.role.as_deref(), Some("observer"));
        assert_eq!(seen.kind, p.kind);
        assert_eq!((seen.delivered, seen.expected), (50, 50), "{seen:?}");
        assert_eq!(seen.latency_us.min, 0, "after its own first arrival");
        // One clock here, but T0 is taken when the HTTP call returns: the
        // event may reach subscribers a little earlier.
        let (first, t0) = (seen.first_arrival_unix_us.unwrap(), p.t0_unix_us.unwrap());
        assert!(
            first + 500_000 >= t0 && first <= t0 + 1_500_000,
            "{first} vs T0 {t0}"
        );
    }
    // The observer records no `propagation` (no T0 here) but its overhead.
    m1.collect();
    let len = |name: &str| m1.cumulative_of(name).unwrap().len();
    assert_eq!(len("propagation"), 0);
    assert!(len("probe_overhead") >= 50);

    let summary = |probes: Vec<ProbeSummary>, shard: &str| Summary {
        schema: SCHEMA_V2.into(),
        kind: "consul".into(),
        started_at: "2026-11-21T22:40:00.000Z".into(),
        probes,
        shard: Some(shard.into()),
        ..Default::default()
    };
    let parts = [summary(probes0.clone(), "0/2"), summary(probes1, "1/2")];
    let merged = merge_summaries(&parts).unwrap();
    for s in parts.iter().chain([&merged]) {
        validate_json(SUMMARY_SCHEMA, &serde_json::to_value(s).unwrap()).unwrap();
    }
    let joined: Vec<&ProbeSummary> = merged.probes.iter().filter(|p| !p.is_observer()).collect();
    assert_eq!(joined.len(), probes0.len());
    for p in &joined {
        assert_eq!((p.delivered, p.expected), (100, 100), "{p:?}");
        assert_eq!(p.latency_us.count, 100);
        assert!(p.time_to_99pct_us.is_some(), "{p:?}");
        assert!(p.latency_us.max <= 1_500_000, "{p:?}");
        // Only arrivals that beat the HTTP reply can need a note here.
        if let Some(n) = &p.note {
            assert!(n.contains("before T0"), "{n}");
        }
    }
    // Anything else the observer saw (the controller's setup change) is
    // kept and flagged, not joined.
    for p in merged.probes.iter().filter(|p| p.is_observer()) {
        assert!(p.note.is_some(), "{p:?}");
    }
    assert_eq!(
        merged.latency_us["propagation"].count,
        100 * probes0.len() as u64
    );
}

#[tokio::test(start_paused = true)]
async fn intentions_probe_reaches_every_agent() {
    let t = start_target().await;
    let m_owned = metrics();
    let m = &m_owned;
    let cfg = ConsulConfig {
        register: false,
        session_ttl: None,
        probe: probe(ProbeKind::Intentions, ms(1500), Duration::from_secs(1)),
        ..config(&t)
    };
    let (report, probes) = run_fleet(cfg, fleet_of(20, None, ms(2800)), m).await;
    assert_eq!(report.ever_connected, 20);
    // web, api and the intentions subscription per agent.
    assert_eq!(counter(m, "snapshots"), 60);
    let p = &probes[0];
    assert_eq!(p.kind, "intentions");
    assert_eq!((p.delivered, p.expected), (20, 20), "{p:?}");
}

/// `--probe catalog,intentions`: both probes in one run, each on its own
/// board, the intentions change half an interval after each catalog
/// change, with the even ids between the catalog probe's odd ones; every
/// agent and every proxy behind it has each change, recorded in each
/// probe's own latencies.
#[tokio::test(start_paused = true)]
async fn catalog_and_intentions_probes_run_side_by_side() {
    let t = start_target().await;
    let m_owned = metrics();
    let m = &m_owned;
    let mut probe = probe(ProbeKind::Catalog, ms(2000), ms(800));
    probe.also = Some(ProbeKind::Intentions);
    let cfg = ConsulConfig {
        register: false,
        session_ttl: None,
        probe,
        proxies: Box::new(agent_sim_consul::proxy::ProxyConfig {
            per_agent: 2,
            ..Default::default()
        }),
        ..config(&t)
    };
    let (report, probes) = run_fleet(cfg, fleet_of(20, None, ms(6600)), m).await;
    assert_eq!(report.ever_connected, 20);
    // web, api, the probe service and the intentions of it, per agent.
    assert_eq!(counter(m, "snapshots"), 80);
    let mut at_agents: Vec<(u64, &str, u64, u64)> = probes
        .iter()
        .filter(|p| p.fleet.is_none())
        .map(|p| (p.id, p.kind.as_str(), p.delivered, p.expected))
        .collect();
    at_agents.sort();
    assert_eq!(
        at_agents,
        [
            (1, "deregister", 20, 20),
            (2, "intentions", 20, 20),
            (3, "register", 20, 20),
            (4, "intentions", 20, 20),
            (5, "deregister", 20, 20),
        ],
        "{probes:?}"
    );
    // The changes were made in the order of their ids (the intentions
    // probe's at 3 s and 5 s, between the catalog probe's at 2, 4 and 6 s;
    // its 7 s change falls after the run).
    let t0 = |id| {
        probes
            .iter()
            .find(|p| p.id == id && p.fleet.is_none())
            .and_then(|p| p.t0_unix_us)
            .unwrap()
    };
    assert!((1..5).all(|id| t0(id) < t0(id + 1)));
    let at_proxies = probes
        .iter()
        .filter(|p| p.fleet.as_deref() == Some("proxy"));
    assert_eq!(at_proxies.clone().count(), 5);
    assert!(
        at_proxies
            .clone()
            .all(|p| (p.delivered, p.expected) == (40, 40)),
        "{probes:?}"
    );
    m.collect();
    let len = |name| m.cumulative_of(name).unwrap().len();
    assert_eq!(len("propagation"), 60);
    assert_eq!(len("propagation_proxy"), 120);
    assert_eq!(len("propagation_intentions"), 40);
    assert_eq!(len("propagation_intentions_proxy"), 80);
}

/// Two shards with both probe kinds: the observer shard measures each
/// kind's changes on its own board and reports them by raft index, each
/// entry of the kind the controller made.
#[tokio::test(start_paused = true)]
async fn an_observer_shard_measures_both_probe_kinds() {
    let t = start_target().await;
    let mut cfg = shard_config(&t, ms(900));
    cfg.probe.also = Some(ProbeKind::Intentions);
    let fleet = || fleet_of(10, None, ms(5500));
    let (reports, _, [probes0, probes1]) = run_two_shards(cfg, [fleet(), fleet()]).await;
    assert_eq!(
        (reports[0].ever_connected, reports[1].ever_connected),
        (10, 10)
    );
    let kinds = |probes: &[ProbeSummary]| {
        let mut k: Vec<(Option<u64>, String, u64, u64)> = probes
            .iter()
            .map(|p| (p.change_id, p.kind.clone(), p.delivered, p.expected))
            .collect();
        k.sort();
        k
    };
    // Catalog changes at 2 and 4 s, intentions at 3 and 5 s.
    let made = kinds(&probes0);
    assert_eq!(made.len(), 4, "{probes0:?}");
    assert_eq!(made.iter().filter(|k| k.1 == "intentions").count(), 2);
    assert!(made.iter().all(|k| (k.2, k.3) == (10, 10)), "{made:?}");
    // The observer saw the same changes, of the same kinds, at its 10.
    let seen = kinds(&probes1);
    let as_made: Vec<_> = made.iter().map(|k| (k.0, k.1.clone())).collect();
    let as_seen: Vec<_> = seen.iter().map(|k| (k.0, k.1.clone())).collect();
    assert_eq!(as_seen, as_made, "{probes1:?}");
    assert!(seen.iter().all(|k| (k.2, k.3) == (10, 10)), "{seen:?}");
}

/// A process on servers of its own (a local process of an embedded run)
/// makes and times its own changes, and its summaries carry no change id:
/// the raft indexes of its cluster name nothing in another process's.
#[tokio::test(start_paused = true)]
async fn a_process_on_servers_of_its_own_reports_no_change_ids() {
    for own_cluster in [false, true] {
        let t = start_target().await;
        let mut cfg = shard_config(&t, ms(900));
        cfg.probe.own_cluster = own_cluster;
        let m = metrics();
        let (report, probes) = run_fleet(cfg, fleet_of(10, None, ms(4500)), &m).await;
        assert_eq!(report.ever_connected, 10);
        // Changes at 2 and 4 s, each delivered to all 10.
        assert_eq!(probes.len(), 2, "{probes:?}");
        for p in &probes {
            assert_eq!((p.delivered, p.expected), (10, 10), "{p:?}");
            assert_eq!(p.change_id.is_some(), !own_cluster, "{p:?}");
            assert!(p.t0_unix_us.is_some(), "{p:?}");
        }
    }
}

/// A resubscribe with the view's index: the server answers a changed topic
/// with `NewSnapshotToFollow` and a snapshot, and keeps an unchanged one
/// silent until its next event, which is when the agent counts the resume
/// (never from silence). The silent stream is live once the server has
/// answered the agent's sync (here: a leader check, nothing registered).
#[tokio::test(start_paused = true)]
async fn a_reconnecting_agent_resumes_from_its_index() {
    let t = start_target().await;
    let m_owned = metrics();
    let m = &m_owned;
    let factory = ConsulFactory::new(subscriber(&t), m.clone()).unwrap();
    let mut agent = factory.create(0);

    let first = (Duration::from_secs(5), "first snapshots");
    let end = session_until(&mut agent, m, first, async || counter(m, "snapshots") == 2).await;
    assert_eq!(end, SessionEnd::Shutdown);
    assert_eq!(agent.view_len("web"), Some(2));
    assert_eq!(agent.view_len("api"), Some(1));
    assert_eq!(counter(m, "sessions_established"), 1);

    // While disconnected, web-2 goes away.
    let api = HttpApi::new(t.http, None, "").unwrap();
    api.put(
        "/v1/catalog/deregister",
        Bytes::from(r#"{"Node":"sim-node-2","ServiceID":"web-2"}"#),
    )
    .await
    .unwrap();

    let api2 = &api;
    let end = with_session(&mut agent, m, |token| async move {
        // `web` changed: a new snapshot follows.
        until(Duration::from_secs(5), "web re-snapshot", async || {
            counter(m, "snapshots") == 3
        })
        .await;
        // `api` did not: silence, which is not a resume yet, but the
        // session is up once the server has answered the agent's check.
        until(Duration::from_secs(10), "established again", async || {
            counter(m, "sessions_established") == 2
        })
        .await;
        assert_eq!(counter(m, "resumes"), 0, "silence is not a resume");
        assert_eq!(
            counter(m, "resumes_silent"),
            0,
            "api: live on the server's answer, but whether it resumed is open until the session ends"
        );
        // The next api event proves the resume.
        api2.put(
            "/v1/catalog/register",
            Bytes::from(
                r#"{"Node":"sim-node-4","Address":"10.9.0.4","Service":{"ID":"api-2","Service":"api","Port":8080}}"#,
            ),
        )
        .await
        .unwrap();
        until(Duration::from_secs(5), "a resume", async || {
            counter(m, "resumes") == 1
        })
        .await;
        token.cancel();
    })
    .await;
    assert_eq!(end, SessionEnd::Shutdown);
    assert_eq!(counter(m, "subscriptions"), 4);
    assert_eq!(counter(m, "snapshots"), 3, "api must not re-snapshot");
    assert_eq!(
        counter(m, "resumes_silent"),
        0,
        "api's event proved a resume: counted once, as a resume"
    );
    assert_eq!(counter(m, "anti_entropy_syncs"), 1, "one leader check");
    assert_eq!(agent.view_len("web"), Some(1), "web-2 deregistered");
    assert_eq!(
        agent.view_len("api"),
        Some(2),
        "api-2 arrived on the resumed stream"
    );
    let ts = t.state.stats();
    assert_eq!(ts.resumes_served, 1);
    assert_eq!(ts.snapshots_sent, 3);

    // Nothing changes while it is away: both streams resume and stay
    // silent, counted as silent resumes when the session ends.
    let third = (Duration::from_secs(10), "established a third time");
    let end = session_until(&mut agent, m, third, async || {
        counter(m, "sessions_established") == 3
    })
    .await;
    assert_eq!(end, SessionEnd::Shutdown);
    assert_eq!(counter(m, "resumes_silent"), 2);
    assert_eq!(counter(m, "resumes"), 1);
    assert_eq!(counter(m, "snapshots"), 3);
}

#[tokio::test(start_paused = true)]
async fn aborted_streams_resubscribe_at_once_then_with_backoff() {
    let t = start_target().await;
    let m_owned = metrics();
    let m = &m_owned;
    let factory = ConsulFactory::new(subscriber(&t), m.clone()).unwrap();
    let mut agent = factory.create(0);
    let state = t.state.clone();
    let end = with_session(&mut agent, m, |token| async move {
        until(Duration::from_secs(5), "snapshots", async || {
            counter(m, "snapshots") == 2
        })
        .await;
        state.abort_subscriptions();
        until(Duration::from_secs(5), "first re-snapshots", async || {
            counter(m, "aborts") == 2 && counter(m, "snapshots") == 4
        })
        .await;
        state.abort_subscriptions();
        // The second abort backs off ≤ 200 ms before resubscribing.
        until(Duration::from_secs(5), "second re-snapshots", async || {
            counter(m, "aborts") == 4 && counter(m, "snapshots") == 6
        })
        .await;
        token.cancel();
    })
    .await;
    assert_eq!(
        end,
        SessionEnd::Shutdown,
        "ABORTED does not lose the session"
    );
    assert_eq!(counter(m, "subscriptions"), 6);
    assert_eq!(agent.view_len("web"), Some(2));
    assert_eq!(agent.view_len("api"), Some(1));
    assert!(m.snapshot().errors.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_session_expires_when_renewals_stop_and_is_recreated() {
    let t = start_target().await;
    let m_owned = metrics();
    let m = &m_owned;
    let cfg = ConsulConfig {
        session_ttl: Some(Duration::from_secs(10)),
        ..config(&t)
    };
    let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
    let mut agent = factory.create(0);
    let created = (Duration::from_secs(5), "session created");
    let end = session_until(&mut agent, m, created, async || {
        counter(m, "sessions_created") == 1
    })
    .await;
    assert_eq!(end, SessionEnd::Shutdown);
    assert_eq!(counter(m, "registrations"), 1);
    // No session runs, so nobody renews: the server expires it after 2 × TTL.
    let state = t.state.clone();
    until(Duration::from_secs(30), "server-side expiry", async || {
        state.stats().sessions_expired >= 1
    })
    .await;
    let recreated = (
        Duration::from_secs(5),
        "expiry noticed and session recreated",
    );
    let end = session_until(&mut agent, m, recreated, async || {
        counter(m, "sessions_expired") == 1 && counter(m, "sessions_created") == 2
    })
    .await;
    assert_eq!(end, SessionEnd::Shutdown);
    assert_eq!(counter(m, "registrations"), 1, "registered once");
    let cx = SessionCx::standalone(0, m.clone(), CancellationToken::new());
    agent.finish(&cx).await;
    assert_eq!(counter(m, "deregistrations"), 1);
    assert!(m.snapshot().errors.is_empty(), "{:?}", m.snapshot().errors);
    // A warning, in the server's words.
    let w = m.warning_report();
    let expired = w
        .iter()
        .find(|k| k.kind == "session_expired")
        .expect("warned");
    assert_eq!(expired.stat.count, 1);
    let words = expired.stat.sample.as_deref().unwrap_or_default();
    assert!(words.contains("not found"), "{words}");
}

#[tokio::test(start_paused = true)]
async fn checks_flap_through_catalog_register() {
    let t = start_target().await;
    let m_owned = metrics();
    let m = &m_owned;
    let cfg = ConsulConfig {
        flap_rate: Some(Rate::per_second(20.0)),
        session_ttl: None,
        ..config(&t)
    };
    let factory = ConsulFactory::new(cfg, m.clone()).unwrap();
    let mut agent = factory.create(3);
    with_session(&mut agent, m, |token| async move {
        until(Duration::from_secs(5), "flaps", async || {
            counter(m, "flaps") >= 4
        })
        .await;
        token.cancel();
    })
    .await;
    assert!(m.snapshot().errors.is_empty(), "{:?}", m.snapshot().errors);
}

#[tokio::test(start_paused = true)]
async fn agent_and_session_future_stay_small() {
    let m_owned = metrics();
    let m = &m_owned;
    let factory = ConsulFactory::new(ConsulConfig::default(), m.clone()).unwrap();
    let mut agent = factory.create(0);
    let agent_size = std::mem::size_of_val(&agent);
    let cx = SessionCx::standalone(0, m.clone(), CancellationToken::new());
    let fut = agent.run_session(&cx);
    let fut_size = std::mem::size_of_val(&*fut);
    drop(fut);
    eprintln!("agent {agent_size} B, session future {fut_size} B");
    assert!(agent_size <= 128, "agent struct {agent_size} bytes");
    assert!(fut_size <= 2048, "session future {fut_size} bytes");
}

/// Probe arrivals are the kernel's receive times of the agents' sockets
/// (loopback stamps every read): no delivery falls back to user time, each
/// has its overhead (processed − kernel arrival) recorded, and the write's
/// round trip is reported apart from T0. Real time: the kernel clock is.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_arrivals_are_timed_at_the_socket() {
    let t = start_target().await;
    let m = metrics();
    let cfg = ConsulConfig {
        probe: probe(ProbeKind::Catalog, ms(1000), ms(800)),
        ..config(&t)
    };
    let (_, probes) = run_fleet(cfg, fleet_of(50, Some(5000.0), ms(2600)), &m).await;
    assert!(!probes.is_empty());
    let delivered: u64 = probes.iter().map(|p| p.delivered).sum();
    assert!(delivered >= 50, "{probes:?}");
    assert_eq!(
        counter(&m, "arrivals_user_time"),
        0,
        "every arrival kernel-stamped"
    );
    m.collect();
    let count = |name: &str| m.cumulative_of(name).unwrap().len();
    assert_eq!(count("probe_overhead"), delivered);
    assert_eq!(count("probe_write"), probes.len() as u64);
    assert!(count("propagation") >= delivered);
}
