//! What the serf port counted: packets, streams and bytes each way,
//! messages and their bytes by memberlist type, probes and their
//! outcomes, push-pulls (answered, refused, the state's encodings),
//! transitions of members, messages memberlist and serf applied, user
//! events, the handler queue's drops, catalog writes of the reconcile, and
//! bad input by cause; and the samples go-metrics keeps as summaries (serf
//! messages' sizes, the queues' depths, probe times). Flattened into the
//! server's [`crate::consul::ConsulTargetSnapshot`] as its `serf_*` fields
//! (maps become one labelled family each in `serve --metrics-addr`); the
//! names a real server exports are in `exposition`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::lock;
use super::queue::Depths;
use crate::consul::timing::Summary;

/// Names of memberlist's message types, by type byte.
const KINDS: [&str; 14] = [
    "ping",
    "indirect_ping",
    "ack",
    "suspect",
    "alive",
    "dead",
    "push_pull",
    "compound",
    "user",
    "compress",
    "encrypt",
    "nack",
    "has_crc",
    "err",
];

/// Causes of refused input (a wire error's `cause()` and the server's own).
const CAUSES: [&str; 17] = [
    "truncated",
    "malformed",
    "unknown_type",
    "compression",
    "oversized",
    "crc",
    "label",
    "encryption",
    "timeout",
    "too_many_members",
    "wrong_dc",
    "conflicting_id",
    "bad_address",
    "address_conflict",
    "unexpected_node",
    "busy",
    "io",
];

/// Members by state, for the gauges (counted by the table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Census {
    pub(crate) alive: u64,
    pub(crate) suspect: u64,
    pub(crate) leaving: u64,
    pub(crate) left: u64,
    pub(crate) failed: u64,
}

/// The counters (shared by the server's restarts).
#[derive(Debug)]
pub(crate) struct SerfCounters {
    received: [AtomicU64; KINDS.len() + 1],
    received_bytes: [AtomicU64; KINDS.len() + 1],
    sent: [AtomicU64; KINDS.len() + 1],
    sent_bytes: [AtomicU64; KINDS.len() + 1],
    bad: [AtomicU64; CAUSES.len() + 1],
    pub(crate) udp_packets_received: AtomicU64,
    pub(crate) udp_bytes_received: AtomicU64,
    pub(crate) udp_packets_sent: AtomicU64,
    pub(crate) udp_bytes_sent: AtomicU64,
    pub(crate) tcp_accepted: AtomicU64,
    pub(crate) tcp_dialed: AtomicU64,
    pub(crate) tcp_bytes_received: AtomicU64,
    pub(crate) tcp_bytes_sent: AtomicU64,
    pub(crate) push_pulls_answered: AtomicU64,
    pub(crate) push_pulls_refused: AtomicU64,
    pub(crate) push_pull_encodings: AtomicU64,
    pub(crate) push_pulls_sent: AtomicU64,
    pub(crate) push_pulls_failed: AtomicU64,
    pub(crate) probes: AtomicU64,
    pub(crate) probes_indirect: AtomicU64,
    pub(crate) probes_tcp: AtomicU64,
    pub(crate) probes_failed: AtomicU64,
    pub(crate) acks_late: AtomicU64,
    pub(crate) acks_unexpected: AtomicU64,
    pub(crate) relayed: AtomicU64,
    pub(crate) joins: AtomicU64,
    pub(crate) suspicions: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) leaves: AtomicU64,
    pub(crate) refutations: AtomicU64,
    pub(crate) reconcile_writes: AtomicU64,
    pub(crate) reconcile_skipped: AtomicU64,
    /// memberlist's `msg.alive` and `msg.dead`: messages that changed the
    /// table (or made this server refute), not every one heard (its
    /// `msg.suspect` is `suspicions`).
    pub(crate) msg_alive: AtomicU64,
    pub(crate) msg_dead: AtomicU64,
    /// serf's `member.left`: a leaving member declared dead (a failed one
    /// made left by its intent is not counted, as serf does not).
    pub(crate) member_left: AtomicU64,
    /// memberlist's `degraded.probe`: probes with a stretched interval.
    pub(crate) degraded_probes: AtomicU64,
    /// Messages the handler queue dropped, full.
    pub(crate) handler_dropped: AtomicU64,
    /// serf's `events`: user events taken (this server's own included).
    pub(crate) events: AtomicU64,
    /// serf's `events.<name>`, by name.
    // Bound: MAX_EVENT_NAMES names (others only in `events`).
    pub(crate) events_by_name: Mutex<BTreeMap<String, u64>>,
    /// The samples kept as summaries.
    pub(crate) samples: Samples,
}

/// Event names counted one by one at most (more are only in `events`).
const MAX_EVENT_NAMES: usize = 64;

/// The go-metrics samples of the serf port, each a summary.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    /// serf's `msgs.received`: the size of each serf message handled.
    pub(crate) msgs_received: Mutex<Summary>,
    /// serf's `msgs.sent`: the size of each serf message gossiped.
    pub(crate) msgs_sent: Mutex<Summary>,
    /// memberlist's `queue.broadcasts`, serf's `queue.Intent`,
    /// `queue.Event`, `queue.Query`: depths every queue check (30 s).
    pub(crate) queue_broadcasts: Mutex<Summary>,
    pub(crate) queue_intent: Mutex<Summary>,
    pub(crate) queue_event: Mutex<Summary>,
    pub(crate) queue_query: Mutex<Summary>,
    /// memberlist's `probeNode`: a probe's time, in milliseconds.
    pub(crate) probe_node: Mutex<Summary>,
}

impl Samples {
    /// The queues' depths, as serf's and memberlist's queue checks sample
    /// them (serf keeps no query broadcasts here: 0).
    pub(crate) fn queues(&self, d: Depths) {
        lock(&self.queue_broadcasts).record(d.broadcasts as f64);
        lock(&self.queue_intent).record(d.intents as f64);
        lock(&self.queue_event).record(d.events as f64);
        lock(&self.queue_query).record(0.0);
    }
}

impl Default for SerfCounters {
    fn default() -> Self {
        SerfCounters {
            received: std::array::from_fn(|_| AtomicU64::new(0)),
            received_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            sent: std::array::from_fn(|_| AtomicU64::new(0)),
            sent_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            bad: std::array::from_fn(|_| AtomicU64::new(0)),
            udp_packets_received: AtomicU64::new(0),
            udp_bytes_received: AtomicU64::new(0),
            udp_packets_sent: AtomicU64::new(0),
            udp_bytes_sent: AtomicU64::new(0),
            tcp_accepted: AtomicU64::new(0),
            tcp_dialed: AtomicU64::new(0),
            tcp_bytes_received: AtomicU64::new(0),
            tcp_bytes_sent: AtomicU64::new(0),
            push_pulls_answered: AtomicU64::new(0),
            push_pulls_refused: AtomicU64::new(0),
            push_pull_encodings: AtomicU64::new(0),
            push_pulls_sent: AtomicU64::new(0),
            push_pulls_failed: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            probes_indirect: AtomicU64::new(0),
            probes_tcp: AtomicU64::new(0),
            probes_failed: AtomicU64::new(0),
            acks_late: AtomicU64::new(0),
            acks_unexpected: AtomicU64::new(0),
            relayed: AtomicU64::new(0),
            joins: AtomicU64::new(0),
            suspicions: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            leaves: AtomicU64::new(0),
            refutations: AtomicU64::new(0),
            reconcile_writes: AtomicU64::new(0),
            reconcile_skipped: AtomicU64::new(0),
            msg_alive: AtomicU64::new(0),
            msg_dead: AtomicU64::new(0),
            member_left: AtomicU64::new(0),
            degraded_probes: AtomicU64::new(0),
            handler_dropped: AtomicU64::new(0),
            events: AtomicU64::new(0),
            events_by_name: Mutex::new(BTreeMap::new()),
            samples: Samples::default(),
        }
    }
}

fn slot(t: u8) -> usize {
    usize::from(t).min(KINDS.len())
}

impl SerfCounters {
    /// Adds one.
    pub(crate) fn bump(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n`.
    pub(crate) fn add(&self, c: &AtomicU64, n: usize) {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A message of type `t` received, `len` bytes with its type byte.
    pub(crate) fn received(&self, t: u8, len: usize) {
        self.bump(&self.received[slot(t)]);
        self.add(&self.received_bytes[slot(t)], len);
    }

    /// A message of type `t` sent.
    pub(crate) fn sent(&self, t: u8, len: usize) {
        self.bump(&self.sent[slot(t)]);
        self.add(&self.sent_bytes[slot(t)], len);
    }

    /// Refused input, by cause (unknown causes as `other`).
    pub(crate) fn bad(&self, cause: &str) {
        let i = CAUSES
            .iter()
            .position(|c| *c == cause)
            .unwrap_or(CAUSES.len());
        self.bump(&self.bad[i]);
    }

    /// A user event taken, by name.
    pub(crate) fn event(&self, name: &str) {
        self.bump(&self.events);
        let mut by = lock(&self.events_by_name);
        if let Some(n) = by.get_mut(name) {
            *n += 1;
        } else if by.len() < MAX_EVENT_NAMES {
            by.insert(name.to_owned(), 1);
        }
    }

    /// A copy, with the members by state and the queues from the table.
    pub(crate) fn snapshot(&self, census: Census, depths: Depths, handoff: usize) -> SerfSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let by = |names: &[&str], counts: &[AtomicU64]| -> BTreeMap<String, u64> {
            names
                .iter()
                .chain(&["other"])
                .zip(counts)
                .map(|(n, c)| (n.to_string(), get(c)))
                .filter(|(_, c)| *c > 0)
                .collect()
        };
        SerfSnapshot {
            serf_members_alive: census.alive,
            serf_members_suspect: census.suspect,
            serf_members_leaving: census.leaving,
            serf_members_left: census.left,
            serf_members_failed: census.failed,
            serf_udp_packets_received: get(&self.udp_packets_received),
            serf_udp_bytes_received: get(&self.udp_bytes_received),
            serf_udp_packets_sent: get(&self.udp_packets_sent),
            serf_udp_bytes_sent: get(&self.udp_bytes_sent),
            serf_tcp_streams_accepted: get(&self.tcp_accepted),
            serf_tcp_streams_dialed: get(&self.tcp_dialed),
            serf_tcp_bytes_received: get(&self.tcp_bytes_received),
            serf_tcp_bytes_sent: get(&self.tcp_bytes_sent),
            serf_received_by_type: by(&KINDS, &self.received),
            serf_received_bytes_by_type: by(&KINDS, &self.received_bytes),
            serf_sent_by_type: by(&KINDS, &self.sent),
            serf_sent_bytes_by_type: by(&KINDS, &self.sent_bytes),
            serf_push_pulls_answered: get(&self.push_pulls_answered),
            serf_push_pulls_refused: get(&self.push_pulls_refused),
            serf_push_pull_encodings: get(&self.push_pull_encodings),
            serf_push_pulls_sent: get(&self.push_pulls_sent),
            serf_push_pulls_failed: get(&self.push_pulls_failed),
            serf_probes_sent: get(&self.probes),
            serf_probes_indirect: get(&self.probes_indirect),
            serf_probes_tcp: get(&self.probes_tcp),
            serf_probes_failed: get(&self.probes_failed),
            serf_acks_late: get(&self.acks_late),
            serf_acks_unexpected: get(&self.acks_unexpected),
            serf_indirect_relayed: get(&self.relayed),
            serf_joins: get(&self.joins),
            serf_suspicions: get(&self.suspicions),
            serf_failures: get(&self.failures),
            serf_leaves: get(&self.leaves),
            serf_refutations: get(&self.refutations),
            serf_reconcile_writes: get(&self.reconcile_writes),
            serf_reconcile_skipped: get(&self.reconcile_skipped),
            serf_bad_by_cause: by(&CAUSES, &self.bad),
            serf_msg_alive: get(&self.msg_alive),
            serf_msg_dead: get(&self.msg_dead),
            serf_degraded_probes: get(&self.degraded_probes),
            serf_handler_queue_dropped: get(&self.handler_dropped),
            serf_user_events: get(&self.events),
            serf_queue_broadcasts: depths.broadcasts as u64,
            serf_queue_intents: depths.intents as u64,
            serf_queue_events: depths.events as u64,
            serf_handler_queue: handoff as u64,
        }
    }
}

/// The counters of the serf port at one moment (`serf_members_*` are
/// gauges, the rest totals).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SerfSnapshot {
    /// Members alive now, this server included (gauge).
    pub serf_members_alive: u64,
    /// Members suspected now (gauge; `/v1/agent/members` shows them alive).
    pub serf_members_suspect: u64,
    /// Members that sent their leave intent and are still alive (gauge).
    pub serf_members_leaving: u64,
    /// Members that left, until reaped (gauge).
    pub serf_members_left: u64,
    /// Members failed, until reaped or back (gauge).
    pub serf_members_failed: u64,
    /// UDP packets received on the serf port.
    pub serf_udp_packets_received: u64,
    /// Their bytes (as received: labelled, encrypted).
    pub serf_udp_bytes_received: u64,
    /// UDP packets sent.
    pub serf_udp_packets_sent: u64,
    /// Their bytes.
    pub serf_udp_bytes_sent: u64,
    /// TCP streams accepted (push-pulls, TCP pings, user messages).
    pub serf_tcp_streams_accepted: u64,
    /// TCP streams this server opened (its push-pulls and TCP pings).
    pub serf_tcp_streams_dialed: u64,
    /// Bytes read from TCP streams.
    pub serf_tcp_bytes_received: u64,
    /// Bytes written to them.
    pub serf_tcp_bytes_sent: u64,
    /// Messages received by memberlist type (compound and compressed
    /// layers opened: the messages inside are counted).
    pub serf_received_by_type: BTreeMap<String, u64>,
    /// Their bytes (type byte and body).
    pub serf_received_bytes_by_type: BTreeMap<String, u64>,
    /// Messages sent by type.
    pub serf_sent_by_type: BTreeMap<String, u64>,
    /// Their bytes.
    pub serf_sent_bytes_by_type: BTreeMap<String, u64>,
    /// Push-pulls answered.
    pub serf_push_pulls_answered: u64,
    /// Push-pulls closed unanswered, as memberlist closes them: "Too many
    /// pending push/pull requests" (128 pending, this one included).
    pub serf_push_pulls_refused: u64,
    /// This server's push-pull state encoded (once per change of it and
    /// `join` flag; answers and its own push-pulls between share one).
    pub serf_push_pull_encodings: u64,
    /// Push-pulls this server started (every push-pull interval).
    pub serf_push_pulls_sent: u64,
    /// Of those, the ones that failed (no connection, no answer, bad answer).
    pub serf_push_pulls_failed: u64,
    /// Probes started (one per probe interval).
    pub serf_probes_sent: u64,
    /// Indirect probes asked of other members (after a missed ack).
    pub serf_probes_indirect: u64,
    /// TCP fallback pings (after a missed ack).
    pub serf_probes_tcp: u64,
    /// Probes that got no ack at all (the member is then suspected).
    pub serf_probes_failed: u64,
    /// Acks that came after the probe timeout (500 ms).
    pub serf_acks_late: u64,
    /// Acks for no probe in flight (very late, or never asked for).
    pub serf_acks_unexpected: u64,
    /// Indirect probes done for other members.
    pub serf_indirect_relayed: u64,
    /// Members joining (or coming back).
    pub serf_joins: u64,
    /// Suspicions raised (by this server or heard: memberlist's
    /// `msg.suspect`).
    pub serf_suspicions: u64,
    /// Members declared failed.
    pub serf_failures: u64,
    /// Members that left.
    pub serf_leaves: u64,
    /// Accusations of this server refuted.
    pub serf_refutations: u64,
    /// Catalog writes of the reconcile (registrations, `serfHealth`
    /// changes, deregistrations).
    pub serf_reconcile_writes: u64,
    /// Alive members not registered (no `build` tag, as Consul skips them)
    /// or not stored (catalog full).
    pub serf_reconcile_skipped: u64,
    /// Input refused, by cause (the wire's causes, `timeout`,
    /// `too_many_members`, `wrong_dc`, `busy`, ...).
    pub serf_bad_by_cause: BTreeMap<String, u64>,
    /// Alive messages that changed the table (memberlist's `msg.alive`).
    pub serf_msg_alive: u64,
    /// Dead messages that declared a member dead (`msg.dead`).
    pub serf_msg_dead: u64,
    /// Probes made with a stretched interval (health awareness above 0:
    /// memberlist's `degraded.probe`).
    pub serf_degraded_probes: u64,
    /// Alive, suspect, dead and serf messages dropped with the handler
    /// queue full (1,024 each: memberlist's "handler queue full, dropping
    /// message").
    pub serf_handler_queue_dropped: u64,
    /// serf user events taken, this server's own `consul:new-leader`
    /// included (serf's `events`).
    pub serf_user_events: u64,
    /// memberlist's broadcasts waiting now (gauge).
    pub serf_queue_broadcasts: u64,
    /// serf's join and leave intents waiting now (gauge).
    pub serf_queue_intents: u64,
    /// serf's user events waiting now (gauge).
    pub serf_queue_events: u64,
    /// Messages waiting in the handler queue now (gauge).
    pub serf_handler_queue: u64,
}
