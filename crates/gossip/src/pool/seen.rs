//! serf's event and query clocks and the buffers that make a member take
//! each user event and each query in once (serf's `handleUserEvent` and
//! `handleQuery`): a buffer of 512 Lamport times, each slot holding what
//! was seen at its time; anything older than the buffer reaches is
//! ignored, and so are events from before the pool's join (Consul joins
//! with `ignoreOld`: the join answer's event clock is the least time taken).
//!
//! Pure state: the pool shares one, as its members share one view.

/// serf's `EventBuffer` and `QueryBuffer`.
pub const BUFFER: u64 = 512;
/// Events kept per Lamport time (serf keeps any number; a flood of
/// distinct events at one time is ignored past this).
const PER_SLOT: usize = 64;

/// A Lamport clock as serf keeps it: the next time to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock(pub u64);

impl Clock {
    /// Witnesses a time seen: the clock moves past it.
    pub fn witness(&mut self, t: u64) {
        if t >= self.0 {
            self.0 = t.saturating_add(1);
        }
    }

    /// Witnesses another member's clock `t` (a push-pull's): serf takes
    /// `t − 1`, as no message has time `t` yet.
    pub fn witness_state(&mut self, t: u64) {
        if t > 0 {
            self.witness(t - 1);
        }
    }
}

/// What was seen at one Lamport time.
#[derive(Debug, Clone, Default)]
struct Slot<T> {
    ltime: u64,
    seen: Vec<T>,
}

/// A buffer of [`BUFFER`] Lamport times.
#[derive(Debug, Clone)]
struct Buffer<T> {
    slots: Vec<Option<Slot<T>>>,
}

impl<T> Default for Buffer<T> {
    fn default() -> Self {
        Buffer {
            slots: (0..BUFFER).map(|_| None).collect(),
        }
    }
}

impl<T: PartialEq> Buffer<T> {
    /// Takes `item` in at `ltime` (the clock at `now`): true when it is new.
    fn take(&mut self, ltime: u64, now: u64, item: T) -> bool {
        if now > BUFFER && ltime < now - BUFFER {
            return false;
        }
        let slot = &mut self.slots[(ltime % BUFFER) as usize];
        match slot {
            Some(s) if s.ltime == ltime => {
                if s.seen.contains(&item) || s.seen.len() >= PER_SLOT {
                    return false;
                }
                s.seen.push(item);
            }
            _ => {
                *slot = Some(Slot {
                    ltime,
                    seen: vec![item],
                })
            }
        }
        true
    }
}

/// The pool's event and query clocks and what it has taken in.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// serf's event clock.
    pub event_clock: Clock,
    /// Events before this time are ignored (set from the join's answer).
    pub event_min: u64,
    events: Buffer<(Box<str>, Box<[u8]>)>,
    /// serf's query clock.
    pub query_clock: Clock,
    queries: Buffer<u32>,
}

impl Seen {
    /// A user event: true when it is taken in (new, and not too old).
    pub fn event(&mut self, ltime: u64, name: &str, payload: &[u8]) -> bool {
        self.event_clock.witness(ltime);
        if ltime < self.event_min {
            return false;
        }
        let item = (name.into(), payload.into());
        self.events.take(ltime, self.event_clock.0, item)
    }

    /// A query: true when it is taken in (new, and not too old).
    pub fn query(&mut self, ltime: u64, id: u32) -> bool {
        self.query_clock.witness(ltime);
        self.queries.take(ltime, self.query_clock.0, id)
    }

    /// The join's answer carried event clock `t`: what came before is
    /// ignored (serf's `eventJoinIgnore`).
    pub fn ignore_before(&mut self, t: u64) {
        self.event_min = self.event_min.max(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_is_taken_once_and_old_ones_not_at_all() {
        let mut s = Seen::default();
        s.ignore_before(5);
        assert!(!s.event(4, "e", b""), "before the join");
        assert!(s.event(5, "e", b"x"));
        assert!(!s.event(5, "e", b"x"), "seen");
        assert!(s.event(5, "e", b"y"), "another payload at the same time");
        assert_eq!(s.event_clock, Clock(6));
        assert!(s.event(1_000, "e", b""));
        assert!(!s.event(400, "f", b""), "older than the buffer reaches");
        assert!(s.event(600, "f", b""));
    }

    #[test]
    fn each_query_is_taken_once() {
        let mut s = Seen::default();
        assert!(s.query(3, 7));
        assert!(!s.query(3, 7));
        assert!(s.query(3, 8));
        // The slot of time 3 is taken over by time 515.
        assert!(s.query(515, 7));
        assert!(!s.query(515, 7));
        assert_eq!(s.query_clock, Clock(516));
    }
}
