//! Sessions as a client agent forwards them: `Session.Apply` (create,
//! destroy) and `Session.Renew`, written as Consul 1.20's agent writes
//! them, and their answers.

use std::borrow::Cow;

use agent_sim_proto::msgpack::Writer;
use serde::Deserialize;

use super::{MsgpackError, request_header};

/// `Session.Apply` (create or destroy).
pub const APPLY: &str = "Session.Apply";
/// `Session.Renew`.
pub const RENEW: &str = "Session.Renew";

/// The agent's default lock delay (15 s in nanoseconds).
pub const LOCK_DELAY_NS: u64 = 15_000_000_000;

/// A session to create.
#[derive(Debug, Clone, Copy)]
pub struct NewSession<'a> {
    /// Datacenter (empty: the server's own).
    pub datacenter: &'a str,
    /// The agent's node.
    pub node: &'a str,
    /// Session name.
    pub name: &'a str,
    /// TTL as Consul writes it (`"30s"`).
    pub ttl: &'a str,
    /// `release` or `delete`.
    pub behavior: &'a str,
    /// Node checks the session is bound to (a client agent's default is
    /// `serfHealth`; a node that is no gossip member has none).
    pub node_checks: &'a [&'a str],
    /// ACL token.
    pub token: &'a str,
}

/// `Session.Apply` with op `create`: the answer is the new session's ID.
pub fn encode_create(seq: u64, s: &NewSession<'_>, out: &mut Vec<u8>) {
    request_header(out, seq, APPLY);
    let mut w = Writer(out);
    w.map(4)
        .kv_str("Datacenter", s.datacenter)
        .kv_str("Op", "create");
    w.str("Session").map(11);
    w.kv_str("Behavior", s.behavior).kv_nil("Checks");
    w.kv_uint("CreateIndex", 0).kv_str("ID", "");
    w.kv_uint("LockDelay", LOCK_DELAY_NS)
        .kv_uint("ModifyIndex", 0);
    w.kv_str("Name", s.name).kv_str("Node", s.node);
    w.str("NodeChecks").array(s.node_checks.len() as u32);
    for c in s.node_checks {
        w.str(c);
    }
    w.kv_nil("ServiceChecks").kv_str("TTL", s.ttl);
    w.kv_str("Token", s.token);
}

/// `Session.Apply` with op `destroy` of session `id`.
pub fn encode_destroy(seq: u64, datacenter: &str, id: &str, token: &str, out: &mut Vec<u8>) {
    request_header(out, seq, APPLY);
    let mut w = Writer(out);
    w.map(4)
        .kv_str("Datacenter", datacenter)
        .kv_str("Op", "destroy");
    w.str("Session").map(11);
    w.kv_str("Behavior", "").kv_nil("Checks");
    w.kv_uint("CreateIndex", 0).kv_str("ID", id);
    w.zeros(&["LockDelay", "ModifyIndex"]);
    w.empties(&["Name", "Node"]);
    w.kv_nil("NodeChecks")
        .kv_nil("ServiceChecks")
        .kv_str("TTL", "");
    w.kv_str("Token", token);
}

/// `Session.Renew` of session `id` (a consistent read: the leader resets
/// its timer).
pub fn encode_renew(seq: u64, datacenter: &str, id: &str, token: &str, out: &mut Vec<u8>) {
    request_header(out, seq, RENEW);
    let mut w = Writer(out);
    // SessionSpecificRequest: 15 fields with QueryOptions flattened; the
    // ID twice (`Session` is the deprecated name of `SessionID`).
    w.map(15);
    w.falses(&["AllowNotModifiedResponse", "AllowStale"]);
    w.kv_str("Datacenter", datacenter).kv_str("Filter", "");
    w.zeros(&[
        "MaxAge",
        "MaxQueryTime",
        "MaxStaleDuration",
        "MinQueryIndex",
    ]);
    w.falses(&["MustRevalidate", "RequireConsistent"]);
    w.kv_str("Session", id).kv_str("SessionID", id);
    w.kv_uint("StaleIfError", 0).kv_str("Token", token);
    w.kv_bool("UseCache", false);
}

/// Decodes `Session.Apply`'s answer: the session's ID (empty for a destroy).
pub fn decode_apply(body: &[u8]) -> Result<Cow<'_, str>, MsgpackError> {
    agent_sim_proto::msgpack::decode_as("Session.Apply", body)
}

#[derive(Deserialize)]
struct SessionRef<'a> {
    #[serde(rename = "ID", borrow, default)]
    _id: Cow<'a, str>,
}

#[derive(Deserialize)]
struct IndexedSessions<'a> {
    #[serde(rename = "Sessions", borrow, default)]
    sessions: Option<Vec<SessionRef<'a>>>,
}

/// Decodes `Session.Renew`'s answer: whether the session still exists (an
/// expired or destroyed one comes back as no session, not an error).
pub fn decode_renew(body: &[u8]) -> Result<bool, MsgpackError> {
    let r: IndexedSessions<'_> = agent_sim_proto::msgpack::decode_as("Session.Renew", body)?;
    Ok(r.sessions.is_some_and(|s| !s.is_empty()))
}
