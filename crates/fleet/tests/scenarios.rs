//! The scenario timeline and the reconvergence report, driven on paused
//! tokio time with a fake protocol (a fake backend that can drop every
//! session and refuse connections for a while, like a restart).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sim_fleet::scenario::{PhaseSpec, What};
use agent_sim_fleet::{
    Agent, AgentFactory, Backoff, BoxFuture, FleetConfig, FleetReport, FleetStatus, Rate,
    ReconnectPolicy, Scenario, SessionCx, SessionEnd,
};
use agent_sim_metrics::Metrics;
use agent_sim_metrics::disruption::{DisruptionSummary, spread};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Time a fake handshake takes.
const CONNECT: Duration = Duration::from_millis(10);
/// A fake session that misses its heartbeats this long is closed by the
/// fake server (seen when the agent thaws).
const SERVER_TIMEOUT: Duration = Duration::from_secs(2);

/// The fake backend: refuses connections while down; bumping `drops`
/// closes every session.
struct Backend {
    down: AtomicBool,
    drops: watch::Sender<u64>,
}

impl Backend {
    fn new() -> Arc<Self> {
        Arc::new(Backend {
            down: AtomicBool::new(false),
            drops: watch::channel(0).0,
        })
    }

    /// Drops every session and refuses connections for `down`.
    fn restart(self: &Arc<Self>, at: Duration, down: Duration) {
        let b = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(at).await;
            b.down.store(true, Ordering::SeqCst);
            b.drops.send_modify(|n| *n += 1);
            tokio::time::sleep(down).await;
            b.down.store(false, Ordering::SeqCst);
        });
    }
}

/// What the fake agents saw.
#[derive(Default)]
struct Seen {
    /// (agent, how long the session was up) of sessions the engine ended.
    ended: Mutex<Vec<(u64, Duration)>>,
    /// (agent, when) of those ends.
    ended_at: Mutex<Vec<(u64, Instant)>>,
    /// Largest heartbeat gap per agent (ms).
    gaps: Mutex<Vec<u64>>,
    finished: AtomicU64,
}

struct Fake {
    backend: Arc<Backend>,
    seen: Arc<Seen>,
}

impl Agent for Fake {
    fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
        Box::pin(async move {
            let mut drops = self.backend.drops.subscribe();
            tokio::time::sleep(CONNECT).await;
            if self.backend.down.load(Ordering::SeqCst) {
                return SessionEnd::lost_with("connect_refused", "connection refused");
            }
            cx.established();
            let up = Instant::now();
            let mut beat = tokio::time::interval(Duration::from_millis(100));
            let mut last = Instant::now();
            loop {
                tokio::select! {
                    _ = cx.cancel.cancelled() => {
                        self.seen.ended.lock().unwrap().push((cx.index, up.elapsed()));
                        self.seen.ended_at.lock().unwrap().push((cx.index, Instant::now()));
                        return SessionEnd::Shutdown;
                    }
                    _ = drops.changed() => return SessionEnd::lost_with("ws_closed", "backend went away"),
                    _ = beat.tick() => {
                        let gap = last.elapsed();
                        last = Instant::now();
                        let mut g = self.seen.gaps.lock().unwrap();
                        let slot = &mut g[cx.index as usize];
                        *slot = (*slot).max(gap.as_millis() as u64);
                        if gap > SERVER_TIMEOUT {
                            return SessionEnd::lost("pong_timeout");
                        }
                    }
                }
            }
        })
    }

    fn finish<'a>(&'a mut self, _cx: &'a SessionCx) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.seen.finished.fetch_add(1, Ordering::Relaxed);
        })
    }
}

struct Factory {
    backend: Arc<Backend>,
    seen: Arc<Seen>,
}

impl AgentFactory for Factory {
    type Agent = Fake;
    fn create(&self, _index: u64) -> Fake {
        Fake {
            backend: self.backend.clone(),
            seen: self.seen.clone(),
        }
    }
}

fn flag(what: What) -> PhaseSpec {
    PhaseSpec::flag(what, "--test")
}

/// A fleet of `agents` started at once, `secs` long, with `phases`.
fn fleet(
    agents: u64,
    secs: u64,
    policy: ReconnectPolicy,
    min_ms: u64,
    phases: &[What],
) -> FleetConfig {
    let specs: Vec<PhaseSpec> = phases.iter().copied().map(flag).collect();
    let duration = Duration::from_secs(secs);
    FleetConfig {
        agents,
        ramp: None,
        duration: Some(duration),
        backoff: Backoff::with_policy(
            policy,
            Duration::from_millis(min_ms),
            Duration::from_secs(10),
        ),
        scenario: Scenario::plan(&specs, Some(duration), agents, Duration::ZERO).unwrap(),
        label: "fake",
        ..Default::default()
    }
}

struct Run {
    report: FleetReport,
    metrics: Metrics,
    seen: Arc<Seen>,
    status: Arc<FleetStatus>,
}

impl Run {
    fn disruptions(&self) -> Vec<DisruptionSummary> {
        self.metrics.disruptions().summaries()
    }

    fn only(&self, cause: &str) -> DisruptionSummary {
        let d = self.disruptions();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].cause, cause, "{d:?}");
        d[0].clone()
    }
}

async fn run_with(
    cfg: FleetConfig,
    backend: Arc<Backend>,
    sample: impl FnOnce(Arc<FleetStatus>),
) -> Run {
    let metrics = Metrics::new(&agent_sim_fleet::metrics_spec(), 2);
    let seen = Arc::new(Seen {
        gaps: Mutex::new(vec![0; cfg.agents as usize]),
        ..Seen::default()
    });
    let status = Arc::new(FleetStatus::default());
    sample(status.clone());
    let report = agent_sim_fleet::run(
        cfg,
        Arc::new(Factory {
            backend,
            seen: seen.clone(),
        }),
        metrics.clone(),
        status.clone(),
        CancellationToken::new(),
    )
    .await;
    Run {
        report,
        metrics,
        seen,
        status,
    }
}

async fn run(cfg: FleetConfig) -> Run {
    run_with(cfg, Backend::new(), |_| {}).await
}

fn ms(d: u64) -> Duration {
    Duration::from_millis(d)
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

#[tokio::test(start_paused = true)]
async fn a_storm_drops_every_session_and_the_fleet_comes_back_spread_over_the_backoff() {
    let r = run(fleet(
        200,
        12,
        ReconnectPolicy::Exponential,
        1000,
        &[What::Storm("at=5s,drop=100%".parse().unwrap())],
    ))
    .await;
    assert_eq!(r.report.connected_at_end, 200);
    assert_eq!(r.report.sessions_lost["scenario_storm"], 200);
    assert!(
        r.metrics.snapshot().errors.is_empty(),
        "a storm is not an error"
    );
    assert!(r.report.missing.is_empty());
    let d = r.only("storm");
    assert_eq!((d.fleet.as_str(), d.began_s), ("fake", 5.0));
    assert_eq!((d.sessions_lost, d.back, d.attempts), (200, 200, 200));
    assert!(d.missing_at_end.is_empty());
    // Loss → back = the first delay (equal jitter over [0.5 s, 1 s]) plus
    // the handshake; spread over that window, not one instant.
    let l = &d.reconnect_us;
    assert_eq!(l.count, 200);
    assert!(
        l.min >= us(ms(500) + CONNECT) && l.max <= us(ms(1000) + CONNECT) + 1000,
        "{l:?}"
    );
    let sp = spread(l).unwrap();
    assert!(sp >= 300_000, "p90 − p10 = {sp} µs");
    // The quantile times are read against the 200 lost.
    let b = &d.back_after_s;
    let (p50, p100) = (b.p50.unwrap(), b.p100.unwrap());
    assert!(
        (0.7..0.85).contains(&p50) && (0.95..=1.02).contains(&p100),
        "{b:?}"
    );
    assert!(b.p90.unwrap() <= b.p99.unwrap() && b.p99.unwrap() <= p100);
}

#[tokio::test(start_paused = true)]
async fn reconnect_policies_set_the_shape_of_the_comeback() {
    let storm = [What::Storm("at=3s".parse().unwrap())];
    // none: every agent is back one handshake after the storm, all at once.
    let r = run(fleet(100, 6, ReconnectPolicy::None, 1000, &storm)).await;
    let d = r.only("storm");
    assert_eq!(d.back, 100);
    let l = &d.reconnect_us;
    assert!(
        l.min == us(CONNECT) && l.max.abs_diff(us(CONNECT)) <= 10,
        "{l:?}"
    );
    assert_eq!(spread(&d.reconnect_us), Some(0), "the synchronized burst");
    // fixed: exactly the minimum every time, just as synchronized.
    let r = run(fleet(100, 6, ReconnectPolicy::Fixed, 1000, &storm)).await;
    let l = r.only("storm").reconnect_us;
    let want = us(ms(1000) + CONNECT);
    assert!(
        l.min.abs_diff(want) <= want / 500 && l.max.abs_diff(want) <= want / 500,
        "{l:?}"
    );
    // full jitter: anywhere in [0, 1 s].
    let r = run(fleet(100, 6, ReconnectPolicy::FullJitter, 1000, &storm)).await;
    let l = r.only("storm").reconnect_us;
    assert!(
        l.min < 250_000 && l.max <= us(ms(1000) + CONNECT) + 1000,
        "{l:?}"
    );
    assert!(spread(&l).unwrap() >= 500_000, "{l:?}");
}

#[tokio::test(start_paused = true)]
async fn churn_holds_the_connected_count_within_its_band() {
    // 10 % of 200 every second: one session every 50 ms, each back after
    // 100 ms + the handshake (110 ms), so 2 or 3 are away at any time.
    let low = Arc::new(AtomicU64::new(u64::MAX));
    let high = Arc::new(AtomicU64::new(0));
    let (l, h) = (low.clone(), high.clone());
    let r = run_with(
        fleet(
            200,
            10,
            ReconnectPolicy::Fixed,
            100,
            &[What::Churn("10%/1s".parse().unwrap())],
        ),
        Backend::new(),
        move |status| {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                for _ in 0..600 {
                    let c = status.connected.load(Ordering::Relaxed).max(0) as u64;
                    l.fetch_min(c, Ordering::Relaxed);
                    h.fetch_max(c, Ordering::Relaxed);
                    tokio::time::sleep(ms(10)).await;
                }
            });
        },
    )
    .await;
    let (low, high) = (low.load(Ordering::Relaxed), high.load(Ordering::Relaxed));
    assert!(
        low >= 197 && high <= 198,
        "connected within [{low}, {high}]"
    );
    // Churn stops 1 s (10 % of the run) before the end: 9 s × 20/s.
    let churned = r.report.sessions_lost["scenario_churn"];
    assert!((178..=180).contains(&churned), "{churned}");
    assert_eq!(r.report.connected_at_end, 200, "settled before the end");
    let d = r.only("churn");
    assert_eq!((d.sessions_lost, d.back), (churned, churned));
    assert!(d.note.unwrap().contains("10%"));
    assert_eq!(
        r.status.connected.load(Ordering::Relaxed),
        0,
        "closed at shutdown"
    );
}

#[tokio::test(start_paused = true)]
async fn sessions_end_after_their_jittered_max_length() {
    let t0 = Instant::now();
    let r = run(fleet(
        50,
        11,
        ReconnectPolicy::Exponential,
        100,
        &[What::MaxSessionLength(Duration::from_secs(2))],
    ))
    .await;
    // Sessions the scenario ended (not those closed at the end of the run).
    let ends = r.seen.ended_at.lock().unwrap().clone();
    let ended: Vec<(u64, Duration)> = r
        .seen
        .ended
        .lock()
        .unwrap()
        .iter()
        .zip(ends)
        .filter(|(_, (_, at))| *at - t0 < Duration::from_secs(11))
        .map(|(e, _)| *e)
        .collect();
    // Sessions up at 10 ms end within 2 s ± 10 % (checked every 20 ms);
    // the phase stops at 9.9 s, so each agent has 4 or 5 of them.
    assert!(
        ended.len() >= 50 * 4 && ended.len() <= 50 * 5,
        "{}",
        ended.len()
    );
    for (i, d) in &ended {
        assert!(*d >= ms(1800) && *d <= ms(2220), "agent {i}: {d:?}");
    }
    let lengths: std::collections::HashSet<_> = ended.iter().map(|(_, d)| d.as_millis()).collect();
    assert!(lengths.len() > 20, "jittered, not one length");
    assert_eq!(
        r.report.sessions_lost["max_session_length"],
        ended.len() as u64
    );
    assert!(r.metrics.snapshot().errors.is_empty());
    assert_eq!(r.report.connected_at_end, 50);
    let d = r.only("max_session_length");
    assert_eq!(
        (d.sessions_lost, d.back),
        (ended.len() as u64, ended.len() as u64)
    );
}

#[tokio::test(start_paused = true)]
async fn a_pause_freezes_the_chosen_agents_and_the_rest_go_on() {
    let r = run(fleet(
        100,
        15,
        ReconnectPolicy::Exponential,
        200,
        &[What::Pause("at=3s,for=5s,share=30%".parse().unwrap())],
    ))
    .await;
    let gaps = r.seen.gaps.lock().unwrap().clone();
    let frozen: Vec<u64> = gaps.iter().copied().filter(|g| *g > 1000).collect();
    assert_eq!(frozen.len(), 30, "{gaps:?}");
    // Frozen from their first tick after 3 s until 8 s: no heartbeat from
    // the last one before it (2.91 s), then every missed timer at once.
    assert!(
        frozen.iter().all(|g| (4_900..=5_100).contains(g)),
        "{frozen:?}"
    );
    assert!(
        gaps.iter().filter(|g| **g <= 1000).all(|g| *g <= 100),
        "{gaps:?}"
    );
    // The fake server closed them (missed heartbeats): found on thawing,
    // and they came back.
    assert_eq!(r.report.sessions_lost["pong_timeout"], 30);
    assert_eq!(r.report.connected_at_end, 100);
    let d = r.only("pause");
    assert_eq!((d.began_s, d.sessions_lost, d.back), (3.0, 30, 30));
    assert_eq!(d.note.as_deref(), Some("30 agent(s) frozen for 5s"));
}

#[tokio::test(start_paused = true)]
async fn ramp_down_lets_every_agent_leave_politely_and_is_not_a_disruption() {
    let t0 = Instant::now();
    let r = run(fleet(
        100,
        5,
        ReconnectPolicy::Exponential,
        500,
        &[What::RampDown("50/s".parse().unwrap())],
    ))
    .await;
    assert_eq!(r.report.left, 100);
    assert_eq!(r.report.connected_at_end, 0);
    assert!(r.report.missing.is_empty(), "{:?}", r.report.missing);
    assert_eq!(r.report.lost_not_back, 0);
    assert_eq!(r.report.sessions_lost["ramp_down"], 100);
    assert_eq!(
        r.seen.finished.load(Ordering::Relaxed),
        100,
        "every agent finished (Consul: deregistered)"
    );
    assert!(r.disruptions().is_empty());
    // 100 agents at 50/s, ending with the run: from 3 s to 5 s.
    let at = r.seen.ended_at.lock().unwrap().clone();
    assert_eq!(at.len(), 100);
    for (_, t) in at {
        let s = t - t0;
        assert!(
            s >= Duration::from_secs(3) && s <= Duration::from_secs(5),
            "{s:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_restart_is_detected_and_its_reconvergence_measured() {
    let backend = Backend::new();
    backend.restart(Duration::from_secs(4), Duration::from_secs(2));
    let cfg = fleet(200, 12, ReconnectPolicy::Exponential, 500, &[]);
    let r = run_with(cfg, backend, |_| {}).await;
    assert_eq!(r.report.connected_at_end, 200);
    assert_eq!(r.report.sessions_lost["ws_closed"], 200);
    let d = r.only("backend");
    assert_eq!(
        (d.fleet.as_str(), d.sessions_lost, d.back),
        ("fake", 200, 200)
    );
    assert!((d.began_s - 4.0).abs() < 0.001, "{}", d.began_s);
    // Nobody can be back before the backend is (2 s), and each agent tried
    // at least twice (refused while it was down).
    let b = &d.back_after_s;
    assert!(b.p50.unwrap() >= 2.0 && b.p100.unwrap() < 6.0, "{b:?}");
    assert!(d.attempts >= 400, "{}", d.attempts);
    // Exactly 2 s when an agent's retry meets the backend's return; the
    // histogram keeps 3 significant digits (2,000,000 µs reads 1,999,872).
    assert!(d.reconnect_us.min >= 1_998_000, "{:?}", d.reconnect_us);
    assert!(r.metrics.snapshot().errors["connect_refused"] > 0);
}

#[tokio::test(start_paused = true)]
async fn a_few_sessions_lost_on_their_own_are_not_a_disruption() {
    // 4 of 100 agents lose their session (below 5 % within a second).
    struct Flaky(u64);
    impl Agent for Flaky {
        fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
            Box::pin(async move {
                tokio::time::sleep(CONNECT).await;
                cx.established();
                if cx.index < 4 && cx.attempt == 0 {
                    tokio::time::sleep(Duration::from_secs(2) + ms(self.0)).await;
                    return SessionEnd::lost("ws_reset");
                }
                cx.cancel.cancelled().await;
                SessionEnd::Shutdown
            })
        }
    }
    struct Flakies;
    impl AgentFactory for Flakies {
        type Agent = Flaky;
        fn create(&self, index: u64) -> Flaky {
            Flaky(index * 100)
        }
    }
    let m = Metrics::new(&agent_sim_fleet::metrics_spec(), 1);
    let report = agent_sim_fleet::run(
        FleetConfig {
            agents: 100,
            ramp: None,
            duration: Some(Duration::from_secs(5)),
            ..Default::default()
        },
        Arc::new(Flakies),
        m.clone(),
        Arc::new(FleetStatus::default()),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(report.sessions_lost["ws_reset"], 4);
    assert!(m.disruptions().summaries().is_empty());
}

#[tokio::test(start_paused = true)]
async fn agents_not_back_at_the_end_are_missing_by_cause() {
    // A storm 2 s before the end; the fixed 5 s backoff keeps them away.
    let r = run(fleet(
        50,
        5,
        ReconnectPolicy::Fixed,
        5000,
        &[What::Storm("at=3s".parse().unwrap())],
    ))
    .await;
    assert_eq!(r.report.connected_at_end, 0);
    assert_eq!(r.report.missing["scenario_storm"], 50);
    assert_eq!(r.report.lost_not_back, 50);
    let d = r.only("storm");
    assert_eq!((d.sessions_lost, d.back), (50, 0));
    assert_eq!(d.missing_at_end["scenario_storm"], 50);
    assert_eq!(d.back_after_s.p50, None);
}

#[tokio::test(start_paused = true)]
async fn a_partial_storm_drops_its_share_of_the_connected_sessions() {
    let r = run(fleet(
        200,
        6,
        ReconnectPolicy::Exponential,
        200,
        &[What::Storm("at=2s,drop=25%".parse().unwrap())],
    ))
    .await;
    assert_eq!(r.report.sessions_lost["scenario_storm"], 50);
    assert_eq!(r.only("storm").back, 50);
    let _ = Rate::per_second(1.0);
}
