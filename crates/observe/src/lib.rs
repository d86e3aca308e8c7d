//! The server's side of a run: while agent-sim loads a backend, this crate
//! reads what the backend says of itself, on the run's time axis, and
//! works out what each agent cost it.
//!
//! Main parts:
//! - [`target`]: what to observe ([`ObserveSpec`] as the flags name it,
//!   [`Target`] as the observer reads it): a Prometheus text endpoint, a
//!   Consul server's `/v1/agent/metrics` (with the run's token and TLS, and
//!   the JSON format when the server keeps no Prometheus metrics), or a
//!   process on this host (`/proc/PID`).
//! - `fetch`: one HTTP(S) GET with a size limit on the project's HTTP/1
//!   client (a new connection per scrape: one every few seconds costs
//!   nothing and never holds a socket a slow server could stall).
//! - [`reading`]: one scrape as typed series (counters, gauges, summaries,
//!   histograms, Consul's 10-second windows), parsed with the
//!   `prometheus-parse` crate (see the module for why).
//! - [`kinds`]: which series each kind of server gets kept by default
//!   (found on real Consul 1.20 and Sensu Go 6.12 servers) and their units
//!   (Consul's and Sensu's summaries are milliseconds).
//! - [`figures`]: readings to the summary's `server` section: per-interval
//!   rates and quantiles, the baseline, the steady state, cores per 1,000
//!   agents, RSS per agent, latencies under load vs at baseline.
//! - [`storm`]: a Consul server's storm figures (its gossip bytes and
//!   messages, serf's queues and member events, the handler queue's drops,
//!   anti-entropy reads) per interval and over the run: the section's
//!   `storm`.
//! - [`members`]: a Consul server's own view of the run's gossip members
//!   (`/v1/agent/members` by serf status, critical `serfHealth` checks),
//!   polled with the metrics when the fleet gossips: the section's `gossip`.
//! - [`Observer`]: the task. A baseline before the first agent dials, a
//!   scrape every interval on its own task (a timeout below the interval,
//!   never two at once, parsing off the async workers), a last one after
//!   the last agent left. A failed scrape is a warning with the server's
//!   words; it never fails or delays the run. Members the server marked
//!   failed are a warning too (`gossip_members_failed`).
//!
//! What it is not: it loads nothing and knows no protocol of the agents.

mod fetch;
pub mod figures;
pub mod kinds;
mod live;
pub mod members;
mod observer;
pub mod reading;
pub mod storm;
pub mod target;

pub use kinds::ServerKind;
pub use live::LiveView;
pub use members::GossipWatch;
pub use observer::{ObserveConfig, Observer, RunView, warning_kinds};
pub use target::{Endpoint, ObserveSpec, Target};

/// Errors of this crate: a setting that cannot be used, or why a scrape
/// failed (that one becomes a warning's words, never the run's error).
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// `consul=` or `sensu=` without an address.
    #[error("{0:?}: an address after `=` (host:port or a URL)")]
    SpecNoAddress(String),
    /// A `--observe` URL without a host.
    #[error("{0:?}: no host")]
    SpecNoHost(String),
    /// A `--observe` value that names nothing observable.
    #[error("{0:?}: expected a URL (http://host:port/metrics), consul[=ADDR] or sensu[=ADDR]")]
    SpecUnknown(String),
    /// `--observe-pid` of no process this host shows.
    #[error("--observe-pid {0}: no such process on this host (or /proc/{0} is not readable)")]
    NoProcess(u32),
    /// A `--observe` URL that does not parse.
    #[error("{spec:?}: {source}")]
    SpecUrl {
        /// The value as typed.
        spec: String,
        /// Why it is not a URL.
        source: http::uri::InvalidUri,
    },
    /// TLS settings that do not load.
    #[error("TLS: {0}")]
    Tls(#[from] agent_sim_net::TlsError),
    /// A scraped URL that does not parse.
    #[error("bad URL: {0}")]
    Url(#[source] http::uri::InvalidUri),
    /// A scraped URL without a host.
    #[error("no host in the URL")]
    NoHost,
    /// An `https://` URL without TLS settings.
    #[error("https:// without TLS settings")]
    NoTls,
    /// The name to verify is not a DNS name or an IP address.
    #[error("server name {name:?}: {source}")]
    ServerName {
        /// The name.
        name: String,
        /// Why it is not one.
        source: rustls_pki_types::InvalidDnsNameError,
    },
    /// The GET failed (dial, TLS, HTTP, the answer's size).
    #[error(transparent)]
    Http(#[from] agent_sim_net::http::Error),
    /// An answer that is not the JSON expected.
    #[error("not {what} ({bytes} bytes): {source}")]
    Answer {
        /// What was expected (`a list of members`).
        what: &'static str,
        /// The answer's size.
        bytes: usize,
        /// Why it does not parse.
        source: serde_json::Error,
    },
}
