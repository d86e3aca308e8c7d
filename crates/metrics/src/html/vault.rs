//! The page's "Vault" section (`--vault-nodes`): what the simulated Vault
//! servers wrote per second over the run, beside the observed server's
//! raft commit time on the same time axis (`--observe consul`), and the
//! run's checks: one lock holder, the sampled read-back, the clean-up.

use super::blocks::{close, disruption_marks, figure, kv, note, open};
use super::charts::{over_time, rate_points};
use super::svg::{Series, Unit};
use crate::summary::Summary;
use crate::vault::VaultSummary;

/// Counters charted as rates, with their legend names.
const RATES: &[(&str, &str)] = &[
    ("vault_kv_writes", "storage writes/s"),
    ("vault_tokens_created", "tokens created/s"),
    ("vault_tokens_revoked", "tokens revoked/s"),
];

/// The observed series of the raft commit time (Consul's
/// `consul.raft.commitTime`, as `--observe consul` names it).
const COMMIT_TIME: &str = "consul_raft_commit_time";

/// The Vault section, when the run had Vault servers.
pub(super) fn vault(o: &mut String, s: &Summary) {
    let Some(v) = &s.vault else { return };
    open(o, "vault", "Vault on Consul");
    facts(o, v);
    let series: Vec<Series> = RATES
        .iter()
        .map(|(name, label)| Series {
            name: label.to_string(),
            points: rate_points(&s.timeline, |t| {
                t.counters.get(*name).copied().unwrap_or(0) as f64
            }),
            steps: false,
        })
        .filter(|x| x.points.iter().any(|p| p.1 > 0.0))
        .collect();
    let mut chart = over_time(
        "Vault storage writes",
        s.duration_s,
        Unit::Count,
        "per second",
        series,
    );
    if let Some(c) = chart.as_mut() {
        c.marks = disruption_marks(s);
    }
    figure(
        o,
        chart,
        "What the active Vault node wrote to the cluster per second (each write one /v1/txn \
         with its session check), and its token creates and revocations.",
    );
    commit_time(o, s);
    close(o);
}

/// The observed servers' raft commit time, p50 and p99 per scrape, on the
/// same time axis as the write rates.
fn commit_time(o: &mut String, s: &Summary) {
    let mut series = Vec::new();
    for (i, srv) in s.server.iter().enumerate() {
        for (q, p99) in [("p50", false), ("p99", true)] {
            let points: Vec<(f64, f64)> = srv
                .samples
                .iter()
                .filter_map(|p| {
                    let l = p.latencies.get(COMMIT_TIME)?;
                    let v = if p99 {
                        l.p99.or(l.max)
                    } else {
                        l.p50.or(l.mean)
                    }?;
                    Some((p.t_s.max(0.0), v))
                })
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    name: if s.server.len() == 1 {
                        format!("commit time {q}")
                    } else {
                        format!("#{} commit time {q}", i + 1)
                    },
                    points,
                    steps: false,
                });
            }
        }
    }
    if series.is_empty() {
        note(
            o,
            "The server's raft commit time shows here beside the writes with --observe consul \
             (its consul.raft.commitTime).",
        );
        return;
    }
    let mut chart = over_time(
        "Server raft commit time",
        s.duration_s,
        Unit::Micros,
        "latency",
        series,
    );
    if let Some(c) = chart.as_mut() {
        c.marks = disruption_marks(s);
    }
    figure(
        o,
        chart,
        "consul.raft.commitTime of each observed server per scrape (p50, p99), on the time axis \
         of the writes above.",
    );
}

/// The run's figures and checks as a list.
fn facts(o: &mut String, v: &VaultSummary) {
    let c = &v.lock_check;
    let r = &v.read_back;
    let k = &v.cleanup;
    let mut items = vec![
        ("servers", format!("{} (storage path {})", v.nodes, v.path)),
        (
            "tokens",
            format!(
                "{} created, {} renewed, {} revoked ({:.0}/s asked, TTL {:.0}s)",
                v.tokens_created, v.tokens_renewed, v.tokens_revoked, v.tokens_per_s, v.token_ttl_s
            ),
        ),
        (
            "storage calls",
            format!("{} ({} writes)", v.kv_ops, v.kv_writes),
        ),
        (
            "lock",
            format!(
                "{} acquisitions, {} leadership changes, {} fenced writes",
                v.lock_acquisitions, v.leadership_changes, v.fenced_writes
            ),
        ),
        ("one holder", c.describe()),
        (
            "read-back",
            format!(
                "{} as written, {} lost, {} changed, {} unread",
                r.ok, r.lost, r.changed, r.unread
            ),
        ),
        (
            "clean-up",
            format!(
                "{} keys and {} sessions removed; {} keys, {} sessions left",
                k.keys_removed, k.sessions_removed, k.keys_left, k.sessions_left
            ),
        ),
    ];
    for b in &v.bursts {
        items.push((
            "burst",
            format!(
                "at {:.0}s: {} of {} tokens{}",
                b.at_s,
                b.created,
                b.tokens,
                b.done_s
                    .map(|d| format!(", all created in {:.1}s", d - b.at_s))
                    .unwrap_or_default()
            ),
        ));
    }
    kv(o, &items);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::TimelineSample;

    #[test]
    fn the_section_charts_the_writes_and_lists_the_checks() {
        let mut s = Summary {
            duration_s: 20.0,
            vault: Some(VaultSummary {
                nodes: 3,
                path: "run/vault/".into(),
                tokens_created: 40,
                ..Default::default()
            }),
            ..Default::default()
        };
        for t in 1..=4 {
            s.timeline.push(TimelineSample {
                t_s: f64::from(t) * 5.0,
                counters: [("vault_kv_writes".to_string(), 100)].into(),
                ..Default::default()
            });
        }
        let mut o = String::new();
        vault(&mut o, &s);
        assert!(o.contains("Vault storage writes"), "{o}");
        assert!(o.contains("run/vault/"));
        assert!(o.contains("--observe consul"), "the commit time's hint");
        let mut none = String::new();
        vault(&mut none, &Summary::default());
        assert!(none.is_empty());
    }
}
