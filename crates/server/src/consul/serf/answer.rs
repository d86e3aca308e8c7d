//! The server's push-pull state, encoded once per change of it, and its
//! push-pulls in flight, bounded as memberlist bounds them.
//!
//! - [`Serf::push_pull_state`]: every member and serf's state, encoded and
//!   sealed (compressed, encrypted with the pool's key) once per version of
//!   the table and `join` flag, then shared by every answer (and by this
//!   server's own push-pulls) until the table changes or a dead member it
//!   holds is forgotten. Nothing in it is per connection: the label header
//!   goes only before what this end dials, and the encryption's data is the
//!   pool's label. The joins answered before the first of them is merged
//!   (a join changes the state once merged) share one encoding, and so do
//!   the joins of [`JOIN_SHARE`] after an encoding while nothing but
//!   members' alive news came since (a member suspected, dead or leaving
//!   is encoded at once): in a join storm every
//!   merged join is a change, and 200 joins a second of a 10,000-member
//!   table would otherwise encode and compress ~1.3 MB 200 times a second
//!   (a real server does, once per push-pull, and stalls past ~5,500
//!   members at 100 joins/s on this box: BENCHMARKS.md). A joiner then
//!   misses the members of the last 250 ms at most, which gossip brings
//!   it; an anti-entropy push-pull still gets the state as it is.
//! - [`Serf::push_pull_slot`]: memberlist's `pushPullReq`: a push-pull
//!   counts from its message read until its answer is written and the
//!   peer's state merged; one that finds 128 pending, itself included, is
//!   closed unanswered, counted as `serf_push_pulls_refused` and logged as
//!   memberlist logs it, "[ERR] memberlist: Too many pending push/pull
//!   requests" (at most once a second, with the count held back).
//!
//! What it is not: no encoding of its own (`view`), no socket (`stream`).

use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use tokio::time::Instant;

use super::handoff::held_back;
use super::{Serf, lock};

/// How long after an encoding the joins share it although the table
/// changed since (see the module's doc).
pub(super) const JOIN_SHARE: std::time::Duration = std::time::Duration::from_millis(250);

/// memberlist's `maxPushPullRequests`: a push-pull that finds this many
/// pending, itself included, is refused (so 127 are answered at once).
pub(super) const MAX_PUSH_PULLS: u32 = 128;

/// The push-pull state as streams carry it (type byte `push_pull`).
#[derive(Clone, Debug)]
pub(super) struct Sealed {
    /// The sealed message (a stream's bytes after any label header).
    pub(super) bytes: Bytes,
    /// The message before it was sealed (type byte first): its length.
    pub(super) len: usize,
    /// The table's version it was encoded from.
    version: u64,
    /// When its encoding was done (a join's share of it runs from then:
    /// an encoding slower than the share itself would otherwise be made
    /// again for every join, a storm's cliff on a busy core).
    made: Instant,
    /// When a dead or left member in it is forgotten (`None`: never).
    until: Option<Instant>,
}

impl Sealed {
    /// Still what the table at `version` would encode at `now`, or, for a
    /// join's answer (`join`), made less than [`JOIN_SHARE`] ago with only
    /// members' alive news since (`settled`: the last other change).
    fn fresh(&self, (version, settled): (u64, u64), now: Instant, join: bool) -> bool {
        let shared = join && settled <= self.version && now < self.made + JOIN_SHARE;
        (self.version == version || shared) && self.until.is_none_or(|u| now <= u)
    }
}

/// The kept encodings and the push-pulls in flight.
#[derive(Debug, Default)]
pub(super) struct Answers {
    /// The last encoding, by the `join` flag of its header. An async lock:
    /// answers that find it stale wait for the one encoding under way
    /// rather than each make their own.
    kept: tokio::sync::Mutex<[Option<Sealed>; 2]>,
    /// Push-pulls being answered (memberlist's `pushPullReq`).
    pub(super) in_flight: AtomicU32,
}

/// One push-pull among those in flight, until dropped.
#[derive(Debug)]
pub(super) struct PushPullSlot<'a>(&'a AtomicU32);

impl Drop for PushPullSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Serf {
    /// This server's push-pull state with `join` in its header, sealed:
    /// the one kept while the table has not changed since, else encoded
    /// (and kept) now.
    pub(super) async fn push_pull_state(&self, join: bool) -> Sealed {
        let mut kept = self.answers.kept.lock().await;
        let slot = &mut kept[usize::from(join)];
        let now = Instant::now();
        let (msg, version, until) = {
            let t = lock(&self.table);
            let at = (t.version, t.settled);
            if let Some(s) = slot.as_ref().filter(|s| s.fresh(at, now, join)) {
                return s.clone();
            }
            (
                t.local_state(join, now),
                t.version,
                t.local_state_until(now),
            )
        };
        let sealed = Sealed {
            bytes: Bytes::from(self.cfg.security.seal_stream(&msg)),
            len: msg.len(),
            version,
            made: Instant::now(),
            until,
        };
        self.counters.bump(&self.counters.push_pull_encodings);
        *slot = Some(sealed.clone());
        sealed
    }

    /// A place among the push-pulls in flight, held until dropped; `None`
    /// (counted) when memberlist would refuse this one.
    pub(super) fn push_pull_slot(&self) -> Option<PushPullSlot<'_>> {
        let n = self.answers.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        let slot = PushPullSlot(&self.answers.in_flight);
        if n >= MAX_PUSH_PULLS {
            self.counters.bump(&self.counters.push_pulls_refused);
            if let Some(held) = lock(&self.throttles[1]).due(Instant::now()) {
                self.log(format!(
                    "[ERR] memberlist: Too many pending push/pull requests{}",
                    held_back(held)
                ));
            }
            return None;
        }
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use agent_sim_gossip::Security;
    use agent_sim_gossip::wire::kind;
    use agent_sim_gossip::wire::msgs::{NodeState, PushPull, state};
    use agent_sim_testkit::bounded::until;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::Instant;

    use super::super::members::VSN;
    use super::super::stream::{handle, read_message};
    use super::super::tests::{alive, meta, verdict};
    use super::super::{Serf, SerfConfig, SerfSnapshot};
    use super::{JOIN_SHARE, MAX_PUSH_PULLS, Sealed};

    /// Virtual time a test may take to see what it waits for.
    const LIMIT: Duration = Duration::from_secs(60);

    fn serf(cfg: SerfConfig) -> Arc<Serf> {
        Arc::new(Serf::new(
            cfg,
            "server",
            "dc1",
            "00000000-0000-0000-0000-000000000001",
            meta("server"),
            Arc::default(),
        ))
    }

    /// The members of a sealed push-pull state, sorted, with their state.
    fn members(s: &Sealed) -> (bool, Vec<(String, u8)>) {
        let (msg, _) = Security::default().open_stream(&s.bytes).unwrap().unwrap();
        assert_eq!((msg[0], msg.len()), (kind::PUSH_PULL, s.len));
        let pp = PushPull::decode(&msg[1..]).unwrap();
        let mut names: Vec<(String, u8)> = pp
            .nodes
            .iter()
            .map(|n| (n.name.to_owned(), n.state))
            .collect();
        names.sort_unstable();
        (pp.join, names)
    }

    fn same(a: &Sealed, b: &Sealed) -> bool {
        a.bytes.as_ptr() == b.bytes.as_ptr()
    }

    #[tokio::test(start_paused = true)]
    async fn the_state_is_encoded_once_per_change_and_shared_between() {
        let serf = serf(SerfConfig::default());
        let encodings = || serf.snapshot().serf_push_pull_encodings;
        let first = serf.push_pull_state(true).await;
        let again = serf.push_pull_state(true).await;
        assert!(same(&first, &again), "nothing changed: one encoding");
        assert_eq!(encodings(), 1);
        let alone = (true, vec![("server".to_owned(), state::ALIVE)]);
        assert_eq!(members(&again), alone);

        let (m, now) = (meta("a"), Instant::now());
        serf.with_table(|t| t.alive(&alive("a", 1, &m), now))
            .unwrap();
        // A join within JOIN_SHARE of the encoding shares it; later, not.
        assert!(same(&first, &serf.push_pull_state(true).await));
        tokio::time::advance(JOIN_SHARE).await;
        let now = Instant::now();
        let joined = serf.push_pull_state(true).await;
        assert_eq!(encodings(), 2, "a member joined: encoded again");
        let a = |st| ("a".to_owned(), st);
        let with_a = |st| (true, vec![a(st), ("server".to_owned(), state::ALIVE)]);
        assert_eq!(members(&joined), with_a(state::ALIVE));
        // Old news changes nothing.
        serf.with_table(|t| t.alive(&alive("a", 1, &m), now))
            .unwrap();
        serf.with_table(|t| t.suspect(&verdict("a", 0, "x"), now));
        assert!(same(&joined, &serf.push_pull_state(true).await));
        // The other `join` flag is an encoding of its own.
        let anti = serf.push_pull_state(false).await;
        assert_eq!((encodings(), members(&anti).0), (3, false));
        assert!(same(&anti, &serf.push_pull_state(false).await));

        // Dead: encoded again; kept until it is forgotten, then without it.
        serf.with_table(|t| t.dead(&verdict("a", 1, "server"), now));
        let dead = serf.push_pull_state(true).await;
        assert_eq!((encodings(), members(&dead)), (4, with_a(state::DEAD)));
        tokio::time::advance(SerfConfig::default().gossip_to_the_dead).await;
        assert!(same(&dead, &serf.push_pull_state(true).await));
        tokio::time::advance(Duration::from_millis(1)).await;
        let forgotten = serf.push_pull_state(true).await;
        assert_eq!((encodings(), members(&forgotten)), (5, alone));
    }

    /// A stream to `serf` (handled as an accepted one) that has sent a
    /// join push-pull from `name` and reads nothing until asked: the answer
    /// waits in a 64-byte pipe.
    async fn push_pull(serf: &Arc<Serf>, name: &str) -> DuplexStream {
        let (mut client, mut server) = tokio::io::duplex(64);
        let s = serf.clone();
        tokio::spawn(async move { handle(&s, &mut server).await });
        let m = meta(name);
        let mut msg = Vec::new();
        PushPull {
            join: true,
            nodes: vec![NodeState {
                name,
                addr: &[127, 0, 0, 2],
                port: 8301,
                meta: &m,
                incarnation: 1,
                state: state::ALIVE,
                vsn: &VSN,
            }],
            user_state: &[],
        }
        .encode(&mut msg);
        let sealed = Security::default().seal_stream(&msg);
        client.write_all(&sealed).await.unwrap();
        client
    }

    fn pending(serf: &Serf) -> u32 {
        serf.answers
            .in_flight
            .load(std::sync::atomic::Ordering::Acquire)
    }

    #[tokio::test(start_paused = true)]
    async fn past_memberlist_s_bound_a_push_pull_is_closed_unanswered_and_counted() {
        let lines: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let kept = lines.clone();
        let serf = serf(
            SerfConfig {
                tcp_timeout: Duration::from_secs(3600),
                ..SerfConfig::default()
            }
            .logging_to(Some(Arc::new(move |l| kept.lock().unwrap().push(l)))),
        );
        let stats = || -> SerfSnapshot { serf.snapshot() };
        // memberlist counts the newcomer too: 127 pending, the 128th refused.
        let held = MAX_PUSH_PULLS - 1;
        let mut streams = Vec::new();
        for i in 0..held {
            streams.push(push_pull(&serf, &format!("agent-{i}")).await);
        }
        until(LIMIT, "127 push-pulls pending", async || {
            pending(&serf) == held
        })
        .await;
        let s = stats();
        assert_eq!(s.serf_push_pulls_refused, 0);
        assert_eq!(s.serf_push_pull_encodings, 1, "one answer for all");

        let mut refused = push_pull(&serf, "agent-late").await;
        let mut got = Vec::new();
        tokio::time::timeout(LIMIT, refused.read_to_end(&mut got))
            .await
            .expect("closed")
            .unwrap();
        assert!(got.is_empty(), "no answer");
        assert_eq!(stats().serf_push_pulls_refused, 1);
        let said = "[ERR] memberlist: Too many pending push/pull requests";
        assert_eq!(lines.lock().unwrap().clone(), vec![said.to_owned()]);
        assert_eq!(pending(&serf), held);
        assert_eq!(stats().serf_push_pulls_answered, 0);

        // One gives up: its place is free, and the next is answered.
        drop(streams.pop());
        until(LIMIT, "126 pending", async || pending(&serf) == held - 1).await;
        let mut next = push_pull(&serf, "agent-next").await;
        let sec = Security::default();
        let read = read_message(&mut next, &sec, 1 << 20, false, &serf.counters);
        let answer = tokio::time::timeout(LIMIT, read).await.unwrap().unwrap();
        assert_eq!(answer[0], kind::PUSH_PULL);
        until(LIMIT, "answered", async || {
            stats().serf_push_pulls_answered == 1
        })
        .await;
        assert_eq!(stats().serf_push_pulls_refused, 1);
    }
}
