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
//! The JSON form lives in `json.rs`; the session (socket, timers) in `session.rs`.

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
    match enc {
        Encoding::Protobuf => Ok(v3::EntityConfig::decode(body)?),
        Encoding::Json => Ok(serde_json::from_slice::<json::JEntityConfig>(body)?.into()),
    }
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
