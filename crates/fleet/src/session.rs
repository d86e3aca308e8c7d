//! The contract between the engine and a protocol: an [`Agent`] runs one
//! session at a time with a [`SessionCx`], which tells the engine when the
//! session is established, what failed on the way, and how the agent's
//! state came back after a reconnect (all of it goes to the fleet's
//! ledger). [`AgentFactory`] creates the agents.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agent_sim_metrics::Metrics;
use agent_sim_metrics::disruption::Resync;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::ceiling::Ceilings;
use crate::ledger::Ledger;
use crate::outcome::{COUNTER_AGENTS_RECONNECTED, COUNTER_SESSIONS, Failure, SessionEnd};
use crate::servers::ServerBoard;

/// A boxed, sendable future (what [`Agent`] methods return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Per-session context handed to [`Agent::run_session`].
pub struct SessionCx {
    /// Global agent index (unique across shards).
    pub index: u64,
    /// Sessions this agent started before this one (0 on the first).
    pub attempt: u32,
    /// Source address to bind, if a pool was configured.
    pub bind_addr: Option<IpAddr>,
    /// Cancelled when the run ends, or when the scenario ends this session
    /// (a storm, churn, the max session length, a ramp-down): close the
    /// session politely (Sensu: WebSocket close 1001; Consul: drop the
    /// streams and the connection, keep the registrations) and return
    /// [`SessionEnd::Shutdown`]; the engine knows which it was.
    pub cancel: CancellationToken,
    pub(crate) metrics: Metrics,
    pub(crate) permit: Mutex<Option<OwnedSemaphorePermit>>,
    pub(crate) established: AtomicBool,
    pub(crate) ever: Arc<AtomicU64>,
    pub(crate) live: Arc<AtomicI64>,
    /// The agent's last session ended in a move to another server: it is
    /// still counted connected (`live`) until this one answers or ends.
    pub(crate) carried: bool,
    pub(crate) was_established_before: bool,
    /// The fleet's ledger and this agent's local number (none standalone).
    pub(crate) ledger: Option<(Arc<Ledger>, usize)>,
    /// The fleet's local ceilings (none standalone).
    pub(crate) ceilings: Option<Arc<Ceilings>>,
    /// Where the fleet's sessions are, per server (none standalone).
    pub(crate) servers: Option<Arc<ServerBoard>>,
    /// The server this session is on ([`SessionCx::on_server`]; `u32::MAX`:
    /// not said).
    pub(crate) server: AtomicU32,
}

impl std::fmt::Debug for SessionCx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCx")
            .field("index", &self.index)
            .field("attempt", &self.attempt)
            .field("bind_addr", &self.bind_addr)
            .finish()
    }
}

impl SessionCx {
    /// A context outside of [`crate::run`] (tests, benches, one-off tools).
    pub fn standalone(index: u64, metrics: Metrics, cancel: CancellationToken) -> Self {
        SessionCx {
            index,
            attempt: 0,
            bind_addr: None,
            cancel,
            metrics,
            permit: Mutex::new(None),
            established: AtomicBool::new(false),
            ever: Arc::new(AtomicU64::new(0)),
            live: Arc::new(AtomicI64::new(0)),
            carried: false,
            was_established_before: false,
            ledger: None,
            ceilings: None,
            servers: None,
            server: AtomicU32::new(u32::MAX),
        }
    }

    /// Which of the run's servers (its index in the targets) this session
    /// is on: call before [`SessionCx::established`].
    pub fn on_server(&self, server: usize) {
        self.server.store(server as u32, Ordering::Relaxed);
    }

    /// The server [`SessionCx::on_server`] named, if any.
    pub(crate) fn server(&self) -> Option<usize> {
        match self.server.load(Ordering::Relaxed) {
            u32::MAX => None,
            s => Some(s as usize),
        }
    }

    /// Call once the session is ready for steady state (handshake done):
    /// releases the dial slot and raises the sessions gauge. Idempotent.
    pub fn established(&self) {
        if !self.established.swap(true, Ordering::AcqRel) {
            self.permit.lock().unwrap_or_else(|p| p.into_inner()).take();
            self.metrics.session_up();
            if !self.carried {
                self.live.fetch_add(1, Ordering::Relaxed);
            }
            self.metrics.incr(self.metrics.counter(COUNTER_SESSIONS));
            if self.was_established_before {
                self.metrics
                    .incr(self.metrics.counter(COUNTER_AGENTS_RECONNECTED));
            } else {
                self.ever.fetch_add(1, Ordering::Relaxed);
            }
            if let Some((ledger, n)) = &self.ledger {
                ledger.up(*n);
            }
            if let Some(c) = &self.ceilings {
                c.up(self.bind_addr);
            }
            if let (Some(b), Some(s)) = (&self.servers, self.server()) {
                b.up(s);
            }
        }
    }

    /// Counts a failure inside a session that goes on (e.g. a catalog
    /// registration refused while the stream is up): the error with the
    /// server's words, and the agent's last cause (for the report of agents
    /// missing at the end, fail-fast and the early stop).
    pub fn report(&self, f: &Failure) {
        self.metrics
            .error_said(f.kind, f.detail.as_deref(), f.said_by);
        if let Some((ledger, n)) = &self.ledger {
            ledger.noted(*n, f);
        }
    }

    /// Releases the dial slot without counting the session as established
    /// (the handshake is over but the server has not answered yet).
    pub fn release_dial_slot(&self) {
        self.permit.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// How the agent's state came back after a reconnect (Consul: a new
    /// snapshot, a resumed stream, a stream resumed silently); counted for
    /// the disruption the agent was lost in, if any.
    pub fn resynced(&self, how: Resync) {
        if let Some((ledger, n)) = &self.ledger {
            ledger.resynced(*n, how);
        }
    }

    /// Whether [`SessionCx::established`] was called in this session.
    pub fn is_established(&self) -> bool {
        self.established.load(Ordering::Acquire)
    }

    /// Key for sharded histogram recording.
    pub fn shard_key(&self) -> usize {
        self.index as usize
    }

    /// The run's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

/// One simulated agent. Its state lives across sessions (a reconnecting
/// Consul agent resumes its subscriptions from the index it had).
pub trait Agent: Send + 'static {
    /// Runs one session to its end: dial, handshake, call
    /// [`SessionCx::established`], steady state until lost or cancelled.
    /// Keep the returned future small: box the connect step so its state is
    /// freed once the session is up.
    fn run_session<'a>(&'a mut self, cx: &'a SessionCx) -> BoxFuture<'a, SessionEnd>;

    /// Called once after the last session, during shutdown (e.g. to
    /// deregister from a catalog). Bounded by the shutdown grace period.
    fn finish<'a>(&'a mut self, _cx: &'a SessionCx) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// Creates the agents of a fleet.
pub trait AgentFactory: Send + Sync + 'static {
    /// The agent type.
    type Agent: Agent;
    /// Creates agent number `index` (global, stable across runs and shards).
    fn create(&self, index: u64) -> Self::Agent;
}
