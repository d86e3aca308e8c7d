//! The engine: [`run`] starts a fleet's agents on a paced ramp, gives each
//! a task that runs its sessions one after the other (a dial slot from the
//! semaphore, the session, a backoff), runs the scenario driver beside
//! them, and ends everything with a bounded grace period.
//!
//! How the parts talk, one way: this module owns the tasks and the clock
//! of the run; `driver` (the scenario's clock) and each agent task tell
//! the `ledger` (per-agent state) what happened; the ledger answers what
//! to do next ([`crate::ledger`]'s `Next`) and never calls back.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sim_metrics::{CounterId, Metrics};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::ceiling::Ceilings;
use crate::driver;
use crate::freeze::{Freezer, Frozen};
use crate::ledger::{Ledger, LedgerSetup, Next};
use crate::outcome::{COUNTER_RECONNECT_ATTEMPTS, SessionEnd, Stopped};
use crate::scenario::Scenario;
use crate::servers::ServerBoard;
use crate::session::{Agent, AgentFactory, SessionCx};
use crate::units::Rate;

/// Tunables of the engine (all validated by the caller).
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Agents this process runs.
    pub agents: u64,
    /// Global index of the first agent (shards get disjoint ranges).
    pub first_index: u64,
    /// Agents started per second; `None` starts them all at once.
    pub ramp: Option<Rate>,
    /// Most dials + handshakes in flight at once.
    pub max_dialing: usize,
    /// Delay between sessions of one agent.
    pub backoff: Backoff,
    /// How long the run lasts from its first dial; `None` until cancelled.
    pub duration: Option<Duration>,
    /// How long sessions get to close after cancellation.
    pub grace: Duration,
    /// Source addresses, used round-robin by agent index; empty = OS choice.
    pub source_addrs: Vec<IpAddr>,
    /// Stop the run at the first failure whose kind cannot heal by itself
    /// (declared `heals: false`: bad credentials, unknown namespace, ACL
    /// denied, wrong protocol on the port).
    pub fail_fast: bool,
    /// When no agent ever held a session, the fleet stops once every agent
    /// has failed at least twice with a cause that cannot heal by itself,
    /// the first of them at least this long ago (a real backend refuses a
    /// namespace it has just created for a few seconds).
    pub give_up_after: Duration,
    /// What the run does to its sessions besides holding them (resolved by
    /// [`Scenario::plan`]; times from the fleet's first dial).
    pub scenario: Scenario,
    /// Name of the fleet in the disruption reports (its protocol, e.g. `sensu`).
    pub label: &'static str,
    /// The run's servers (its targets, in order): with two or more, where
    /// the sessions are is kept per server ([`FleetStatus::servers`]).
    pub servers: Vec<String>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            agents: 1,
            first_index: 0,
            ramp: Some(Rate::per_second(500.0)),
            max_dialing: 256,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            duration: None,
            grace: Duration::from_secs(5),
            source_addrs: Vec::new(),
            fail_fast: false,
            give_up_after: Duration::from_secs(10),
            scenario: Scenario::default(),
            label: "fleet",
            servers: Vec::new(),
        }
    }
}

/// A setting of [`FleetConfig`] the engine cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidFleetConfig {
    /// The field (`agents`, `max_dialing`, `reconnect_max`, ...).
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl FleetConfig {
    /// Checks the engine's own rules (the protocol crates check theirs).
    pub fn validate(&self) -> Result<(), InvalidFleetConfig> {
        let bad = |field: &'static str, reason: &str| {
            Err(InvalidFleetConfig {
                field,
                reason: reason.into(),
            })
        };
        if self.agents == 0 {
            return bad("agents", "must be at least 1");
        }
        if self.max_dialing == 0 {
            return bad("max_dialing", "must be at least 1");
        }
        if self.backoff.max() < self.backoff.min() {
            return bad("reconnect_max", "must be at least the reconnect minimum");
        }
        if let Some(r) = self.ramp
            && !(r.as_per_second().is_finite() && r.as_per_second() > 0.0)
        {
            return bad("ramp", "must be a positive rate");
        }
        Ok(())
    }
}

/// Live progress of a run, readable while it runs.
#[derive(Debug, Default)]
pub struct FleetStatus {
    /// Agents whose task has started.
    pub started: AtomicU64,
    /// Agents that established at least one session.
    pub ever_connected: Arc<AtomicU64>,
    /// Sessions of this fleet established right now (the metrics gauge
    /// counts every fleet of the run).
    pub connected: Arc<AtomicI64>,
    /// Set once every agent has been started.
    pub ramp_done: AtomicBool,
    /// Microseconds from the first start to the last (set with `ramp_done`).
    pub ramp_us: AtomicU64,
    /// Sessions per server, when the run has several servers (set when the
    /// run starts).
    pub servers: std::sync::OnceLock<Arc<ServerBoard>>,
}

/// What [`run`] returns.
#[derive(Debug, Clone)]
pub struct FleetReport {
    /// Agents requested of this process.
    pub requested: u64,
    /// Agents holding a session when shutdown began.
    pub connected_at_end: u64,
    /// Agents that established at least one session.
    pub ever_connected: u64,
    /// Time from the first agent start to the last.
    pub ramp_elapsed: Option<Duration>,
    /// Time from the first agent start until every agent had been connected
    /// once (if that happened).
    pub all_connected_after: Option<Duration>,
    /// Time from the first start to the end of shutdown.
    pub elapsed: Duration,
    /// Agent tasks that had not finished when the grace period ran out.
    pub unfinished: u64,
    /// Agents that held a session, lost it, and were not back at the end.
    pub lost_not_back: u64,
    /// Agents not holding a session at the end, by their last failure's
    /// kind ([`crate::CAUSE_NO_ANSWER_YET`] when they had none).
    pub missing: BTreeMap<&'static str, u64>,
    /// Established sessions that ended, by cause.
    pub sessions_lost: BTreeMap<&'static str, u64>,
    /// Agents that left on purpose (ramp-down): not connected, not missing.
    pub left: u64,
    /// Why the fleet stopped before the run's end, if it did.
    pub stopped: Option<Stopped>,
    /// Sessions per server when shutdown began (runs with several servers).
    pub servers: Option<crate::servers::ServerCounts>,
}

/// Runs a fleet until `shutdown` is cancelled or `cfg.duration` elapses, then
/// cancels every agent, waits up to `cfg.grace` and returns the report.
pub async fn run<F: AgentFactory>(
    cfg: FleetConfig,
    factory: Arc<F>,
    metrics: Metrics,
    status: Arc<FleetStatus>,
    shutdown: CancellationToken,
) -> FleetReport {
    // Agents get their own tree: the end of the run is decided below, and the
    // sessions gauge is read before any agent sees the cancellation.
    let run_token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let dial_gate = Arc::new(Semaphore::new(cfg.max_dialing.max(1)));
    let start = Instant::now();
    let reconnect_attempts = metrics.counter(COUNTER_RECONNECT_ATTEMPTS);
    let plan = Arc::new(cfg.scenario.clone());
    let freezer = Freezer::new(&plan, cfg.agents, start).map(Arc::new);
    let ledger = Arc::new(Ledger::new(LedgerSetup {
        agents: cfg.agents,
        fail_fast: cfg.fail_fast,
        give_up_after: cfg.give_up_after,
        ever: status.ever_connected.clone(),
        metrics: metrics.clone(),
        start,
        label: cfg.label,
        plan: plan.clone(),
        freezer: freezer.clone(),
    }));
    let mut scenario = driver::start(
        &plan,
        ledger.clone(),
        freezer.clone(),
        cfg.agents,
        start,
        &run_token,
    );
    let all_connected_at = watch_all_connected(status.clone(), cfg.agents, start, &run_token);
    let servers = (cfg.servers.len() > 1).then(|| {
        status
            .servers
            .get_or_init(|| Arc::new(ServerBoard::new(cfg.servers.clone())))
            .clone()
    });
    let template = AgentEnv {
        index: 0,
        ceilings: Arc::new(Ceilings::new(&cfg.source_addrs)),
        bind_addr: None,
        run: run_token.clone(),
        freezer: freezer.clone(),
        metrics: metrics.clone(),
        dial_gate,
        backoff: cfg.backoff.clone(),
        ever: status.ever_connected.clone(),
        live: status.connected.clone(),
        reconnect_attempts,
        grace: cfg.grace,
        ledger: ledger.clone(),
        servers,
        n: 0,
    };
    let spawner = tokio::spawn(ramp(
        factory,
        cfg.clone(),
        start,
        tracker.clone(),
        status.clone(),
        template,
    ));

    // The run ends at the deadline, on external shutdown, or when the
    // ledger stops it (fail-fast, or nothing can ever connect).
    let deadline = async {
        match cfg.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = deadline => {}
        _ = shutdown.cancelled() => {}
        _ = ledger.stop.cancelled() => {}
    }
    let connected_at_end = status.connected.load(Ordering::Relaxed).max(0) as u64;
    let servers_at_end = status.servers.get().map(|b| b.counts());
    let tally = ledger.tally();
    run_token.cancel();
    scenario.abort_all();
    let _ = spawner.await;
    tracker.close();
    let finished = tokio::time::timeout(cfg.grace, tracker.wait())
        .await
        .is_ok();
    let unfinished = if finished { 0 } else { tracker.len() as u64 };
    let ramp_elapsed = status
        .ramp_done
        .load(Ordering::Acquire)
        .then(|| Duration::from_micros(status.ramp_us.load(Ordering::Relaxed)));
    let all_connected_after = *all_connected_at.lock().unwrap_or_else(|p| p.into_inner());
    FleetReport {
        requested: cfg.agents,
        connected_at_end,
        ever_connected: status.ever_connected.load(Ordering::Relaxed),
        ramp_elapsed,
        all_connected_after,
        elapsed: start.elapsed(),
        unfinished,
        lost_not_back: tally.lost_not_back,
        missing: tally.missing,
        sessions_lost: tally.sessions_lost,
        left: tally.left,
        stopped: ledger.stopped(),
        servers: servers_at_end,
    }
}

/// When every agent has connected once (since `start`), looked for every
/// 50 ms until then or until the run ends.
fn watch_all_connected(
    status: Arc<FleetStatus>,
    want: u64,
    start: Instant,
    run: &CancellationToken,
) -> Arc<Mutex<Option<Duration>>> {
    let at: Arc<Mutex<Option<Duration>>> = Arc::new(Mutex::new(None));
    let (t, found) = (run.clone(), at.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = t.cancelled() => return,
            }
            if status.ever_connected.load(Ordering::Relaxed) >= want {
                *found.lock().unwrap_or_else(|p| p.into_inner()) = Some(start.elapsed());
                return;
            }
        }
    });
    at
}

/// Starts the fleet's agents at the ramp's pace until all are started or
/// the run ends, each a task of `tracker` with its copy of `template`; then
/// records how long the ramp took.
async fn ramp<F: AgentFactory>(
    factory: Arc<F>,
    cfg: FleetConfig,
    start: Instant,
    tracker: TaskTracker,
    status: Arc<FleetStatus>,
    template: AgentEnv,
) {
    let run_token = template.run.clone();
    for n in 0..cfg.agents {
        if run_token.is_cancelled() {
            break;
        }
        if let Some(rate) = cfg.ramp {
            let slot = rate.interval();
            // Jitter within the slot keeps starts from lining up on
            // timer ticks while holding the average rate.
            let jitter = slot.mul_f64(fastrand::f64());
            let due = start + slot.mul_f64(n as f64) + jitter;
            if due > Instant::now() {
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    _ = run_token.cancelled() => break,
                }
            }
        }
        let index = cfg.first_index + n;
        let agent = factory.create(index);
        let bind_addr = if cfg.source_addrs.is_empty() {
            None
        } else {
            Some(cfg.source_addrs[(index as usize) % cfg.source_addrs.len()])
        };
        tracker.spawn(agent_task(
            agent,
            AgentEnv {
                index,
                bind_addr,
                n: n as usize,
                ..template.clone()
            },
        ));
        status.started.fetch_add(1, Ordering::Relaxed);
    }
    status
        .ramp_us
        .store(start.elapsed().as_micros() as u64, Ordering::Relaxed);
    status.ramp_done.store(true, Ordering::Release);
}

#[derive(Clone)]
struct AgentEnv {
    index: u64,
    ceilings: Arc<Ceilings>,
    bind_addr: Option<IpAddr>,
    /// The run's token (each turn gets a child of it).
    run: CancellationToken,
    freezer: Option<Arc<Freezer>>,
    metrics: Metrics,
    dial_gate: Arc<Semaphore>,
    backoff: Backoff,
    ever: Arc<AtomicU64>,
    live: Arc<AtomicI64>,
    reconnect_attempts: CounterId,
    grace: Duration,
    ledger: Arc<Ledger>,
    servers: Option<Arc<ServerBoard>>,
    n: usize,
}

/// One agent: turns of (backoff, dial slot, session) until the run ends,
/// the agent leaves (ramp-down) or a session cannot be attempted.
async fn agent_task<A: Agent>(mut agent: A, env: AgentEnv) {
    let mut backoff = env.backoff;
    let mut attempt = 0u32;
    let mut carried = false;
    let mut was_established_before = false;
    let mut delay: Option<Duration> = None;
    loop {
        // The turn's token: cancelled by the run's end, or by the scenario
        // (ending this session, or a ramp-down cutting the backoff short).
        // A fresh one per turn, so that the request that ended the last
        // session does not cut this backoff short.
        let Some(turn) = env.ledger.begin_turn(env.n, &env.run, attempt > 0) else {
            break;
        };
        match delay.take() {
            Some(d) if d.is_zero() => {
                // `--reconnect none`: at once, but let the other tasks run.
                tokio::task::yield_now().await;
            }
            Some(d) => {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = turn.cancelled() => {}
                }
            }
            None => {}
        }
        if turn.is_cancelled() {
            if env.run.is_cancelled() {
                break;
            }
            continue;
        }
        let permit = tokio::select! {
            p = env.dial_gate.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = turn.cancelled() => {
                if env.run.is_cancelled() {
                    break;
                }
                continue;
            }
        };
        if attempt > 0 {
            env.metrics.incr(env.reconnect_attempts);
        }
        env.ledger.attempt(env.n);
        let cx = SessionCx {
            index: env.index,
            attempt,
            bind_addr: env.bind_addr,
            cancel: turn.clone(),
            metrics: env.metrics.clone(),
            permit: Mutex::new(Some(permit)),
            established: AtomicBool::new(false),
            ever: env.ever.clone(),
            live: env.live.clone(),
            carried,
            was_established_before,
            ledger: Some((env.ledger.clone(), env.n)),
            ceilings: Some(env.ceilings.clone()),
            servers: env.servers.clone(),
            server: AtomicU32::new(u32::MAX),
            overloaded: AtomicBool::new(false),
        };
        let end = Frozen::new(
            agent.run_session(&cx),
            env.freezer.as_deref(),
            env.n as u64,
            &env.run,
        )
        .await;
        drop(cx.permit.lock().unwrap_or_else(|p| p.into_inner()).take());
        let was_up = cx.is_established();
        // A move between servers keeps the agent counted connected until
        // its next session answers (or fails): a handover, not a gap.
        let moving = was_up && end == SessionEnd::Moved && !env.run.is_cancelled();
        if (was_up || carried) && !moving {
            env.live.fetch_sub(1, Ordering::Relaxed);
        }
        carried = moving;
        if was_up {
            env.metrics.session_down();
            env.ceilings.down(env.bind_addr);
            if let (Some(b), Some(s)) = (&env.servers, cx.server()) {
                b.down(s);
            }
            was_established_before = true;
            backoff.reset();
        }
        attempt = attempt.saturating_add(1);
        // A dial the load box itself refused (ports, fds, socket memory):
        // wait for one of the fleet's own connections to close, not a
        // backoff that would retry into the same wall.
        let ceiling = (!was_up)
            .then(|| env.ceilings.refused(&end, env.bind_addr, &env.metrics))
            .flatten();
        let (end, gate) = match ceiling {
            Some((e, g)) => (e, Some(g)),
            None => (end, None),
        };
        match env
            .ledger
            .session_ended(env.n, was_up, &end, env.run.is_cancelled())
        {
            Next::Stop | Next::Leave => break,
            Next::Retry => match gate {
                Some(g) => {
                    tokio::select! {
                        _ = g.wait() => {}
                        _ = env.run.cancelled() => break,
                    }
                    delay = None;
                }
                // A move to another server: the next session at once.
                None if end == SessionEnd::Moved => delay = None,
                None if cx.overloaded.load(Ordering::Relaxed) => {
                    delay = Some(backoff.next_delay_overloaded());
                }
                None => delay = Some(backoff.next_delay()),
            },
        }
    }
    let cx = SessionCx {
        index: env.index,
        attempt,
        bind_addr: env.bind_addr,
        cancel: env.run.clone(),
        metrics: env.metrics.clone(),
        permit: Mutex::new(None),
        established: AtomicBool::new(true),
        ever: env.ever.clone(),
        live: env.live.clone(),
        carried: false,
        was_established_before: true,
        ledger: None,
        ceilings: None,
        servers: None,
        server: AtomicU32::new(u32::MAX),
        overloaded: AtomicBool::new(false),
    };
    let _ = tokio::time::timeout(env.grace, agent.finish(&cx)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{
        CAUSE_NO_ANSWER_YET, COUNTER_AGENTS_RECONNECTED, COUNTER_SESSIONS, SessionEnd, metrics_spec,
    };
    use crate::session::BoxFuture;

    /// A fake protocol: connects after a short delay, optionally drops the
    /// first session, and holds the session until cancelled.
    struct Fake {
        drops_left: u32,
        finished: Arc<AtomicU64>,
    }

    impl Agent for Fake {
        fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                cx.established();
                if self.drops_left > 0 {
                    self.drops_left -= 1;
                    return SessionEnd::lost_with("dropped", "peer went away");
                }
                cx.cancel.cancelled().await;
                SessionEnd::Shutdown
            })
        }

        fn finish<'a>(&'a mut self, _cx: &'a SessionCx) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                self.finished.fetch_add(1, Ordering::Relaxed);
            })
        }
    }

    struct FakeFactory {
        drops: u32,
        finished: Arc<AtomicU64>,
    }

    impl AgentFactory for FakeFactory {
        type Agent = Fake;
        fn create(&self, _index: u64) -> Fake {
            Fake {
                drops_left: self.drops,
                finished: self.finished.clone(),
            }
        }
    }

    fn metrics() -> Metrics {
        Metrics::new(&metrics_spec(), 2)
    }

    #[tokio::test(start_paused = true)]
    async fn ramp_connects_every_agent_and_shuts_down() {
        let m = metrics();
        let finished = Arc::new(AtomicU64::new(0));
        let cfg = FleetConfig {
            agents: 100,
            ramp: Some(Rate::per_second(1000.0)),
            duration: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let status = Arc::new(FleetStatus::default());
        let report = run(
            cfg,
            Arc::new(FakeFactory {
                drops: 0,
                finished: finished.clone(),
            }),
            m.clone(),
            status,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(report.connected_at_end, 100);
        assert_eq!(report.ever_connected, 100);
        assert_eq!(report.unfinished, 0);
        let ramp = report.ramp_elapsed.unwrap();
        // 100 agents at 1000/s take about 0.1 s of (paused) time.
        assert!(
            ramp >= Duration::from_millis(99) && ramp <= Duration::from_millis(101),
            "{ramp:?}"
        );
        assert!(report.all_connected_after.is_some());
        assert_eq!(finished.load(Ordering::Relaxed), 100);
        assert_eq!(m.connected(), 0);
        assert_eq!(m.snapshot().peak_connected, 100);
    }

    /// An agent on two servers in turn: its first session moves (a
    /// rebalance), its second is refused as overloaded, then it holds.
    struct Mover {
        turn: u32,
        starts: Arc<Mutex<Vec<Duration>>>,
        t0: Instant,
    }

    impl Agent for Mover {
        fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
            Box::pin(async move {
                self.starts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(self.t0.elapsed());
                self.turn += 1;
                cx.on_server((self.turn as usize) % 2);
                match self.turn {
                    1 => {
                        cx.established();
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        SessionEnd::Moved
                    }
                    2 => {
                        cx.overloaded();
                        SessionEnd::lost("upgrade_429")
                    }
                    _ => {
                        cx.established();
                        cx.cancel.cancelled().await;
                        SessionEnd::Shutdown
                    }
                }
            })
        }
    }

    struct MoverFactory(Arc<Mutex<Vec<Duration>>>, Instant);

    impl AgentFactory for MoverFactory {
        type Agent = Mover;
        fn create(&self, _index: u64) -> Mover {
            Mover {
                turn: 0,
                starts: self.0.clone(),
                t0: self.1,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_move_reconnects_at_once_an_overloaded_server_doubles_the_backoff() {
        let m = metrics();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let cfg = FleetConfig {
            agents: 1,
            ramp: None,
            duration: Some(Duration::from_secs(10)),
            backoff: Backoff::with_policy(
                crate::ReconnectPolicy::Fixed,
                Duration::from_millis(500),
                Duration::from_secs(5),
            ),
            servers: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        let status = Arc::new(FleetStatus::default());
        let report = run(
            cfg,
            Arc::new(MoverFactory(starts.clone(), Instant::now())),
            m.clone(),
            status.clone(),
            CancellationToken::new(),
        )
        .await;
        let starts = starts.lock().unwrap().clone();
        assert_eq!(starts.len(), 3, "{starts:?}");
        // The move: the next session at once, not after a backoff.
        assert_eq!(starts[1] - starts[0], Duration::from_secs(1));
        // The 429: twice the fixed backoff.
        assert_eq!(starts[2] - starts[1], Duration::from_secs(1));
        // Neither is a loss or an error of the move; the 429 is counted.
        assert!(
            report.sessions_lost.is_empty(),
            "{:?}",
            report.sessions_lost
        );
        assert_eq!(m.snapshot().errors.get("upgrade_429"), Some(&1));
        // Where the sessions were: established on b, then (after the
        // refused attempt on a) on b again, where it is at the end.
        let counts = report.servers.expect("two servers kept");
        assert_eq!(counts.held, vec![0, 1]);
        assert_eq!(counts.connects, vec![0, 2]);
    }

    /// Agent 0 moves, and its next session has not answered when the run
    /// ends; agent 1 moves and its next session fails at once (then waits
    /// its backoff past the end).
    struct Handover(u64, u32);

    impl Agent for Handover {
        fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
            Box::pin(async move {
                self.1 += 1;
                if self.1 == 1 {
                    cx.established();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    return SessionEnd::Moved;
                }
                if self.0 == 1 {
                    return SessionEnd::lost("connect_refused");
                }
                cx.cancel.cancelled().await;
                SessionEnd::Shutdown
            })
        }
    }

    struct HandoverFactory;

    impl AgentFactory for HandoverFactory {
        type Agent = Handover;
        fn create(&self, index: u64) -> Handover {
            Handover(index, 0)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_agent_in_a_move_is_connected_until_its_next_session_fails() {
        let m = metrics();
        let cfg = FleetConfig {
            agents: 2,
            ramp: None,
            duration: Some(Duration::from_secs(5)),
            backoff: Backoff::new(Duration::from_secs(10), Duration::from_secs(10)),
            ..Default::default()
        };
        let status = Arc::new(FleetStatus::default());
        let report = run(
            cfg,
            Arc::new(HandoverFactory),
            m.clone(),
            status,
            CancellationToken::new(),
        )
        .await;
        // Agent 0's handover is no gap; agent 1 is out since its failure.
        assert_eq!(report.connected_at_end, 1);
        assert_eq!(
            report.missing.get("connect_refused"),
            Some(&1),
            "{:?}",
            report.missing
        );
        assert_eq!(
            report.missing.values().sum::<u64>(),
            1,
            "{:?}",
            report.missing
        );
        // The failed handover is no lost session (the agent chose to move).
        assert!(
            report.sessions_lost.is_empty(),
            "{:?}",
            report.sessions_lost
        );
        assert_eq!(m.connected(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_sessions_reconnect_with_backoff_and_are_counted() {
        let m = metrics();
        let cfg = FleetConfig {
            agents: 10,
            ramp: None,
            duration: Some(Duration::from_secs(5)),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
            ..Default::default()
        };
        let report = run(
            cfg,
            Arc::new(FakeFactory {
                drops: 2,
                finished: Arc::new(AtomicU64::new(0)),
            }),
            m.clone(),
            Arc::new(FleetStatus::default()),
            CancellationToken::new(),
        )
        .await;
        let s = m.snapshot();
        assert_eq!(s.errors["dropped"], 20);
        assert_eq!(s.counter(COUNTER_RECONNECT_ATTEMPTS), 20);
        assert_eq!(s.counter(COUNTER_AGENTS_RECONNECTED), 20);
        assert_eq!(s.counter(COUNTER_SESSIONS), 30);
        assert_eq!(report.connected_at_end, 10);
        assert_eq!(report.ever_connected, 10);
        assert_eq!(report.sessions_lost["dropped"], 20);
        assert!(report.missing.is_empty() && report.lost_not_back == 0);
        assert_eq!(
            m.error_report()[0].stat.sample.as_deref(),
            Some("peer went away")
        );
    }

    /// Every session is refused with `kind`; agents with an index in
    /// `lucky` are accepted instead and hold their session.
    struct Refused {
        kind: &'static str,
        lucky: std::ops::Range<u64>,
        attempts: Arc<AtomicU64>,
    }

    impl Agent for Refused {
        fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
            Box::pin(async move {
                self.attempts.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
                if self.lucky.contains(&cx.index) {
                    cx.established();
                    cx.cancel.cancelled().await;
                    return SessionEnd::Shutdown;
                }
                SessionEnd::lost_with(self.kind, "wrong password for user agent")
            })
        }
    }

    struct RefusedFactory(&'static str, std::ops::Range<u64>, Arc<AtomicU64>);

    impl AgentFactory for RefusedFactory {
        type Agent = Refused;
        fn create(&self, _index: u64) -> Refused {
            Refused {
                kind: self.0,
                lucky: self.1.clone(),
                attempts: self.2.clone(),
            }
        }
    }

    fn refusing_metrics() -> Metrics {
        let mut spec = metrics_spec();
        spec.errors = vec![
            agent_sim_metrics::ErrorKindSpec {
                kind: "upgrade_401",
                hint: "check --password",
                heals: false,
            },
            agent_sim_metrics::ErrorKindSpec {
                kind: "upgrade_503",
                hint: "the backend is overloaded",
                heals: true,
            },
        ];
        Metrics::new(&spec, 1)
    }

    async fn refused_run(
        kind: &'static str,
        lucky: std::ops::Range<u64>,
        fail_fast: bool,
    ) -> (FleetReport, u64) {
        let attempts = Arc::new(AtomicU64::new(0));
        let report = run(
            FleetConfig {
                agents: 20,
                ramp: None,
                duration: Some(Duration::from_secs(600)),
                backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
                fail_fast,
                ..Default::default()
            },
            Arc::new(RefusedFactory(kind, lucky, attempts.clone())),
            refusing_metrics(),
            Arc::new(FleetStatus::default()),
            CancellationToken::new(),
        )
        .await;
        (report, attempts.load(Ordering::Relaxed))
    }

    #[tokio::test(start_paused = true)]
    async fn a_fleet_nobody_can_join_stops_after_everyone_failed_twice() {
        let t0 = Instant::now();
        let (r, attempts) = refused_run("upgrade_401", 0..0, false).await;
        // Every agent retried (no give-up after one refusal), past the
        // settling window, and the run ended long before its 600 s deadline.
        assert!(attempts >= 20 * 5, "{attempts}");
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_secs(10) && took < Duration::from_secs(15),
            "{took:?}"
        );
        let stopped = r.stopped.expect("stopped early");
        assert!(!stopped.fail_fast);
        assert_eq!(stopped.failure.kind, "upgrade_401");
        assert_eq!(r.missing["upgrade_401"], 20);
        assert_eq!((r.ever_connected, r.connected_at_end), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn causes_that_heal_are_retried_until_the_deadline() {
        let t0 = Instant::now();
        let (r, attempts) = refused_run("upgrade_503", 0..0, false).await;
        assert_eq!(r.stopped, None);
        assert!(t0.elapsed() >= Duration::from_secs(600));
        assert!(attempts > 20 * 100, "{attempts}");
        assert_eq!(r.missing["upgrade_503"], 20);
    }

    /// Refused once with a cause that heals, then an attempt the server
    /// never answers (a backend too slow to let the agent in).
    struct RefusedThenSlow(bool);

    impl Agent for RefusedThenSlow {
        fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
            Box::pin(async move {
                if !self.0 {
                    self.0 = true;
                    return SessionEnd::lost_with("upgrade_503", "Service Unavailable");
                }
                cx.cancel.cancelled().await;
                SessionEnd::Shutdown
            })
        }
    }

    struct RefusedThenSlowFactory;

    impl AgentFactory for RefusedThenSlowFactory {
        type Agent = RefusedThenSlow;
        fn create(&self, _index: u64) -> RefusedThenSlow {
            RefusedThenSlow(false)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn agents_mid_attempt_at_the_end_are_missing_with_no_answer_yet_not_an_old_failure() {
        let m = refusing_metrics();
        let r = run(
            FleetConfig {
                agents: 4,
                ramp: None,
                duration: Some(Duration::from_secs(30)),
                backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
                ..Default::default()
            },
            Arc::new(RefusedThenSlowFactory),
            m.clone(),
            Arc::new(FleetStatus::default()),
            CancellationToken::new(),
        )
        .await;
        // The refusal is still in the errors; the reason they are out at the
        // end is the attempt the server had not answered.
        assert_eq!(m.snapshot().errors["upgrade_503"], 4);
        assert_eq!(
            r.missing.get(CAUSE_NO_ANSWER_YET),
            Some(&4),
            "{:?}",
            r.missing
        );
        assert!(!r.missing.contains_key("upgrade_503"));
    }

    #[tokio::test(start_paused = true)]
    async fn one_connected_agent_keeps_the_run_going_and_the_rest_are_missing_by_cause() {
        let (r, _) = refused_run("upgrade_401", 0..5, false).await;
        assert_eq!(r.stopped, None);
        assert_eq!(r.connected_at_end, 5);
        assert_eq!(r.missing["upgrade_401"], 15);
        assert_eq!(r.lost_not_back, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn fail_fast_stops_at_the_first_cause_that_cannot_heal() {
        let t0 = Instant::now();
        let (r, attempts) = refused_run("upgrade_401", 0..5, true).await;
        let stopped = r.stopped.expect("fail-fast");
        assert!(stopped.fail_fast);
        assert_eq!(
            stopped.failure.detail.as_deref(),
            Some("wrong password for user agent")
        );
        assert!(attempts <= 20, "{attempts}");
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn external_shutdown_stops_a_run_without_deadline() {
        let token = CancellationToken::new();
        let t = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            t.cancel();
        });
        let report = run(
            FleetConfig {
                agents: 5,
                ramp: None,
                duration: None,
                ..Default::default()
            },
            Arc::new(FakeFactory {
                drops: 0,
                finished: Arc::new(AtomicU64::new(0)),
            }),
            metrics(),
            Arc::new(FleetStatus::default()),
            token,
        )
        .await;
        assert_eq!(report.connected_at_end, 5);
        assert!(report.elapsed >= Duration::from_secs(3));
    }

    /// A protocol on a box with `ports` free ephemeral ports: a dial beyond
    /// them is refused the way the kernel refuses it; the first `drop_after`
    /// sessions end after 1 s, freeing their port.
    struct Ported {
        ports: Arc<AtomicI64>,
        dials: Arc<AtomicU64>,
        drops: Arc<AtomicI64>,
    }

    impl Agent for Ported {
        fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd> {
            Box::pin(async move {
                self.dials.fetch_add(1, Ordering::Relaxed);
                if self.ports.fetch_sub(1, Ordering::Relaxed) <= 0 {
                    self.ports.fetch_add(1, Ordering::Relaxed);
                    return SessionEnd::lost_with(
                        "connect_addr_unavailable",
                        "Cannot assign requested address (os error 99)",
                    );
                }
                cx.established();
                let end = if self.drops.fetch_sub(1, Ordering::Relaxed) > 0 {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {
                            SessionEnd::lost("ws_dropped")
                        }
                        _ = cx.cancel.cancelled() => SessionEnd::Shutdown,
                    }
                } else {
                    cx.cancel.cancelled().await;
                    SessionEnd::Shutdown
                };
                self.ports.fetch_add(1, Ordering::Relaxed);
                end
            })
        }
    }

    struct PortedFactory(Arc<AtomicI64>, Arc<AtomicU64>, Arc<AtomicI64>);

    impl AgentFactory for PortedFactory {
        type Agent = Ported;
        fn create(&self, _index: u64) -> Ported {
            Ported {
                ports: self.0.clone(),
                dials: self.1.clone(),
                drops: self.2.clone(),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_box_out_of_ports_waits_for_closes_instead_of_retrying() {
        let m = metrics();
        let (ports, dials, drops) = (
            Arc::new(AtomicI64::new(60)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicI64::new(10)),
        );
        let cfg = FleetConfig {
            agents: 100,
            ramp: None,
            max_dialing: 100,
            backoff: Backoff::new(Duration::from_millis(10), Duration::from_millis(20)),
            duration: Some(Duration::from_secs(30)),
            ..Default::default()
        };
        let report = run(
            cfg,
            Arc::new(PortedFactory(ports, dials.clone(), drops)),
            m.clone(),
            Arc::new(FleetStatus::default()),
            CancellationToken::new(),
        )
        .await;
        // 60 ports held to the end; 40 agents never got one.
        assert_eq!(report.connected_at_end, 60);
        assert_eq!(report.missing.get(crate::outcome::CAUSE_PORTS), Some(&40));
        // No retry storm: with a 10 ms backoff over 30 s the 40 refused
        // agents would have dialed ~100,000 times; they dial once each,
        // and once more per close (10 sessions dropped and came back).
        let n = dials.load(Ordering::Relaxed);
        assert!(n <= 100 + 10 + 10 + 10, "{n} dials");
        let w = m.warning_report();
        let ceiling = w
            .iter()
            .find(|k| k.kind == crate::outcome::CAUSE_PORTS)
            .unwrap();
        assert_eq!(ceiling.stat.count, 1, "reported once");
        assert!(
            ceiling.stat.sample.as_deref().unwrap().contains("held 60"),
            "{ceiling:?}"
        );
        assert!(m.error_kind(crate::outcome::CAUSE_PORTS).is_some());
    }
}
