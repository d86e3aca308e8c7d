//! The propagation probe: how long a catalog (or intentions) change takes
//! to reach every agent's view, measured on one clock.
//!
//! - [`ProbeBoard`] (shared by every agent of the process): the runner arms
//!   probe `k` with what to expect *before* making the change; an agent whose
//!   view receives the matching change pushes its arrival instant, once.
//! - [`ProbeRunner`]: makes a change every `every` (catalog: alternately
//!   deregister / re-register the run's own instance of the probe service,
//!   by default the run's own `<prefix>-probe` that every agent watches, on
//!   the run's probe node; intentions: flip a source of the run's own
//!   `service-intentions` entry between allow and deny, check-and-set, never
//!   an entry it did not create), takes T0 the instant the write is sent
//!   (its round trip is `probe_write`), and after `timeout` turns the
//!   arrivals into a [`ProbeSummary`] with exact percentiles. Arrivals are
//!   the kernel receive times of the agents' sockets where the kernel stamps
//!   them (`probe_overhead` is the simulator's own delay after that).
//!   Missing deliveries stay visible as `delivered < expected`.
//! - [`ProbeObserver`] (every other process of a sharded run, where
//!   `controller == false`): its board is in observe mode — agents report
//!   every live change of the probe instance (or source), keyed by the raft
//!   index of its event, which every subscriber of every process sees alike.
//!   Arrivals are grouped by that index; each group becomes a
//!   [`ProbeSummary`] with role `observer`: latencies after this process's
//!   first arrival plus that arrival's wall-clock time, which `agent-sim
//!   report merge` shifts onto the controller's T0 (see
//!   [`agent_sim_metrics::merge`]). The controller's own entries carry the
//!   raft index and T0 as unix µs for that join.

//!
//! Parts: `board` ([`ProbeBoard`]), `runner` ([`ProbeRunner`]), `observer`
//! ([`ProbeObserver`]) and `stats` (exact percentiles and the summaries).

mod board;
mod observer;
mod runner;
mod stats;

pub use board::{Owed, ProbeBoard};
pub use observer::ProbeObserver;
pub use runner::{ProbeRunner, RunnerSetup};
pub use stats::{common_index, micros_after, percentile, summarize};

/// What the armed probe expects an agent to see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Expect {
    /// The probe instance appears.
    Register = 1,
    /// The probe instance disappears.
    Deregister = 2,
    /// The probe source becomes `allow`.
    Allow = 3,
    /// The probe source becomes `deny`.
    Deny = 4,
    /// The probe key holds the probe's id.
    KvSet = 5,
}

impl Expect {
    /// `ProbeSummary::kind` of a change with this outcome.
    pub fn kind_name(self) -> &'static str {
        match self {
            Expect::Register => "register",
            Expect::Deregister => "deregister",
            Expect::Allow | Expect::Deny => "intentions",
            Expect::KvSet => "kv",
        }
    }

    /// Inverse of `self as u8` (0 and unknown values: `None`).
    pub fn from_u8(v: u8) -> Option<Expect> {
        match v {
            1 => Some(Expect::Register),
            2 => Some(Expect::Deregister),
            3 => Some(Expect::Allow),
            4 => Some(Expect::Deny),
            5 => Some(Expect::KvSet),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use agent_sim_metrics::units::unix_us;
    use tokio::time::Instant;

    use super::*;
    use crate::codec::instance_key;
    use crate::config::ProbeKind;
    use crate::view::{Change, View};

    #[test]
    fn exact_percentiles_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 0.999), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn summary_is_exact_and_reports_missing() {
        // 200 expected, 198 delivered in time, one late, one never.
        let mut lat: Vec<u64> = (0..198).map(|i| 1_000 + i * 1_001).collect();
        lat.push(20_000_000); // after the 10 s timeout: missing
        lat.reverse();
        let s = summarize(
            7,
            "deregister",
            SystemTime::UNIX_EPOCH,
            200,
            lat,
            10_000_000,
        );
        assert_eq!(s.id, 7);
        assert_eq!(s.kind, "deregister");
        assert_eq!(s.t0, "1970-01-01T00:00:00.000Z");
        assert_eq!(s.delivered, 198);
        assert_eq!(s.expected, 200);
        // 99 % of 200 = 198 → the 198th arrival.
        assert_eq!(s.time_to_99pct_us, Some(1_000 + 197 * 1_001));
        assert_eq!(s.latency_us.count, 198);
        assert_eq!(s.latency_us.min, 1_000);
        assert_eq!(s.latency_us.max, 1_000 + 197 * 1_001);
        assert_eq!(s.latency_us.p50, 1_000 + 98 * 1_001);
        assert!(!s.latency_us.hdr.is_empty());
    }

    #[test]
    fn time_to_99pct_needs_enough_deliveries() {
        let s = summarize(
            1,
            "register",
            SystemTime::UNIX_EPOCH,
            200,
            vec![5; 197],
            1_000,
        );
        assert_eq!(s.delivered, 197);
        assert_eq!(s.time_to_99pct_us, None);
        let s = summarize(1, "register", SystemTime::UNIX_EPOCH, 0, vec![], 1_000);
        assert_eq!(s.time_to_99pct_us, None);
        assert_eq!(s.latency_us.count, 0);
        let s = summarize(1, "register", SystemTime::UNIX_EPOCH, 1, vec![0], 1_000);
        assert_eq!(s.time_to_99pct_us, Some(0));
        assert_eq!(s.latency_us.p99, 0);
    }

    #[test]
    fn early_arrivals_count_as_zero() {
        let t0 = Instant::now();
        let before = t0 - Duration::from_millis(3);
        assert_eq!(micros_after(t0, before), 0);
        assert_eq!(micros_after(t0, t0 + Duration::from_millis(2)), 2_000);
    }

    #[test]
    fn board_matches_only_the_armed_expectation_once_per_probe() {
        let b = ProbeBoard::new(ProbeKind::Catalog, "web", "agent-sim");
        let key = b.target();
        assert_eq!(
            key,
            instance_key("agent-sim-probe", "agent-sim-probe-agent-sim")
        );
        let dereg = Change::Deregister { key };
        assert_eq!(b.matches(&dereg), None, "not armed");
        assert_eq!(b.arm(1, Expect::Deregister), 0, "no live subscription");
        assert_eq!(b.matches(&dereg), Some(1));
        assert_eq!(b.matches(&Change::Deregister { key: key ^ 1 }), None);
        assert_eq!(
            b.matches(&Change::Register {
                key,
                snapshot: false
            }),
            None
        );
        let now = Instant::now();
        assert!(b.arrive(1, now, 41));
        assert!(!b.arrive(2, now, 41));
        assert_eq!(b.disarm(), vec![(now, 41)]);
        assert!(!b.arrive(1, now, 41), "disarmed");
        assert!(
            !b.observe(41, Expect::Deregister, now, (Some(0), Owed::default())),
            "not an observer"
        );
        assert_eq!(b.observes(&dereg), None);
        b.arm(2, Expect::Register);
        assert_eq!(
            b.matches(&Change::Register {
                key,
                snapshot: true
            }),
            None,
            "snapshot items are checked with matches_state"
        );
        let mut view = View::new(crate::view::ViewKind::Health);
        assert_eq!(b.matches_state(&view), None);
        view.reset();
        b.arm(3, Expect::Deregister);
        assert_eq!(b.matches_state(&view), Some(3));
    }

    #[test]
    fn proxies_behind_the_live_subscriptions_are_expected_too() {
        let plain = ProbeBoard::new(ProbeKind::Catalog, "web", "agent-sim");
        plain.arm(1, Expect::Deregister);
        assert_eq!(plain.take_proxied(), None, "no proxies");
        let b = ProbeBoard::new(ProbeKind::Catalog, "web", "agent-sim").with_proxies(3);
        for _ in 0..2 {
            b.sub_up();
        }
        assert_eq!(b.arm(1, Expect::Deregister), 2);
        let t = Instant::now();
        let ms = Duration::from_millis;
        assert!(b.arrive(1, t, 9));
        assert!(b.arrive_proxied(1, 9, &[t + ms(200), t + ms(200), t + ms(204)]));
        assert!(!b.arrive_proxied(2, 9, &[t]), "not the armed probe");
        assert_eq!(b.disarm(), vec![(t, 9)]);
        assert!(!b.arrive_proxied(1, 9, &[t]), "disarmed");
        let (expected, at) = b.take_proxied().unwrap();
        assert_eq!(expected, 6);
        assert_eq!(at.len(), 3);
        assert_eq!(at[2], (t + ms(204), 9));
        // The next probe starts empty.
        b.arm(2, Expect::Register);
        assert_eq!(b.take_proxied(), Some((6, vec![])));
    }

    #[test]
    fn a_probe_expects_the_subscriptions_live_when_it_was_armed() {
        let b = ProbeBoard::new(ProbeKind::Catalog, "web", "agent-sim");
        let (mut owed_a, mut owed_c) = (Owed::default(), Owed::default());
        // a: live before probe 1; c: down before it, back while it is armed.
        let a = b.sub_up();
        let c = b.sub_up();
        assert_eq!((a, c), (0, 0));
        b.sub_down(c, &mut owed_c);
        assert_eq!(b.arm(1, Expect::Deregister), 1);
        assert!(ProbeBoard::expects(Some(a), owed_a, 1));
        assert!(!ProbeBoard::expects(None, owed_c, 1), "down at the arming");
        let c = b.sub_up();
        assert_eq!(c, 1);
        assert!(
            !ProbeBoard::expects(Some(c), owed_c, 1),
            "came live after the arming: the change is in its snapshot"
        );
        // a goes down and comes back inside the window: still owed, also
        // after a second drop inside the same window.
        b.sub_down(a, &mut owed_a);
        assert!(ProbeBoard::expects(None, owed_a, 1), "owed while down");
        let a = b.sub_up();
        assert!(ProbeBoard::expects(Some(a), owed_a, 1));
        b.sub_down(a, &mut owed_a);
        let a = b.sub_up();
        assert!(ProbeBoard::expects(Some(a), owed_a, 1));
        // c going down owes probe 1 nothing.
        b.sub_down(c, &mut owed_c);
        assert!(!ProbeBoard::expects(None, owed_c, 1));
        b.disarm();
        // The next probe expects what is live at its arming.
        assert_eq!(b.arm(2, Expect::Register), 1);
        assert!(ProbeBoard::expects(Some(a), owed_a, 2));
        assert!(!ProbeBoard::expects(None, owed_c, 2));
        b.sub_down(a, &mut owed_a);
        assert!(ProbeBoard::expects(None, owed_a, 2));
        assert_eq!(b.live(), 0);
    }

    #[test]
    fn common_index_is_the_most_frequent_known_one() {
        let t = Instant::now();
        assert_eq!(common_index(&[]), None);
        assert_eq!(common_index(&[(t, 0), (t, 0)]), None);
        assert_eq!(common_index(&[(t, 9), (t, 0), (t, 7), (t, 9)]), Some(9));
        assert_eq!(common_index(&[(t, 9), (t, 7)]), Some(7), "tie: smaller");
    }

    fn observer(timeout: Duration) -> ProbeBoard {
        let b = ProbeBoard::new_observer(ProbeKind::Catalog, "web", "agent-sim", timeout);
        for _ in 0..4 {
            b.sub_up();
        }
        b
    }

    #[test]
    fn observer_sees_live_changes_of_the_derived_probe_instance_only() {
        let b = observer(Duration::from_secs(1));
        assert!(b.is_observer());
        // Same instance as the controller's board of the same prefix.
        assert_eq!(
            b.target(),
            ProbeBoard::new(ProbeKind::Catalog, "web", "agent-sim").target()
        );
        let key = b.target();
        assert_eq!(
            b.observes(&Change::Deregister { key }),
            Some(Expect::Deregister)
        );
        assert_eq!(
            b.observes(&Change::Register {
                key,
                snapshot: false
            }),
            Some(Expect::Register)
        );
        assert_eq!(
            b.observes(&Change::Register {
                key,
                snapshot: true
            }),
            None
        );
        assert_eq!(b.observes(&Change::Deregister { key: key ^ 1 }), None);
        assert_eq!(b.matches(&Change::Deregister { key }), None, "never armed");
        let i = ProbeBoard::new_observer(ProbeKind::Intentions, "web", "x", Duration::ZERO);
        let source = i.target();
        let allow = |a| Change::Intention {
            source,
            allow: Some(a),
            snapshot: false,
        };
        assert_eq!(i.observes(&allow(false)), Some(Expect::Deny));
        assert_eq!(i.observes(&allow(true)), Some(Expect::Allow));
        assert_eq!(Expect::Deny.kind_name(), "intentions");
    }

    #[test]
    fn observer_groups_arrivals_by_raft_index() {
        let b = observer(Duration::from_millis(500));
        // Arrivals stamped in the past, as the kernel stamps them.
        let t = Instant::now() - Duration::from_secs(2);
        let ms = Duration::from_millis;
        // Change at index 10 (deregister): 3 of 4 agents, recorded out of
        // order; one arrival after the 500 ms window (missing).
        let live = (Some(0), Owed::default());
        assert!(b.observe(10, Expect::Deregister, t + ms(5), live));
        assert!(b.observe(10, Expect::Deregister, t + ms(2), live));
        assert!(b.observe(10, Expect::Deregister, t + ms(9), live));
        assert!(b.observe(10, Expect::Deregister, t + ms(900), live));
        assert!(
            !b.observe(10, Expect::Register, t, live),
            "one index, one outcome"
        );
        // Change at index 12 (register): all 4, one of them by a re-sync
        // after its subscription went down while the change was open.
        for k in 0..3 {
            assert!(b.observe(12, Expect::Register, t + ms(1_000 + k), live));
        }
        let mut owed = Owed::default();
        b.sub_down(0, &mut owed);
        assert!(
            !b.observe(12, Expect::Register, t, (Some(2), Owed::default())),
            "live only since the change opened"
        );
        assert!(
            !b.observe_resync((12, 20), Expect::Register, t + ms(1_010), owed),
            "already had index 12"
        );
        assert!(
            !b.observe_resync((10, 20), Expect::Deregister, t, owed),
            "no open deregister in (10, 20]"
        );
        assert!(
            !b.observe_resync((10, 20), Expect::Register, t, Owed::default()),
            "down when the change opened: not expected"
        );
        assert!(b.observe_resync((10, 20), Expect::Register, t + ms(1_010), owed));
        let (done, interrupted) = b.close_observer();
        assert_eq!(interrupted, 0);
        assert!(!b.observe(14, Expect::Deregister, t, live), "closed");
        assert_eq!(done.len(), 2);
        let (d, r) = (&done[0], &done[1]);
        assert_eq!(d.change_id, Some(10));
        assert_eq!(d.kind, "deregister");
        assert_eq!(d.role.as_deref(), Some("observer"));
        assert_eq!((d.id, d.t0.as_str(), d.t0_unix_us), (0, "", None));
        assert_eq!((d.delivered, d.expected), (3, 4));
        assert_eq!(d.latency_us.min, 0, "after the first arrival");
        assert_eq!(d.latency_us.max, 7_000);
        assert_eq!(d.time_to_99pct_us, None);
        assert_eq!(r.change_id, Some(12));
        assert_eq!(
            (r.kind.as_str(), r.delivered, r.expected),
            ("register", 4, 4)
        );
        assert_eq!(r.latency_us.max, 10_000);
        assert_eq!(r.time_to_99pct_us, Some(10_000));
        // First arrivals in wall-clock time keep their monotonic distance.
        let (fd, fr) = (
            d.first_arrival_unix_us.unwrap(),
            r.first_arrival_unix_us.unwrap(),
        );
        let now = unix_us(SystemTime::now());
        assert!(fd <= now && now - fd < 10_000_000, "{fd} vs {now}");
        assert!((fr - fd).abs_diff(998_000) <= 1_000, "{}", fr - fd);
    }

    #[test]
    fn observer_leaves_out_a_change_cut_short_with_missing_deliveries() {
        let b = observer(Duration::from_secs(60));
        let t = Instant::now();
        let live = (Some(0), Owed::default());
        assert!(b.observe(5, Expect::Deregister, t, live));
        for _ in 0..4 {
            assert!(b.observe(6, Expect::Register, t, live));
        }
        // Both windows are open: 6 is complete (kept), 5 is not (counted).
        let (done, interrupted) = b.close_observer();
        assert_eq!(interrupted, 1);
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].change_id, done[0].delivered), (Some(6), 4));
    }
}
