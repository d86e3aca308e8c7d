//! agent-sim as a library: the command line, and a builder that runs a fleet
//! from another Rust program or test and returns the run [`Summary`].
//!
//! Main parts, leaves first (imports go one way): [`values`] (typed flag
//! values), [`exit`] (exit codes), [`args`] (clap flags only), [`defaults`]
//! (every default) and [`help`] (the command with its defaults shown),
//! [`plan`] (the validated run: fleets, shard, usage errors), [`scenario`]
//! (scenario flags and `[[scenario]]` sections onto each fleet),
//! [`settings`] (the effective settings for the summary), [`observing`]
//! (the servers `--observe` reads), [`shard`] (the shard index from
//! `--shard` or the engine's variable), [`results`] (the one merge → report
//! path: summaries and hlogs of several processes as one summary and one
//! page, result files written whole), [`local`] (a run as local processes
//! when one cannot hold it), [`config`]
//! (layering defaults < file < env < flags into a plan), [`preflight`] (fds, ports, somaxconn,
//! conntrack, memory and the result files before any socket), [`run`] (orchestration,
//! progress, hlog, Prometheus, summary, assertions), [`serve`] (`agent-sim
//! serve`), [`report_cmd`] (`report show|merge|html`), [`cleanup_cmd`]
//! (`agent-sim cleanup`), [`doctor_cmd`] (`agent-sim doctor`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), agent_sim::run::RunError> {
//! use std::time::Duration;
//! // 200 Sensu agents against the embedded backend for 5 seconds.
//! let outcome = agent_sim::RunBuilder::new(agent_sim::Kind::Sensu)
//!     .agents(200)
//!     .duration(Duration::from_secs(5))
//!     .run()
//!     .await?;
//! assert_eq!(outcome.summary.agents.connected, 200);
//! # Ok(()) }
//! ```

pub mod args;
pub mod cleanup_cmd;
pub mod config;
pub mod defaults;
pub mod doctor_cmd;
pub mod exit;
pub mod help;
pub mod local;
pub mod observing;
pub mod plan;
pub mod preflight;
pub mod progress;
pub mod report_cmd;
pub mod results;
pub mod run;
pub mod scenario;
pub mod serve;
pub mod settings;
pub mod shard;
pub mod steps;
pub mod study;
pub mod values;

use std::time::Duration;

pub use agent_sim_metrics::Summary;
use tokio_util::sync::CancellationToken;

use agent_sim_metrics::assert::Assertion;

use crate::args::RunArgs;
use crate::run::{Output, RunError, RunOutcome};
pub use crate::values::{Kind, Ramp, Secs};

/// Builds and runs a fleet in-process (see the crate example). Anything the
/// command line accepts can be set through [`RunBuilder::args`].
#[derive(Debug, Clone)]
pub struct RunBuilder {
    args: RunArgs,
    shutdown: Option<CancellationToken>,
}

impl RunBuilder {
    /// A run of `kind` with default settings: 100
    /// agents against the embedded backend until [`RunBuilder::shutdown`]
    /// fires or the duration elapses.
    pub fn new(kind: Kind) -> Self {
        RunBuilder {
            args: RunArgs {
                kind: Some(kind),
                quiet: Some(true),
                ..RunArgs::default()
            },
            shutdown: None,
        }
    }

    /// Number of agents.
    pub fn agents(mut self, n: u64) -> Self {
        self.args.agents = Some(n);
        self
    }

    /// Adds a backend target (none = embedded backend).
    pub fn target(mut self, t: impl Into<String>) -> Self {
        self.args.targets.push(t.into());
        self
    }

    /// Run length.
    pub fn duration(mut self, d: Duration) -> Self {
        self.args.duration = Some(Secs(d));
        self
    }

    /// Start rate: `Ramp::per_second(1000.0)` or [`Ramp::All`].
    pub fn ramp(mut self, ramp: Ramp) -> Self {
        self.args.ramp = Some(ramp);
        self
    }

    /// Adds an SLO assertion (see [`agent_sim_metrics::assert`]).
    pub fn assert(mut self, assertion: Assertion) -> Self {
        self.args.asserts.push(assertion);
        self
    }

    /// Any other setting, exactly as the flags name it.
    pub fn args(mut self, f: impl FnOnce(&mut RunArgs)) -> Self {
        f(&mut self.args);
        self
    }

    /// A token that ends the run early (like Ctrl-C); the summary is still built.
    pub fn shutdown(mut self, token: CancellationToken) -> Self {
        self.shutdown = Some(token);
        self
    }

    /// Validates, runs and returns the outcome (the summary is also written
    /// to `--summary` if set). Must be called inside a multi-thread tokio runtime.
    pub async fn run(self) -> Result<RunOutcome, RunError> {
        let mut cfg = config::resolve(self.args, &|k| std::env::var(k).ok())?;
        preflight::outputs(&cfg)?;
        let host = preflight::Host::of_this_host();
        preflight::spread_loopback(&mut cfg, &host);
        let p = preflight::check(&cfg, &host)?;
        preflight::apply(&p, &host)?;
        run::execute(cfg, self.shutdown.unwrap_or_default(), Output::Silent).await
    }
}
