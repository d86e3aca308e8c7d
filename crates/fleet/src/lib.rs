//! The fleet engine: starts N simulated agents on tokio tasks and keeps them
//! connected, without knowing any protocol.
//!
//! Main parts:
//! - [`session`]: [`Agent`] / [`AgentFactory`], what a protocol crate
//!   implements, and the [`SessionCx`] it reports through. One
//!   [`Agent::run_session`] call is one session (dial, handshake, steady state)
//!   that returns a [`SessionEnd`]; the engine counts it and reconnects.
//! - [`outcome`]: what a session ends with ([`Failure`], [`SessionEnd`]) and
//!   the names the engine counts.
//! - [`run`] (module `engine`): paced ramp with jitter, a semaphore on concurrent dials,
//!   jittered exponential [`Backoff`] between sessions, one cancellation tree
//!   (each agent a child token), and a bounded graceful shutdown.
//! - Source addresses are handed to each session ([`SessionCx::bind_addr`]);
//!   sockets and TLS live in `agent-sim-net`.
//! - [`units`]: human units for durations and rates (`20s`, `500/s`).
//! - [`scenario`]: the scenario timeline (churn, max session length,
//!   storms, pauses, ramp-down) as given and as resolved; the `driver`
//!   runs it, `freeze` stands paused sessions still, and the `ledger`
//!   keeps, per agent, what the reports and the scenario need. One way:
//!   the engine's agent tasks and the driver (the scenario's clock) tell
//!   the ledger what happened and read back what to do next; the ledger
//!   never calls either.
//! - [`ceiling`]: a dial the load box itself refused (ports, fds, socket
//!   memory) waits for one of the fleet's own connections to close instead
//!   of retrying into the same wall, reported once with the numbers.
//! - [`backoff`]: the reconnect policies (`exponential` with equal jitter by
//!   default, `full-jitter`, `fixed`, `none`).
//! - [`wake`]: the wait at the top of every protocol's session loop
//!   (cancellation, connection and streams, a side call, a timer: one
//!   [`wake::Woke`]).
//!
//! Reconvergence: every established session lost is attributed to at most
//! one disruption (the scenario's, or a backend restart the engine detects
//! from many sessions lost at once, see `ledger`), and the time until the
//! agent is in steady state again is recorded in the run's
//! [`agent_sim_metrics::disruption::DisruptionLog`]. Scenario-made ends
//! are counted under their own causes (`scenario_storm`, `scenario_churn`,
//! `max_session_length`, `ramp_down`), never as errors, and never decide
//! the outcome by themselves.
//!
//! Outcome bookkeeping: every agent's last failure is kept, so that the
//! report says why each agent missing at the end is missing; a session that
//! fails is always retried with backoff, as a real agent does, unless
//! `fail_fast` stops the run at the first cause that cannot heal by itself
//! (as declared by the protocol's [`agent_sim_metrics::ErrorKindSpec`]);
//! when no agent ever held a session and every agent has failed twice with
//! such a cause, the fleet stops early instead of idling.
//!
//! What it is not: it opens no sockets itself and records no protocol metrics;
//! it only maintains the sessions gauge, the reconnect counters and error
//! kinds reported through [`SessionEnd`].

pub mod backoff;
pub mod boot;
pub mod ceiling;
mod driver;
mod engine;
mod freeze;
mod ledger;
pub mod outcome;
pub mod scenario;
pub mod servers;
pub mod session;
pub mod units;
pub mod wake;

pub use agent_sim_metrics::disruption::Resync;
pub use backoff::{Backoff, ReconnectPolicy};
pub use boot::{Boot, Step};
pub use engine::{FleetConfig, FleetReport, FleetStatus, InvalidFleetConfig, run};
pub use ledger::{DETECT_WINDOW, PAUSE_SETTLE, detect_threshold};
pub use outcome::{
    CAUSE_NO_ANSWER_YET, COUNTER_AGENTS_RECONNECTED, COUNTER_RECONNECT_ATTEMPTS, COUNTER_SESSIONS,
    Failure, SessionEnd, Stopped, dial_error_kinds, metrics_spec,
};
pub use scenario::Scenario;
pub use session::{Agent, AgentFactory, BoxFuture, SessionCx};
pub use units::{Rate, parse_duration};
