//! The shared timer grid of a fleet's Sensu sessions: every session's timer
//! fires on a multiple of one step (`SensuConfig::timer_tick`) counted from
//! one origin, so agents whose keepalives or pings fall due within the same
//! step are all woken by one turn of the runtime's timer, and one wakeup of
//! the process writes all their frames.
//!
//! Why: at a few hundred messages a second, each on a timer of its own, the
//! process sleeps and wakes once per message, and that (the switch, the
//! epoll wait, the timer wheel) costs more than the frame and its `send`
//! (BENCHMARKS.md, "Sensu: one wakeup for many agents"). What the backend
//! sees: each agent's frames at its own fixed intervals as before; only the
//! phase of its schedule moves, once per session, by less than one step.
//!
//! What it is not: no task or timer of its own; a session snaps its own
//! deadlines with [`TimerGrid::snap`] and keeps its own `Sleep`.

use std::time::Duration;

use tokio::time::Instant;

/// Multiples of `tick` from `origin`; a zero `tick` leaves every instant
/// as it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimerGrid {
    origin: Instant,
    tick: Duration,
}

impl TimerGrid {
    /// A grid of `tick` steps from `origin` (zero: no grid).
    pub(crate) fn new(origin: Instant, tick: Duration) -> Self {
        TimerGrid { origin, tick }
    }

    /// The first point of the grid at or after `t` (`t` itself without a
    /// grid, or when it comes before the origin).
    pub(crate) fn snap(&self, t: Instant) -> Instant {
        let tick = self.tick.as_nanos();
        if tick == 0 || t <= self.origin {
            return t;
        }
        let since = (t - self.origin).as_nanos();
        let steps = since.div_ceil(tick);
        let Ok(nanos) = u64::try_from(steps * tick) else {
            return t;
        };
        self.origin + Duration::from_nanos(nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn instants_move_up_to_the_next_step_and_points_stay() {
        let o = Instant::now();
        let g = TimerGrid::new(o, 50 * MS);
        assert_eq!(g.snap(o), o);
        assert_eq!(g.snap(o + MS), o + 50 * MS);
        assert_eq!(g.snap(o + 49 * MS), o + 50 * MS);
        assert_eq!(g.snap(o + 50 * MS), o + 50 * MS);
        assert_eq!(g.snap(o + 50 * MS + Duration::from_nanos(1)), o + 100 * MS);
        // A point plus a whole number of steps is a point.
        let p = g.snap(o + 1234 * MS);
        assert_eq!(
            g.snap(p + Duration::from_secs(20)),
            p + Duration::from_secs(20)
        );
    }

    #[test]
    fn no_grid_and_instants_before_the_origin_are_left_alone() {
        let o = Instant::now() + Duration::from_secs(1);
        let off = TimerGrid::new(o, Duration::ZERO);
        assert_eq!(off.snap(o + 7 * MS), o + 7 * MS);
        let g = TimerGrid::new(o, 50 * MS);
        let before = o - 7 * MS;
        assert_eq!(g.snap(before), before);
    }

    #[test]
    fn a_snapped_instant_is_never_earlier_nor_a_step_later() {
        let o = Instant::now();
        let g = TimerGrid::new(o, 50 * MS);
        for us in (0..200_000u64).step_by(997) {
            let t = o + Duration::from_micros(us);
            let s = g.snap(t);
            assert!(s >= t && s - t < 50 * MS, "{us} µs -> {:?}", s - o);
        }
    }
}
