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
//! - `probes`: matched by `id` (shard 0 runs a probe, every shard measures it):
//!   `delivered`/`expected` summed, histograms added, `t0` the earliest;
//!   `time_to_99pct_us` recomputed from the merged histogram (the value by which
//!   99 % of `expected` had arrived; `None` when fewer did); when a probe has
//!   `expected == 0` it cannot be recomputed and the parts' maximum is kept.
//! - `shard`: `None`.
//!
//! It does not read files: see [`crate::summary::Summary::read`] and
//! [`crate::hlog::read_hlog`].

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::summary::{LatencySummary, ProbeSummary, SCHEMA_V1, Summary};
use crate::{MetricsError, new_latency_histogram};

fn add_into(acc: &mut Histogram<u64>, h: &Histogram<u64>) -> Result<(), MetricsError> {
    acc.add(h)
        .map_err(|e| MetricsError::Merge(format!("{e:?}")))
}

/// The histogram of a latency entry: decoded `hdr`, an empty histogram when
/// there were no samples, an error when samples exist but `hdr` is missing.
pub(crate) fn histogram_of(l: &LatencySummary, what: &str) -> Result<Histogram<u64>, MetricsError> {
    if l.hdr.is_empty() {
        if l.count == 0 {
            return Ok(new_latency_histogram());
        }
        return Err(MetricsError::Merge(format!(
            "{what}: {} samples but no embedded histogram (`hdr`); percentiles cannot be \
             merged exactly",
            l.count
        )));
    }
    l.histogram()
        .map_err(|e| MetricsError::Merge(format!("{what}: {e}")))
}

/// The smallest recorded value by which `rank` samples had been seen, if
/// the histogram holds that many.
fn value_at_rank(h: &Histogram<u64>, rank: u64) -> Option<u64> {
    if rank == 0 || h.len() < rank {
        return None;
    }
    let mut seen = 0;
    for v in h.iter_recorded() {
        seen += v.count_at_value();
        if seen >= rank {
            return Some(v.value_iterated_to());
        }
    }
    None
}

/// Time by which 99 % of `expected` subscribers had the change, from the
/// histogram of their delivery latencies.
pub fn time_to_99pct(h: &Histogram<u64>, expected: u64) -> Option<u64> {
    value_at_rank(h, expected.saturating_mul(99).div_ceil(100))
}

/// Merges shard summaries into one (see the module doc for each field).
pub fn merge_summaries(parts: &[Summary]) -> Result<Summary, MetricsError> {
    let Some(first) = parts.first() else {
        return Err(MetricsError::Merge("nothing to merge".into()));
    };
    let mut out = Summary {
        schema: SCHEMA_V1.to_string(),
        kind: first.kind.clone(),
        ..Default::default()
    };
    let mut latencies: BTreeMap<String, Histogram<u64>> = BTreeMap::new();
    let mut probes: BTreeMap<u64, (ProbeSummary, Histogram<u64>, Option<u64>)> = BTreeMap::new();

    for (n, p) in parts.iter().enumerate() {
        let part = format!("part {} ({})", n + 1, p.shard.as_deref().unwrap_or(&p.kind));
        if p.kind != out.kind {
            out.kind = "mixed".into();
        }
        for t in &p.targets {
            if !out.targets.contains(t) {
                out.targets.push(t.clone());
            }
        }
        if !p.started_at.is_empty() && (out.started_at.is_empty() || p.started_at < out.started_at)
        {
            // RFC 3339 UTC with a fixed layout orders as text.
            out.started_at = p.started_at.clone();
        }
        out.duration_s = out.duration_s.max(p.duration_s);

        out.agents.requested += p.agents.requested;
        out.agents.connected += p.agents.connected;
        out.agents.peak_connected += p.agents.peak_connected;
        out.agents.failed += p.agents.failed;

        for (k, v) in &p.counters.values {
            *out.counters.values.entry(k.clone()).or_insert(0) += v;
        }
        for (k, v) in &p.counters.errors {
            *out.counters.errors.entry(k.clone()).or_insert(0) += v;
        }
        for (k, v) in &p.rates_per_s {
            *out.rates_per_s.entry(k.clone()).or_insert(0.0) += v;
        }
        out.process.peak_rss_bytes += p.process.peak_rss_bytes;
        out.process.cpu_user_s += p.process.cpu_user_s;
        out.process.cpu_sys_s += p.process.cpu_sys_s;

        for (name, l) in &p.latency_us {
            let h = histogram_of(l, &format!("{part}: latency {name:?}"))?;
            let acc = latencies
                .entry(name.clone())
                .or_insert_with(new_latency_histogram);
            add_into(acc, &h)?;
        }

        for probe in &p.probes {
            let h = histogram_of(&probe.latency_us, &format!("{part}: probe #{}", probe.id))?;
            match probes.get_mut(&probe.id) {
                None => {
                    probes.insert(probe.id, (probe.clone(), h, probe.time_to_99pct_us));
                }
                Some((acc, acc_h, max_t99)) => {
                    if acc.kind != probe.kind {
                        return Err(MetricsError::Merge(format!(
                            "{part}: probe #{} is {:?} here but {:?} elsewhere (summaries of \
                             different runs?)",
                            probe.id, probe.kind, acc.kind
                        )));
                    }
                    acc.delivered += probe.delivered;
                    acc.expected += probe.expected;
                    if !probe.t0.is_empty() && (acc.t0.is_empty() || probe.t0 < acc.t0) {
                        acc.t0 = probe.t0.clone();
                    }
                    *max_t99 = (*max_t99).max(probe.time_to_99pct_us);
                    add_into(acc_h, &h)?;
                }
            }
        }
    }

    out.latency_us = latencies
        .iter()
        .map(|(k, h)| (k.clone(), LatencySummary::from_histogram(h)))
        .collect();
    out.probes = probes
        .into_values()
        .map(|(mut p, h, max_t99)| {
            p.time_to_99pct_us = if p.expected > 0 {
                time_to_99pct(&h, p.expected)
            } else {
                max_t99
            };
            p.latency_us = LatencySummary::from_histogram(&h);
            p
        })
        .collect();
    out.shard = None;
    Ok(out)
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
            schema: SCHEMA_V1.into(),
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
        s.agents.failed = 10 - n;
        s.counters
            .values
            .insert("keepalives_sent".into(), 100 * (n + 1));
        s.counters.errors.insert("connect_refused".into(), n + 1);
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
        assert_eq!(m.agents.failed, 19);
        assert_eq!(m.counters.values["keepalives_sent"], 300);
        assert_eq!(m.counters.errors["connect_refused"], 3);
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
}
