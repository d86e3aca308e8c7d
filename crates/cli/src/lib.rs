//! agent-sim as a library: the command line, and a builder that runs a fleet
//! from another Rust program or test and returns the run [`Summary`].
//!
//! Main parts: [`args`] (clap flags), [`config`] (layering defaults < file <
//! env < flags, validation, shards), [`preflight`] (fds and ports before any
//! socket), [`run`] (orchestration, progress, hlog, Prometheus, summary,
//! assertions), [`serve`] (`agent-sim serve`), [`report_cmd`] (`report
//! show|merge`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), agent_sim::run::RunError> {
//! use std::time::Duration;
//! // 200 Sensu agents against the embedded backend for 5 seconds.
//! let outcome = agent_sim::RunBuilder::new("sensu")
//!     .agents(200)
//!     .duration(Duration::from_secs(5))
//!     .run()
//!     .await?;
//! assert_eq!(outcome.summary.agents.connected, 200);
//! # Ok(()) }
//! ```

pub mod args;
pub mod config;
pub mod preflight;
pub mod progress;
pub mod report_cmd;
pub mod run;
pub mod serve;

use std::time::Duration;

pub use agent_sim_metrics::Summary;
use tokio_util::sync::CancellationToken;

use crate::args::RunArgs;
use crate::run::{Output, RunError, RunOutcome};

/// Builds and runs a fleet in-process (see the crate example). Anything the
/// command line accepts can be set through [`RunBuilder::args`].
#[derive(Debug, Clone)]
pub struct RunBuilder {
    args: RunArgs,
    shutdown: Option<CancellationToken>,
}

impl RunBuilder {
    /// A run of `kind` (`sensu` or `consul`) with default settings: 100
    /// agents against the embedded backend until [`RunBuilder::shutdown`]
    /// fires or the duration elapses.
    pub fn new(kind: &str) -> Self {
        RunBuilder {
            args: RunArgs {
                kind: Some(kind.to_string()),
                quiet: true,
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
        self.args.duration = Some(format!("{}ms", d.as_millis()));
        self
    }

    /// Start rate, e.g. `"1000/s"` or `"all"`.
    pub fn ramp(mut self, rate: &str) -> Self {
        self.args.ramp = Some(rate.to_string());
        self
    }

    /// Adds an SLO assertion (see [`agent_sim_metrics::assert`]).
    pub fn assert(mut self, expr: &str) -> Self {
        self.args.asserts.push(expr.to_string());
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
        let cfg = config::resolve(self.args, &|k| std::env::var(k).ok())?;
        let limits = preflight::Limits::of_this_host();
        let p = preflight::check(&cfg, limits)?;
        preflight::apply(&p, limits)?;
        run::execute(cfg, self.shutdown.unwrap_or_default(), Output::Silent).await
    }
}
