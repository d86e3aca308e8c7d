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
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::boot::{Boot, Schedule, Step};
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
    /// Agents started per second; `None` starts them all at once (unless
    /// `boot_window` is set).
    pub ramp: Option<Rate>,
    /// Start each agent at a uniform random moment of this window instead
    /// of on the ramp (`ramp` must then be `None`).
    pub boot_window: Option<Duration>,
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
    /// A stepped run's steps (`--steps`), in order, the last holding every
    /// agent: each step's new agents start on the boot from its time.
    /// Empty: every agent on one boot from the start.
    pub steps: Vec<Step>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            agents: 1,
            first_index: 0,
            ramp: Some(Rate::per_second(500.0)),
            boot_window: None,
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
            steps: Vec::new(),
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
        if !self.steps.is_empty() {
            let grows = self
                .steps
                .windows(2)
                .all(|w| w[0].agents <= w[1].agents && w[0].at <= w[1].at);
            if !grows || self.steps.last().map(|s| s.agents) != Some(self.agents) {
                return bad(
                    "steps",
                    "must grow, in time order, up to the fleet's agents",
                );
            }
        }
        match self.boot_window {
            Some(_) if self.ramp.is_some() => {
                return bad("boot_window", "and a ramp both set: choose one");
            }
            Some(w) if w.is_zero() => return bad("boot_window", "must be longer than zero"),
            _ => {}
        }
        Ok(())
    }

    /// How the agents start (the ramp, the boot window, or all at once).
    pub fn boot(&self) -> Boot {
        match (self.boot_window, self.ramp) {
            (Some(w), _) => Boot::Window(w),
            (None, Some(rate)) => Boot::Ramp(rate),
            (None, None) => Boot::AllAtOnce,
        }
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
    let start = Instant::now();
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
    let template = agent_env(&cfg, &metrics, &status, &run_token, freezer, &ledger);
    let spawner = tokio::spawn(ramp(
        factory,
        cfg.clone(),
        start,
        tracker.clone(),
        status.clone(),
        template,
    ));
    until_the_end(cfg.duration, &shutdown, &ledger).await;
    let at_end = AtEnd {
        connected: status.connected.load(Ordering::Relaxed).max(0) as u64,
        servers: status.servers.get().map(|b| b.counts()),
        tally: ledger.tally(),
    };
    run_token.cancel();
    scenario.abort_all();
    let _ = spawner.await;
    let unfinished = drain(&tracker, cfg.grace).await;
    let all_connected_after = *all_connected_at.lock().unwrap_or_else(|p| p.into_inner());
    FleetReport {
        requested: cfg.agents,
        connected_at_end: at_end.connected,
        ever_connected: status.ever_connected.load(Ordering::Relaxed),
        ramp_elapsed: ramp_elapsed(&status),
        all_connected_after,
        elapsed: start.elapsed(),
        unfinished,
        lost_not_back: at_end.tally.lost_not_back,
        missing: at_end.tally.missing,
        sessions_lost: at_end.tally.sessions_lost,
        left: at_end.tally.left,
        stopped: ledger.stopped(),
        servers: at_end.servers,
    }
}

/// What the report takes when the run's end is decided, before any agent
/// sees the cancellation.
struct AtEnd {
    /// Sessions of the fleet established.
    connected: u64,
    /// Sessions per server (runs with several servers).
    servers: Option<crate::servers::ServerCounts>,
    /// The ledger's count of the agents.
    tally: crate::ledger::Tally,
}

/// What every agent task of the run starts from: the run's shared state
/// (its token, gauges, ledger, gates and, with two or more servers, the
/// board of where the sessions are).
fn agent_env(
    cfg: &FleetConfig,
    metrics: &Metrics,
    status: &FleetStatus,
    run: &CancellationToken,
    freezer: Option<Arc<Freezer>>,
    ledger: &Arc<Ledger>,
) -> AgentEnv {
    let servers = (cfg.servers.len() > 1).then(|| {
        status
            .servers
            .get_or_init(|| Arc::new(ServerBoard::new(cfg.servers.clone())))
            .clone()
    });
    AgentEnv {
        index: 0,
        ceilings: Arc::new(Ceilings::new(&cfg.source_addrs)),
        bind_addr: None,
        run: run.clone(),
        freezer,
        metrics: metrics.clone(),
        dial_gate: Arc::new(Semaphore::new(cfg.max_dialing.max(1))),
        backoff: cfg.backoff.clone(),
        ever: status.ever_connected.clone(),
        live: status.connected.clone(),
        reconnect_attempts: metrics.counter(COUNTER_RECONNECT_ATTEMPTS),
        grace: cfg.grace,
        ledger: ledger.clone(),
        servers,
        n: 0,
    }
}

/// The run ends at the deadline (`duration` from now), on external
/// `shutdown`, or when the ledger stops it (fail-fast, or nothing can ever
/// connect).
async fn until_the_end(duration: Option<Duration>, shutdown: &CancellationToken, ledger: &Ledger) {
    let deadline = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = deadline => {}
        _ = shutdown.cancelled() => {}
        _ = ledger.stop.cancelled() => {}
    }
}

/// Waits up to `grace` for the agent tasks to finish; how many had not.
async fn drain(tracker: &TaskTracker, grace: Duration) -> u64 {
    tracker.close();
    let finished = tokio::time::timeout(grace, tracker.wait()).await.is_ok();
    if finished { 0 } else { tracker.len() as u64 }
}

/// How long the ramp took, once it is done.
fn ramp_elapsed(status: &FleetStatus) -> Option<Duration> {
    status
        .ramp_done
        .load(Ordering::Acquire)
        .then(|| Duration::from_micros(status.ramp_us.load(Ordering::Relaxed)))
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
    let mut schedule = if cfg.steps.is_empty() {
        Schedule::new(cfg.boot(), cfg.agents)
    } else {
        Schedule::stepped(cfg.boot(), &cfg.steps)
    };
    for n in 0..cfg.agents {
        if run_token.is_cancelled() {
            break;
        }
        let due = start + schedule.next_offset().unwrap_or_default();
        if due > Instant::now() {
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = run_token.cancelled() => break,
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

/// What every agent task of a run shares, and where this one is in it
/// (`index`, `bind_addr`, `n`), copied from one template per agent.
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

impl AgentEnv {
    /// A dial slot from the fleet's gate; the next turn instead when the
    /// turn's token is cancelled first (during the delay or here), or the
    /// task's end when the run's is.
    async fn dial_slot(&self, turn: &CancellationToken) -> Result<OwnedSemaphorePermit, Then> {
        let cut = || {
            if self.run.is_cancelled() {
                Then::Stop
            } else {
                Then::Turn
            }
        };
        if turn.is_cancelled() {
            return Err(cut());
        }
        tokio::select! {
            p = self.dial_gate.clone().acquire_owned() => p.map_err(|_| Then::Stop),
            _ = turn.cancelled() => Err(cut()),
        }
    }
}

/// One agent: turns of (backoff, dial slot, session) until the run ends,
/// the agent leaves (ramp-down) or a session cannot be attempted; then its
/// finish.
///
/// Not an `async fn`: its arguments would be kept in the task beside the
/// [`AgentTask`] moved out of them (and `run(self)` would keep a second copy
/// again). The block owns the one `AgentTask` and runs it in place, so a
/// task is the state once plus its turn.
fn agent_task<A: Agent>(agent: A, env: AgentEnv) -> impl Future<Output = ()> + Send {
    let mut task = AgentTask {
        agent,
        backoff: env.backoff.clone(),
        env,
        attempt: 0,
        carried: false,
        was_established_before: false,
        delay: None,
    };
    async move { task.run().await }
}

/// An agent's task: the agent, and what its turns carry from one to the
/// next.
struct AgentTask<A> {
    agent: A,
    env: AgentEnv,
    /// The agent's own backoff (reset by an established session).
    backoff: Backoff,
    /// Sessions started so far.
    attempt: u32,
    /// The last session ended in a move to another server: the agent is
    /// still counted connected until the next one answers or ends.
    carried: bool,
    /// A session of this agent was established once.
    was_established_before: bool,
    /// The wait before the next dial (none: at once).
    delay: Option<Duration>,
}

/// Where a turn leaves the agent's task.
#[derive(Debug, PartialEq, Eq)]
enum Then {
    /// The next turn.
    Turn,
    /// The task ends (the run ended, the agent left, or it cannot go on).
    Stop,
}

/// What a [`SessionCx`] of the task is for.
enum CxFor {
    /// A session, on the turn's token, holding its dial slot.
    Session(CancellationToken, OwnedSemaphorePermit),
    /// The agent's finish, after its last session, on the run's token.
    Finish,
}

impl<A: Agent> AgentTask<A> {
    /// Turns until one stops the task, then the agent's finish (bounded by
    /// the grace period; boxed, as it happens once).
    async fn run(&mut self) {
        while let Some(turn) = self.begin_turn() {
            if self.turn(turn).await == Then::Stop {
                break;
            }
        }
        let cx = self.cx(CxFor::Finish);
        let _ = Box::pin(tokio::time::timeout(self.env.grace, self.agent.finish(&cx))).await;
    }

    /// The next turn's token (none when the agent was asked to leave):
    /// cancelled by the run's end, or by the scenario (ending this session,
    /// or a ramp-down cutting the backoff short). A fresh one per turn, so
    /// that the request that ended the last session does not cut this
    /// backoff short.
    fn begin_turn(&self) -> Option<CancellationToken> {
        let env = &self.env;
        env.ledger.begin_turn(env.n, &env.run, self.attempt > 0)
    }

    /// One turn: the delay, a dial slot, the session and its end. All but
    /// the session are boxed: they happen once a turn, and the task (one
    /// per agent) is as large as the largest step it awaits.
    async fn turn(&mut self, turn: CancellationToken) -> Then {
        Box::pin(self.wait_delay(&turn)).await;
        let permit = match Box::pin(self.env.dial_slot(&turn)).await {
            Ok(p) => p,
            Err(then) => return then,
        };
        let cx = self.cx(CxFor::Session(turn, permit));
        let end = self.session(&cx).await;
        Box::pin(self.ended(&cx, end)).await
    }

    /// The delay the last session's end set, if any, cut short by the
    /// turn's token.
    async fn wait_delay(&mut self, turn: &CancellationToken) {
        match self.delay.take() {
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
    }

    /// The context of a session of this agent, or of its finish (with no
    /// ledger, ceilings or servers to tell, and counted established so that
    /// nothing in it counts a session).
    fn cx(&self, purpose: CxFor) -> SessionCx {
        let env = &self.env;
        let (cancel, permit, session) = match purpose {
            CxFor::Session(turn, permit) => (turn, Some(permit), true),
            CxFor::Finish => (env.run.clone(), None, false),
        };
        SessionCx {
            index: env.index,
            attempt: self.attempt,
            bind_addr: env.bind_addr,
            cancel,
            metrics: env.metrics.clone(),
            permit: Mutex::new(permit),
            established: AtomicBool::new(!session),
            ever: env.ever.clone(),
            live: env.live.clone(),
            carried: session && self.carried,
            was_established_before: !session || self.was_established_before,
            ledger: session.then(|| (env.ledger.clone(), env.n)),
            ceilings: session.then(|| env.ceilings.clone()),
            servers: session.then(|| env.servers.clone()).flatten(),
            server: AtomicU32::new(u32::MAX),
        }
    }

    /// The session, counted as an attempt (a reconnect after the first)
    /// and paused by the scenario's freezes; its dial slot is freed when
    /// it ends, if it was not before.
    async fn session(&mut self, cx: &SessionCx) -> SessionEnd {
        let env = &self.env;
        if self.attempt > 0 {
            env.metrics.incr(env.reconnect_attempts);
        }
        env.ledger.attempt(env.n);
        let session = self.agent.run_session(cx);
        let end = Frozen::new(session, env.freezer.as_deref(), env.n as u64, &env.run).await;
        drop(cx.permit.lock().unwrap_or_else(|p| p.into_inner()).take());
        end
    }

    /// After a session: the gauges told, then the ledger's answer: the
    /// task's end, or the next turn after the delay set here.
    async fn ended(&mut self, cx: &SessionCx, end: SessionEnd) -> Then {
        let was_up = cx.is_established();
        self.count_down(cx, was_up, &end);
        self.attempt = self.attempt.saturating_add(1);
        let env = &self.env;
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
            Next::Stop | Next::Leave => return Then::Stop,
            Next::Retry => {}
        }
        self.delay = match gate {
            Some(g) => {
                tokio::select! {
                    _ = g.wait() => {}
                    _ = env.run.cancelled() => return Then::Stop,
                }
                None
            }
            // A move to another server: the next session at once.
            None if end == SessionEnd::Moved => {
                self.backoff.started_at_once();
                None
            }
            None => Some(self.backoff.next_delay()),
        };
        Then::Turn
    }

    /// A session ended: the agent's place in the gauges, the ceilings and
    /// the servers given back (`was_up`: it was established), unless it
    /// moves to another server (a handover, not a gap: it stays counted
    /// connected until its next session answers or fails).
    fn count_down(&mut self, cx: &SessionCx, was_up: bool, end: &SessionEnd) {
        let env = &self.env;
        let moving = was_up && *end == SessionEnd::Moved && !env.run.is_cancelled();
        if (was_up || self.carried) && !moving {
            env.live.fetch_sub(1, Ordering::Relaxed);
        }
        self.carried = moving;
        if was_up {
            env.metrics.session_down();
            env.ceilings.down(env.bind_addr);
            if let (Some(b), Some(s)) = (&env.servers, cx.server()) {
                b.down(s);
            }
            self.was_established_before = true;
            self.backoff.reset();
        }
    }
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

    /// Runs a fleet of [`Fake`] agents that never drop: the report, the
    /// metrics, and how many agents finished.
    async fn run_fakes(
        cfg: FleetConfig,
        status: Arc<FleetStatus>,
    ) -> (FleetReport, Metrics, Arc<AtomicU64>) {
        let m = metrics();
        let finished = Arc::new(AtomicU64::new(0));
        let factory = Arc::new(FakeFactory {
            drops: 0,
            finished: finished.clone(),
        });
        let report = run(cfg, factory, m.clone(), status, CancellationToken::new()).await;
        (report, m, finished)
    }

    /// An agent's task (one per agent, all alive at once) holds its state
    /// once and the step it waits in: the spawned future keeps no copy of
    /// its arguments, and the rare steps of a turn are boxed (it was
    /// 1,568 bytes in release, the state three times over).
    #[test]
    fn an_agent_task_holds_its_state_once() {
        let cfg = FleetConfig::default();
        let m = metrics();
        let status = FleetStatus::default();
        let run = CancellationToken::new();
        let ledger = Arc::new(Ledger::new(LedgerSetup {
            agents: 1,
            fail_fast: false,
            give_up_after: cfg.give_up_after,
            ever: status.ever_connected.clone(),
            metrics: m.clone(),
            start: Instant::now(),
            label: cfg.label,
            plan: Arc::new(cfg.scenario.clone()),
            freezer: None,
        }));
        let env = agent_env(&cfg, &m, &status, &run, None, &ledger);
        let agent = Fake {
            drops_left: 0,
            finished: Arc::default(),
        };
        let task = agent_task(agent, env);
        let size = std::mem::size_of_val(&task);
        println!("agent task {size} B");
        // 584 bytes with this agent in a debug build.
        assert!(size <= 768, "{size}");
    }

    #[tokio::test(start_paused = true)]
    async fn ramp_connects_every_agent_and_shuts_down() {
        let cfg = FleetConfig {
            agents: 100,
            ramp: Some(Rate::per_second(1000.0)),
            duration: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        let (report, m, finished) = run_fakes(cfg, Arc::default()).await;
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

    #[tokio::test(start_paused = true)]
    async fn a_boot_window_starts_every_agent_within_it() {
        let cfg = FleetConfig {
            agents: 200,
            ramp: None,
            boot_window: Some(Duration::from_secs(60)),
            duration: Some(Duration::from_secs(70)),
            ..Default::default()
        };
        let status = Arc::new(FleetStatus::default());
        let watch = status.clone();
        let probe = tokio::spawn(async move {
            // Half-way through the window, about half the agents started.
            tokio::time::sleep(Duration::from_secs(30)).await;
            watch.started.load(Ordering::Relaxed)
        });
        let (report, ..) = run_fakes(cfg, status).await;
        let half = probe.await.unwrap();
        // 200 uniform starts: 100 expected by 30 s (sd 7); 60..140 is 5.6 sd.
        assert!((60..=140).contains(&half), "{half} of 200 by half-time");
        let ramp = report.ramp_elapsed.unwrap();
        assert!(ramp <= Duration::from_secs(60), "{ramp:?}");
        assert!(ramp >= Duration::from_secs(50), "{ramp:?}");
        assert_eq!(report.ever_connected, 200);
        assert_eq!(report.connected_at_end, 200);
    }

    #[test]
    fn a_boot_window_and_a_ramp_are_refused_together() {
        let cfg = FleetConfig {
            boot_window: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        assert_eq!(cfg.validate().unwrap_err().field, "boot_window");
        let cfg = FleetConfig {
            ramp: None,
            boot_window: Some(Duration::ZERO),
            ..Default::default()
        };
        assert_eq!(cfg.validate().unwrap_err().field, "boot_window");
        let cfg = FleetConfig {
            ramp: None,
            boot_window: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.boot(), Boot::Window(Duration::from_secs(10)));
    }

    /// An agent on two servers in turn: its first session moves (a
    /// rebalance), its second is refused (a 429), then it holds.
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
                    2 => SessionEnd::lost("upgrade_429"),
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
    async fn a_move_reconnects_at_once_a_refused_session_waits_its_backoff() {
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
        // The 429: the plain backoff, as a real sensu-agent waits after any
        // refused handshake (its 429 branch is never reached).
        assert_eq!(starts[2] - starts[1], Duration::from_millis(500));
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
                said_by: agent_sim_metrics::Speaker::Server,
            },
            agent_sim_metrics::ErrorKindSpec {
                kind: "upgrade_503",
                hint: "the backend is overloaded",
                heals: true,
                said_by: agent_sim_metrics::Speaker::Server,
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
