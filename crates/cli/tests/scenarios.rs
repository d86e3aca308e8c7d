//! Scenarios end to end with real sockets on 127.0.0.1: storms, the
//! synchronized burst of `--reconnect none`, churn, and a backend restart
//! without state, through the same path as the binary (`RunBuilder`), with
//! the reconvergence figures read from the summary.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};
use agent_sim_metrics::disruption::{DisruptionSummary, spread};
use agent_sim_server::sensu::{SensuTargetConfig, SensuTargetStats};
use tokio_util::sync::CancellationToken;

use crate::common::{assert_exit, temp_path};
use agent_sim_testkit::bounded::until;

/// The only disruption of a run, of `cause`.
fn only(s: &agent_sim::Summary, cause: &str) -> DisruptionSummary {
    assert_eq!(s.disruptions.len(), 1, "{:#?}", s.disruptions);
    let d = s.disruptions[0].clone();
    assert_eq!(d.cause, cause, "{d:#?}");
    d
}

/// A Sensu backend of our own on `addr` (port 0: any), stopped by `stop`.
async fn sensu_backend(
    addr: std::net::SocketAddr,
    stop: CancellationToken,
) -> (std::net::SocketAddr, Arc<SensuTargetStats>) {
    let listener = agent_sim_server::listen::bind(addr, false).unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(SensuTargetStats::default());
    tokio::spawn(agent_sim_server::sensu::serve(
        listener,
        SensuTargetConfig::default(),
        stats.clone(),
        stop,
    ));
    (addr, stats)
}

/// A token cancelled once `stats` has `keepalives` keepalives (each agent
/// sends one right after it is connected, then one a minute), or after a
/// minute (the test then fails on its figures): a run that ends when the
/// fleet is back, however busy the test machine is.
fn when_back(stats: Arc<SensuTargetStats>, keepalives: u64) -> CancellationToken {
    let t = CancellationToken::new();
    let fire = t.clone();
    tokio::spawn(async move {
        // Fired when they are in, or after a minute.
        let _fire = fire.drop_guard();
        until(Duration::from_secs(60), "the keepalives", async move || {
            stats.keepalives_received.load(Ordering::Relaxed) >= keepalives
        })
        .await;
        // The last keepalive's agent is connected: it sent it after that.
    });
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_storm_of_2000_sensu_agents_recovers_spread_over_the_backoff() {
    let summary_path = temp_path("storm-sensu.json");
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (addr, stats) = sensu_backend("127.0.0.1:0".parse().unwrap(), stop).await;
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(2000)
        .target(addr.to_string())
        .ramp(Ramp::per_second(2000.0))
        .shutdown(when_back(stats.clone(), 4000))
        .args(|a| {
            a.storms = vec!["at=6s,drop=100%".parse().unwrap()];
            // Equal jitter (not Sensu's default, sensu-agent, whose first
            // attempt after a held session goes at once).
            a.reconnect = Some("exponential".parse().unwrap());
            a.reconnect_min = Some("2s".parse().unwrap());
            a.keepalive_interval = Some("60s".parse().unwrap());
            a.summary = Some(summary_path.clone());
        })
        .assert("disruptions.missing == 0".parse().unwrap())
        .assert("reconvergence.min >= 1s".parse().unwrap())
        .run()
        .await
        .expect("run");
    let s = &outcome.summary;
    assert_exit(&outcome, 0);
    assert_eq!(s.agents.connected, 2000);
    assert_eq!(s.sessions_lost["scenario_storm"], 2000);
    assert!(
        s.errors.is_empty(),
        "a storm is not an error: {:?}",
        s.errors
    );
    let d = only(s, "storm");
    assert_eq!((d.fleet.as_str(), d.began_s), ("sensu", 6.0));
    assert_eq!(d.sessions_lost, 2000, "every agent was connected by 6 s");
    assert_eq!((d.back, d.attempts), (2000, 2000));
    // Each agent waited its jittered first delay, uniform in [1 s, 2 s]
    // (--reconnect-min 2s): the comeback is spread over that window.
    let l = &d.reconnect_us;
    assert!(l.min >= 1_000_000, "{l:?}");
    let sp = spread(l).unwrap();
    assert!(sp >= 500_000, "p90 − p10 = {sp} µs: {l:?}");
    let b = &d.back_after_s;
    assert!(
        b.p50.unwrap() >= 1.0 && b.p50 <= b.p90 && b.p99 <= b.p100,
        "{b:?}"
    );
    // The file has them too, and validates.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    assert_eq!(v["disruptions"][0]["sessions_lost"], 2000);
    agent_sim_testkit::validate_json(agent_sim_metrics::SUMMARY_SCHEMA, &v).unwrap();
    let table = agent_sim_metrics::report::render(s);
    assert!(table.contains("storm (sensu)"), "{table}");
    let _ = std::fs::remove_file(&summary_path);
}

/// A 100 % storm of `n` Sensu agents at 3 s with `policy`; the disruption.
async fn storm_with(n: u64, policy: &str) -> DisruptionSummary {
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (addr, stats) = sensu_backend("127.0.0.1:0".parse().unwrap(), stop).await;
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(n)
        .target(addr.to_string())
        .ramp(Ramp::All)
        .shutdown(when_back(stats, 2 * n))
        .args(|a| {
            a.storms = vec!["at=3s".parse().unwrap()];
            a.reconnect = Some(policy.parse().unwrap());
            a.reconnect_min = Some("2s".parse().unwrap());
            a.keepalive_interval = Some("60s".parse().unwrap());
        })
        .run()
        .await
        .expect("run");
    assert_eq!(outcome.exit_code, 0, "{policy}: {:?}", outcome.problem);
    let d = only(&outcome.summary, "storm");
    assert_eq!((d.sessions_lost, d.back), (n, n), "{policy}");
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_none_comes_back_in_one_synchronized_burst() {
    let jittered = storm_with(300, "exponential").await;
    let burst = storm_with(300, "none").await;
    let (j, b) = (&jittered.reconnect_us, &burst.reconnect_us);
    // Without a delay every agent is back within the handshakes of the
    // burst; with jitter they spread over [1 s, 2 s].
    assert!(b.max < j.min, "none {b:?} vs exponential {j:?}");
    let (sj, sb) = (spread(j).unwrap(), spread(b).unwrap());
    assert!(
        sb * 4 < sj,
        "the spread collapses: none {sb} µs vs exponential {sj} µs"
    );
}

/// 20 % of 300 every 2 s: at most 204 sessions ended (30/s from 0 s until
/// 1.2 s before the 8 s run's end: the 200 ms delay + 1 s handshake).
const CHURN_AT_MOST: u64 = 204;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_holds_the_connected_count_within_its_band() {
    // 20 % of 300 every 2 s: one session every 33 ms, each away for its
    // jittered delay of [100 ms, 200 ms] plus a handshake. The exact band
    // (how many are away at once) is checked on paused time in the fleet
    // crate (`crates/fleet/tests/scenarios.rs`, same name); here, through
    // real sockets on a machine however busy, bounds the schedule itself
    // sets: never more than one period's share away at once.
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (addr, stats) = sensu_backend("127.0.0.1:0".parse().unwrap(), stop).await;
    let low = Arc::new(AtomicI64::new(i64::MAX));
    let (l, st) = (low.clone(), stats.clone());
    // The run ends 8 s after this at the earliest; a sample read before
    // 7 s is one of the churn, never of the shutdown.
    let last = tokio::time::Instant::now() + Duration::from_secs(7);
    let sampler = tokio::spawn(async move {
        // From when the fleet is in (churn runs from the start, so it
        // never holds all 300 at once).
        let fleet = st.clone();
        until(Duration::from_secs(60), "the fleet in", async move || {
            fleet.sessions_active.load(Ordering::Relaxed) >= 270
        })
        .await;
        let mut samples = 0;
        loop {
            let active = st.sessions_active.load(Ordering::Relaxed);
            if tokio::time::Instant::now() >= last {
                return samples;
            }
            l.fetch_min(active, Ordering::Relaxed);
            samples += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(300)
        .target(addr.to_string())
        .ramp(Ramp::All)
        .duration(Duration::from_secs(8))
        .args(|a| {
            a.churn = Some("20%/2s".parse().unwrap());
            a.reconnect = Some("exponential".parse().unwrap());
            a.reconnect_min = Some("200ms".parse().unwrap());
        })
        .run()
        .await
        .expect("run");
    assert!(sampler.await.unwrap() > 0, "no sample while churning");
    let low = low.load(Ordering::Relaxed);
    // One period's share is 60: a churn that took more away at once would
    // be a storm.
    assert!(
        (240..=300).contains(&low),
        "server saw as few as {low} sessions"
    );
    let s = &outcome.summary;
    assert_exit(&outcome, 0);
    // Never more than the schedule; a late tick ends every session that
    // was due, so only a driver that never woke in the run's last 1.2 s
    // could end fewer than the schedule's half.
    let churned = s.sessions_lost["scenario_churn"];
    assert!(
        (CHURN_AT_MOST / 2..=CHURN_AT_MOST).contains(&churned),
        "{churned}"
    );
    let d = only(s, "churn");
    assert_eq!((d.sessions_lost, d.back), (churned, churned));
    // Each back within a period (the ones still away then would not be
    // back before the end).
    assert!(d.reconnect_us.max < 2_000_000, "{:?}", d.reconnect_us);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sensu_backend_restart_is_detected_and_recovered() {
    let stop = CancellationToken::new();
    let (addr, stats) = sensu_backend("127.0.0.1:0".parse().unwrap(), stop.clone()).await;
    let restarted = CancellationToken::new();
    let done = CancellationToken::new();
    let (r, st, d) = (restarted.clone(), stats.clone(), done.clone());
    tokio::spawn(async move {
        until(Duration::from_secs(60), "300 keepalives", async move || {
            st.keepalives_received.load(Ordering::Relaxed) >= 300
        })
        .await;
        // Stop (every session gets close 1001), stay down 1 s, and come
        // back on the same port with a fresh backend; the run ends when
        // every agent has sent it a keepalive.
        stop.cancel();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (_, fresh) = sensu_backend(addr, r.clone()).await;
        when_back(fresh, 300).cancelled().await;
        d.cancel();
    });
    let _restarted = restarted.drop_guard();
    // Bounded whatever happens to the restart.
    let cap = done.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(90)).await;
        cap.cancel();
    });
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(300)
        .target(addr.to_string())
        .ramp(Ramp::All)
        .shutdown(done)
        .args(|a| {
            a.reconnect_min = Some("500ms".parse().unwrap());
            a.keepalive_interval = Some("60s".parse().unwrap());
        })
        .run()
        .await
        .expect("run");
    let s = &outcome.summary;
    assert_exit(&outcome, 0);
    assert_eq!(s.agents.connected, 300);
    let d = only(s, "backend");
    assert_eq!(
        (d.fleet.as_str(), d.sessions_lost, d.back),
        ("sensu", 300, 300)
    );
    assert!(d.missing_at_end.is_empty());
    // Nobody is back before the backend (down 1 s after it closed the
    // sessions, which agents notice a little later on a busy machine).
    assert!(d.reconnect_us.min >= 500_000, "{:?}", d.reconnect_us);
    assert!(d.attempts >= 300);
    assert!(s.sessions_lost["ws_closed"] == 300, "{:?}", s.sessions_lost);
}
