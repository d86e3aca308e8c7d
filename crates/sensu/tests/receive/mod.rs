//! What a Sensu agent does with bytes a backend sent, without a socket:
//! shared by the property tests (`tests/hostile.rs`, `mod receive`) and the
//! fuzz targets `sensu_message` and `sensu_ws_client`
//! (`#[path = "../../crates/sensu/tests/receive/mod.rs"]`), so that both
//! drive the same code.

#![allow(dead_code)] // each includer (test file, fuzz target) uses a part

use std::io::Cursor;
use std::sync::Arc;

use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_sensu::messages::{MessageBuilder, Templates, agent_name};
use agent_sim_sensu::session::ws_config;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};

/// One agent's message builder for `enc`.
pub fn builder(enc: Encoding) -> MessageBuilder {
    let cfg = agent_sim_sensu::SensuConfig {
        encoding: enc,
        ..Default::default()
    };
    MessageBuilder::new(Arc::new(Templates::new(&cfg)), agent_name("a", 1), 1)
}

/// One message payload: the `<kind>\n<body>` split, the unknown-field scan
/// and every body decoder, in both encodings; then what the agent builds
/// from what it decoded (the check reply, keepalives carrying the entity
/// config) and the encoders on it.
pub fn message(payload: &[u8]) {
    let Ok(f) = codec::split_frame(payload) else {
        return;
    };
    for enc in [Encoding::Protobuf, Encoding::Json] {
        let _ = codec::unknown_fields(f.kind, f.body, enc);
        let _ = codec::unknown_fields(codec::KIND_CHECK_REQUEST, f.body, enc);
        let _ = codec::unknown_fields(codec::KIND_ENTITY_CONFIG, f.body, enc);
        let mut b = builder(enc);
        let mut out = Vec::new();
        if let Ok(r) = codec::decode_check_request(f.body, enc) {
            let _ = codec::encode_check_request(&r, enc);
            let check = b.check_result(&r, 1);
            let _ = b.write_event_frame(&mut out, check, 1, [1; 16], 1);
        }
        if let Ok(ec) = codec::decode_entity_config(f.body, enc) {
            b.apply_entity_config(ec);
            let _ = b.write_keepalive_frame(&mut out, 1, [2; 16], 1);
        }
        if let Ok(ev) = codec::decode_event(f.body, enc) {
            let _ = codec::validate_event(&ev, true);
            let _ = codec::encode_event(&ev, enc);
        }
    }
}

/// Raw socket bytes read by tungstenite with the session's WebSocket config
/// (its message and frame limits), each message then handled as
/// [`message`]; at most 64 messages.
pub fn socket(bytes: &[u8]) {
    let mut ws =
        WebSocket::from_raw_socket(Cursor::new(bytes.to_vec()), Role::Client, Some(ws_config()));
    for _ in 0..64 {
        match ws.read() {
            Ok(Message::Binary(b)) => {
                assert!(b.len() <= codec::MAX_MESSAGE);
                message(&b);
            }
            Ok(Message::Text(t)) => assert!(t.len() <= codec::MAX_MESSAGE),
            Ok(_) => {}
            Err(_) => return,
        }
    }
}
