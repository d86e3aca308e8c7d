//! Where a probe's change spent its time, and which probes were late.
//!
//! A probe's time to its p99 splits into three legs, each measured at a
//! different place:
//! - **written**: T0 until the server answered the write (`written_us`). A
//!   Consul server answers a catalog or config-entry write once its leader
//!   has committed the entry through raft and applied it, so this leg is
//!   the server's commit and apply.
//! - **published**: from that answer to the first delivery
//!   (`latency_us.min`, a kernel receive time at one of our agents). The
//!   change is applied; the server has yet to send it to any subscriber:
//!   the server's publishing (its event publisher, a blocking query's
//!   wake-up, the xDS snapshot).
//! - **fan-out**: from the first delivery to the p99: the server sending it
//!   to every subscriber and the network and agents receiving it.
//!
//! A probe is *late* when its p99 is more than [`LATE_FACTOR`] times the
//! median p99 of its group (the probes of one kind timed at one fleet) and
//! more than [`LATE_MARGIN_US`] above it; its late time is given to the leg
//! that grew most over that leg's median in the group. A group needs
//! [`MIN_GROUP`] probes with a write time before any is called late.

use std::collections::BTreeMap;

use crate::summary::ProbeSummary;
use crate::units::fmt_us;

/// A late p99 is more than this many times its group's median p99.
pub const LATE_FACTOR: u64 = 3;
/// ... and more than this many µs above it.
pub const LATE_MARGIN_US: u64 = 50_000;
/// Probes in a group before any of them can be called late.
pub const MIN_GROUP: usize = 4;

/// A group of probes: their kind and the fleet they were timed at.
type Group<'a> = (&'a str, Option<&'a str>);

/// The legs in the order of the probe's time.
const LEGS: [Leg; 3] = [Leg::Written, Leg::Published, Leg::FanOut];

/// One leg of a probe's time (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leg {
    /// T0 to the server's answer: its raft commit and apply.
    Written,
    /// The answer to the first delivery: the server's publishing.
    Published,
    /// The first delivery to the p99: the fan-out.
    FanOut,
}

impl Leg {
    /// Whose time the leg is, in a reader's words.
    pub fn words(self) -> &'static str {
        match self {
            Leg::Written => "the server's raft commit and apply (T0 until it answered the write)",
            Leg::Published => {
                "the server's publishing (from its answer to the write until the first \
                 agent received the change)"
            }
            Leg::FanOut => "the fan-out (from the first agent that received the change to the p99)",
        }
    }
}

/// A probe's time to its p99, split into its legs (µs; they add up to the
/// p99 unless the p99 came before the write's answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Legs {
    /// T0 to the write's answer (at most the p99).
    pub written: u64,
    /// The write's answer to the first delivery.
    pub published: u64,
    /// The first delivery (or the answer, if later) to the p99.
    pub fan_out: u64,
}

impl Legs {
    /// The legs of `p`, or `None` without a write time or an arrival.
    pub fn of(p: &ProbeSummary) -> Option<Self> {
        let w = p.written_us?;
        let first = p.first_us()?;
        let p99 = p.latency_us.p99;
        Some(Legs {
            written: w.min(p99),
            published: first.saturating_sub(w),
            fan_out: p99.saturating_sub(first.max(w)),
        })
    }

    fn get(&self, leg: Leg) -> u64 {
        match leg {
            Leg::Written => self.written,
            Leg::Published => self.published,
            Leg::FanOut => self.fan_out,
        }
    }
}

/// A late probe and the leg its late time went to.
#[derive(Clone, Debug, PartialEq)]
pub struct Late {
    /// The probe's id.
    pub id: u64,
    /// Its p99 (µs after T0).
    pub p99_us: u64,
    /// Its group's median p99.
    pub typical_us: u64,
    /// Its legs.
    pub legs: Legs,
    /// The leg that grew most over its group's median of that leg.
    pub leg: Leg,
    /// That leg's median in the group.
    pub leg_typical_us: u64,
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The late probes of `probes` (controller entries with a write time),
/// in their order.
pub fn late_probes(probes: &[ProbeSummary]) -> Vec<Late> {
    let timed: Vec<(&ProbeSummary, Legs)> = probes
        .iter()
        .filter(|p| !p.is_observer())
        .filter_map(|p| Legs::of(p).map(|l| (p, l)))
        .collect();
    // Each group's medians, once: its p99 and each leg's.
    let mut groups: BTreeMap<Group<'_>, Vec<(u64, Legs)>> = BTreeMap::new();
    for (p, legs) in &timed {
        groups
            .entry((p.kind.as_str(), p.fleet.as_deref()))
            .or_default()
            .push((p.latency_us.p99, *legs));
    }
    let typical: BTreeMap<_, (u64, [u64; 3])> = groups
        .into_iter()
        .filter(|(_, g)| g.len() >= MIN_GROUP)
        .map(|(k, g)| {
            let of = |leg| median(g.iter().map(|(_, l)| l.get(leg)).collect());
            let p99 = median(g.iter().map(|(p, _)| *p).collect());
            (k, (p99, LEGS.map(of)))
        })
        .collect();
    let mut out = Vec::new();
    for (p, legs) in &timed {
        let Some(&(typical, leg_medians)) = typical.get(&(p.kind.as_str(), p.fleet.as_deref()))
        else {
            continue;
        };
        let p99 = p.latency_us.p99;
        if p99 <= typical.saturating_mul(LATE_FACTOR) || p99 - typical <= LATE_MARGIN_US {
            continue;
        }
        let (leg, leg_typical) = LEGS
            .into_iter()
            .zip(leg_medians)
            .max_by_key(|&(leg, med)| legs.get(leg).saturating_sub(med))
            .unwrap_or((Leg::FanOut, 0));
        out.push(Late {
            id: p.id,
            p99_us: p99,
            typical_us: typical,
            legs: *legs,
            leg,
            leg_typical_us: leg_typical,
        });
    }
    out
}

/// One line per late probe, naming whose time it was.
pub fn late_lines(probes: &[ProbeSummary]) -> Vec<String> {
    late_probes(probes)
        .iter()
        .map(|l| {
            format!(
                "probe #{} was late (p99 {} against a typical {}): {} of it (typically {}) \
                 was {}",
                l.id,
                fmt_us(l.p99_us),
                fmt_us(l.typical_us),
                fmt_us(l.legs.get(l.leg)),
                fmt_us(l.leg_typical_us),
                l.leg.words()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::new_latency_histogram;
    use crate::summary::{LatencySummary, ROLE_CONTROLLER};

    /// A controller entry: written at `w` µs, arrivals `first..=p99` µs.
    fn probe(id: u64, w: u64, first: u64, last: u64) -> ProbeSummary {
        let mut h = new_latency_histogram();
        for v in [first, (first + last) / 2, last] {
            h.record(v).unwrap();
        }
        ProbeSummary {
            id,
            kind: "register".into(),
            role: Some(ROLE_CONTROLLER.into()),
            written_us: Some(w),
            delivered: 3,
            expected: 3,
            latency_us: LatencySummary::from_histogram(&h),
            ..Default::default()
        }
    }

    #[test]
    fn legs_add_up_to_the_p99_and_an_arrival_before_the_answer_publishes_nothing() {
        let p = probe(0, 4_000, 10_000, 30_000);
        let l = Legs::of(&p).unwrap();
        assert_eq!(l.written, 4_000);
        assert_eq!(l.written + l.published + l.fan_out, p.latency_us.p99);
        // The change reached an agent before the HTTP answer came back.
        let early = Legs::of(&probe(0, 12_000, 9_000, 30_000)).unwrap();
        assert_eq!((early.written, early.published), (12_000, 0));
        assert_eq!(
            early.written + early.fan_out,
            probe(0, 0, 9_000, 30_000).latency_us.p99
        );
        let mut none = probe(0, 1, 2, 3);
        none.written_us = None;
        assert_eq!(Legs::of(&none), None);
    }

    #[test]
    fn a_late_probe_is_given_to_the_leg_that_grew() {
        let typical = |id| probe(id, 3_000, 8_000, 20_000);
        // Publishing held for a second: written on time, first late.
        let mut ps: Vec<_> = (0..5).map(typical).collect();
        ps.push(probe(5, 3_000, 1_000_000, 1_012_000));
        // The commit took a second: the answer late, delivery right after.
        ps.push(probe(6, 1_000_000, 1_004_000, 1_016_000));
        // Delivered at once to some, a second later to the rest.
        ps.push(probe(7, 3_000, 8_000, 1_000_000));
        let late = late_probes(&ps);
        let got: Vec<(u64, Leg)> = late.iter().map(|l| (l.id, l.leg)).collect();
        assert_eq!(
            got,
            [(5, Leg::Published), (6, Leg::Written), (7, Leg::FanOut)]
        );
        assert_eq!(late[0].typical_us, ps[0].latency_us.p99);
        let lines = late_lines(&ps);
        assert!(
            lines[0].contains("probe #5") && lines[0].contains("publishing"),
            "{lines:?}"
        );
        assert!(lines[1].contains("raft commit"), "{lines:?}");
    }

    #[test]
    fn nothing_is_late_in_a_small_group_or_within_the_margin() {
        let mut ps: Vec<_> = (0..3).map(|id| probe(id, 3_000, 8_000, 20_000)).collect();
        ps.push(probe(3, 3_000, 900_000, 910_000));
        // Four probes are a group; three are not.
        assert_eq!(late_probes(&ps).len(), 1);
        assert!(
            late_probes(&ps[1..]).is_empty(),
            "three probes decide nothing"
        );
        // 3x the median but only 40 ms above it: noise, not late.
        let mut quick: Vec<_> = (0..4).map(|id| probe(id, 1_000, 5_000, 15_000)).collect();
        quick.push(probe(4, 1_000, 5_000, 55_000));
        assert!(late_probes(&quick).is_empty());
        // Observers' entries carry no write time and are never judged.
        let mut obs = ps.clone();
        for p in &mut obs {
            p.role = Some(crate::summary::ROLE_OBSERVER.into());
        }
        assert!(late_probes(&obs).is_empty());
    }
}
