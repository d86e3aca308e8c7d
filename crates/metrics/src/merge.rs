//! Exact merge of results from several processes or boxes (`agent-sim report
//! merge FILE...`): summaries of shards combined into one summary, and
//! histograms read from interval logs applied onto it.
//!
//! Latency percentiles of the result always come from the *added histograms*
//! (each summary latency embeds its histogram as `hdr`), never from averaging
//! percentiles; a part whose latency has samples but no `hdr` is an error.
//!
//! How each field combines (parts are shards of one run, or runs side by side):
//! - `kind`: the common kind, or `mixed`; `targets`: union in first-seen order.
//! - `started_at`: the earliest; `duration_s`: the longest.
//! - `agents.*`, counters, errors, `rates_per_s`: summed. `peak_connected` is
//!   the sum of the peaks, an upper bound of the fleet's true peak (the shards'
//!   peaks need not coincide).
//! - `process.*`: summed, i.e. the fleet total of all simulator processes
//!   (total peak RSS, total CPU seconds), not a per-process figure.
//! - `probes`: shard 0 (role `controller`) makes each change and times its
//!   own agents from T0; every other shard (role `observer`) times its agents
//!   from its own first arrival of that change. Entries are joined by
//!   their change id (JSON `raft_index`: an identifier of the change that is
//!   the same for every subscriber, whatever the protocol), or by `id` when
//!   an entry has none (older summaries).
//!   Within a join: `delivered`/`expected` summed; each part's histogram is
//!   shifted onto the common zero — an observer's by
//!   `first_arrival_unix_us − t0_unix_us` (each recorded bucket value plus
//!   the shift, below 0 counted as 0 and said in `note`) — and added; `id`,
//!   `t0`, `t0_unix_us` from the controller with the earliest T0 (a
//!   controller's own arrivals are never shifted: several controllers of
//!   one probe are shards on servers of their own, as the local processes
//!   of a run on the embedded backend are, each timing the change it made);
//!   `time_to_99pct_us` recomputed from the merged histogram (the value by
//!   which 99 % of `expected` had arrived; `None` when fewer did; when
//!   `expected == 0` the parts' maximum is kept). A lone controller entry is
//!   kept exactly as it is. Observer entries with no controller entry are
//!   joined among themselves (zero = their earliest first arrival), kept,
//!   and flagged in `note` — never dropped.
//!
//!   When any part has observer entries, `latency_us.propagation` (which
//!   only the controller records) is rebuilt as the sum of the merged
//!   controller-role probes' histograms, i.e. every shard's deliveries.
//!
//!   Precision: a shifted value moves by at most one HDR bucket (3
//!   significant figures, ≤ 0.1 %) of the observer's offset; accuracy:
//!   cross-process latencies compare two wall clocks and are only as good as
//!   their sync (see `docs/multi-box.md`). Within the controller's process no
//!   shift happens and latencies stay on one monotonic clock.
//! - `timeline`: the parts' samples on one grid from the earliest start,
//!   levels and increments summed ([`crate::timeline::merge_timelines`]);
//!   `config`: one object, keys on which the parts differ listing each
//!   part's value ([`merge_configs`]); `disruptions`: see
//!   [`crate::disruption::merge`] (the same scheduled disruption of every
//!   shard joined exactly; detected ones of a fleet, put on the earliest
//!   start's clock, joined when their starts are within 2 s).
//! - `shard`: `None`.
//!
//! It does not read files: see [`crate::summary::Summary::read`] and
//! [`crate::hlog::read_hlog`].

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::assert::Assertion;
use crate::capacity::{CapacitySummary, Limit, StepSummary, StepVerdict};
use crate::disruption::DisruptionSummary;
use crate::histo::{add_into, add_shifted, value_at_rank};
use crate::server::ServerSummary;
use crate::step_window::{StepHead, judge};
use crate::summary::{KindEntry, LatencySummary, Outcome, ProbeSummary, SCHEMA_V2, Summary};
use crate::{MetricsError, new_latency_histogram};

/// Time by which 99 % of `expected` subscribers had the change, from the
/// histogram of their delivery latencies.
pub fn time_to_99pct(h: &Histogram<u64>, expected: u64) -> Option<u64> {
    value_at_rank(h, expected.saturating_mul(99).div_ceil(100))
}

/// Latency name of probe deliveries (after T0), rebuilt by a merge that
/// joins observer entries.
pub const PROPAGATION: &str = "propagation";

/// The entries of one probe over the parts, with their histograms.
type ProbeGroup = Vec<(ProbeSummary, Histogram<u64>)>;

/// What joins probe entries of several parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ProbeKey {
    /// Older summaries without a change id: the controller's sequence number.
    Id(u64),
    /// The change id every subscriber saw.
    Change(u64),
}

impl std::fmt::Display for ProbeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeKey::Id(id) => write!(f, "id {id}"),
            ProbeKey::Change(i) => write!(f, "change {i}"),
        }
    }
}

/// `note` of observer entries no controller entry joined.
pub const NOTE_NO_CONTROLLER: &str = "no controller entry for this change: latencies are \
     after the earliest observed arrival, not after T0 (the controller's summary is missing, \
     or this change was its setup/cleanup or a probe it did not report)";

/// `note` of a probe several controllers made (after their number).
pub const NOTE_OWN_SERVERS: &str = "changes, one per part with servers of its own, each \
     part's arrivals timed from its own T0 (t0 is the earliest)";

/// The zero a probe entry's latencies count from: its T0, or for an
/// observer its first arrival (wall clock, µs).
fn zero_of(p: &ProbeSummary) -> Option<u64> {
    if p.is_observer() {
        p.first_arrival_unix_us
    } else {
        p.t0_unix_us
    }
}

/// The entry giving id, t0 and change id: the controller with the earliest
/// T0, else the first observer.
fn template(parts: &ProbeGroup, any_controller: bool) -> &ProbeSummary {
    parts
        .iter()
        .filter(|(p, _)| p.is_observer() != any_controller)
        .min_by(|(a, _), (b, _)| match (a.t0.is_empty(), b.t0.is_empty()) {
            (false, true) => std::cmp::Ordering::Less,
            (true, false) => std::cmp::Ordering::Greater,
            _ => a.t0.cmp(&b.t0),
        })
        .map(|(p, _)| p)
        .unwrap_or(&parts[0].0)
}

/// The entries of one probe added on a common zero.
struct Added {
    /// Their arrivals, shifted onto the zero.
    h: Histogram<u64>,
    /// Arrivals that fell before the zero (counted as 0 µs).
    below_zero: u64,
    /// Observer entries without a wall-clock zero, added unshifted.
    unshifted: usize,
    /// The largest time-to-99 % of an entry.
    max_t99: Option<u64>,
}

/// Adds the entries' counts into `out` and their arrivals onto `base`;
/// controllers' notes of earlier merges go into `notes`.
fn add_entries(
    parts: &ProbeGroup,
    base: Option<u64>,
    out: &mut ProbeSummary,
    notes: &mut Vec<String>,
) -> Result<Added, MetricsError> {
    let mut a = Added {
        h: new_latency_histogram(),
        below_zero: 0,
        unshifted: 0,
        max_t99: None,
    };
    for (p, ph) in parts {
        out.delivered += p.delivered;
        out.expected += p.expected;
        a.max_t99 = a.max_t99.max(p.time_to_99pct_us);
        if !p.is_observer()
            && let Some(n) = &p.note
            && !notes.contains(n)
        {
            // Notes of earlier merges (observer notes are recomputed).
            notes.push(n.clone());
        }
        let shift = match (zero_of(p), base) {
            // A controller's arrivals count from its own T0: two controllers
            // of one probe made two changes (each shard on servers of its
            // own), each timed from the instant it was made.
            _ if !p.is_observer() => 0,
            (Some(z), Some(b)) => i128::from(z) - i128::from(b),
            _ => {
                if p.is_observer() {
                    a.unshifted += 1;
                }
                0
            }
        };
        add_shifted(&mut a.h, ph, shift, &mut a.below_zero)?;
    }
    Ok(a)
}

/// Combines the entries of one probe (see the module doc).
fn combine_probe(parts: ProbeGroup) -> Result<ProbeSummary, MetricsError> {
    use crate::summary::{ROLE_CONTROLLER, ROLE_OBSERVER};
    let any_controller = parts.iter().any(|(p, _)| !p.is_observer());
    if let [(only, _)] = parts.as_slice()
        && !only.is_observer()
    {
        return Ok(only.clone());
    }
    // The common zero: the earliest T0, or without a controller the
    // earliest first arrival.
    let base = parts
        .iter()
        .filter(|(p, _)| p.is_observer() != any_controller)
        .filter_map(|(p, _)| zero_of(p))
        .min();
    let template = template(&parts, any_controller);
    let mut out = ProbeSummary {
        id: template.id,
        kind: template.kind.clone(),
        t0: template.t0.clone(),
        change_id: template.change_id,
        fleet: template.fleet.clone(),
        written_us: template.written_us.filter(|_| any_controller),
        ..Default::default()
    };
    let mut notes: Vec<String> = Vec::new();
    let added = add_entries(&parts, base, &mut out, &mut notes)?;
    if any_controller {
        out.role = parts
            .iter()
            .any(|(p, _)| p.role.is_some())
            .then(|| ROLE_CONTROLLER.to_string());
        out.t0_unix_us = base;
    } else {
        out.role = Some(ROLE_OBSERVER.to_string());
        out.first_arrival_unix_us = base;
        notes.insert(0, NOTE_NO_CONTROLLER.to_string());
    }
    let controllers = parts.iter().filter(|(p, _)| !p.is_observer()).count();
    if controllers > 1 && !notes.iter().any(|n| n.contains(NOTE_OWN_SERVERS)) {
        notes.push(format!("{controllers} {NOTE_OWN_SERVERS}"));
    }
    if added.below_zero > 0 {
        notes.push(format!(
            "{} arrival(s) fell before T0 after the shift and count as 0 µs (the \
             change can reach subscribers before the controller's HTTP call returns, as its \
             own early arrivals do; a large number means the boxes' clocks disagree)",
            added.below_zero
        ));
    }
    if added.unshifted > 0 {
        notes.push(format!(
            "{} part(s) lacked the wall-clock zero (t0_unix_us / \
             first_arrival_unix_us) and were added unshifted",
            added.unshifted
        ));
    }
    out.time_to_99pct_us = if out.expected > 0 {
        time_to_99pct(&added.h, out.expected)
    } else {
        added.max_t99
    };
    out.latency_us = LatencySummary::from_histogram(&added.h);
    out.note = (!notes.is_empty()).then(|| notes.join("; "));
    Ok(out)
}

/// Merges shard summaries into one (see the module doc for each field).
pub fn merge_summaries(parts: &[Summary]) -> Result<Summary, MetricsError> {
    let Some(first) = parts.first() else {
        return Err(MetricsError::Merge("nothing to merge".into()));
    };
    let mut out = Summary {
        schema: SCHEMA_V2.to_string(),
        kind: first.kind.clone(),
        ..Default::default()
    };
    let mut hists = Histograms::default();
    for (n, p) in parts.iter().enumerate() {
        let part = format!("part {} ({})", n + 1, p.shard.as_deref().unwrap_or(&p.kind));
        add_run(&mut out, p);
        add_counts(&mut out, p);
        hists.add(&part, p)?;
    }
    out.latency_us = hists
        .latencies
        .iter()
        .map(|(k, h)| (k.clone(), LatencySummary::from_histogram(h)))
        .collect();
    out.probes = hists
        .probes
        .into_values()
        .map(combine_probe)
        .collect::<Result<_, _>>()?;
    if parts
        .iter()
        .any(|p| p.probes.iter().any(ProbeSummary::is_observer))
    {
        // Only the controller records `propagation` (latency after T0);
        // with observers joined, the fleet's figure is the merged probes'.
        let mut h = new_latency_histogram();
        // The agents' own entries: not those timed at another fleet
        // (dataplane sidecars) or at the proxies behind the agents.
        for p in out
            .probes
            .iter()
            .filter(|p| !p.is_observer() && p.fleet.is_none())
        {
            add_into(
                &mut h,
                &p.latency_us.merge_histogram(&format!("probe #{}", p.id))?,
            )?;
        }
        out.latency_us
            .insert(PROPAGATION.into(), LatencySummary::from_histogram(&h));
    }
    merge_over_time(parts, &mut out)?;
    (out.capacity, out.step_windows) = merge_steps(parts)?;
    out.connect = crate::connect::merge(parts, &out);
    out.shard = None;
    out.outcome = merged_outcome(parts, &out);
    Ok(out)
}

/// Shards' stepped runs as one: each step judged again over its merged
/// window (the parts' windows of that step merged as summaries), up to
/// the steps every part judged; a step any part saw cut is cut.
fn merge_steps(parts: &[Summary]) -> Result<(Option<CapacitySummary>, Vec<Summary>), MetricsError> {
    let caps: Vec<&CapacitySummary> = parts.iter().filter_map(|p| p.capacity.as_ref()).collect();
    let Some(first) = caps.first() else {
        return Ok((None, Vec::new()));
    };
    if caps.len() < parts.len() {
        return Err(MetricsError::Merge(
            "some parts are stepped runs and some are not".into(),
        ));
    }
    let slos: Vec<Assertion> = first
        .slos
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()
        .map_err(|e| MetricsError::Merge(format!("a step's SLO: {e}")))?;
    let mut out = CapacitySummary {
        steps: Vec::new(),
        ..(*first).clone()
    };
    let mut windows = Vec::new();
    let judged = parts
        .iter()
        .map(|p| p.step_windows.len())
        .min()
        .unwrap_or(0);
    for k in 0..judged {
        let steps: Vec<&StepSummary> = caps.iter().filter_map(|c| c.steps.get(k)).collect();
        let w = merge_summaries(
            &parts
                .iter()
                .map(|p| p.step_windows[k].clone())
                .collect::<Vec<_>>(),
        )?;
        let head = StepHead {
            agents: steps[0].agents,
            started_s: steps
                .iter()
                .map(|s| s.started_s)
                .fold(f64::INFINITY, f64::min),
            window_s: steps[0].window_s,
        };
        let load_box = steps
            .iter()
            .flat_map(|s| s.load_box.iter().cloned())
            .collect();
        out.steps.push(judge(head, &w, &slos, load_box));
        windows.push(w);
    }
    let cut = caps
        .iter()
        .any(|c| c.steps.len() > judged || c.limit == Limit::Interrupted);
    if let Some(s) = caps
        .iter()
        .find_map(|c| c.steps.get(judged))
        .filter(|_| cut)
    {
        out.steps.push(StepSummary {
            agents: s.agents,
            verdict: StepVerdict::Cut,
            ..StepSummary::default()
        });
    }
    out.conclude(caps.iter().any(|c| c.limit == Limit::Interrupted));
    Ok((Some(out), windows))
}

/// What ran: the kind (`mixed` when parts differ), the targets, the
/// earliest start and the longest run.
fn add_run(out: &mut Summary, p: &Summary) {
    if p.kind != out.kind {
        out.kind = "mixed".into();
    }
    for t in &p.targets {
        if !out.targets.contains(t) {
            out.targets.push(t.clone());
        }
    }
    if !p.started_at.is_empty() && (out.started_at.is_empty() || p.started_at < out.started_at) {
        // RFC 3339 UTC with a fixed layout orders as text.
        out.started_at = p.started_at.clone();
    }
    out.duration_s = out.duration_s.max(p.duration_s);
}

/// Agents, missing causes, counters, sessions lost, errors, warnings,
/// rates and the process, each summed.
fn add_counts(out: &mut Summary, p: &Summary) {
    out.agents.requested += p.agents.requested;
    out.agents.connected += p.agents.connected;
    out.agents.peak_connected += p.agents.peak_connected;
    out.agents.ever_connected += p.agents.ever_connected;
    out.agents.never_connected += p.agents.never_connected;
    out.agents.lost_not_back += p.agents.lost_not_back;
    out.agents.left += p.agents.left;
    for (k, v) in &p.outcome.missing {
        *out.outcome.missing.entry(k.clone()).or_insert(0) += v;
    }
    for (k, v) in &p.counters {
        *out.counters.entry(k.clone()).or_insert(0) += v;
    }
    for (k, v) in &p.denied {
        *out.denied.entry(k.clone()).or_insert(0) += v;
    }
    for (k, v) in &p.sessions_lost {
        *out.sessions_lost.entry(k.clone()).or_insert(0) += v;
    }
    merge_kinds(&mut out.errors, &p.errors);
    merge_kinds(&mut out.warnings, &p.warnings);
    for (k, v) in &p.rates_per_s {
        *out.rates_per_s.entry(k.clone()).or_insert(0.0) += v;
    }
    out.process.peak_rss_bytes += p.process.peak_rss_bytes;
    out.process.cpu_user_s += p.process.cpu_user_s;
    out.process.cpu_sys_s += p.process.cpu_sys_s;
}

/// The parts' histograms, added up as the parts are read.
#[derive(Default)]
struct Histograms {
    /// Each latency, over the parts.
    latencies: BTreeMap<String, Histogram<u64>>,
    /// Each probe's entries. Keyed by the fleet too: a change timed at
    /// dataplane sidecars is its own entry beside the Consul agents' entry
    /// of the same change.
    probes: BTreeMap<(Option<String>, ProbeKey), ProbeGroup>,
}

impl Histograms {
    /// Adds the latencies and probe entries of `p` (`part` names it in an
    /// error).
    fn add(&mut self, part: &str, p: &Summary) -> Result<(), MetricsError> {
        for (name, l) in &p.latency_us {
            let h = l.merge_histogram(&format!("{part}: latency {name:?}"))?;
            let acc = self
                .latencies
                .entry(name.clone())
                .or_insert_with(new_latency_histogram);
            add_into(acc, &h)?;
        }
        for probe in &p.probes {
            let h = probe
                .latency_us
                .merge_histogram(&format!("{part}: probe #{}", probe.id))?;
            let key = probe
                .change_id
                .map_or(ProbeKey::Id(probe.id), ProbeKey::Change);
            let group = self.probes.entry((probe.fleet.clone(), key)).or_default();
            if let Some((other, _)) = group.first()
                && other.kind != probe.kind
            {
                return Err(MetricsError::Merge(format!(
                    "{part}: probe #{} ({key}) is {:?} here but {:?} elsewhere (summaries of \
                     different runs?)",
                    probe.id, probe.kind, other.kind
                )));
            }
            group.push((probe.clone(), h));
        }
        Ok(())
    }
}

// --- timeline, config and disruptions ---

/// Seconds from the unix epoch of an RFC 3339 `started_at`.
fn unix_s(started_at: &str) -> Option<f64> {
    humantime::parse_rfc3339(started_at)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
}

/// Every part's servers, in order of first appearance: shards of one fleet
/// share theirs, the local processes of a run on the embedded backend each
/// have servers of their own.
fn server_names(parts: &[Summary]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for s in parts.iter().flat_map(|p| &p.by_server) {
        if !names.contains(&s.target) {
            names.push(s.target.clone());
        }
    }
    names
}

/// A part's timeline with its per-server levels (in the order of its
/// `by_server`) moved to their places in `names`; `None` when they are
/// there already.
fn timeline_on(p: &Summary, names: &[String]) -> Option<Vec<crate::summary::TimelineSample>> {
    let at: Vec<usize> = p
        .by_server
        .iter()
        .filter_map(|s| names.iter().position(|n| *n == s.target))
        .collect();
    if at.iter().enumerate().all(|(i, &j)| i == j) {
        return None;
    }
    let place = |v: &[u64]| {
        let mut out = vec![0; names.len()];
        for (i, &x) in v.iter().enumerate() {
            if let Some(&j) = at.get(i) {
                out[j] = x;
            }
        }
        out
    };
    let mut t = p.timeline.clone();
    for s in &mut t {
        s.held_by_server = place(&s.held_by_server);
        s.connects_by_server = place(&s.connects_by_server);
    }
    Some(t)
}

/// The per-server view of the parts: counts at the end summed by server,
/// the rest from the merged timeline (its levels at `names`' positions).
fn merge_by_server(
    parts: &[Summary],
    names: Vec<String>,
    timeline: &[crate::summary::TimelineSample],
) -> Vec<crate::summary::ServerSpread> {
    if names.is_empty() {
        return Vec::new();
    }
    let mut end = crate::spread::ServerLevels {
        held: vec![0; names.len()],
        connects: vec![0; names.len()],
    };
    for p in parts {
        for s in &p.by_server {
            if let Some(i) = names.iter().position(|n| *n == s.target) {
                end.held[i] += s.held_at_end;
                end.connects[i] += s.connects;
            }
        }
    }
    crate::spread::spread(&names, timeline, &end)
}

/// The timelines (on the earliest start), configs and disruptions of the
/// parts, into `out` (see [`crate::timeline::merge_timelines`],
/// [`merge_configs`], [`crate::disruption::merge`]).
fn merge_over_time(parts: &[Summary], out: &mut Summary) -> Result<(), MetricsError> {
    let starts: Vec<Option<f64>> = parts.iter().map(|p| unix_s(&p.started_at)).collect();
    let earliest = starts
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let offset = |n: usize| match starts[n] {
        Some(s) if earliest.is_finite() => s - earliest,
        _ => 0.0,
    };
    let names = server_names(parts);
    let moved: Vec<_> = parts.iter().map(|p| timeline_on(p, &names)).collect();
    let timelines: Vec<(f64, &[crate::summary::TimelineSample])> = parts
        .iter()
        .zip(&moved)
        .enumerate()
        .map(|(n, (p, m))| (offset(n), m.as_deref().unwrap_or(&p.timeline)))
        .collect();
    out.timeline = crate::timeline::merge_timelines(&timelines);
    out.by_server = merge_by_server(parts, names, &out.timeline);
    out.config = merge_configs(parts.iter().map(|p| p.config.as_ref()));
    // One shard (the probe's controller) runs the Vault servers.
    out.vault = parts.iter().find_map(|p| p.vault.clone());
    out.study = parts.iter().find_map(|p| p.study.clone());
    // A detected disruption (a backend restart) is one wall-clock event:
    // put every part's on the earliest start's clock before joining them. A
    // scheduled one is at the same offset from each part's own start.
    let shifted: Vec<Vec<DisruptionSummary>> = parts
        .iter()
        .enumerate()
        .map(|(n, p)| {
            p.disruptions
                .iter()
                .map(|d| DisruptionSummary {
                    began_s: d.began_s
                        + if d.cause == crate::disruption::CAUSE_BACKEND {
                            offset(n)
                        } else {
                            0.0
                        },
                    ..d.clone()
                })
                .collect()
        })
        .collect();
    let views: Vec<&[DisruptionSummary]> = shifted.iter().map(Vec::as_slice).collect();
    out.disruptions = crate::disruption::merge(&views)?;
    out.server = merge_servers(parts, offset);
    Ok(())
}

/// The observed servers of every part, on the earliest start's clock. One
/// shard observes, so a server is normally in one part; if several parts
/// observed the same target, the one with the most scrapes is kept.
fn merge_servers(parts: &[Summary], offset: impl Fn(usize) -> f64) -> Vec<ServerSummary> {
    let mut out: Vec<ServerSummary> = Vec::new();
    for (n, p) in parts.iter().enumerate() {
        let shift = offset(n);
        for srv in &p.server {
            let mut srv = srv.clone();
            for x in std::iter::once(&mut srv.baseline).chain(srv.samples.iter_mut()) {
                x.t_s += shift;
            }
            if let Some(g) = srv.gossip.as_mut() {
                g.shift(shift);
            }
            if let Some(st) = srv.storm.as_mut() {
                st.shift(shift);
            }
            if let Some((a, b)) = srv.sizing.steady_s.as_mut().map(|w| (&mut w.0, &mut w.1)) {
                *a += shift;
                *b += shift;
            }
            match out.iter_mut().find(|o| o.target == srv.target) {
                Some(o) if o.scrapes < srv.scrapes => *o = srv,
                Some(_) => {}
                None => out.push(srv),
            }
        }
    }
    out
}

/// The parts' configs as one: a key on which every part that has it agrees
/// keeps its value; a key on which they differ (the shard, a per-box
/// `--source-addr`) becomes the list of each part's value (`null` where a
/// part lacks it). `None` when no part has a config.
pub fn merge_configs<'a>(
    configs: impl Iterator<Item = Option<&'a serde_json::Map<String, serde_json::Value>>>,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    use serde_json::Value;
    let configs: Vec<Option<&serde_json::Map<String, Value>>> = configs.collect();
    let present: Vec<&serde_json::Map<String, Value>> = configs.iter().flatten().copied().collect();
    match present.as_slice() {
        [] => return None,
        [one] if configs.len() == 1 => return Some((*one).clone()),
        _ => {}
    }
    let mut out = serde_json::Map::new();
    for c in &present {
        for key in c.keys() {
            if out.contains_key(key) {
                continue;
            }
            let values: Vec<Option<&Value>> =
                configs.iter().map(|c| c.and_then(|c| c.get(key))).collect();
            let first = values.iter().flatten().next().copied();
            let agree = values.iter().flatten().all(|v| Some(*v) == first);
            let v = match first {
                Some(v) if agree => v.clone(),
                _ => Value::Array(
                    values
                        .iter()
                        .map(|v| v.cloned().unwrap_or(Value::Null))
                        .collect(),
                ),
            };
            out.insert(key.clone(), v);
        }
    }
    Some(out)
}

/// Adds error (or warning) entries: counts summed, the earliest first
/// sighting with its sample (and whose words it is), the first hint; heals
/// only if every part says so.
fn merge_kinds(acc: &mut BTreeMap<String, KindEntry>, part: &BTreeMap<String, KindEntry>) {
    for (kind, e) in part {
        match acc.get_mut(kind) {
            None => {
                acc.insert(kind.clone(), e.clone());
            }
            Some(a) => {
                a.count += e.count;
                if e.first_seen_s < a.first_seen_s || a.sample.is_none() {
                    if e.sample.is_some() {
                        a.sample = e.sample.clone();
                        a.said_by = e.said_by;
                    }
                    a.first_seen_s = a.first_seen_s.min(e.first_seen_s);
                }
                if a.hint.is_none() {
                    a.hint = e.hint.clone();
                }
                a.heals &= e.heals;
            }
        }
    }
}

/// The outcome of the parts together: complete when every part was; exit
/// 1 when no part could run at all, 2 when the fleet was incomplete, 3 when
/// a part's assertion failed, else 0.
fn merged_outcome(parts: &[Summary], merged: &Summary) -> Outcome {
    let complete = parts.iter().all(|p| p.outcome.complete);
    let (exit_code, reason) = if parts.iter().all(|p| p.outcome.exit_code == 1) {
        (
            1,
            Some("no part of the run could hold a session".to_string()),
        )
    } else if !complete && merged.capacity.is_none() {
        // A stepped run's fleet past its knee is the result, not a fault.
        let missing = merged
            .agents
            .requested
            .saturating_sub(merged.agents.connected + merged.agents.left);
        (
            2,
            Some(format!(
                "incomplete fleet: {missing} of {} agent(s) not connected at the end",
                merged.agents.requested
            )),
        )
    } else if parts.iter().any(|p| p.outcome.exit_code == 3) {
        (3, Some("an assertion of a part failed".to_string()))
    } else {
        (0, None)
    };
    Outcome {
        exit_code,
        complete,
        reason,
        missing: merged.outcome.missing.clone(),
    }
}

/// Builds or replaces `summary.latency_us[tag]` from histograms merged out of
/// interval logs ([`crate::hlog::HlogContents::merged_by_tag`], added over
/// all logs). Entries of other names are kept.
pub fn apply_hlogs(summary: &mut Summary, by_tag: &BTreeMap<String, Histogram<u64>>) {
    for (tag, h) in by_tag {
        summary
            .latency_us
            .insert(tag.clone(), LatencySummary::from_histogram(h));
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::hlog::{HlogWriter, read_hlog};

    fn random_samples(rng: &mut fastrand::Rng, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| match rng.u8(0..4) {
                0 => rng.u64(1..2_048),
                1 => rng.u64(2_048..1_000_000),
                2 => rng.u64(1_000_000..60_000_000),
                _ => rng.u64(1..crate::LATENCY_MAX_US),
            })
            .collect()
    }

    #[test]
    fn merging_two_hlogs_is_exactly_the_union_of_their_samples() {
        let mut rng = fastrand::Rng::with_seed(7);
        let dir = std::env::temp_dir().join(format!("agent-sim-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut union: BTreeMap<&str, Histogram<u64>> = BTreeMap::new();
        let mut merged: BTreeMap<String, Histogram<u64>> = BTreeMap::new();
        for shard in 0..2 {
            let path = dir.join(format!("shard{shard}.hlog"));
            let mut w = HlogWriter::create(&path, UNIX_EPOCH + Duration::from_secs(1_000)).unwrap();
            for interval in 0..3u64 {
                for tag in ["connect", "session_ready"] {
                    let mut h = new_latency_histogram();
                    for v in random_samples(&mut rng, 2_000) {
                        h.record(v).unwrap();
                        union
                            .entry(tag)
                            .or_insert_with(new_latency_histogram)
                            .record(v)
                            .unwrap();
                    }
                    w.write_interval(
                        Duration::from_secs(10 * interval),
                        Duration::from_secs(10),
                        tag,
                        &h,
                    )
                    .unwrap();
                }
            }
            w.flush().unwrap();
            for (tag, h) in read_hlog(&path).unwrap().merged_by_tag() {
                merged
                    .entry(tag)
                    .or_insert_with(new_latency_histogram)
                    .add(&h)
                    .unwrap();
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(merged.len(), 2);
        for (tag, u) in &union {
            assert_eq!(&merged[*tag], u, "tag {tag}");
            assert_eq!(merged[*tag].len(), 12_000);
        }
        // And through apply_hlogs into a summary.
        let mut s = Summary::default();
        apply_hlogs(&mut s, &merged);
        assert_eq!(
            s.latency_us["connect"].histogram().unwrap(),
            union["connect"]
        );
        assert_eq!(
            s.latency_us["connect"].p99,
            union["connect"].value_at_quantile(0.99)
        );
    }

    fn shard_summary(n: u64, samples: &[u64], probe_samples: &[u64]) -> Summary {
        let mut h = new_latency_histogram();
        for v in samples {
            h.record(*v).unwrap();
        }
        let mut ph = new_latency_histogram();
        for v in probe_samples {
            ph.record(*v).unwrap();
        }
        let mut s = Summary {
            schema: SCHEMA_V2.into(),
            kind: "sensu".into(),
            targets: vec![
                format!("ws://127.0.0.1:808{n}/"),
                "ws://shared:8081/".into(),
            ],
            started_at: format!("2026-11-21T22:40:4{n}.000Z"),
            duration_s: 60.0 + n as f64,
            shard: Some(format!("{n}/2")),
            ..Default::default()
        };
        s.agents.requested = 5_000;
        s.agents.connected = 4_990 + n;
        s.agents.peak_connected = 5_000;
        s.agents.never_connected = 10 - n;
        s.agents.ever_connected = 4_990 + n;
        s.outcome.complete = false;
        s.outcome.exit_code = 2;
        s.outcome.missing.insert("connect_refused".into(), 10 - n);
        s.counters.insert("keepalives_sent".into(), 100 * (n + 1));
        s.errors.insert(
            "connect_refused".into(),
            KindEntry {
                count: n + 1,
                first_seen_s: 2.0 - n as f64,
                sample: Some(format!("refused by shard {n}")),
                hint: None,
                heals: true,
                said_by: crate::Speaker::Os,
            },
        );
        s.rates_per_s.insert("keepalives".into(), 250.0);
        s.process.peak_rss_bytes = 50 << 20;
        s.process.cpu_user_s = 1.5;
        s.latency_us
            .insert("connect".into(), LatencySummary::from_histogram(&h));
        s.latency_us
            .insert("unused".into(), LatencySummary::default());
        s.probes.push(ProbeSummary {
            id: 1,
            kind: "deregister".into(),
            t0: "2026-11-21T22:41:00.000Z".into(),
            delivered: probe_samples.len() as u64,
            expected: 100,
            time_to_99pct_us: None,
            latency_us: LatencySummary::from_histogram(&ph),
            ..Default::default()
        });
        s
    }

    #[test]
    fn merging_summaries_adds_histograms_and_counts() {
        let mut rng = fastrand::Rng::with_seed(11);
        let a_samples = random_samples(&mut rng, 5_000);
        let b_samples = random_samples(&mut rng, 3_000);
        let pa: Vec<u64> = (1..=100).map(|i| i * 1_000).collect();
        let pb: Vec<u64> = (1..=99).map(|i| 500_000 + i * 1_000).collect();
        let a = shard_summary(0, &a_samples, &pa);
        let b = shard_summary(1, &b_samples, &pb);
        let m = merge_summaries(&[a, b]).unwrap();

        let mut u = new_latency_histogram();
        for v in a_samples.iter().chain(&b_samples) {
            u.record(*v).unwrap();
        }
        assert_eq!(m.latency_us["connect"].histogram().unwrap(), u);
        assert_eq!(m.latency_us["connect"], LatencySummary::from_histogram(&u));
        assert_eq!(m.latency_us["unused"].count, 0);
        assert_eq!(m.kind, "sensu");
        assert_eq!(m.shard, None);
        assert_eq!(m.started_at, "2026-11-21T22:40:40.000Z");
        assert_eq!(m.duration_s, 61.0);
        assert_eq!(m.targets.len(), 3);
        assert_eq!(m.agents.requested, 10_000);
        assert_eq!(m.agents.connected, 9_981);
        assert_eq!(m.agents.peak_connected, 10_000);
        assert_eq!(m.agents.never_connected, 19);
        assert_eq!(m.agents.ever_connected, 9_981);
        assert_eq!(m.counters["keepalives_sent"], 300);
        assert_eq!(m.errors["connect_refused"].count, 3);
        // The earliest sighting (shard 1 at 1 s) and its words.
        assert_eq!(m.errors["connect_refused"].first_seen_s, 1.0);
        assert_eq!(
            m.errors["connect_refused"].sample.as_deref(),
            Some("refused by shard 1")
        );
        assert_eq!(m.errors["connect_refused"].said_by, crate::Speaker::Os);
        assert_eq!(m.outcome.missing["connect_refused"], 19);
        assert_eq!((m.outcome.exit_code, m.outcome.complete), (2, false));
        assert_eq!(m.rates_per_s["keepalives"], 500.0);
        assert_eq!(m.process.peak_rss_bytes, 100 << 20);
        assert_eq!(m.process.cpu_user_s, 3.0);
        // Probe: 199 of 200 delivered; 99 % of 200 = 198th sample = 598 ms.
        assert_eq!(m.probes.len(), 1);
        let p = &m.probes[0];
        assert_eq!((p.delivered, p.expected), (199, 200));
        assert_eq!(p.latency_us.count, 199);
        let t = p.time_to_99pct_us.unwrap();
        assert!((597_000..=599_000).contains(&t), "{t}");
        // Merge is associative with itself as a part.
        let again = merge_summaries(std::slice::from_ref(&m)).unwrap();
        assert_eq!(again.latency_us, m.latency_us);
    }

    #[test]
    fn kinds_mix_and_missing_histograms_are_errors() {
        let a = shard_summary(0, &[10], &[10]);
        let mut b = shard_summary(1, &[20], &[20]);
        b.kind = "consul".into();
        assert_eq!(
            merge_summaries(&[a.clone(), b.clone()]).unwrap().kind,
            "mixed"
        );

        b.latency_us.get_mut("connect").unwrap().hdr.clear();
        let e = merge_summaries(&[a.clone(), b]).unwrap_err().to_string();
        assert!(
            e.contains("part 2") && e.contains("connect") && e.contains("hdr"),
            "{e}"
        );

        let mut c = shard_summary(1, &[20], &[20]);
        c.probes[0].kind = "register".into();
        let e = merge_summaries(&[a, c]).unwrap_err().to_string();
        assert!(e.contains("probe #1"), "{e}");

        assert!(merge_summaries(&[]).is_err());
    }

    const T0: u64 = 1_795_300_860_000_000;

    fn probe_entry(
        role: &str,
        raft: u64,
        zero_unix_us: u64,
        expected: u64,
        samples: &[u64],
    ) -> ProbeSummary {
        let mut h = new_latency_histogram();
        for &v in samples {
            h.record(v).unwrap();
        }
        let controller = role == "controller";
        ProbeSummary {
            id: if controller { 3 } else { 0 },
            kind: "deregister".into(),
            t0: if controller {
                "2026-11-21T22:41:00.000Z".into()
            } else {
                String::new()
            },
            delivered: samples.len() as u64,
            expected,
            time_to_99pct_us: time_to_99pct(&h, expected),
            latency_us: LatencySummary::from_histogram(&h),
            change_id: Some(raft),
            role: Some(role.into()),
            t0_unix_us: controller.then_some(zero_unix_us),
            first_arrival_unix_us: (!controller).then_some(zero_unix_us),
            note: None,
            fleet: None,
            written_us: controller.then_some(2_500),
        }
    }

    fn consul_part(probes: Vec<ProbeSummary>) -> Summary {
        Summary {
            schema: SCHEMA_V2.into(),
            kind: "consul".into(),
            probes,
            ..Default::default()
        }
    }

    /// Within HDR precision (3 significant figures) of `exact`.
    fn near(got: u64, exact: u64) {
        assert!(got.abs_diff(exact) <= exact / 500 + 1, "{got} vs {exact}");
    }

    #[test]
    fn observer_parts_join_by_raft_index_shifted_onto_t0() {
        // Controller: 50 agents, 1..50 ms after T0. Observer: 50 agents,
        // 0..49 ms after its first arrival, which was 20 ms after T0.
        let c: Vec<u64> = (1..=50).map(|i| i * 1_000).collect();
        let o: Vec<u64> = (0..50).map(|i| i * 1_000).collect();
        let a = consul_part(vec![
            probe_entry("controller", 100, T0, 50, &c),
            probe_entry("controller", 104, T0 + 30_000_000, 50, &c[..49]),
        ]);
        let b = consul_part(vec![
            probe_entry("observer", 100, T0 + 20_000, 50, &o),
            probe_entry("observer", 104, T0 + 30_000_000 + 20_000, 50, &o),
        ]);
        let m = merge_summaries(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(m.probes.len(), 2);
        let p = &m.probes[0];
        assert_eq!((p.delivered, p.expected), (100, 100));
        assert_eq!((p.id, p.change_id), (3, Some(100)));
        assert_eq!(p.role.as_deref(), Some("controller"));
        assert_eq!(p.t0_unix_us, Some(T0));
        assert_eq!(p.t0, "2026-11-21T22:41:00.000Z");
        assert_eq!((p.first_arrival_unix_us, p.note.as_deref()), (None, None));
        // The union of 1..=50 ms and 20..=69 ms, exactly as samples.
        let mut all: Vec<u64> = c.iter().chain(o.iter()).copied().collect();
        for v in &mut all[50..] {
            *v += 20_000;
        }
        all.sort_unstable();
        assert_eq!(p.latency_us.count, 100);
        near(p.latency_us.min, 1_000);
        near(p.latency_us.max, 69_000);
        near(p.latency_us.p50, all[49]);
        near(p.latency_us.p90, all[89]);
        near(p.latency_us.p99, all[98]);
        near(p.time_to_99pct_us.unwrap(), all[98]);
        let q = &m.probes[1];
        assert_eq!((q.change_id, q.delivered, q.expected), (Some(104), 99, 100));
        near(q.time_to_99pct_us.unwrap(), 69_000);
        // `propagation` is rebuilt from the joined probes: 199 deliveries.
        assert_eq!(m.latency_us[PROPAGATION].count, 199);

        // Observers merged first, then with the controller: same counts and
        // the same figures within HDR precision.
        let b2 = consul_part(vec![probe_entry(
            "observer",
            100,
            T0 + 25_000,
            10,
            &o[..10],
        )]);
        let obs = merge_summaries(&[b.clone(), b2.clone()]).unwrap();
        assert_eq!(obs.probes[0].first_arrival_unix_us, Some(T0 + 20_000));
        let two_step = merge_summaries(&[a.clone(), obs]).unwrap();
        let one_step = merge_summaries(&[a, b, b2]).unwrap();
        let (x, y) = (&two_step.probes[0], &one_step.probes[0]);
        assert_eq!((x.delivered, x.expected), (110, 110));
        assert_eq!((y.delivered, y.expected), (110, 110));
        near(x.latency_us.p50, y.latency_us.p50);
        near(x.latency_us.p99, y.latency_us.p99);
    }

    #[test]
    fn arrivals_before_t0_after_the_shift_count_as_zero_with_a_note() {
        // The observer's clock runs 3 ms behind: its first arrival seems to
        // come before T0.
        let a = consul_part(vec![probe_entry("controller", 7, T0, 1, &[4_000])]);
        let b = consul_part(vec![probe_entry(
            "observer",
            7,
            T0 - 3_000,
            3,
            &[0, 1_000, 5_000],
        )]);
        let m = merge_summaries(&[a, b]).unwrap();
        let p = &m.probes[0];
        assert_eq!((p.delivered, p.expected), (4, 4));
        assert_eq!(p.latency_us.min, 0);
        near(p.latency_us.max, 4_000);
        let mut h = p.latency_us.histogram().unwrap();
        assert_eq!(h.count_at(0), 2);
        near(p.time_to_99pct_us.unwrap(), 4_000);
        let note = p.note.as_deref().unwrap();
        assert!(note.starts_with("2 arrival(s) fell before T0"), "{note}");
        h.reset();
        let mut below = 0;
        add_shifted(&mut h, &new_latency_histogram(), -5, &mut below).unwrap();
        assert_eq!((h.len(), below), (0, 0));
    }

    #[test]
    fn observer_entries_without_a_controller_entry_are_kept_and_flagged() {
        let o: Vec<u64> = (0..20).map(|i| i * 500).collect();
        // The same change timed at the proxies behind the agents: its own
        // entry, not part of the agents' `propagation`.
        let at_proxies = ProbeSummary {
            fleet: Some("proxy".into()),
            ..probe_entry("controller", 50, T0, 20, &o)
        };
        let a = consul_part(vec![probe_entry("controller", 50, T0, 20, &o), at_proxies]);
        let lone = probe_entry("observer", 49, T0 - 1_000_000, 20, &o);
        let b = consul_part(vec![
            lone.clone(),
            probe_entry("observer", 50, T0 + 1_000, 20, &o),
        ]);
        let m = merge_summaries(&[a, b]).unwrap();
        assert_eq!(m.probes.len(), 3);
        // Ordered by raft index; the lone one unchanged but for its note.
        let p = &m.probes[0];
        assert_eq!(p.change_id, Some(49));
        assert_eq!(p.role.as_deref(), Some("observer"));
        assert_eq!(p.note.as_deref(), Some(NOTE_NO_CONTROLLER));
        assert_eq!(
            ProbeSummary {
                note: None,
                ..p.clone()
            },
            lone
        );
        assert_eq!((m.probes[1].delivered, m.probes[1].expected), (40, 40));
        // Only controller-role entries make up `propagation`.
        assert_eq!(m.latency_us[PROPAGATION].count, 40);
        // Re-merging keeps one note, not two.
        let again = merge_summaries(&[m]).unwrap();
        assert_eq!(again.probes[0].note.as_deref(), Some(NOTE_NO_CONTROLLER));
    }

    #[test]
    fn controllers_of_one_probe_each_count_from_their_own_t0() {
        // Two local processes on embedded servers of their own: each made
        // probe 3 on its own cluster a second apart and timed it from its T0.
        let own = |zero: u64, samples: &[u64]| ProbeSummary {
            change_id: None,
            ..probe_entry("controller", 0, zero, 4, samples)
        };
        let a = consul_part(vec![own(T0, &[1_000, 2_000, 3_000, 4_000])]);
        let b = consul_part(vec![own(T0 + 1_000_000, &[1_000, 2_000, 3_000])]);
        let m = merge_summaries(&[a, b]).unwrap();
        assert_eq!(m.probes.len(), 1);
        let p = &m.probes[0];
        assert_eq!((p.id, p.delivered, p.expected), (3, 7, 8));
        assert_eq!(p.t0_unix_us, Some(T0));
        near(p.latency_us.max, 4_000);
        near(p.time_to_99pct_us.unwrap_or(0), 0);
        let note = p.note.as_deref().unwrap();
        assert_eq!(note, format!("2 {NOTE_OWN_SERVERS}"));
        // Merged once more with a third part, the note is said once.
        let c = consul_part(vec![own(T0 + 5_000, &[500; 4])]);
        let again = merge_summaries(&[m, c]).unwrap();
        let note = again.probes[0].note.as_deref().unwrap();
        assert_eq!(note.matches(NOTE_OWN_SERVERS).count(), 1, "{note}");
        assert_eq!(again.probes[0].expected, 12);
    }

    #[test]
    fn parts_with_servers_of_their_own_keep_each_server() {
        use crate::summary::{ServerSpread, TimelineSample};
        // Two local processes, each with two embedded servers of its own
        // (a, b and c, d), holding 3 and 5 sessions on each.
        let part = |names: [&str; 2], held: u64| {
            let sample = |t_s: f64| TimelineSample {
                t_s,
                held_by_server: vec![held, held],
                connects_by_server: vec![held, 0],
                ..Default::default()
            };
            Summary {
                started_at: "2026-12-03T10:00:00Z".into(),
                timeline: vec![sample(1.0), sample(2.0)],
                by_server: names
                    .iter()
                    .map(|n| ServerSpread {
                        target: n.to_string(),
                        held_at_end: held,
                        connects: held,
                        ..Default::default()
                    })
                    .collect(),
                ..consul_part(Vec::new())
            }
        };
        let m = merge_summaries(&[part(["a", "b"], 3), part(["c", "d"], 5)]).unwrap();
        let got: Vec<(&str, u64, u64)> = m
            .by_server
            .iter()
            .map(|s| (s.target.as_str(), s.held_at_end, s.peak_held))
            .collect();
        assert_eq!(got, [("a", 3, 3), ("b", 3, 3), ("c", 5, 5), ("d", 5, 5)]);
        assert_eq!(m.timeline[1].held_by_server, [3, 3, 5, 5]);
        assert_eq!(m.timeline[0].connects_by_server, [3, 0, 5, 0]);
        // Shards of one fleet sharing its servers still add up on each.
        let m = merge_summaries(&[part(["a", "b"], 3), part(["a", "b"], 5)]).unwrap();
        assert_eq!(m.by_server[0].peak_held, 8);
        assert_eq!(m.timeline[1].held_by_server, [8, 8]);
    }

    #[test]
    fn time_to_99pct_needs_99_percent_of_expected() {
        let mut h = new_latency_histogram();
        for v in 1..=98u64 {
            h.record(v).unwrap();
        }
        assert_eq!(time_to_99pct(&h, 100), None);
        h.record(500).unwrap();
        assert_eq!(time_to_99pct(&h, 100), Some(500));
        assert_eq!(time_to_99pct(&h, 0), None);
    }

    fn disruption(cause: &str, began_s: f64, lost: u64, back: u64) -> DisruptionSummary {
        let mut h = new_latency_histogram();
        for i in 0..back {
            h.record(1_000 + i).unwrap();
        }
        DisruptionSummary {
            id: 9,
            cause: cause.into(),
            fleet: "sensu".into(),
            began_s,
            sessions_lost: lost,
            back,
            back_after_s: crate::disruption::back_after(&h, lost),
            reconnect_us: LatencySummary::from_histogram(&h),
            back_at_us: LatencySummary::from_histogram(&h),
            attempts: lost * 2,
            missing_at_end: if lost > back {
                [("connect_refused".to_string(), lost - back)].into()
            } else {
                BTreeMap::new()
            },
            ..Default::default()
        }
    }

    #[test]
    fn timelines_configs_and_disruptions_of_shards_are_summed() {
        use crate::summary::TimelineSample;
        let sample = |t_s: f64, connected: u64| TimelineSample {
            t_s,
            connected,
            rss_bytes: 1,
            cpu_s: 0.5,
            counters: [("keepalives_sent".to_string(), 10)].into(),
            errors: BTreeMap::new(),
            ..TimelineSample::default()
        };
        let cfg = |shard: &str| {
            serde_json::json!({"agents": 10, "shard": shard})
                .as_object()
                .unwrap()
                .clone()
        };
        let part = |shard: u64, value: u64, connected: u64, ds: &[(&str, f64, u64, u64)]| {
            let mut p = shard_summary(shard, &[value], &[value]);
            p.timeline = vec![sample(10.0, connected), sample(20.0, connected)];
            p.config = Some(cfg(&format!("{shard}/2")));
            p.disruptions = ds.iter().map(|d| disruption(d.0, d.1, d.2, d.3)).collect();
            p
        };
        // (cause, began_s, lost, back) of each shard's disruptions.
        let da = [
            ("storm", 60.0, 10, 10),
            ("storm", 120.0, 4, 4),
            ("backend", 200.0, 3, 3),
        ];
        let db = [
            ("storm", 60.0, 6, 5),
            ("churn", 30.0, 1, 1),
            ("backend", 199.5, 2, 2),
        ];
        let a = part(0, 10, 5, &da);
        // Shard 1 started 1 s later (started_at ...:41 vs ...:40).
        let b = part(1, 20, 3, &db);
        let m = merge_summaries(&[a, b]).unwrap();
        assert_eq!(m.timeline.len(), 2);
        assert_eq!((m.timeline[0].t_s, m.timeline[0].connected), (11.0, 8));
        assert_eq!(m.timeline[1].counters["keepalives_sent"], 20);
        assert_eq!(m.timeline[1].rss_bytes, 2);
        let c = m.config.as_ref().unwrap();
        assert_eq!(c["agents"], 10);
        assert_eq!(c["shard"], serde_json::json!(["0/2", "1/2"]));
        // Scheduled ones at their own offset: churn (30 s), storm #1 joined
        // (60 s), storm #2 alone (120 s); the detected restart is one
        // wall-clock event (shard 1's at 199.5 s is 200.5 s on shard 0's
        // clock), joined.
        let d = &m.disruptions;
        assert_eq!(d.len(), 4, "{d:?}");
        assert_eq!(
            (d[0].id, d[0].cause.as_str(), d[0].began_s),
            (1, "churn", 30.0)
        );
        assert_eq!((d[1].id, d[1].sessions_lost, d[1].back), (2, 16, 15));
        assert_eq!(d[1].began_s, 60.0);
        assert_eq!(d[1].attempts, 32);
        assert_eq!(d[1].reconnect_us.count, 15);
        assert_eq!(d[1].missing_at_end["connect_refused"], 1);
        // Never all back in part b.
        assert_eq!(d[1].back_after_s.p100, None);
        assert_eq!((d[2].id, d[2].sessions_lost), (3, 4));
        assert_eq!(
            (d[3].cause.as_str(), d[3].began_s, d[3].sessions_lost),
            ("backend", 200.0, 5)
        );
        validate(&m);
        // Merging one part changes nothing of these.
        let one = merge_summaries(std::slice::from_ref(&m)).unwrap();
        assert_eq!(
            (one.timeline.clone(), one.config.clone()),
            (m.timeline.clone(), m.config.clone())
        );
        assert_eq!(one.disruptions, m.disruptions);
    }

    fn validate(s: &Summary) {
        agent_sim_testkit::validate_json(crate::SUMMARY_SCHEMA, &serde_json::to_value(s).unwrap())
            .unwrap();
    }
}
