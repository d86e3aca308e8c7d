//! Consul's LAN gossip for agent-sim: what a Consul client agent sends and
//! answers on its serf LAN port (memberlist for membership and failure
//! detection, serf on top of it for tags, join and leave intents), and a
//! pool in which thousands of simulated agents are gossip members at once.
//!
//! Parts, each importing only those after it:
//! - `pool`: the members of one process sharing one membership view, its
//!   sockets and the timers that make servers see what N real members would
//!   send them (probes, gossip, push-pulls, leaves).
//! - [`serf`]: serf's messages (intents, user events, queries, the
//!   keyring's) and tags; [`coordinate`]: serf's Vivaldi
//!   estimate and the coordinate in a probe's ack.
//! - [`wire`]: memberlist's messages and the layers around them (label,
//!   encryption, CRC, compression, compound).
//! - [`broadcast`]: memberlist's transmit-limited queue, the one the pool
//!   fills for each server and the embedded server fills for its members.
//!
//! What it is not: a full memberlist. The simulated members do not gossip
//! among themselves on the network; see docs/gossip.md for the model.

pub mod broadcast;
pub mod coordinate;
pub mod serf;
pub mod wire;

pub use wire::{Keyring, Security, WireError};

pub mod pool;

pub use pool::{ExchangeError, JoinError, News, Pool, PoolConfig, PoolError, ServerNews, Timings};

use agent_sim_metrics::{ErrorKindSpec, MetricsSpec};

/// Counter names a pool adds to.
pub mod names {
    /// Members joined (their join push-pull answered).
    pub const JOINS: &str = "gossip_joins";
    /// Members that left.
    pub const LEAVES: &str = "gossip_leaves";
    /// Probes of our members answered.
    pub const ACKS_SENT: &str = "gossip_acks_sent";
    /// Probes our members sent to servers.
    pub const PROBES: &str = "gossip_probes";
    /// Of those, unanswered in the probe timeout.
    pub const PROBE_TIMEOUTS: &str = "gossip_probe_timeouts";
    /// State exchanges (joins, periodic, the servers' own, closing).
    pub const PUSH_PULLS: &str = "gossip_push_pulls";
    /// Bytes of the members' join answers (each the server's whole member
    /// list, read as it arrives and not held; in `BYTES_RECEIVED` too).
    pub const JOIN_ANSWER_BYTES: &str = "gossip_join_answer_bytes";
    /// UDP packets sent.
    pub const PACKETS_SENT: &str = "gossip_packets_sent";
    /// UDP packets received.
    pub const PACKETS_RECEIVED: &str = "gossip_packets_received";
    /// Gossip bytes sent (UDP and TCP).
    pub const BYTES_SENT: &str = "gossip_bytes_sent";
    /// Gossip bytes received (UDP and TCP).
    pub const BYTES_RECEIVED: &str = "gossip_bytes_received";
    /// Ticks of the pool's timers that came late (a busy load box).
    pub const LATE_TICKS: &str = "gossip_late_ticks";
    /// How long members took to answer the servers' probes: each ack sent
    /// after the kernel received its ping (the load box's own delay;
    /// memberlist gives an ack 500 ms).
    pub const ACK_DELAY: &str = "gossip_ack_delay";
    /// Alive messages of the members a join taught a member, re-announced
    /// to servers as a fresh memberlist member does (in `PACKETS_SENT` and
    /// `BYTES_SENT` too).
    pub const REANNOUNCED: &str = "gossip_reannounced";
    /// serf user events taken in (each once, however many copies came).
    pub const USER_EVENTS: &str = "gossip_user_events";
    /// Members' answers to serf queries (an ack, a response or both, each
    /// member once per query).
    pub const QUERIES_ANSWERED: &str = "gossip_queries_answered";
    /// Answers to queries not sent before the query's deadline (more
    /// members answering than the pool's ceiling lets through in time).
    pub const QUERY_ANSWERS_DROPPED: &str = "gossip_query_answers_dropped";
    /// Servers suspected (an unanswered probe, or another member's suspect).
    pub const SERVERS_SUSPECTED: &str = "gossip_servers_suspected";
    /// Servers declared failed (their suspicion ran out, or another
    /// member's dead message).
    pub const SERVERS_FAILED: &str = "gossip_servers_failed";
    /// Servers alive again after they failed or left.
    pub const SERVERS_RETURNED: &str = "gossip_servers_returned";
}

/// A member's join push-pull failed.
pub const JOIN_FAILED: ErrorKindSpec = ErrorKindSpec {
    kind: "gossip_join_failed",
    hint: "the servers' serf LAN port (--gossip-join, default each target host on 8301) did not \
           take the join: is it reachable from here, and do --gossip-key and --gossip-label match \
           the cluster's?",
    heals: true,
    said_by: agent_sim_metrics::Speaker::Server,
};
/// A member's join the servers did not take after they had taken others.
pub const JOIN_OVERLOADED: ErrorKindSpec = ErrorKindSpec {
    kind: "gossip_join_overloaded",
    hint: "the servers took other members' joins, then did not answer this one: they are \
           overloaded (a real memberlist refuses push-pulls past 128 in flight). Slow --ramp, or \
           spread the joins with --boot-window as large fleets boot",
    heals: true,
    said_by: agent_sim_metrics::Speaker::Local,
};
/// Gossip bytes that could not be read.
pub const BAD_PACKET: ErrorKindSpec = ErrorKindSpec {
    kind: "gossip_bad_packet",
    hint: "a packet or stream on the gossip port was malformed, truncated or too large (the \
           sample names the cause and sender)",
    heals: true,
    said_by: agent_sim_metrics::Speaker::Server,
};
/// A TCP stream a server opened and closed (or reset) before a whole
/// message, or before our answer.
pub const STREAM_CUT: ErrorKindSpec = ErrorKindSpec {
    kind: "gossip_stream_cut",
    hint: "a server opened a gossip TCP stream to a member (a push-pull or a fallback probe) and \
           closed or reset it before its message was whole or before the member's answer: the \
           server gave up on the exchange (memberlist bounds each by its TCP timeout, 10 s by \
           default); the sample gives how far it got",
    heals: true,
    said_by: agent_sim_metrics::Speaker::Server,
};
/// Encrypted traffic this pool cannot open, or plain traffic where it encrypts.
pub const BAD_KEY: ErrorKindSpec = ErrorKindSpec {
    kind: "gossip_encryption",
    hint: "--gossip-key must be the cluster's `encrypt` key (consul keygen, base64), and is \
           needed when the cluster encrypts and refused when it does not (a server that closes \
           the first push-pull unanswered could not open it: the key, or --gossip-label)",
    heals: false,
    said_by: agent_sim_metrics::Speaker::Server,
};
/// A label other than this pool's.
pub const BAD_LABEL: ErrorKindSpec = ErrorKindSpec {
    kind: "gossip_label",
    hint: "--gossip-label must be the cluster's gossip label",
    heals: false,
    said_by: agent_sim_metrics::Speaker::Server,
};
/// The pool's own timers ran late.
pub const ACKED_LATE: ErrorKindSpec = ErrorKindSpec {
    kind: "gossip_acked_late",
    hint: "the load box was too busy to answer the servers' probes within 500 ms (an ack sent \
           past it, or the pool's ticker late): members will \
           flap as suspect or failed as real agents on a saturated host would; use fewer agents \
           per process or more cores",
    heals: true,
    said_by: agent_sim_metrics::Speaker::Local,
};

/// What a pool records.
pub fn metrics_spec() -> MetricsSpec {
    MetricsSpec {
        counters: vec![
            names::JOINS,
            names::LEAVES,
            names::ACKS_SENT,
            names::PROBES,
            names::PROBE_TIMEOUTS,
            names::PUSH_PULLS,
            names::JOIN_ANSWER_BYTES,
            names::PACKETS_SENT,
            names::PACKETS_RECEIVED,
            names::BYTES_SENT,
            names::BYTES_RECEIVED,
            names::LATE_TICKS,
            names::REANNOUNCED,
            names::USER_EVENTS,
            names::QUERIES_ANSWERED,
            names::QUERY_ANSWERS_DROPPED,
            names::SERVERS_SUSPECTED,
            names::SERVERS_FAILED,
            names::SERVERS_RETURNED,
        ],
        latencies: vec![names::ACK_DELAY],
        errors: vec![
            JOIN_FAILED,
            JOIN_OVERLOADED,
            BAD_PACKET,
            STREAM_CUT,
            BAD_KEY,
            BAD_LABEL,
            ACKED_LATE,
        ],
    }
}
