//! Measurement for agent-sim: counters, a sessions gauge and HDR latency
//! histograms, recorded from tens of thousands of agent tasks and merged on an
//! interval, plus the run [`Summary`] (JSON schema `agent-sim.summary.v2`) and its
//! human-readable table.
//!
//! Main parts:
//! - [`Metrics`]: a cheap-to-clone handle. Names of counters and latencies are
//!   declared once at construction ([`MetricsSpec`]); recording goes through the
//!   resolved [`CounterId`] / [`LatencyId`]. Histograms are sharded (an agent
//!   records into shard `index % shards`), so a sample costs an uncontended
//!   lock and no channel send; [`Metrics::collect`] drains the shards into
//!   interval histograms and a cumulative one.
//! - [`summary`]: the serializable run summary and per-histogram percentiles.
//! - [`report`]: the final table printed for people.
//! - [`html`]: the report page: one self-contained HTML file with SVG charts.
//! - [`process`]: peak RSS and CPU time of this process.
//! - [`hlog`]: HdrHistogram interval logs (`--hlog PATH`), written and read.
//! - [`merge`]: exact merge of summaries and hlogs from several processes.
//! - [`assert`](mod@assert): SLO assertions (`--assert 'connect.p99 < 1s'`) and verdicts.
//! - [`prometheus`]: `/metrics` in the Prometheus text format, and its server.
//! - [`schema`]: the JSON Schema of the summary and a validator for it.
//! - [`timeline`]: the run over time (sessions, CPU, RSS, increments, latency
//!   per interval), bounded however long the run.
//! - [`disruption`]: disruptions (storms, churn, backend restarts) and the
//!   fleet's reconvergence after each, live and in the summary.
//! - [`compare`]: two runs side by side with the ratio B/A.
//! - [`server`]: the summary's `server` section (what observed servers did,
//!   and what each agent cost them), and [`storm`]: its storm figures (an
//!   observed Consul server's gossip and anti-entropy reads, as it counts them).
//! - [`histo`] and [`units`]: the leaves every part uses (histogram
//!   encoding and exact adds; readable units and instants).
//!
//! Imports go one way: the leaves at the bottom, the [`summary`] model
//! above them, what computes the summary (`disruption`, `timeline`,
//! `merge`, `assert`) above that, and presentation (`report`, `html`,
//! `prometheus`) on top.
//!
//! This crate knows no protocol: Sensu and Consul declare their own names.

pub mod assert;
pub mod capacity;
pub mod compare;
pub mod connect;
pub mod disruption;
pub mod gate;
pub mod histo;
pub mod hlog;
pub mod html;
pub mod late;
pub mod merge;
pub mod process;
pub mod prometheus;
pub mod report;
pub mod schema;
pub mod server;
pub mod spread;
pub mod step_window;
pub mod storm;
pub mod study;
pub mod summary;
pub mod timeline;
pub mod units;
pub mod vault;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

pub use schema::{SUMMARY_SCHEMA, SUMMARY_SCHEMA_V1};
pub use summary::{LatencySummary, ProbeSummary, Summary};
pub use vault::VaultSummary;

/// Lowest trackable latency, in microseconds.
pub const LATENCY_MIN_US: u64 = 1;
/// Highest trackable latency, in microseconds (one hour). Larger samples are
/// clamped to this value and counted in [`Metrics::clamped`].
pub const LATENCY_MAX_US: u64 = 3_600_000_000;
/// Significant figures kept by every latency histogram.
pub const LATENCY_SIGFIG: u8 = 3;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A histogram could not be serialized or parsed.
    #[error("histogram encoding: {0}")]
    Encoding(String),
    /// A histogram's text is not base64.
    #[error("histogram encoding: {0}")]
    Base64(#[source] base64::DecodeError),
    /// Histograms with different bounds cannot be merged.
    #[error("histogram merge: {0}")]
    Merge(String),
    /// A summary could not be written as JSON.
    #[error("summary: {0}")]
    Summary(#[source] serde_json::Error),
    /// A summary file could not be parsed.
    #[error("summary: {}: {source}", path.display())]
    SummaryFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: summary::SummaryError,
    },
    /// An HdrHistogram interval log could not be written, read or parsed
    /// (the message names the file).
    #[error("hlog: {0}")]
    Hlog(String),
    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Creates an empty latency histogram with the crate-wide bounds.
pub fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(LATENCY_MIN_US, LATENCY_MAX_US, LATENCY_SIGFIG)
        .expect("static histogram bounds are valid")
}

/// A shard's histogram: the same buckets, but its counts reach only as far
/// as the largest value recorded in it. One with the full bounds holds
/// 184 KiB of counts, and clearing it after each collect made every page
/// resident: shards × latencies of them (15 MiB on 2 cores, 128 shards on
/// 32 cores).
fn new_shard_histogram() -> Histogram<u64> {
    let mut h = Histogram::new_with_bounds(LATENCY_MIN_US, 2 * LATENCY_MIN_US, LATENCY_SIGFIG)
        .expect("static histogram bounds are valid");
    h.auto(true);
    h
}

/// Names of the counters and latency histograms a run records, and what
/// the protocols say about their error kinds.
#[derive(Debug, Clone, Default)]
pub struct MetricsSpec {
    /// Counter names, e.g. `keepalives_sent`.
    pub counters: Vec<&'static str>,
    /// Latency histogram names, e.g. `connect`.
    pub latencies: Vec<&'static str>,
    /// Error (and warning) kinds with a hint for people; kinds not declared
    /// are still counted, without a hint.
    pub errors: Vec<ErrorKindSpec>,
}

/// What a protocol declares about one error kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorKindSpec {
    /// The kind, e.g. `upgrade_401`.
    pub kind: &'static str,
    /// What to check, in people's words (flags to look at, server settings).
    pub hint: &'static str,
    /// Whether the cause can go away by itself (a restart, a cache refresh,
    /// load); `false`: bad credentials, unknown namespace, ACL denied, wrong
    /// protocol on the port.
    pub heals: bool,
    /// Whose words the kind's sample is: the server's (the common case), or
    /// the OS's (a refused connect, no port left), or agent-sim's own.
    pub said_by: Speaker,
}

/// Whose words an error kind's sample is (the server's, the OS's or
/// agent-sim's), from the transport crate where errors are told apart.
pub use agent_sim_net::Speaker;

/// Longest sample message kept per kind (characters).
pub const SAMPLE_MAX_CHARS: usize = 300;

/// What was seen of one error or warning kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindStat {
    /// Occurrences.
    pub count: u64,
    /// When the kind was first seen, after the recorder was created.
    pub first_seen: Duration,
    /// The first words it had, secrets redacted: the server's own (HTTP
    /// body or status line, gRPC status message, close reason), or the OS's
    /// or agent-sim's as [`KindStat::said_by`] says.
    pub sample: Option<String>,
    /// Whose words the sample is, when the recorder was told (from the
    /// error itself); else the kind's [`ErrorKindSpec::said_by`].
    pub said_by: Option<Speaker>,
}

/// One error or warning kind for reports: what was seen and what to check.
#[derive(Debug, Clone, PartialEq)]
pub struct KindReport {
    /// The kind.
    pub kind: String,
    /// What was seen.
    pub stat: KindStat,
    /// The declared hint, if any.
    pub hint: Option<&'static str>,
    /// Whether the cause can heal by itself (`true` when undeclared).
    pub heals: bool,
    /// Whose words the sample is (the server's when undeclared).
    pub said_by: Speaker,
}

impl MetricsSpec {
    /// Adds the names of `other` that are not present yet (mixed fleets).
    pub fn merge(mut self, other: &MetricsSpec) -> Self {
        for c in &other.counters {
            if !self.counters.contains(c) {
                self.counters.push(c);
            }
        }
        for l in &other.latencies {
            if !self.latencies.contains(l) {
                self.latencies.push(l);
            }
        }
        for e in &other.errors {
            if !self.errors.iter().any(|x| x.kind == e.kind) {
                self.errors.push(*e);
            }
        }
        self
    }
}

/// Index of a declared counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterId(usize);

/// Index of a declared latency histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyId(usize);

struct Shard {
    hists: Vec<Histogram<u64>>,
}

struct Inner {
    counter_names: Vec<&'static str>,
    counters: Vec<AtomicU64>,
    latency_names: Vec<&'static str>,
    shards: Vec<Mutex<Shard>>,
    clamped: AtomicU64,
    cumulative: Mutex<Vec<Histogram<u64>>>,
    errors: Mutex<BTreeMap<String, KindStat>>,
    warnings: Mutex<BTreeMap<String, KindStat>>,
    denied: Mutex<BTreeMap<String, u64>>,
    kinds: Vec<ErrorKindSpec>,
    secrets: Mutex<Vec<String>>,
    created: std::time::Instant,
    connected: AtomicI64,
    peak_connected: AtomicI64,
    disruptions: disruption::DisruptionLog,
    /// Held by [`Metrics::collect`] and [`Metrics::recorded_now`]: a sample
    /// is in a shard or in the cumulative histograms, never in neither.
    collecting: Mutex<()>,
}

/// Shared recorder for one run. Clone it freely; all clones record into the
/// same counters and histograms.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("counters", &self.inner.counter_names)
            .field("latencies", &self.inner.latency_names)
            .field("shards", &self.inner.shards.len())
            .finish()
    }
}

/// Point-in-time values of the counters and the sessions gauge.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// `(name, value)` for every declared counter, in declaration order.
    pub counters: Vec<(&'static str, u64)>,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// Warnings by kind.
    pub warnings: BTreeMap<String, u64>,
    /// Sessions established right now.
    pub connected: i64,
    /// Most sessions established at once.
    pub peak_connected: i64,
    /// The latest disruption whose lost sessions are not all back yet.
    pub disruption: Option<disruption::LiveDisruption>,
}

impl Snapshot {
    /// Value of a counter by name (0 when not declared).
    pub fn counter(&self, name: &str) -> u64 {
        self.counters
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .unwrap_or(0)
    }

    /// Sum of all error kinds.
    pub fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The most frequent error kind and its count, if any.
    pub fn top_error(&self) -> Option<(&str, u64)> {
        self.errors
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(k, v)| (k.as_str(), *v))
    }
}

impl Metrics {
    /// Creates a recorder for the given names with `shards` histogram shards
    /// (use about four per worker thread; at least one).
    pub fn new(spec: &MetricsSpec, shards: usize) -> Self {
        let shards = shards.max(1);
        let hist_set = |new: fn() -> Histogram<u64>| spec.latencies.iter().map(|_| new()).collect();
        Metrics {
            inner: Arc::new(Inner {
                counter_names: spec.counters.clone(),
                counters: spec.counters.iter().map(|_| AtomicU64::new(0)).collect(),
                latency_names: spec.latencies.clone(),
                shards: (0..shards)
                    .map(|_| {
                        Mutex::new(Shard {
                            hists: hist_set(new_shard_histogram),
                        })
                    })
                    .collect(),
                clamped: AtomicU64::new(0),
                cumulative: Mutex::new(hist_set(new_latency_histogram)),
                errors: Mutex::new(BTreeMap::new()),
                warnings: Mutex::new(BTreeMap::new()),
                denied: Mutex::new(BTreeMap::new()),
                kinds: spec.errors.clone(),
                secrets: Mutex::new(Vec::new()),
                created: std::time::Instant::now(),
                connected: AtomicI64::new(0),
                peak_connected: AtomicI64::new(0),
                disruptions: disruption::DisruptionLog::default(),
                collecting: Mutex::new(()),
            }),
        }
    }

    /// Resolves a counter name. Panics if the name was not declared: that is a
    /// programming error found by the first test that runs the code path.
    pub fn counter(&self, name: &str) -> CounterId {
        CounterId(
            self.inner
                .counter_names
                .iter()
                .position(|n| *n == name)
                .unwrap_or_else(|| panic!("counter {name:?} was not declared in MetricsSpec")),
        )
    }

    /// Resolves a latency histogram name (panics if not declared, see [`Metrics::counter`]).
    pub fn latency(&self, name: &str) -> LatencyId {
        LatencyId(
            self.inner
                .latency_names
                .iter()
                .position(|n| *n == name)
                .unwrap_or_else(|| panic!("latency {name:?} was not declared in MetricsSpec")),
        )
    }

    /// Declared latency names, in order.
    pub fn latency_names(&self) -> &[&'static str] {
        &self.inner.latency_names
    }

    /// Adds `n` to a counter.
    #[inline]
    pub fn add(&self, id: CounterId, n: u64) {
        self.inner.counters[id.0].fetch_add(n, Ordering::Relaxed);
    }

    /// Adds one to a counter.
    #[inline]
    pub fn incr(&self, id: CounterId) {
        self.add(id, 1);
    }

    /// Current value of a counter.
    pub fn get(&self, id: CounterId) -> u64 {
        self.inner.counters[id.0].load(Ordering::Relaxed)
    }

    /// Records a latency. `shard_key` spreads writers over shards (an agent
    /// index is a good key). Never panics: values outside the bounds are
    /// clamped and counted.
    #[inline]
    pub fn record(&self, id: LatencyId, shard_key: usize, value: Duration) {
        let us = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.record_us(id, shard_key, us);
    }

    /// Records a latency given in microseconds (see [`Metrics::record`]).
    pub fn record_us(&self, id: LatencyId, shard_key: usize, us: u64) {
        let v = if us > LATENCY_MAX_US {
            self.inner.clamped.fetch_add(1, Ordering::Relaxed);
            LATENCY_MAX_US
        } else {
            us.max(LATENCY_MIN_US)
        };
        let shard = &self.inner.shards[shard_key % self.inner.shards.len()];
        let mut guard = shard.lock().unwrap_or_else(|p| p.into_inner());
        // In bounds by construction; saturate rather than panic regardless.
        let _ = guard.hists[id.0].record(v);
    }

    /// Samples that were above [`LATENCY_MAX_US`] and were clamped.
    pub fn clamped(&self) -> u64 {
        self.inner.clamped.load(Ordering::Relaxed)
    }

    /// Counts one failed operation of the given kind (e.g. `connect_refused`).
    pub fn error(&self, kind: &str) {
        self.error_with(kind, None);
    }

    /// Counts one failed operation, keeping `sample` (the server's own
    /// words) if this kind has none yet.
    pub fn error_with(&self, kind: &str, sample: Option<&str>) {
        self.tally(&self.inner.errors, kind, sample, None);
    }

    /// Counts one failed operation, keeping `sample` with whose words it is
    /// (`said_by`, told from the error itself: a refused dial is the OS's, a
    /// TLS alert the server's) if this kind has none yet.
    pub fn error_said(&self, kind: &str, sample: Option<&str>, said_by: Option<Speaker>) {
        self.tally(&self.inner.errors, kind, sample, said_by);
    }

    /// Counts one warning: something a real agent logs and carries on with
    /// (e.g. no `entity_config` within its wait); not an error.
    pub fn warn(&self, kind: &str, sample: Option<&str>) {
        self.tally(&self.inner.warnings, kind, sample, None);
    }

    /// Counts one call the server refused for the caller's credentials
    /// (unknown token, permission denied, bad password), by what was
    /// called (`Catalog.Register`, `subscribe`, `agent websocket`): beside
    /// the error, never a success.
    pub fn denied(&self, what: &str) {
        *self
            .lock(&self.inner.denied)
            .entry(what.to_owned())
            .or_insert(0) += 1;
    }

    /// The calls refused for their credentials so far, by what was called.
    pub fn denial_report(&self) -> BTreeMap<String, u64> {
        self.lock(&self.inner.denied).clone()
    }

    /// A secret (password, token) that must never appear in a sample: every
    /// occurrence is replaced by `<redacted>`. Empty strings are ignored.
    pub fn add_secret(&self, secret: &str) {
        if !secret.is_empty() {
            self.lock(&self.inner.secrets).push(secret.to_owned());
        }
    }

    fn lock<'a, T>(&self, m: &'a Mutex<T>) -> std::sync::MutexGuard<'a, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tally(
        &self,
        map: &Mutex<BTreeMap<String, KindStat>>,
        kind: &str,
        sample: Option<&str>,
        said_by: Option<Speaker>,
    ) {
        let mut map = self.lock(map);
        let needs_sample = match map.get_mut(kind) {
            Some(stat) => {
                stat.count += 1;
                stat.sample.is_none()
            }
            None => {
                map.insert(
                    kind.to_owned(),
                    KindStat {
                        count: 1,
                        first_seen: self.inner.created.elapsed(),
                        sample: None,
                        said_by: None,
                    },
                );
                true
            }
        };
        if needs_sample && let Some(text) = sample {
            let clean = self.clean_sample(text);
            if let Some(stat) = map.get_mut(kind) {
                stat.sample = Some(clean);
                stat.said_by = said_by;
            }
        }
    }

    /// One line, at most [`SAMPLE_MAX_CHARS`], secrets redacted.
    fn clean_sample(&self, text: &str) -> String {
        let mut line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for secret in self.lock(&self.inner.secrets).iter() {
            line = line.replace(secret.as_str(), "<redacted>");
        }
        if line.chars().count() > SAMPLE_MAX_CHARS {
            line = line.chars().take(SAMPLE_MAX_CHARS).collect::<String>() + "…";
        }
        line
    }

    /// Every error kind seen, most frequent first, with its hint.
    pub fn error_report(&self) -> Vec<KindReport> {
        self.report_of(&self.inner.errors)
    }

    /// Every warning kind seen, most frequent first.
    pub fn warning_report(&self) -> Vec<KindReport> {
        self.report_of(&self.inner.warnings)
    }

    /// The words kept of warning `kind` (its sample), when it was seen with
    /// some.
    pub fn warning_sample(&self, kind: &str) -> Option<String> {
        self.sample_of(&self.inner.warnings, kind)
    }

    /// The words kept of error `kind` (its sample), when it was seen with
    /// some.
    pub fn error_sample(&self, kind: &str) -> Option<String> {
        self.sample_of(&self.inner.errors, kind)
    }

    fn sample_of(&self, map: &Mutex<BTreeMap<String, KindStat>>, kind: &str) -> Option<String> {
        self.lock(map).get(kind).and_then(|s| s.sample.clone())
    }

    /// Whose words the kept sample of error `kind` is: as the recorder was
    /// told, else as the kind declares, else the server's.
    pub fn error_speaker(&self, kind: &str) -> Speaker {
        let told = self
            .lock(&self.inner.errors)
            .get(kind)
            .and_then(|s| s.said_by);
        told.or(self.error_kind(kind).map(|s| s.said_by))
            .unwrap_or_default()
    }

    fn report_of(&self, map: &Mutex<BTreeMap<String, KindStat>>) -> Vec<KindReport> {
        let mut out: Vec<KindReport> = self
            .lock(map)
            .iter()
            .map(|(kind, stat)| {
                let spec = self.inner.kinds.iter().find(|k| k.kind == kind.as_str());
                KindReport {
                    kind: kind.clone(),
                    stat: stat.clone(),
                    hint: spec.map(|s| s.hint),
                    heals: spec.is_none_or(|s| s.heals),
                    said_by: stat.said_by.or(spec.map(|s| s.said_by)).unwrap_or_default(),
                }
            })
            .collect();
        out.sort_by(|a, b| b.stat.count.cmp(&a.stat.count).then(a.kind.cmp(&b.kind)));
        out
    }

    /// The declared spec of an error kind.
    pub fn error_kind(&self, kind: &str) -> Option<ErrorKindSpec> {
        self.inner.kinds.iter().find(|k| k.kind == kind).copied()
    }

    /// Marks one session established (gauge up, peak tracked).
    pub fn session_up(&self) {
        let now = self.inner.connected.fetch_add(1, Ordering::Relaxed) + 1;
        self.inner.peak_connected.fetch_max(now, Ordering::Relaxed);
    }

    /// Marks one session gone.
    pub fn session_down(&self) {
        self.inner.connected.fetch_sub(1, Ordering::Relaxed);
    }

    /// Sessions established right now.
    pub fn connected(&self) -> i64 {
        self.inner.connected.load(Ordering::Relaxed)
    }

    /// Counters, errors and gauge values now.
    pub fn snapshot(&self) -> Snapshot {
        // One lock at a time, each in its own statement: a guard inside the
        // literal would be held while the next lock is taken.
        let count = |m: &Mutex<BTreeMap<String, KindStat>>| -> BTreeMap<String, u64> {
            self.lock(m)
                .iter()
                .map(|(k, v)| (k.clone(), v.count))
                .collect()
        };
        let errors = count(&self.inner.errors);
        let warnings = count(&self.inner.warnings);
        let disruption = self
            .inner
            .disruptions
            .live()
            .into_iter()
            .rev()
            .find(|d| d.back < d.lost);
        Snapshot {
            counters: self
                .inner
                .counter_names
                .iter()
                .zip(&self.inner.counters)
                .map(|(n, c)| (*n, c.load(Ordering::Relaxed)))
                .collect(),
            errors,
            warnings,
            connected: self.inner.connected.load(Ordering::Relaxed),
            peak_connected: self.inner.peak_connected.load(Ordering::Relaxed),
            disruption,
        }
    }

    /// The run's disruptions and the reconvergence after each.
    pub fn disruptions(&self) -> &disruption::DisruptionLog {
        &self.inner.disruptions
    }

    /// Drains every shard: returns what was recorded since the previous call
    /// (one histogram per declared name, in order) and adds it to the
    /// cumulative histograms. Call it from one reporter task on an interval.
    pub fn collect(&self) -> Vec<(&'static str, Histogram<u64>)> {
        let _one = self.lock(&self.inner.collecting);
        let mut interval: Vec<Histogram<u64>> = self
            .inner
            .latency_names
            .iter()
            .map(|_| new_latency_histogram())
            .collect();
        for shard in &self.inner.shards {
            let mut guard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (acc, h) in interval.iter_mut().zip(guard.hists.iter_mut()) {
                if !h.is_empty() {
                    // Same bounds everywhere: cannot fail.
                    let _ = acc.add(&*h);
                    h.reset();
                }
            }
        }
        let mut cumulative = self
            .inner
            .cumulative
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (acc, h) in cumulative.iter_mut().zip(&interval) {
            let _ = acc.add(h);
        }
        self.inner
            .latency_names
            .iter()
            .copied()
            .zip(interval)
            .collect()
    }

    /// Everything recorded so far (call [`Metrics::collect`] first to include
    /// the newest samples).
    pub fn cumulative(&self) -> Vec<(&'static str, Histogram<u64>)> {
        let cumulative = self
            .inner
            .cumulative
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.inner
            .latency_names
            .iter()
            .copied()
            .zip(cumulative.iter().cloned())
            .collect()
    }

    /// Everything recorded up to now, the samples not yet collected
    /// included, without draining them: the reporter's intervals stay
    /// whole. A stepped run reads it at each window's edges.
    pub fn recorded_now(&self) -> Vec<(&'static str, Histogram<u64>)> {
        let _one = self.lock(&self.inner.collecting);
        let mut all: Vec<Histogram<u64>> = self.cumulative().into_iter().map(|(_, h)| h).collect();
        for shard in &self.inner.shards {
            let guard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (acc, h) in all.iter_mut().zip(guard.hists.iter()) {
                if !h.is_empty() {
                    // Same bounds everywhere: cannot fail.
                    let _ = acc.add(h);
                }
            }
        }
        self.inner.latency_names.iter().copied().zip(all).collect()
    }

    /// What latency `name` recorded so far, if the run declares it (as
    /// [`Metrics::cumulative`], one histogram copied).
    pub fn cumulative_of(&self, name: &str) -> Option<Histogram<u64>> {
        let at = self.inner.latency_names.iter().position(|n| *n == name)?;
        let cumulative = self
            .inner
            .cumulative
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cumulative.get(at).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MetricsSpec {
        MetricsSpec {
            counters: vec!["a", "b"],
            latencies: vec!["connect", "rtt"],
            errors: vec![ErrorKindSpec {
                kind: "refused",
                hint: "is the server up?",
                heals: true,
                said_by: Speaker::Os,
            }],
        }
    }

    #[test]
    fn a_sample_says_whose_words_it_is_as_it_was_told_else_as_declared() {
        let m = Metrics::new(&spec(), 1);
        // Declared the OS's, but this sample was the server's answer.
        m.error_said("refused", Some("the server said no"), Some(Speaker::Server));
        m.error_said("refused", Some("later"), Some(Speaker::Os));
        m.error_with("conn_error", Some("reset"));
        m.error_said("tls", None, Some(Speaker::Local));
        m.error_said(
            "tls",
            Some("invalid peer certificate"),
            Some(Speaker::Local),
        );
        let by = |k: &str| m.error_report().into_iter().find(|r| r.kind == k).unwrap();
        assert_eq!(by("refused").said_by, Speaker::Server);
        assert_eq!(m.error_speaker("refused"), Speaker::Server);
        assert_eq!(by("conn_error").said_by, Speaker::Server);
        assert_eq!(by("tls").said_by, Speaker::Local);
        assert_eq!(
            by("tls").stat.sample.as_deref(),
            Some("invalid peer certificate")
        );
        // Untold, the kind's declaration holds.
        let d = Metrics::new(&spec(), 1);
        d.error_with("refused", Some("connection refused"));
        assert_eq!(d.error_speaker("refused"), Speaker::Os);
    }

    #[test]
    fn errors_keep_the_first_sample_a_hint_and_no_secret() {
        let m = Metrics::new(&spec(), 1);
        m.add_secret("P@ssw0rd!");
        m.error("refused");
        m.error_with("refused", Some("dial tcp: connection refused\n(retrying)"));
        m.error_with("refused", Some("a later message"));
        m.error_with(
            "upgrade_401",
            Some("wrong password for user agent (sent P@ssw0rd!)"),
        );
        m.error_with("long", Some(&"x".repeat(1000)));
        m.warn("entity_config_timeout", None);
        let r = m.error_report();
        assert_eq!(r[0].kind, "refused");
        assert_eq!(r[0].stat.count, 3);
        assert_eq!(
            r[0].stat.sample.as_deref(),
            Some("dial tcp: connection refused (retrying)")
        );
        assert_eq!(r[0].hint, Some("is the server up?"));
        let u = r.iter().find(|k| k.kind == "upgrade_401").unwrap();
        let sample = u.stat.sample.as_deref().unwrap();
        assert!(
            !sample.contains("P@ssw0rd!") && sample.contains("<redacted>"),
            "{sample}"
        );
        assert!((u.hint, u.heals) == (None, true));
        let long = r.iter().find(|k| k.kind == "long").unwrap();
        assert_eq!(
            long.stat.sample.as_ref().unwrap().chars().count(),
            SAMPLE_MAX_CHARS + 1
        );
        assert!(r[0].stat.first_seen <= u.stat.first_seen);
        let s = m.snapshot();
        assert_eq!(s.top_error(), Some(("refused", 3)));
        assert_eq!(s.warnings["entity_config_timeout"], 1);
        assert_eq!(s.errors.get("entity_config_timeout"), None);
        assert_eq!(m.warning_report()[0].stat.count, 1);
    }

    #[test]
    fn a_warnings_words_are_read_by_its_kind() {
        let m = Metrics::new(&spec(), 1);
        m.warn("view_full", Some("web: 65,536 instances kept"));
        m.warn("quiet", None);
        assert_eq!(
            m.warning_sample("view_full").as_deref(),
            Some("web: 65,536 instances kept")
        );
        assert_eq!(m.warning_sample("quiet"), None);
        assert_eq!(m.warning_sample("never"), None);
    }

    #[test]
    fn counters_gauge_and_errors() {
        let m = Metrics::new(&spec(), 4);
        let a = m.counter("a");
        m.incr(a);
        m.add(a, 4);
        m.session_up();
        m.session_up();
        m.session_down();
        m.error("refused");
        m.error("refused");
        m.error("timeout");
        let s = m.snapshot();
        assert_eq!(s.counter("a"), 5);
        assert_eq!(s.counter("b"), 0);
        assert_eq!(s.connected, 1);
        assert_eq!(s.peak_connected, 2);
        assert_eq!(s.errors["refused"], 2);
        assert_eq!(s.errors_total(), 3);
    }

    #[test]
    fn shards_merge_into_interval_and_cumulative() {
        let m = Metrics::new(&spec(), 3);
        let c = m.latency("connect");
        for i in 0..300u64 {
            m.record_us(c, i as usize, 1000 + i);
        }
        let first = m.collect();
        assert_eq!(first[0].0, "connect");
        assert_eq!(first[0].1.len(), 300);
        assert_eq!(first[1].1.len(), 0);
        m.record(c, 7, Duration::from_millis(5));
        let second = m.collect();
        assert_eq!(second[0].1.len(), 1);
        let total = m.cumulative();
        assert_eq!(total[0].1.len(), 301);
        assert_eq!(m.cumulative_of("connect").unwrap().len(), 301);
        assert_eq!(m.cumulative_of("rtt").unwrap().len(), 0);
        assert!(m.cumulative_of("undeclared").is_none());
    }

    #[test]
    fn out_of_range_values_are_clamped_not_panicking() {
        let m = Metrics::new(&spec(), 1);
        let c = m.latency("rtt");
        m.record_us(c, 0, 0);
        m.record_us(c, 0, u64::MAX);
        m.record(c, 0, Duration::from_secs(10 * 3600));
        m.collect();
        let h = &m.cumulative()[1].1;
        assert_eq!(h.len(), 3);
        assert_eq!(m.clamped(), 2);
        assert!(h.max() >= LATENCY_MAX_US / 2);
    }

    #[test]
    #[should_panic(expected = "not declared")]
    fn unknown_names_are_programming_errors() {
        Metrics::new(&spec(), 1).counter("nope");
    }
}
