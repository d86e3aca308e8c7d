//! serf's part of the gossip: its messages travel as memberlist user
//! messages (type byte 8, then serf's own type byte and a msgpack map), its
//! tags are a node's memberlist metadata (the coordinate an ack carries is
//! in [`crate::coordinate`]).
//!
//! Here: tags, join and leave intents, serf's push-pull state. Apart:
//! [`event`] (user events), [`query`] (queries, their answers, relays),
//! [`keys`] (serf's internal queries: the keyring's and the conflict's).
//! Every struct is written as serf's Go codec writes it: a map of its field
//! names in sorted order, `[]byte` as raw, a nil slice as nil.

pub mod event;
pub mod keys;
pub mod query;

use agent_sim_proto::msgpack::Writer;

use crate::wire::read::Reader;
use crate::wire::{WireError, kind};

/// serf message type bytes.
pub mod kind_serf {
    /// A leave intent.
    pub const LEAVE: u8 = 0;
    /// A join intent.
    pub const JOIN: u8 = 1;
    /// serf's state in a push-pull.
    pub const PUSH_PULL: u8 = 2;
    /// A user event.
    pub const USER_EVENT: u8 = 3;
    /// A query.
    pub const QUERY: u8 = 4;
    /// A query's answer.
    pub const QUERY_RESPONSE: u8 = 5;
    /// The answer to a `_serf_conflict` query (inside a response's payload).
    pub const CONFLICT_RESPONSE: u8 = 6;
    /// A keyring query's payload.
    pub const KEY_REQUEST: u8 = 7;
    /// A keyring query's answer (inside a response's payload).
    pub const KEY_RESPONSE: u8 = 8;
    /// A message another member is asked to pass on to its destination.
    pub const RELAY: u8 = 9;
}

/// serf's event buffer (`EventBuffer`): its push-pull state always carries
/// this many entries.
pub const EVENT_BUFFER: usize = 512;

/// The byte in front of msgpack-encoded tags.
pub const TAGS_MAGIC: u8 = 0xff;

/// A Consul 1.20.1 client agent's serf tags, `id` apart (the eight keys a
/// real one sends: `role`, `dc`, `segment`, `id`, `vsn`, `vsn_min`,
/// `vsn_max`, `build`; an empty `dc` is learned from the servers).
pub fn client_tags(datacenter: &str) -> Vec<(String, String)> {
    [
        ("role", "node"),
        ("dc", datacenter),
        ("segment", ""),
        ("vsn", "2"),
        ("vsn_min", "2"),
        ("vsn_max", "3"),
        ("build", "1.20.1:"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Tags as serf writes them into a node's metadata.
pub fn encode_tags(tags: &[(&str, &str)]) -> Vec<u8> {
    let mut out = vec![TAGS_MAGIC];
    Writer(&mut out).str_map(tags);
    out
}

/// A node's tags from its metadata (an old role-only meta is `role`).
pub fn decode_tags(meta: &[u8]) -> Result<Vec<(String, String)>, WireError> {
    let Some((&TAGS_MAGIC, rest)) = meta.split_first() else {
        let role = std::str::from_utf8(meta).map_err(|_| WireError::Utf8)?;
        return Ok(vec![("role".into(), role.into())]);
    };
    let mut r = Reader::new(rest);
    let n = r.map()?;
    let mut tags = Vec::with_capacity(n);
    for _ in 0..n {
        tags.push((r.str()?.to_string(), r.str()?.to_string()));
    }
    Ok(tags)
}

/// A join or leave intent, wrapped as the memberlist user message it
/// travels in.
pub fn intent(leave: bool, ltime: u64, node: &str, out: &mut Vec<u8>) {
    out.push(kind::USER);
    if leave {
        out.push(kind_serf::LEAVE);
        Writer(out)
            .map(3)
            .kv_uint("LTime", ltime)
            .kv_str("Node", node)
            .kv_bool("Prune", false);
    } else {
        out.push(kind_serf::JOIN);
        Writer(out)
            .map(2)
            .kv_uint("LTime", ltime)
            .kv_str("Node", node);
    }
}

/// A join or leave intent read from a user message's body (serf type byte
/// first): `(leave, ltime, node)`, or `None` for serf's other messages.
pub fn decode_intent(body: &[u8]) -> Result<Option<(bool, u64, &str)>, WireError> {
    let (&t, rest) = body.split_first().ok_or(WireError::Truncated)?;
    if t != kind_serf::JOIN && t != kind_serf::LEAVE {
        return Ok(None);
    }
    let (mut ltime, mut node) = (0, "");
    Reader::new(rest).fields(|k, r| {
        match k {
            "LTime" => ltime = r.uint()?,
            "Node" => node = r.str()?,
            _ => r.skip()?,
        }
        Ok(())
    })?;
    Ok(Some((t == kind_serf::LEAVE, ltime, node)))
}

/// serf's state in a push-pull (`messagePushPull`), as much of it as a
/// member of this pool keeps: clocks, each member's status time, who left.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SerfState<'a> {
    /// The member clock.
    pub ltime: u64,
    /// Each member's status Lamport time.
    pub status: Vec<(&'a str, u64)>,
    /// Members that left.
    pub left: Vec<&'a str>,
    /// The event clock.
    pub event_ltime: u64,
    /// The query clock.
    pub query_ltime: u64,
}

impl<'a> SerfState<'a> {
    /// serf's type byte and map, fields in sorted order (an empty event
    /// buffer: this pool sends no events).
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_with_events(out, &|w| {
            // serf sends its whole event buffer: a slot per Lamport time,
            // nil where no event is kept (all of them, for this pool).
            w.array(EVENT_BUFFER as u32);
            for _ in 0..EVENT_BUFFER {
                w.nil();
            }
        });
    }

    /// The state with the event buffer `events` writes (the whole
    /// `Events` value: a server keeps the events it fired and heard).
    pub fn encode_with_events(&self, out: &mut Vec<u8>, events: &dyn Fn(&mut Writer<'_>)) {
        out.push(kind_serf::PUSH_PULL);
        let mut w = Writer(out);
        w.map(6)
            .kv_uint("EventLTime", self.event_ltime)
            .str("Events");
        events(&mut w);
        w.kv_uint("LTime", self.ltime)
            .str("LeftMembers")
            .array(self.left.len() as u32);
        for n in &self.left {
            w.str(n);
        }
        w.kv_uint("QueryLTime", self.query_ltime)
            .str("StatusLTimes")
            .map(self.status.len() as u32);
        for (n, t) in &self.status {
            w.str(n).uint(*t);
        }
    }

    /// From a push-pull's user state (serf's type byte first).
    pub fn decode(buf: &'a [u8]) -> Result<Self, WireError> {
        let (&t, rest) = buf.split_first().ok_or(WireError::Truncated)?;
        if t != kind_serf::PUSH_PULL {
            return Err(WireError::Unknown(t));
        }
        let mut s = SerfState::default();
        Reader::new(rest).fields(|k, r| {
            match k {
                "LTime" => s.ltime = r.uint()?,
                "StatusLTimes" => {
                    let n = r.map()?;
                    s.status.reserve(n);
                    for _ in 0..n {
                        s.status.push((r.str()?, r.uint()?));
                    }
                }
                "LeftMembers" => {
                    let n = r.array()?;
                    s.left.reserve(n);
                    for _ in 0..n {
                        s.left.push(r.str()?);
                    }
                }
                "EventLTime" => s.event_ltime = r.uint()?,
                "QueryLTime" => s.query_ltime = r.uint()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_intents_state_and_coordinates_read_back() {
        let t = encode_tags(&[("role", "node"), ("dc", "dc1")]);
        assert_eq!(
            decode_tags(&t).unwrap(),
            vec![("role".into(), "node".into()), ("dc".into(), "dc1".into())]
        );
        let mut b = Vec::new();
        intent(true, 42, "agent-1", &mut b);
        assert_eq!(b[0], kind::USER);
        assert_eq!(decode_intent(&b[1..]).unwrap(), Some((true, 42, "agent-1")));
        let s = SerfState {
            ltime: 5,
            status: vec![("a", 3), ("b", 4)],
            left: vec!["b"],
            event_ltime: 1,
            query_ltime: 2,
        };
        b.clear();
        s.encode(&mut b);
        assert_eq!(SerfState::decode(&b).unwrap(), s);
    }
}
