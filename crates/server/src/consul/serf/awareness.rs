//! memberlist's health awareness (Lifeguard's local health): a score from
//! 0 to 7 that rises when this server's own probes fail without the nacks
//! that would put the fault on the target, and when it has to refute an
//! accusation, and falls with each probe answered. The probe interval is
//! stretched `score + 1` times (the probe timeout is not), and a probe made
//! stretched counts as degraded (`memberlist.degraded.probe`): in a join
//! storm, a server too busy to answer in time probes more slowly.
//!
//! What it is not: no timer; `probe` reads and moves it.

use std::time::Duration;

/// memberlist's `AwarenessMaxMultiplier`: the score stays below it.
const MAX_MULTIPLIER: u32 = 8;

/// The score.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Awareness {
    score: u32,
}

impl Awareness {
    /// memberlist's `ApplyDelta`: the score moved, kept within 0..=7.
    pub(crate) fn apply(&mut self, delta: i32) {
        let moved = i64::from(self.score) + i64::from(delta);
        self.score = moved.clamp(0, i64::from(MAX_MULTIPLIER - 1)) as u32;
    }

    /// The score now (memberlist's `health.score` gauge).
    pub(crate) fn score(self) -> u32 {
        self.score
    }

    /// memberlist's `ScaleTimeout`: `d` stretched `score + 1` times.
    pub(crate) fn scale(self, d: Duration) -> Duration {
        d * (self.score + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_score_stays_within_bounds_and_stretches_the_interval() {
        let mut a = Awareness::default();
        let s = Duration::from_secs(1);
        assert_eq!(a.scale(s), s);
        a.apply(-1);
        assert_eq!(a.score(), 0);
        a.apply(3);
        assert_eq!(a.scale(s), 4 * s);
        a.apply(20);
        assert_eq!((a.score(), a.scale(s)), (7, 8 * s));
        a.apply(-2);
        assert_eq!(a.score(), 5);
    }
}
