//! memberlist's messages. Each is written as the Go codec memberlist uses
//! (hashicorp/go-msgpack 0.5) writes its struct: a map of the field names
//! in sorted order (checked on a real agent's packets), `omitempty` fields
//! left out when empty, `[]byte` as raw; after its type byte. They are read
//! back from a map in any order, unknown fields skipped.

use agent_sim_proto::msgpack::Writer;

use super::read::Reader;
use super::{WireError, kind};

fn start(out: &mut Vec<u8>, t: u8) -> Writer<'_> {
    out.push(t);
    Writer(out)
}

/// Reads a u32 field (sequence numbers, incarnations).
fn u32f(r: &mut Reader<'_>) -> Result<u32, WireError> {
    r.uint_as()
}

/// A direct probe (`ping`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ping<'a> {
    /// Matches the ack.
    pub seq: u32,
    /// The member probed (it checks the name is its own).
    pub node: &'a str,
    /// Where to answer (omitted when empty).
    pub source_addr: &'a [u8],
    /// Its port.
    pub source_port: u16,
    /// Its name.
    pub source_node: &'a str,
}

impl<'a> Ping<'a> {
    /// Type byte and body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let full = !self.source_addr.is_empty();
        let mut w = start(out, kind::PING);
        w.map(if full { 5 } else { 2 })
            .kv_str("Node", self.node)
            .kv_uint("SeqNo", u64::from(self.seq));
        if full {
            w.str("SourceAddr").raw(self.source_addr);
            w.kv_str("SourceNode", self.source_node);
            w.kv_uint("SourcePort", u64::from(self.source_port));
        }
    }

    /// From a body (after the type byte).
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut p = Ping::default();
        Reader::new(body).fields(|k, r| {
            match k {
                "SeqNo" => p.seq = u32f(r)?,
                "Node" => p.node = r.str()?,
                "SourceAddr" => p.source_addr = r.bytes()?,
                "SourcePort" => p.source_port = r.uint_as()?,
                "SourceNode" => p.source_node = r.str()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(p)
    }
}

/// "Probe `node` for me" (`indirectPingReq`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndirectPing<'a> {
    /// The asker's sequence number (the relayed ack carries it).
    pub seq: u32,
    /// The target's address.
    pub target: &'a [u8],
    /// Its port.
    pub port: u16,
    /// Its name.
    pub node: &'a str,
    /// The asker wants a nack if no ack comes.
    pub nack: bool,
    /// Where to answer.
    pub source_addr: &'a [u8],
    /// Its port.
    pub source_port: u16,
    /// The asker's name.
    pub source_node: &'a str,
}

impl<'a> IndirectPing<'a> {
    /// Type byte and body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let full = !self.source_addr.is_empty();
        let mut w = start(out, kind::INDIRECT_PING);
        w.map(if full { 8 } else { 5 })
            .kv_bool("Nack", self.nack)
            .kv_str("Node", self.node)
            .kv_uint("Port", u64::from(self.port))
            .kv_uint("SeqNo", u64::from(self.seq));
        if full {
            w.str("SourceAddr").raw(self.source_addr);
            w.kv_str("SourceNode", self.source_node);
            w.kv_uint("SourcePort", u64::from(self.source_port));
        }
        w.str("Target").raw(self.target);
    }

    /// From a body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut p = IndirectPing::default();
        Reader::new(body).fields(|k, r| {
            match k {
                "SeqNo" => p.seq = u32f(r)?,
                "Target" => p.target = r.bytes()?,
                "Port" => p.port = r.uint_as()?,
                "Node" => p.node = r.str()?,
                "Nack" => p.nack = r.bool()?,
                "SourceAddr" => p.source_addr = r.bytes()?,
                "SourcePort" => p.source_port = r.uint_as()?,
                "SourceNode" => p.source_node = r.str()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(p)
    }
}

/// A probe's answer (`ackResp`); serf's payload is a version byte and the
/// member's coordinate.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ack<'a> {
    /// The probe's sequence number.
    pub seq: u32,
    /// The ping delegate's payload (nil when empty).
    pub payload: &'a [u8],
}

impl<'a> Ack<'a> {
    /// Type byte and body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = start(out, kind::ACK);
        w.map(2).str("Payload");
        if self.payload.is_empty() {
            w.nil();
        } else {
            w.raw(self.payload);
        }
        w.kv_uint("SeqNo", u64::from(self.seq));
    }

    /// From a body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut a = Ack::default();
        Reader::new(body).fields(|k, r| {
            match k {
                "SeqNo" => a.seq = u32f(r)?,
                "Payload" => a.payload = r.bytes()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(a)
    }
}

/// An indirect probe's "no answer" (`nackResp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Nack {
    /// The asker's sequence number.
    pub seq: u32,
}

impl Nack {
    /// Type byte and body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        start(out, kind::NACK)
            .map(1)
            .kv_uint("SeqNo", u64::from(self.seq));
    }

    /// From a body.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut n = Nack::default();
        Reader::new(body).fields(|k, r| {
            if k == "SeqNo" {
                n.seq = u32f(r)?;
            } else {
                r.skip()?;
            }
            Ok(())
        })?;
        Ok(n)
    }
}

/// `suspect` and `dead` share a shape: who, at which incarnation, said by
/// whom (a dead message from the node itself is a leave).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict<'a> {
    /// The node's incarnation the verdict is about.
    pub incarnation: u32,
    /// The node.
    pub node: &'a str,
    /// Who says so.
    pub from: &'a str,
}

impl<'a> Verdict<'a> {
    /// Type byte (`kind::SUSPECT` or `kind::DEAD`) and body.
    pub fn encode(&self, t: u8, out: &mut Vec<u8>) {
        start(out, t)
            .map(3)
            .kv_str("From", self.from)
            .kv_uint("Incarnation", u64::from(self.incarnation))
            .kv_str("Node", self.node);
    }

    /// From a body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut v = Verdict::default();
        Reader::new(body).fields(|k, r| {
            match k {
                "Incarnation" => v.incarnation = u32f(r)?,
                "Node" => v.node = r.str()?,
                "From" => v.from = r.str()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(v)
    }
}

/// "This node is alive" (`alive`): also how a node announces itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Alive<'a> {
    /// Raised by the node to refute a suspicion.
    pub incarnation: u32,
    /// Its name.
    pub node: &'a str,
    /// Its address (4 or 16 bytes).
    pub addr: &'a [u8],
    /// Its gossip port.
    pub port: u16,
    /// Its metadata (serf's tags).
    pub meta: &'a [u8],
    /// pmin, pmax, pcur, dmin, dmax, dcur.
    pub vsn: &'a [u8],
}

impl<'a> Alive<'a> {
    /// Type byte and body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        start(out, kind::ALIVE)
            .map(6)
            .str("Addr")
            .raw(self.addr)
            .kv_uint("Incarnation", u64::from(self.incarnation))
            .str("Meta")
            .raw(self.meta)
            .kv_str("Node", self.node)
            .kv_uint("Port", u64::from(self.port))
            .str("Vsn")
            .raw(self.vsn);
    }

    /// From a body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut a = Alive::default();
        Reader::new(body).fields(|k, r| {
            match k {
                "Incarnation" => a.incarnation = u32f(r)?,
                "Node" => a.node = r.str()?,
                "Addr" => a.addr = r.bytes()?,
                "Port" => a.port = r.uint_as()?,
                "Meta" => a.meta = r.bytes()?,
                "Vsn" => a.vsn = vsn(r)?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(a)
    }
}

/// `Vsn` is a Go `[]uint8`: raw bytes; an array of numbers is read too.
fn vsn<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], WireError> {
    if matches!(r.rest().first(), Some(0x90..=0x9f | 0xdc | 0xdd)) {
        let n = r.array()?;
        for _ in 0..n {
            r.uint()?;
        }
        return Ok(&[]);
    }
    r.bytes()
}

/// A push-pull's header (`pushPullHeader`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PushPullHeader {
    /// Node states that follow.
    pub nodes: usize,
    /// Bytes of the delegate's (serf's) state after them.
    pub user_state_len: usize,
    /// A join's exchange, not an anti-entropy one.
    pub join: bool,
}

impl PushPullHeader {
    /// The type byte and header (node states and user state follow).
    pub fn encode(&self, out: &mut Vec<u8>) {
        start(out, kind::PUSH_PULL)
            .map(3)
            .kv_bool("Join", self.join)
            .kv_uint("Nodes", self.nodes as u64)
            .kv_uint("UserStateLen", self.user_state_len as u64);
    }

    /// Reads the header; `nodes` is checked against what is left.
    pub fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let h = Self::read_head(r)?;
        // Each node state takes well over 20 bytes: a header promising more
        // than the message could hold is refused before any allocation.
        if h.nodes.saturating_mul(20) > r.rest().len() {
            return Err(WireError::Truncated);
        }
        Ok(h)
    }

    /// Reads the header alone (`user_state_len` checked), as a stream
    /// read as it arrives does: its node states are not there yet.
    pub fn read_head(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let mut h = PushPullHeader::default();
        r.fields(|k, r| {
            match k {
                "Nodes" => h.nodes = r.uint_as()?,
                "UserStateLen" => h.user_state_len = r.uint_as()?,
                "Join" => h.join = r.bool()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        if h.user_state_len > super::MAX_STATE_BYTES {
            return Err(WireError::TooLarge(super::MAX_STATE_BYTES));
        }
        Ok(h)
    }
}

/// A node's state in a push-pull (`pushNodeState`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeState<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its address.
    pub addr: &'a [u8],
    /// Its gossip port.
    pub port: u16,
    /// Its metadata (serf's tags).
    pub meta: &'a [u8],
    /// Its incarnation.
    pub incarnation: u32,
    /// 0 alive, 1 suspect, 2 dead, 3 left.
    pub state: u8,
    /// Its protocol versions.
    pub vsn: &'a [u8],
}

/// memberlist's node states.
pub mod state {
    /// Alive.
    pub const ALIVE: u8 = 0;
    /// Suspected.
    pub const SUSPECT: u8 = 1;
    /// Dead (failed).
    pub const DEAD: u8 = 2;
    /// Left.
    pub const LEFT: u8 = 3;
}

impl<'a> NodeState<'a> {
    /// The map (no type byte: states follow the header).
    pub fn encode(&self, out: &mut Vec<u8>) {
        Writer(out)
            .map(7)
            .str("Addr")
            .raw(self.addr)
            .kv_uint("Incarnation", u64::from(self.incarnation))
            .str("Meta")
            .raw(self.meta)
            .kv_str("Name", self.name)
            .kv_uint("Port", u64::from(self.port))
            .kv_uint("State", u64::from(self.state))
            .str("Vsn")
            .raw(self.vsn);
    }

    /// Reads one state.
    pub fn read(r: &mut Reader<'a>) -> Result<Self, WireError> {
        let mut s = NodeState::default();
        r.fields(|k, r| {
            match k {
                "Name" => s.name = r.str()?,
                "Addr" => s.addr = r.bytes()?,
                "Port" => s.port = r.uint_as()?,
                "Meta" => s.meta = r.bytes()?,
                "Incarnation" => s.incarnation = u32f(r)?,
                "State" => s.state = r.uint_as()?,
                "Vsn" => s.vsn = vsn(r)?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(s)
    }
}

/// A whole push-pull message read: header, states, the delegate's state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PushPull<'a> {
    /// A join's exchange.
    pub join: bool,
    /// Every node the peer knows.
    pub nodes: Vec<NodeState<'a>>,
    /// serf's state (its type byte first).
    pub user_state: &'a [u8],
}

impl<'a> PushPull<'a> {
    /// From a body (after the type byte).
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let h = PushPullHeader::read(&mut r)?;
        let mut nodes = Vec::with_capacity(h.nodes);
        for _ in 0..h.nodes {
            nodes.push(NodeState::read(&mut r)?);
        }
        let user_state = r
            .rest()
            .get(..h.user_state_len)
            .ok_or(WireError::Truncated)?;
        Ok(PushPull {
            join: h.join,
            nodes,
            user_state,
        })
    }

    /// The whole message, type byte first.
    pub fn encode(&self, out: &mut Vec<u8>) {
        PushPullHeader {
            nodes: self.nodes.len(),
            user_state_len: self.user_state.len(),
            join: self.join,
        }
        .encode(out);
        for n in &self.nodes {
            n.encode(out);
        }
        out.extend_from_slice(self.user_state);
    }
}

/// An error answer on a stream (`errResp`).
pub fn decode_err(body: &[u8]) -> Result<String, WireError> {
    let mut e = String::new();
    Reader::new(body).fields(|k, r| {
        if k == "Error" {
            e = r.str()?.to_string();
        } else {
            r.skip()?;
        }
        Ok(())
    })?;
    Ok(e)
}

/// A user (serf) message sent alone on a stream: header, then the bytes.
pub fn user_stream(msg: &[u8], out: &mut Vec<u8>) {
    start(out, kind::USER)
        .map(1)
        .kv_uint("UserMsgLen", msg.len() as u64);
    out.extend_from_slice(msg);
}

/// A user stream message's header (body after the type byte): the bytes
/// it takes, and the length of the serf message after it.
pub(super) fn user_header(body: &[u8]) -> Result<(usize, usize), WireError> {
    let mut r = Reader::new(body);
    let mut len = 0usize;
    r.fields(|k, r| {
        if k == "UserMsgLen" {
            len = r.uint_as()?;
        } else {
            r.skip()?;
        }
        Ok(())
    })?;
    Ok((r.position(), len))
}

/// A user message sent alone on a stream, read back: the serf message
/// after the header [`user_stream`] writes (body after the type byte).
pub fn decode_user_stream(body: &[u8]) -> Result<&[u8], WireError> {
    let (at, len) = user_header(body)?;
    body.get(at..at.saturating_add(len))
        .ok_or(WireError::Truncated)
}

impl<'a> NodeState<'a> {
    /// The alive message a pushed state of a member stands for (memberlist
    /// merges an alive state as one).
    pub fn alive(&self) -> Alive<'a> {
        Alive {
            incarnation: self.incarnation,
            node: self.name,
            addr: self.addr,
            port: self.port,
            meta: self.meta,
            vsn: self.vsn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back_what_was_written() {
        let mut b = Vec::new();
        let p = Ping {
            seq: 9,
            node: "n1",
            source_addr: &[127, 0, 0, 2],
            source_port: 8301,
            source_node: "n2",
        };
        p.encode(&mut b);
        assert_eq!(Ping::decode(&b[1..]).unwrap(), p);
        b.clear();
        let i = IndirectPing {
            seq: 1,
            target: &[127, 0, 0, 3],
            port: 8301,
            node: "n3",
            nack: true,
            ..Default::default()
        };
        i.encode(&mut b);
        assert_eq!(IndirectPing::decode(&b[1..]).unwrap(), i);
        b.clear();
        let a = Alive {
            incarnation: 3,
            node: "n1",
            addr: &[127, 0, 0, 1],
            port: 8301,
            meta: &[0xff, 0x80],
            vsn: &[1, 5, 2, 2, 5, 4],
        };
        a.encode(&mut b);
        assert_eq!(Alive::decode(&b[1..]).unwrap(), a);
        b.clear();
        let pp = PushPull {
            join: true,
            nodes: vec![NodeState {
                name: "n1",
                addr: &[127, 0, 0, 1],
                port: 8301,
                meta: &[],
                incarnation: 1,
                state: state::LEFT,
                vsn: &[1, 5, 2, 2, 5, 4],
            }],
            user_state: &[2, 0x80],
        };
        pp.encode(&mut b);
        assert_eq!(PushPull::decode(&b[1..]).unwrap(), pp);
    }

    #[test]
    fn a_user_stream_and_a_pushed_state_read_back() {
        let mut b = Vec::new();
        user_stream(b"serf", &mut b);
        assert_eq!(decode_user_stream(&b[1..]), Ok(&b"serf"[..]));
        assert_eq!(
            decode_user_stream(&b[1..b.len() - 1]),
            Err(WireError::Truncated)
        );
        let n = NodeState {
            name: "n1",
            addr: &[127, 0, 0, 1],
            port: 8301,
            meta: &[0xff, 0x80],
            incarnation: 4,
            state: state::ALIVE,
            vsn: &[1, 5, 2, 2, 5, 4],
        };
        let a = n.alive();
        assert_eq!(
            (a.node, a.incarnation, a.port, a.vsn),
            (n.name, 4, 8301, n.vsn)
        );
    }

    #[test]
    fn a_push_pull_claiming_a_million_nodes_in_a_few_bytes_is_refused() {
        let mut b = Vec::new();
        PushPullHeader {
            nodes: 1_000_000,
            user_state_len: 0,
            join: false,
        }
        .encode(&mut b);
        assert_eq!(PushPull::decode(&b[1..]), Err(WireError::Truncated));
    }
}
