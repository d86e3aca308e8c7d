//! serf's internal queries (names starting `_serf_`) and what their
//! payloads and answers hold: the keyring's (`consul keyring`: a key in,
//! `nodeKeyResponse` out) and the name conflict's (a member's view of the
//! node named, as a serf `Member`).

use agent_sim_proto::msgpack::Writer;

use super::kind_serf;
use crate::wire::WireError;
use crate::wire::read::Reader;

/// Acked when asked; no answer.
pub const PING: &str = "_serf_ping";
/// "What do you know of this node?" (payload: the name).
pub const CONFLICT: &str = "_serf_conflict";
/// Adds a key to the keyring.
pub const INSTALL_KEY: &str = "_serf_install-key";
/// Makes a key of the keyring the one messages are encrypted with.
pub const USE_KEY: &str = "_serf_use-key";
/// Takes a key out of the keyring (never the primary).
pub const REMOVE_KEY: &str = "_serf_remove-key";
/// "Which keys do you hold?"
pub const LIST_KEYS: &str = "_serf_list-keys";

/// The key of a keyring query's payload (`messageKeyRequest`: its type
/// byte, then `{Key}`).
pub fn decode_key_request(payload: &[u8]) -> Result<&[u8], WireError> {
    let (&t, rest) = payload.split_first().ok_or(WireError::Truncated)?;
    if t != kind_serf::KEY_REQUEST {
        return Err(WireError::Unknown(t));
    }
    let mut key = &[][..];
    Reader::new(rest).fields(|k, r| {
        match k {
            "Key" => key = r.bytes()?,
            _ => r.skip()?,
        }
        Ok(())
    })?;
    Ok(key)
}

/// A keyring query's payload, as serf's key manager writes it.
pub fn encode_key_request(key: &[u8], out: &mut Vec<u8>) {
    out.push(kind_serf::KEY_REQUEST);
    Writer(out).map(1).str("Key").raw(key);
}

/// A member's answer to a keyring query (`nodeKeyResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyResponse {
    /// Whether the operation (or the listing) succeeded.
    pub result: bool,
    /// Why not, in memberlist's words.
    pub message: String,
    /// The keys held, base64 (listing only).
    pub keys: Vec<String>,
    /// The primary key, base64 (listing only).
    pub primary: String,
}

impl KeyResponse {
    /// The answer's payload: its type byte, then the struct.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(kind_serf::KEY_RESPONSE);
        let mut w = Writer(out);
        w.map(4).str("Keys");
        if self.keys.is_empty() {
            w.nil();
        } else {
            w.array(self.keys.len() as u32);
            for k in &self.keys {
                w.str(k);
            }
        }
        w.kv_str("Message", &self.message)
            .kv_str("PrimaryKey", &self.primary)
            .kv_bool("Result", self.result);
    }

    /// From an answer's payload.
    pub fn decode(payload: &[u8]) -> Result<Self, WireError> {
        let (&t, rest) = payload.split_first().ok_or(WireError::Truncated)?;
        if t != kind_serf::KEY_RESPONSE {
            return Err(WireError::Unknown(t));
        }
        let mut out = KeyResponse::default();
        Reader::new(rest).fields(|k, r| {
            match k {
                "Result" => out.result = r.bool()?,
                "Message" => out.message = r.str()?.into(),
                "PrimaryKey" => out.primary = r.str()?.into(),
                "Keys" => {
                    let n = r.array()?;
                    for _ in 0..n {
                        out.keys.push(r.str()?.into());
                    }
                }
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(out)
    }
}

/// serf's member status (`MemberStatus`).
pub mod status {
    /// Alive (memberlist's alive or suspect).
    pub const ALIVE: u8 = 1;
    /// Its leave intent taken, its leave not yet.
    pub const LEAVING: u8 = 2;
    /// Left.
    pub const LEFT: u8 = 3;
    /// Failed.
    pub const FAILED: u8 = 4;
}

/// A node as serf describes it (`Member`), the answer to a conflict query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its IP (4 or 16 bytes).
    pub addr: &'a [u8],
    /// Its gossip port.
    pub port: u16,
    /// Its tags.
    pub tags: Vec<(String, String)>,
    /// [`status`].
    pub status: u8,
    /// memberlist's min, max, current, then serf's min, max, current.
    pub vsn: [u8; 6],
}

/// A conflict query's answer payload: its type byte, then the member the
/// answering node knows by that name (nil when it knows none).
pub fn encode_conflict(m: Option<&Member<'_>>, out: &mut Vec<u8>) {
    out.push(kind_serf::CONFLICT_RESPONSE);
    let mut w = Writer(out);
    let Some(m) = m else {
        w.nil();
        return;
    };
    let v = m.vsn;
    w.map(11)
        .str("Addr")
        .raw(m.addr)
        .kv_uint("DelegateCur", u64::from(v[5]))
        .kv_uint("DelegateMax", u64::from(v[4]))
        .kv_uint("DelegateMin", u64::from(v[3]))
        .kv_str("Name", m.name)
        .kv_uint("Port", u64::from(m.port))
        .kv_uint("ProtocolCur", u64::from(v[2]))
        .kv_uint("ProtocolMax", u64::from(v[1]))
        .kv_uint("ProtocolMin", u64::from(v[0]))
        .kv_uint("Status", u64::from(m.status))
        .str("Tags");
    let tags: Vec<(&str, &str)> = m.tags.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    w.str_map(&tags);
}

/// A conflict answer's member: `(name, status)`, `None` for nil.
pub fn decode_conflict(payload: &[u8]) -> Result<Option<(&str, u8)>, WireError> {
    let (&t, rest) = payload.split_first().ok_or(WireError::Truncated)?;
    if t != kind_serf::CONFLICT_RESPONSE {
        return Err(WireError::Unknown(t));
    }
    let mut r = Reader::new(rest);
    if r.nil()? {
        return Ok(None);
    }
    let (mut name, mut st) = ("", 0);
    r.fields(|k, r| {
        match k {
            "Name" => name = r.str()?,
            "Status" => st = r.uint_as()?,
            _ => r.skip()?,
        }
        Ok(())
    })?;
    Ok(Some((name, st)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_requests_answers_and_members_read_back() {
        let mut b = Vec::new();
        encode_key_request(&[1; 16], &mut b);
        assert_eq!(decode_key_request(&b).unwrap(), &[1; 16]);
        let r = KeyResponse {
            result: true,
            message: String::new(),
            keys: vec!["a".into(), "b".into()],
            primary: "a".into(),
        };
        b.clear();
        r.encode(&mut b);
        assert_eq!(KeyResponse::decode(&b).unwrap(), r);
        let m = Member {
            name: "m1",
            addr: &[127, 0, 0, 1],
            port: 8301,
            tags: vec![("role".into(), "node".into())],
            status: status::ALIVE,
            vsn: [1, 5, 2, 2, 5, 4],
        };
        b.clear();
        encode_conflict(Some(&m), &mut b);
        assert_eq!(decode_conflict(&b).unwrap(), Some(("m1", status::ALIVE)));
        b.clear();
        encode_conflict(None, &mut b);
        assert_eq!(decode_conflict(&b).unwrap(), None);
    }
}
