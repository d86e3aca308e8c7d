//! Sensu agent frame and message codec: pure encode/decode on bytes, no sockets.
//!
//! A Sensu agent message is one binary WebSocket message `<kind>\n<body>`
//! ([`split_frame`] / [`encode_frame`]). The body is protobuf (gogo wire
//! format of `sensu.core.v2` / `v3`) or JSON, chosen at the upgrade by the
//! `Accept` header ([`Encoding`]). Message types: [`KIND_KEEPALIVE`] and
//! [`KIND_EVENT`] (agent → backend, a `v2::Event`), [`KIND_ENTITY_CONFIG`]
//! (`v3::EntityConfig`) and [`KIND_CHECK_REQUEST`] (`v2::CheckRequest`)
//! (backend → agent). [`validate_event`] applies the backend's acceptance rules.
//!
//! Hostile input: every decoder here refuses a message over [`MAX_MESSAGE`]
//! before touching it, never panics (property tests in `tests/hostile.rs`,
//! fuzz targets under `fuzz/`), and [`unknown_fields`] names top-level
//! fields or keys this agent does not know, so a session can count them
//! and carry on, as the real agent does.
//!
//! The JSON form lives in `json.rs`; the session (socket, timers) in `session.rs`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use agent_sim_proto::sensu::{v2, v3};
use prost::Message as _;

use crate::json;

/// Frame kind of an agent keepalive (a `v2::Event` with check `keepalive`).
pub const KIND_KEEPALIVE: &str = "keepalive";
/// Frame kind of an agent event (check result or metrics).
pub const KIND_EVENT: &str = "event";
/// Frame kind of the backend's entity configuration (`v3::EntityConfig`).
pub const KIND_ENTITY_CONFIG: &str = "entity_config";
/// Frame kind of a backend check request (`v2::CheckRequest`).
pub const KIND_CHECK_REQUEST: &str = "check_request";

/// Largest agent protocol message (one WebSocket message) either side
/// accepts. Backend → agent messages are an `entity_config` (≈100 bytes) or
/// a `check_request` (≈300 bytes: one check config); agent → backend events
/// carry at most [`crate::MAX_EVENT_OUTPUT`] (32 KiB) of output plus the
/// entity (≈1 KiB). 64 KiB holds all of them with room for long commands,
/// env lists and labels, and bounds what one hostile message can make a
/// session buffer (tungstenite enforces it on the socket, see
/// `session::ws_config`; the decoders here check it again).
pub const MAX_MESSAGE: usize = 64 * 1024;

/// Largest single WebSocket frame: a message may not be split to sneak past
/// [`MAX_MESSAGE`], and no peer of ours fragments, so one frame may be a
/// whole message and no more.
pub const MAX_FRAME: usize = MAX_MESSAGE;

/// Deepest JSON nesting a JSON body may have: serde_json's own recursion
/// limit (we do not build it with `unbounded_depth`), far above the 4
/// levels an agent message uses, and low enough that a body of `[[[[…` is
/// an error rather than a stack overflow. `tests/hostile.rs` pins it.
pub const JSON_MAX_DEPTH: usize = 128;

/// Top-level field numbers Sensu Go 6.x defines for `v3.EntityConfig`
/// (all of which agent-sim decodes).
pub const ENTITY_CONFIG_FIELDS: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8];
/// JSON keys of `v3.EntityConfig`.
pub const ENTITY_CONFIG_KEYS: &[&str] = &[
    "metadata",
    "entity_class",
    "user",
    "subscriptions",
    "deregister",
    "deregistration",
    "keepalive_handlers",
    "redact",
];
/// Top-level field numbers Sensu Go 6.x defines for `v2.CheckRequest`:
/// config 1, assets 2, hooks 3, issued 4, and `hook_assets` 5 and `secrets`
/// 6, which agent-sim skips (it runs no hooks and resolves no secrets) but
/// expects: they are not counted as unknown.
pub const CHECK_REQUEST_FIELDS: &[u32] = &[1, 2, 3, 4, 5, 6];
/// JSON keys of `v2.CheckRequest` (as [`CHECK_REQUEST_FIELDS`]).
pub const CHECK_REQUEST_KEYS: &[&str] = &[
    "config",
    "assets",
    "hooks",
    "issued",
    "hook_assets",
    "secrets",
];

/// Errors of encoding or decoding a frame or message body.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The payload has no `\n` separating kind and body.
    #[error("frame has no newline after its kind")]
    NoNewline,
    /// The kind before the `\n` is empty or not UTF-8.
    #[error("frame kind is empty or not UTF-8")]
    BadKind,
    /// The protobuf body does not decode.
    #[error("protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// The JSON body does not decode (or could not be encoded).
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A JSON event `id` that is not a UUID string.
    #[error("json: event id is not a UUID")]
    BadId,
    /// An unknown encoding name.
    #[error("unknown encoding {0:?} (use protobuf or json)")]
    UnknownEncoding(String),
    /// A message over [`MAX_MESSAGE`].
    #[error("message of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Refuses a body or payload over [`MAX_MESSAGE`].
fn within_limit(bytes: &[u8]) -> Result<(), CodecError> {
    if bytes.len() > MAX_MESSAGE {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: MAX_MESSAGE,
        });
    }
    Ok(())
}

/// Body encoding of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Protobuf (`Accept: application/octet-stream`), what real agents use.
    Protobuf,
    /// JSON (no `Accept` header).
    Json,
}

impl Encoding {
    /// The MIME type the backend uses for this encoding.
    pub fn content_type(&self) -> &'static str {
        match self {
            Encoding::Protobuf => "application/octet-stream",
            Encoding::Json => "application/json",
        }
    }

    /// The encoding the backend picks for a request `Accept` header value
    /// (protobuf only for `application/octet-stream`; JSON otherwise).
    pub fn from_accept(accept: Option<&str>) -> Encoding {
        match accept {
            Some(a) if a.contains("application/octet-stream") => Encoding::Protobuf,
            _ => Encoding::Json,
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Encoding::Protobuf => "protobuf",
            Encoding::Json => "json",
        })
    }
}

impl FromStr for Encoding {
    type Err = CodecError;
    fn from_str(s: &str) -> Result<Self, CodecError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "protobuf" | "proto" | "pb" => Ok(Encoding::Protobuf),
            "json" => Ok(Encoding::Json),
            _ => Err(CodecError::UnknownEncoding(s.to_owned())),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Encoding {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One agent message: its kind and its (protobuf or JSON) body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Message type, e.g. [`KIND_CHECK_REQUEST`].
    pub kind: &'a str,
    /// Encoded message.
    pub body: &'a [u8],
}

/// Splits a WebSocket message payload at its first `\n`.
pub fn split_frame(payload: &[u8]) -> Result<Frame<'_>, CodecError> {
    within_limit(payload)?;
    let nl = payload
        .iter()
        .position(|b| *b == b'\n')
        .ok_or(CodecError::NoNewline)?;
    let kind = std::str::from_utf8(&payload[..nl]).map_err(|_| CodecError::BadKind)?;
    if kind.is_empty() {
        return Err(CodecError::BadKind);
    }
    Ok(Frame {
        kind,
        body: &payload[nl + 1..],
    })
}

/// Builds a WebSocket message payload `<kind>\n<body>`.
pub fn encode_frame(kind: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(kind.len() + 1 + body.len());
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(body);
    out
}

/// Encodes an event body (keepalive or event).
pub fn encode_event(ev: &v2::Event, enc: Encoding) -> Result<Vec<u8>, CodecError> {
    match enc {
        Encoding::Protobuf => Ok(ev.encode_to_vec()),
        Encoding::Json => Ok(serde_json::to_vec(&json::JEvent::from(ev))?),
    }
}

/// Decodes an event body (keepalive or event).
pub fn decode_event(body: &[u8], enc: Encoding) -> Result<v2::Event, CodecError> {
    within_limit(body)?;
    match enc {
        Encoding::Protobuf => Ok(v2::Event::decode(body)?),
        Encoding::Json => serde_json::from_slice::<json::JEvent>(body)?
            .into_proto()
            .map_err(|_| CodecError::BadId),
    }
}

/// Encodes a check request body.
pub fn encode_check_request(r: &v2::CheckRequest, enc: Encoding) -> Result<Vec<u8>, CodecError> {
    match enc {
        Encoding::Protobuf => Ok(r.encode_to_vec()),
        Encoding::Json => Ok(serde_json::to_vec(&json::JCheckRequest::from(r))?),
    }
}

/// Decodes a check request body.
pub fn decode_check_request(body: &[u8], enc: Encoding) -> Result<v2::CheckRequest, CodecError> {
    within_limit(body)?;
    match enc {
        Encoding::Protobuf => Ok(v2::CheckRequest::decode(body)?),
        Encoding::Json => Ok(serde_json::from_slice::<json::JCheckRequest>(body)?.into()),
    }
}

/// Encodes an entity config body.
pub fn encode_entity_config(c: &v3::EntityConfig, enc: Encoding) -> Result<Vec<u8>, CodecError> {
    match enc {
        Encoding::Protobuf => Ok(c.encode_to_vec()),
        Encoding::Json => Ok(serde_json::to_vec(&json::JEntityConfig::from(c))?),
    }
}

/// Decodes an entity config body.
pub fn decode_entity_config(body: &[u8], enc: Encoding) -> Result<v3::EntityConfig, CodecError> {
    within_limit(body)?;
    match enc {
        Encoding::Protobuf => Ok(v3::EntityConfig::decode(body)?),
        Encoding::Json => Ok(serde_json::from_slice::<json::JEntityConfig>(body)?.into()),
    }
}

/// Top-level fields (protobuf) or keys (JSON) of a message that this agent
/// does not know: the first one, as `field 9 (wire type 2)` or
/// `key "extra"`, and how many there were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    /// The first unknown field or key, in words.
    pub first: String,
    /// How many top-level fields or keys were unknown.
    pub count: usize,
}

/// Longest key quoted in [`Unknown::first`].
const UNKNOWN_KEY_CHARS: usize = 64;

/// The unknown top-level fields of a backend message of `kind` (only
/// `entity_config` and `check_request` are checked: the messages an agent
/// decodes), `None` when there are none or the kind is another.
///
/// Cost: protobuf reads each top-level key and skips its value (no
/// allocation, tens of nanoseconds for a check request); JSON walks the
/// top-level object a second time with serde's `IgnoredAny` (allocates
/// only escaped keys). Backend messages are rare (one per check interval),
/// and the keepalive path never calls this.
pub fn unknown_fields(kind: &str, body: &[u8], enc: Encoding) -> Option<Unknown> {
    let (fields, keys) = match kind {
        KIND_ENTITY_CONFIG => (ENTITY_CONFIG_FIELDS, ENTITY_CONFIG_KEYS),
        KIND_CHECK_REQUEST => (CHECK_REQUEST_FIELDS, CHECK_REQUEST_KEYS),
        _ => return None,
    };
    match enc {
        Encoding::Protobuf => {
            let (n, wire, count) = agent_sim_proto::scan::unknown_fields(body, fields)?;
            Some(Unknown {
                first: format!("field {n} (wire type {wire})"),
                count,
            })
        }
        Encoding::Json => unknown_json_keys(body, keys),
    }
}

/// A JSON object key, borrowed when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The unknown top-level keys of a JSON object (`None`: none, or not an
/// object).
pub fn unknown_json_keys(body: &[u8], known: &[&str]) -> Option<Unknown> {
    struct Scan<'k> {
        known: &'k [&'k str],
    }
    impl<'de> serde::de::Visitor<'de> for Scan<'_> {
        type Value = Option<Unknown>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Option<Unknown>, A::Error> {
            let mut out: Option<Unknown> = None;
            while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                map.next_value::<serde::de::IgnoredAny>()?;
                if self.known.contains(&k.as_ref()) {
                    continue;
                }
                match &mut out {
                    Some(u) => u.count += 1,
                    None => {
                        let shown: String = k.chars().take(UNKNOWN_KEY_CHARS).collect();
                        out = Some(Unknown {
                            first: format!("key {shown:?}"),
                            count: 1,
                        });
                    }
                }
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    serde::Deserializer::deserialize_map(&mut de, Scan { known })
        .ok()
        .flatten()
}

/// Sensu resource-name rule `\A[\w.\-:]+\z` (ASCII word characters).
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
}

/// The backend's acceptance rules for an agent event (`corev2.Event.Validate`,
/// plus `timestamp != 0` for keepalives). Returns a short snake_case reason.
pub fn validate_event(ev: &v2::Event, is_keepalive: bool) -> Result<(), &'static str> {
    let entity = ev.entity.as_ref().ok_or("missing_entity")?;
    if ev.check.is_none() && ev.metrics.is_none() {
        return Err("missing_check_or_metrics");
    }
    let emeta = entity.metadata.as_ref();
    if !valid_name(emeta.map(|m| m.name.as_str()).unwrap_or("")) {
        return Err("invalid_entity_name");
    }
    if !valid_name(&entity.entity_class) {
        return Err("invalid_entity_class");
    }
    if emeta.map(|m| m.namespace.is_empty()).unwrap_or(true) {
        return Err("missing_namespace");
    }
    if let Some(check) = &ev.check {
        let name = check
            .metadata
            .as_ref()
            .map(|m| m.name.as_str())
            .unwrap_or("");
        if !valid_name(name) {
            return Err("invalid_check_name");
        }
        if check.ttl > 0 {
            if check.ttl <= i64::from(check.interval) {
                return Err("ttl_not_greater_than_interval");
            }
            if check.ttl < 5 {
                return Err("ttl_below_minimum");
            }
        }
    }
    if ev.metadata.as_ref().is_some_and(|m| !m.name.is_empty()) {
        return Err("event_named");
    }
    if !ev.id.is_empty() && ev.id.len() != 16 {
        return Err("invalid_id");
    }
    if is_keepalive && ev.timestamp == 0 {
        return Err("invalid_timestamp");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_at_the_first_newline() {
        let f = split_frame(b"event\n{\"a\":\"x\ny\"}").unwrap();
        assert_eq!(f.kind, "event");
        assert_eq!(f.body, b"{\"a\":\"x\ny\"}");
        assert_eq!(split_frame(b"keepalive\n").unwrap().body, b"");
        assert!(matches!(
            split_frame(b"keepalive"),
            Err(CodecError::NoNewline)
        ));
        assert!(matches!(split_frame(b"\nbody"), Err(CodecError::BadKind)));
        assert_eq!(encode_frame("event", b"xy"), b"event\nxy");
    }

    #[test]
    fn encodings_parse_and_print() {
        assert_eq!("protobuf".parse::<Encoding>().unwrap(), Encoding::Protobuf);
        assert_eq!("JSON".parse::<Encoding>().unwrap(), Encoding::Json);
        assert!("xml".parse::<Encoding>().is_err());
        assert_eq!(Encoding::Json.to_string(), "json");
        assert_eq!(
            Encoding::Protobuf.content_type(),
            "application/octet-stream"
        );
        assert_eq!(
            Encoding::from_accept(Some("application/octet-stream")),
            Encoding::Protobuf
        );
        assert_eq!(Encoding::from_accept(None), Encoding::Json);
    }

    #[test]
    fn names_follow_the_sensu_rule() {
        assert!(valid_name("agent-sim-1"));
        assert!(valid_name("a.b:c_d"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name("a/b"));
    }

    #[test]
    fn validation_reasons() {
        let meta = |n: &str| {
            Some(v2::ObjectMeta {
                name: n.into(),
                namespace: "default".into(),
                ..Default::default()
            })
        };
        let ok = v2::Event {
            timestamp: 1,
            entity: Some(v2::Entity {
                entity_class: "agent".into(),
                metadata: meta("a1"),
                ..Default::default()
            }),
            check: Some(v2::Check {
                interval: 20,
                metadata: meta("keepalive"),
                ..Default::default()
            }),
            id: vec![0; 16],
            ..Default::default()
        };
        assert_eq!(validate_event(&ok, true), Ok(()));
        let mut e = ok.clone();
        e.timestamp = 0;
        assert_eq!(validate_event(&e, true), Err("invalid_timestamp"));
        assert_eq!(validate_event(&e, false), Ok(()));
        let mut e = ok.clone();
        e.check.as_mut().unwrap().ttl = 20;
        assert_eq!(
            validate_event(&e, true),
            Err("ttl_not_greater_than_interval")
        );
        let mut e = ok.clone();
        e.id = vec![1; 3];
        assert_eq!(validate_event(&e, true), Err("invalid_id"));
        let mut e = ok.clone();
        e.entity = None;
        assert_eq!(validate_event(&e, true), Err("missing_entity"));
        let mut e = ok.clone();
        e.check = None;
        assert_eq!(validate_event(&e, true), Err("missing_check_or_metrics"));
        let mut e = ok;
        e.entity.as_mut().unwrap().metadata = meta("bad name");
        assert_eq!(validate_event(&e, true), Err("invalid_entity_name"));
    }
}
