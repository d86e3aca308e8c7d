//! What an agent sent, decided on its bytes alone: a keepalive, an event, or
//! an invalid frame with the reason the backend gives. Pure (no socket, no
//! state), so property tests and the `sensu_server_frame` fuzz target drive
//! exactly what a session runs on every data message.

use agent_sim_proto::sensu::v2;
use agent_sim_sensu::codec::{self, Encoding};

/// One data message from an agent.
#[derive(Debug)]
pub enum Inbound {
    /// A valid keepalive (frame kind `keepalive`, or an event of the
    /// `keepalive` check).
    Keepalive(v2::Event),
    /// A valid event (check result or metrics).
    Event(v2::Event),
    /// Not a frame, an unknown kind, or a body that does not decode
    /// (`frames_invalid`).
    Invalid,
    /// Decoded but refused by the backend's rules (the reason is counted).
    Rejected(&'static str),
}

/// Decides what `payload` (one WebSocket message, `<kind>\n<body>`) is.
/// A payload over [`codec::MAX_MESSAGE`] is `Invalid` without decoding.
pub fn classify(payload: &[u8], enc: Encoding) -> Inbound {
    let Ok(frame) = codec::split_frame(payload) else {
        return Inbound::Invalid;
    };
    let keepalive_frame = match frame.kind {
        codec::KIND_KEEPALIVE => true,
        codec::KIND_EVENT => false,
        _ => return Inbound::Invalid,
    };
    let Ok(event) = codec::decode_event(frame.body, enc) else {
        return Inbound::Invalid;
    };
    let check_name = event
        .check
        .as_ref()
        .and_then(|c| c.metadata.as_ref())
        .map_or("", |m| m.name.as_str());
    let is_keepalive = keepalive_frame || check_name == "keepalive";
    if let Err(reason) = codec::validate_event(&event, is_keepalive) {
        return Inbound::Rejected(reason);
    }
    if is_keepalive {
        Inbound::Keepalive(event)
    } else {
        Inbound::Event(event)
    }
}
