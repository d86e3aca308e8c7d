//! memberlist's wire format, as a Consul 1.20 agent speaks it on the serf
//! LAN port (UDP for probes and gossip, TCP for push-pull and fallback
//! pings):
//!
//! - [`read`]: the msgpack reader every decoder uses (bounded by the input).
//! - [`msgs`]: each memberlist message, written field for field as Go's
//!   codec writes the struct and read back tolerating any field order.
//! - [`lzw`]: the compression memberlist wraps payloads in.
//! - [`crypt`]: the AES-GCM keyring (`encrypt`).
//! - here: the layers around a message: label header, encryption, CRC,
//!   compression and compound messages, for a packet and for a stream.
//!
//! What it is not: no state and no sockets; [`crate::pool`] holds those.

pub mod crypt;
pub mod lzw;
pub mod msgs;
pub mod read;

use std::net::IpAddr;

use agent_sim_proto::msgpack::Writer;

pub use crypt::{Keyring, KeyringError};
use read::Reader;

/// Message type bytes (memberlist's `messageType`).
pub mod kind {
    /// A direct probe.
    pub const PING: u8 = 0;
    /// "Probe this node for me."
    pub const INDIRECT_PING: u8 = 1;
    /// A probe's answer.
    pub const ACK: u8 = 2;
    /// "I suspect this node."
    pub const SUSPECT: u8 = 3;
    /// "This node is alive" (also a join).
    pub const ALIVE: u8 = 4;
    /// "This node is dead" (from itself: it left).
    pub const DEAD: u8 = 5;
    /// A state exchange (TCP).
    pub const PUSH_PULL: u8 = 6;
    /// Several messages in one packet.
    pub const COMPOUND: u8 = 7;
    /// A delegate's message: serf's, here.
    pub const USER: u8 = 8;
    /// A compressed message.
    pub const COMPRESS: u8 = 9;
    /// An encrypted stream message.
    pub const ENCRYPT: u8 = 10;
    /// An indirect probe that got no answer.
    pub const NACK: u8 = 11;
    /// A CRC32 in front of the message.
    pub const HAS_CRC: u8 = 12;
    /// An error answer on a stream.
    pub const ERR: u8 = 13;
    /// A label header in front of a packet or a stream.
    pub const HAS_LABEL: u8 = 244;
}

/// Largest push-pull state a peer may send (memberlist's own limit).
pub const MAX_STATE_BYTES: usize = 20 * 1024 * 1024;
/// Largest output of a decompression (memberlist: twice the state).
pub const MAX_DECOMPRESSED: usize = 2 * MAX_STATE_BYTES;
/// A UDP packet memberlist fills with gossip at most.
pub const UDP_BUFFER: usize = 1400;
/// Nesting of compound and compressed layers accepted in one packet.
const MAX_LAYERS: u8 = 4;

/// An IP as memberlist writes it in a message's `Addr` (and `SourceAddr`):
/// 4 bytes for IPv4, 16 for IPv6.
pub fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// An address from a message's `Addr` (4 bytes, or 16 with IPv4 mapped)
/// and port.
pub fn socket_addr(ip: &[u8], port: u16) -> Option<std::net::SocketAddr> {
    let ip = match ip.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(ip).ok()?),
        16 => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(ip).ok()?).to_canonical(),
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

/// What is wrong with bytes received (each a cause a run counts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message ends before its values do.
    #[error("truncated message")]
    Truncated,
    /// The peer closed a TCP stream before a whole message: after `got`
    /// bytes of it.
    #[error("the peer closed the stream after {got} bytes, before a whole message")]
    Cut {
        /// Bytes of the message that had come.
        got: usize,
    },
    /// A TCP stream failed under a read or write (the peer reset it, or
    /// hung up before our answer).
    #[error("the stream failed: {0}")]
    Hungup(std::io::ErrorKind),
    /// A value is not of the type its field needs.
    #[error("expected {0}, found marker {1:#04x}")]
    Type(&'static str, u8),
    /// A number does not fit its field.
    #[error("number out of range")]
    Range,
    /// A string is not UTF-8.
    #[error("string is not UTF-8")]
    Utf8,
    /// Values nested deeper than any gossip message does.
    #[error("nested too deep")]
    TooDeep,
    /// A message type this end does not know.
    #[error("unknown message type {0}")]
    Unknown(u8),
    /// The LZW stream is corrupt.
    #[error("corrupt LZW data")]
    Lzw,
    /// A message larger than the bound given.
    #[error("message larger than {0} bytes")]
    TooLarge(usize),
    /// The CRC in front of a packet does not match it.
    #[error("CRC mismatch")]
    Crc,
    /// The label is not this pool's (`--gossip-label`).
    #[error("label {got:?} where {want:?} is expected")]
    Label {
        /// The label received.
        got: String,
        /// This pool's label.
        want: String,
    },
    /// Encrypted where this pool is not, plain where it is, or
    /// undecryptable.
    #[error("encryption: {0}")]
    Crypt(String),
    /// A key given cannot be used.
    #[error("gossip key: {0}")]
    Key(String),
    /// A compression algorithm other than LZW.
    #[error("unknown compression algorithm {0}")]
    Algo(u64),
}

impl WireError {
    /// A short cause for counters (`gossip_bad_<cause>`).
    pub fn cause(&self) -> &'static str {
        match self {
            WireError::Truncated => "truncated",
            WireError::Cut { .. } | WireError::Hungup(_) => "stream_cut",
            WireError::Type(..) | WireError::Range | WireError::Utf8 | WireError::TooDeep => {
                "malformed"
            }
            WireError::Unknown(_) => "unknown_type",
            WireError::Lzw | WireError::Algo(_) => "compression",
            WireError::TooLarge(_) => "oversized",
            WireError::Crc => "crc",
            WireError::Label { .. } => "label",
            WireError::Crypt(_) | WireError::Key(_) => "encryption",
        }
    }
}

/// How this pool wraps what it sends and checks what it receives: the label
/// and the keyring (Consul's `encrypt`, verified both ways).
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// `--gossip-label` (empty: none).
    pub label: String,
    /// `--gossip-key`.
    pub keyring: Option<Keyring>,
}

impl Security {
    /// Wraps a message for a UDP packet: compressed when that is smaller
    /// (memberlist's `EnableCompression`), encrypted, labelled.
    pub fn seal_packet(&self, msg: &[u8]) -> Vec<u8> {
        let compressed = compress_msg(msg);
        let body = if compressed.len() < msg.len() {
            &compressed[..]
        } else {
            msg
        };
        let mut out = Vec::with_capacity(body.len() + crypt::OVERHEAD + 2 + self.label.len());
        if !self.label.is_empty() {
            out.push(kind::HAS_LABEL);
            out.push(self.label.len() as u8);
            out.extend_from_slice(self.label.as_bytes());
        }
        match &self.keyring {
            Some(k) => k.seal(body, self.label.as_bytes(), &mut out),
            None => out.extend_from_slice(body),
        }
        out
    }

    /// Unwraps a UDP packet down to its message (type byte first): label
    /// checked, decrypted, CRC checked. Compression and compound layers
    /// stay: [`each_message`] walks them.
    pub fn open_packet<'a>(&self, buf: &'a [u8]) -> Result<std::borrow::Cow<'a, [u8]>, WireError> {
        let (label, rest) = split_label(buf)?;
        self.check_label(label)?;
        let plain: std::borrow::Cow<'a, [u8]> = match &self.keyring {
            Some(k) => k.open(rest, label.as_bytes())?.into(),
            None => rest.into(),
        };
        if plain.first() == Some(&kind::HAS_CRC) {
            if plain.len() < 5 {
                return Err(WireError::Truncated);
            }
            let want = u32::from_be_bytes([plain[1], plain[2], plain[3], plain[4]]);
            if crc32fast::hash(&plain[5..]) != want {
                return Err(WireError::Crc);
            }
            return Ok(match plain {
                std::borrow::Cow::Borrowed(b) => b[5..].into(),
                std::borrow::Cow::Owned(v) => v[5..].to_vec().into(),
            });
        }
        Ok(plain)
    }

    fn check_label(&self, got: &str) -> Result<(), WireError> {
        if got != self.label {
            return Err(WireError::Label {
                got: got.into(),
                want: self.label.clone(),
            });
        }
        Ok(())
    }

    /// The bytes a stream starts with: the label header, if any.
    pub fn stream_preamble(&self) -> Vec<u8> {
        if self.label.is_empty() {
            return Vec::new();
        }
        let mut v = vec![kind::HAS_LABEL, self.label.len() as u8];
        v.extend_from_slice(self.label.as_bytes());
        v
    }

    /// Wraps one stream message (type byte first): always compressed, as
    /// memberlist does on streams, then encrypted in its length frame.
    pub fn seal_stream(&self, msg: &[u8]) -> Vec<u8> {
        let body = compress_msg(msg);
        let Some(k) = &self.keyring else {
            return body;
        };
        let len = (body.len() + crypt::OVERHEAD) as u32;
        let mut out = Vec::with_capacity(5 + len as usize);
        out.push(kind::ENCRYPT);
        out.extend_from_slice(&len.to_be_bytes());
        let mut aad = out.clone();
        aad.extend_from_slice(self.label.as_bytes());
        k.seal(&body, &aad, &mut out);
        out
    }

    /// Reads one stream message from the bytes received so far (after the
    /// preamble): `Ok(None)` until they hold all of it; then the message
    /// (decrypted and decompressed, type byte first) and the bytes used.
    pub fn open_stream(&self, buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, WireError> {
        match self.open_stream_frame(buf)? {
            Some((f, used)) => Ok(Some((f.message()?, used))),
            None => Ok(None),
        }
    }

    /// As [`Security::open_stream`], but the message stays compressed
    /// until asked for: a join's answer (the server's whole member list)
    /// is read off the wire, and decompressed only when the pool merges it.
    pub fn open_stream_frame(&self, buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
        let Some(&first) = buf.first() else {
            return Ok(None);
        };
        if first == kind::ENCRYPT {
            let Some(k) = &self.keyring else {
                return Err(WireError::Crypt(
                    "the peer encrypts and this pool has no --gossip-key".into(),
                ));
            };
            if buf.len() < 5 {
                return Ok(None);
            }
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > MAX_STATE_BYTES {
                return Err(WireError::TooLarge(MAX_STATE_BYTES));
            }
            if buf.len() < 5 + len {
                return Ok(None);
            }
            let mut aad = buf[..5].to_vec();
            aad.extend_from_slice(self.label.as_bytes());
            let plain = k.open(&buf[5..5 + len], &aad)?;
            let msg = match complete_plain(&plain)? {
                Some((m, _)) => m,
                None => return Err(WireError::Truncated),
            };
            return Ok(Some((msg, 5 + len)));
        }
        if self.keyring.is_some() {
            return Err(WireError::Crypt(
                "the peer sent plain text and this pool encrypts (is its --gossip-key set?)".into(),
            ));
        }
        complete_plain(buf)
    }
}

/// One stream message as read (and decrypted): plain, or still compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The message, type byte first.
    Plain(Vec<u8>),
    /// A compress message's body (its msgpack map).
    Compressed(Vec<u8>),
}

impl Frame {
    /// The message's type, decompressing no more than its first byte.
    pub fn kind(&self) -> Result<u8, WireError> {
        match self {
            Frame::Plain(m) => m.first().copied().ok_or(WireError::Truncated),
            Frame::Compressed(body) => {
                let (algo, data) = compressed_parts(body)?;
                if algo != 0 {
                    return Err(WireError::Algo(algo));
                }
                let head = lzw::decompress_prefix(data, 1)?;
                head.first().copied().ok_or(WireError::Truncated)
            }
        }
    }

    /// The whole message, type byte first.
    pub fn message(self) -> Result<Vec<u8>, WireError> {
        match self {
            Frame::Plain(m) => Ok(m),
            Frame::Compressed(body) => decompress_msg(&body),
        }
    }
}

/// A plain stream message, left compressed if it is: `Ok(None)` while its
/// bytes are incomplete.
fn complete_plain(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    match msg_len(buf) {
        Err(WireError::Truncated) => Ok(None),
        Err(e) => Err(e),
        Ok(n) if first == kind::COMPRESS => Ok(Some((Frame::Compressed(buf[1..n].to_vec()), n))),
        Ok(n) => Ok(Some((Frame::Plain(buf[..n].to_vec()), n))),
    }
}

/// The length of the stream message at the start of `buf` (type byte
/// first), or `Truncated` while it is incomplete.
fn msg_len(buf: &[u8]) -> Result<usize, WireError> {
    let mut r = Reader::new(&buf[1..]);
    match buf[0] {
        kind::COMPRESS | kind::PING | kind::ACK | kind::ERR => r.skip()?,
        kind::PUSH_PULL => {
            let h = msgs::PushPullHeader::read(&mut r)?;
            for _ in 0..h.nodes {
                r.skip()?;
            }
            if r.rest().len() < h.user_state_len {
                return Err(WireError::Truncated);
            }
            return Ok(1 + r.position() + h.user_state_len);
        }
        kind::USER => {
            let (at, len) = msgs::user_header(&buf[1..])?;
            if buf.len() - 1 - at < len {
                return Err(WireError::Truncated);
            }
            return Ok(1 + at + len);
        }
        t => return Err(WireError::Unknown(t)),
    }
    Ok(1 + r.position())
}

/// Splits a label header off a packet: `("", buf)` without one.
pub fn split_label(buf: &[u8]) -> Result<(&str, &[u8]), WireError> {
    if buf.first() != Some(&kind::HAS_LABEL) {
        return Ok(("", buf));
    }
    let n = usize::from(*buf.get(1).ok_or(WireError::Truncated)?);
    if n == 0 {
        return Err(WireError::Truncated);
    }
    let label = buf.get(2..2 + n).ok_or(WireError::Truncated)?;
    let label = std::str::from_utf8(label).map_err(|_| WireError::Utf8)?;
    Ok((label, &buf[2 + n..]))
}

/// A message wrapped in memberlist's compress message (type byte first).
pub fn compress_msg(msg: &[u8]) -> Vec<u8> {
    let z = lzw::compress(msg);
    let mut out = Vec::with_capacity(z.len() + 16);
    out.push(kind::COMPRESS);
    Writer(&mut out)
        .map(2)
        .kv_uint("Algo", 0)
        .str("Buf")
        .raw(&z);
    out
}

/// A compress message's algorithm and data.
fn compressed_parts(body: &[u8]) -> Result<(u64, &[u8]), WireError> {
    let (mut algo, mut data) = (0u64, &[][..]);
    Reader::new(body).fields(|k, r| {
        match k {
            "Algo" => algo = r.uint()?,
            "Buf" => data = r.bytes()?,
            _ => r.skip()?,
        }
        Ok(())
    })?;
    Ok((algo, data))
}

/// The message inside a compress message's body (after its type byte).
pub fn decompress_msg(body: &[u8]) -> Result<Vec<u8>, WireError> {
    let (algo, data) = compressed_parts(body)?;
    if algo != 0 {
        return Err(WireError::Algo(algo));
    }
    lzw::decompress(data, MAX_DECOMPRESSED)
}

/// Several messages as one compound message.
pub fn compound(msgs: &[&[u8]]) -> Vec<u8> {
    let total: usize = msgs.iter().map(|m| m.len() + 2).sum();
    let mut out = Vec::with_capacity(2 + total);
    out.push(kind::COMPOUND);
    out.push(msgs.len() as u8);
    for m in msgs {
        out.extend_from_slice(&(m.len() as u16).to_be_bytes());
    }
    for m in msgs {
        out.extend_from_slice(m);
    }
    out
}

/// Calls `f` with each message in `msg` (type byte, body), expanding
/// compound and compressed layers. A compound message cut short yields the
/// parts it holds whole, then `Truncated`, as memberlist handles what it can.
pub fn each_message(msg: &[u8], f: &mut impl FnMut(u8, &[u8])) -> Result<(), WireError> {
    walk(msg, f, 0)
}

fn walk(msg: &[u8], f: &mut impl FnMut(u8, &[u8]), depth: u8) -> Result<(), WireError> {
    if depth > MAX_LAYERS {
        return Err(WireError::TooDeep);
    }
    let (&t, body) = msg.split_first().ok_or(WireError::Truncated)?;
    match t {
        kind::COMPOUND => {
            let (&n, rest) = body.split_first().ok_or(WireError::Truncated)?;
            let n = usize::from(n);
            let lens = rest.get(..n * 2).ok_or(WireError::Truncated)?;
            let mut at = n * 2;
            for l in lens.chunks_exact(2) {
                let l = usize::from(u16::from_be_bytes([l[0], l[1]]));
                let part = rest.get(at..at + l).ok_or(WireError::Truncated)?;
                at += l;
                walk(part, f, depth + 1)?;
            }
            Ok(())
        }
        kind::COMPRESS => walk(&decompress_msg(body)?, f, depth + 1),
        kind::HAS_CRC => Err(WireError::Unknown(t)),
        _ => {
            f(t, body);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sec(label: &str, key: Option<&str>) -> Security {
        Security {
            label: label.into(),
            keyring: key.map(|k| Keyring::from_base64(&[k]).unwrap()),
        }
    }

    #[test]
    fn packets_round_trip_in_every_wrapping() {
        let key = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";
        let big = vec![kind::USER; 600];
        for s in [
            sec("", None),
            sec("prod", None),
            sec("", Some(key)),
            sec("prod", Some(key)),
        ] {
            for msg in [&[kind::PING, 0x80][..], &big[..]] {
                let p = s.seal_packet(msg);
                let plain = s.open_packet(&p).unwrap();
                let mut got = Vec::new();
                each_message(&plain, &mut |t, b| got.push((t, b.len()))).unwrap();
                assert_eq!(got, vec![(msg[0], msg.len() - 1)]);
            }
        }
    }

    #[test]
    fn the_wrong_label_or_key_is_named() {
        let key = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";
        let p = sec("a", None).seal_packet(&[kind::PING, 0x80]);
        assert!(matches!(
            sec("b", None).open_packet(&p),
            Err(WireError::Label { .. })
        ));
        let p = sec("", Some(key)).seal_packet(&[kind::PING, 0x80]);
        assert!(sec("", None).open_packet(&p).is_ok_and(|m| m[0] == 1));
        let s = sec("", Some(key)).seal_stream(&[kind::PING, 0x80]);
        let e = sec("", None).open_stream(&s).unwrap_err().to_string();
        assert!(e.contains("--gossip-key"), "{e}");
    }

    #[test]
    fn a_compound_cut_short_is_truncated_after_its_whole_parts() {
        let a = [kind::PING, 0x80];
        let b = [kind::ACK, 0x80];
        let c = compound(&[&a, &b]);
        let mut seen = 0;
        assert_eq!(
            each_message(&c[..c.len() - 1], &mut |_, _| seen += 1),
            Err(WireError::Truncated)
        );
        assert_eq!(seen, 1);
        let crc_in_compound = compound(&[&[kind::HAS_CRC, 0, 0, 0, 0]]);
        assert!(each_message(&crc_in_compound, &mut |_, _| {}).is_err());
    }

    #[test]
    fn an_ip_is_4_bytes_for_v4_and_16_for_v6() {
        assert_eq!(ip_bytes(IpAddr::from([10, 0, 0, 7])), [10, 0, 0, 7]);
        let v6 = ip_bytes("fe80::1".parse().unwrap());
        assert_eq!((v6.len(), v6[0], v6[15]), (16, 0xfe, 1));
    }

    #[test]
    fn a_stream_message_is_whole_only_when_all_its_bytes_are_in() {
        let key = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";
        for s in [sec("", None), sec("", Some(key))] {
            let mut msg = vec![kind::PUSH_PULL];
            Writer(&mut msg)
                .map(3)
                .kv_uint("Nodes", 0)
                .kv_uint("UserStateLen", 3)
                .kv_bool("Join", true);
            msg.extend_from_slice(b"abc");
            let wire = s.seal_stream(&msg);
            for cut in 0..wire.len() {
                assert_eq!(s.open_stream(&wire[..cut]).unwrap(), None, "cut at {cut}");
            }
            assert_eq!(
                s.open_stream(&wire).unwrap(),
                Some((msg.clone(), wire.len()))
            );
        }
    }
}
