//! serf's queries (`messageQuery`): a name and a payload gossiped like an
//! event, which each member it reaches (and whose filters it passes)
//! answers straight to the asker's address by UDP (`messageQueryResponse`),
//! with an ack first when asked; and the relay wrapper (`messageRelay`) in
//! which a member passes another's answer on to the asker.

use std::net::SocketAddr;
use std::time::Duration;

use agent_sim_proto::msgpack::Writer;

use super::event::raw_or_nil;
use super::kind_serf;
use crate::wire::read::Reader;
use crate::wire::{WireError, kind, socket_addr};

/// `Flags`: the asker wants an ack from each member the query reaches.
pub const FLAG_ACK: u32 = 1;
/// `Flags`: the members do not pass the query on.
pub const FLAG_NO_BROADCAST: u32 = 2;
/// serf's bound on an answer's encoded size (`QueryResponseSizeLimit`).
pub const RESPONSE_LIMIT: usize = 1024;

/// One query.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query<'a> {
    /// Its time on the query clock.
    pub ltime: u64,
    /// Its random ID (with `ltime`, what a member takes in once).
    pub id: u32,
    /// The asker's IP (4 or 16 bytes).
    pub addr: &'a [u8],
    /// The asker's UDP port.
    pub port: u16,
    /// The asker's node name.
    pub source_node: &'a str,
    /// Filters, each a type byte and a msgpack value ([`Filter`]).
    pub filters: Vec<&'a [u8]>,
    /// [`FLAG_ACK`], [`FLAG_NO_BROADCAST`].
    pub flags: u32,
    /// How many other members each answer is also relayed through.
    pub relay_factor: u8,
    /// How long after a member takes it in that member may still answer.
    pub timeout: Duration,
    /// Its name (`_serf_` for serf's own).
    pub name: &'a str,
    /// Its payload.
    pub payload: &'a [u8],
}

impl<'a> Query<'a> {
    /// The query wrapped as the memberlist user message it travels in.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(kind::USER);
        out.push(kind_serf::QUERY);
        let mut w = Writer(out);
        w.map(11).str("Addr");
        raw_or_nil(&mut w, self.addr);
        w.str("Filters");
        if self.filters.is_empty() {
            w.nil();
        } else {
            w.array(self.filters.len() as u32);
            for f in &self.filters {
                w.raw(f);
            }
        }
        let nanos = i64::try_from(self.timeout.as_nanos()).unwrap_or(i64::MAX);
        w.kv_uint("Flags", u64::from(self.flags))
            .kv_uint("ID", u64::from(self.id))
            .kv_uint("LTime", self.ltime)
            .kv_str("Name", self.name)
            .str("Payload");
        raw_or_nil(&mut w, self.payload);
        w.kv_uint("Port", u64::from(self.port))
            .kv_uint("RelayFactor", u64::from(self.relay_factor))
            .kv_str("SourceNode", self.source_node)
            .str("Timeout")
            .int(nanos);
    }

    /// From a user message's body (serf's type byte first): `None` for
    /// serf's other messages.
    pub fn decode(body: &'a [u8]) -> Result<Option<Self>, WireError> {
        let (&t, rest) = body.split_first().ok_or(WireError::Truncated)?;
        if t != kind_serf::QUERY {
            return Ok(None);
        }
        let mut q = Query::default();
        Reader::new(rest).fields(|k, r| {
            match k {
                "LTime" => q.ltime = r.uint()?,
                "ID" => q.id = r.uint_as()?,
                "Addr" => q.addr = r.bytes()?,
                "Port" => q.port = r.uint_as()?,
                "SourceNode" => q.source_node = r.str()?,
                "Filters" => {
                    let n = r.array()?;
                    q.filters.reserve(n);
                    for _ in 0..n {
                        q.filters.push(r.bytes()?);
                    }
                }
                "Flags" => q.flags = r.uint_as()?,
                "RelayFactor" => q.relay_factor = r.uint_as()?,
                // A Go time.Duration: nanoseconds, signed.
                "Timeout" => {
                    let ns = u64::try_from(r.int()?).unwrap_or(0);
                    q.timeout = Duration::from_nanos(ns);
                }
                "Name" => q.name = r.str()?,
                "Payload" => q.payload = r.bytes()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(Some(q))
    }

    /// Where the answers go.
    pub fn reply_to(&self) -> Option<SocketAddr> {
        socket_addr(self.addr, self.port)
    }
}

/// A query's filter: the members it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter<'a> {
    /// Only members of these names (`filterNode`, type 0).
    Nodes(Vec<&'a str>),
    /// Only members whose tag matches this regular expression (Go's
    /// `regexp.MatchString`: found anywhere in the value; `filterTag`,
    /// type 1).
    Tag {
        /// The tag's name.
        tag: &'a str,
        /// The expression.
        expr: &'a str,
    },
}

impl<'a> Filter<'a> {
    /// As serf writes a filter: its type byte, then its value.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        match self {
            Filter::Nodes(names) => {
                w.0.push(0);
                w.array(names.len() as u32);
                for n in names {
                    w.str(n);
                }
            }
            Filter::Tag { tag, expr } => {
                w.0.push(1);
                w.map(2).kv_str("Expr", expr).kv_str("Tag", tag);
            }
        }
    }

    /// One of a query's filters (an unknown type is an error: serf then
    /// does not answer).
    pub fn decode(buf: &'a [u8]) -> Result<Self, WireError> {
        let (&t, rest) = buf.split_first().ok_or(WireError::Truncated)?;
        let mut r = Reader::new(rest);
        match t {
            0 => {
                let n = r.array()?;
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push(r.str()?);
                }
                Ok(Filter::Nodes(names))
            }
            1 => {
                let (mut tag, mut expr) = ("", "");
                r.fields(|k, r| {
                    match k {
                        "Tag" => tag = r.str()?,
                        "Expr" => expr = r.str()?,
                        _ => r.skip()?,
                    }
                    Ok(())
                })?;
                Ok(Filter::Tag { tag, expr })
            }
            other => Err(WireError::Unknown(other)),
        }
    }
}

/// A member's answer to a query (or its ack: [`FLAG_ACK`], no payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueryResponse<'a> {
    /// The query's time.
    pub ltime: u64,
    /// The query's ID.
    pub id: u32,
    /// The answering member's name.
    pub from: &'a str,
    /// [`FLAG_ACK`] on an ack.
    pub flags: u32,
    /// The answer.
    pub payload: &'a [u8],
}

impl<'a> QueryResponse<'a> {
    /// The answer wrapped as the memberlist user message it travels in.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(kind::USER);
        out.push(kind_serf::QUERY_RESPONSE);
        let mut w = Writer(out);
        w.map(5)
            .kv_uint("Flags", u64::from(self.flags))
            .kv_str("From", self.from)
            .kv_uint("ID", u64::from(self.id))
            .kv_uint("LTime", self.ltime)
            .str("Payload");
        raw_or_nil(&mut w, self.payload);
    }

    /// From a user message's body (serf's type byte first): `None` for
    /// serf's other messages.
    pub fn decode(body: &'a [u8]) -> Result<Option<Self>, WireError> {
        let (&t, rest) = body.split_first().ok_or(WireError::Truncated)?;
        if t != kind_serf::QUERY_RESPONSE {
            return Ok(None);
        }
        let mut q = QueryResponse::default();
        Reader::new(rest).fields(|k, r| {
            match k {
                "LTime" => q.ltime = r.uint()?,
                "ID" => q.id = r.uint_as()?,
                "From" => q.from = r.str()?,
                "Flags" => q.flags = r.uint_as()?,
                "Payload" => q.payload = r.bytes()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(Some(q))
    }
}

/// A message to pass on (`messageRelay`): its destination, then the serf
/// message itself (type byte first), which goes there as a user message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relay<'a> {
    /// Where it goes.
    pub to: SocketAddr,
    /// The destination's node name.
    pub node: &'a str,
    /// The serf message, type byte first.
    pub msg: &'a [u8],
}

impl<'a> Relay<'a> {
    /// From a user message's body (serf's type byte first): `None` for
    /// serf's other messages.
    pub fn decode(body: &'a [u8]) -> Result<Option<Self>, WireError> {
        let (&t, rest) = body.split_first().ok_or(WireError::Truncated)?;
        if t != kind_serf::RELAY {
            return Ok(None);
        }
        let mut r = Reader::new(rest);
        let (mut ip, mut port, mut node) = (&[][..], 0u16, "");
        r.fields(|k, r| {
            match k {
                "DestAddr" => r.fields(|k, r| {
                    match k {
                        "IP" => ip = r.bytes()?,
                        "Port" => port = r.uint_as()?,
                        _ => r.skip()?,
                    }
                    Ok(())
                })?,
                "DestName" => node = r.str()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        let to = socket_addr(ip, port).ok_or(WireError::Range)?;
        Ok(Some(Relay {
            to,
            node,
            msg: r.rest(),
        }))
    }

    /// As serf writes it (its header's fields sorted, the UDP address's
    /// `Zone` empty).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(kind::USER);
        out.push(kind_serf::RELAY);
        let ip = crate::wire::ip_bytes(self.to.ip());
        Writer(out)
            .map(2)
            .str("DestAddr")
            .map(3)
            .str("IP")
            .raw(&ip)
            .kv_uint("Port", u64::from(self.to.port()))
            .kv_str("Zone", "")
            .kv_str("DestName", self.node);
        out.extend_from_slice(self.msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_its_filters_answers_and_relays_read_back() {
        let mut nodes = Vec::new();
        Filter::Nodes(vec!["a", "b"]).encode(&mut nodes);
        let mut tag = Vec::new();
        Filter::Tag {
            tag: "role",
            expr: "^no",
        }
        .encode(&mut tag);
        let q = Query {
            ltime: 9,
            id: 77,
            addr: &[127, 0, 0, 1],
            port: 8301,
            source_node: "srv",
            filters: vec![&nodes, &tag],
            flags: FLAG_ACK,
            relay_factor: 2,
            timeout: Duration::from_secs(5),
            name: "_serf_ping",
            payload: b"",
        };
        let mut b = Vec::new();
        q.encode(&mut b);
        let back = Query::decode(&b[1..]).unwrap().unwrap();
        assert_eq!(back, q);
        assert_eq!(back.reply_to(), Some("127.0.0.1:8301".parse().unwrap()));
        assert_eq!(
            Filter::decode(back.filters[0]).unwrap(),
            Filter::Nodes(vec!["a", "b"])
        );
        assert_eq!(
            Filter::decode(back.filters[1]).unwrap(),
            Filter::Tag {
                tag: "role",
                expr: "^no"
            }
        );
        assert!(Filter::decode(&[7, 0x90]).is_err());
        let a = QueryResponse {
            ltime: 9,
            id: 77,
            from: "m1",
            flags: FLAG_ACK,
            payload: b"",
        };
        let mut ab = Vec::new();
        a.encode(&mut ab);
        assert_eq!(QueryResponse::decode(&ab[1..]).unwrap(), Some(a));
        let relay = Relay {
            to: "127.0.0.1:9000".parse().unwrap(),
            node: "srv",
            msg: &ab[1..],
        };
        let mut rb = Vec::new();
        relay.encode(&mut rb);
        assert_eq!(Relay::decode(&rb[1..]).unwrap(), Some(relay));
        assert_eq!(Query::decode(&ab[1..]).unwrap(), None);
    }
}
