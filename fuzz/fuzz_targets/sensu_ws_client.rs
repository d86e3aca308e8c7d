//! Bytes a backend sends on an agent's socket, read by tungstenite with the
//! session's WebSocket config (message and frame limits), each message then
//! split and decoded as the session does.
#![no_main]

use std::io::Cursor;

use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_sensu::session::ws_config;
use libfuzzer_sys::fuzz_target;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};

fuzz_target!(|bytes: &[u8]| {
    let mut ws =
        WebSocket::from_raw_socket(Cursor::new(bytes.to_vec()), Role::Client, Some(ws_config()));
    for _ in 0..64 {
        let Ok(m) = ws.read() else {
            return;
        };
        let data = m.into_data();
        assert!(data.len() <= codec::MAX_MESSAGE);
        if let Ok(f) = codec::split_frame(&data) {
            for enc in [Encoding::Protobuf, Encoding::Json] {
                let _ = codec::unknown_fields(f.kind, f.body, enc);
                let _ = codec::decode_check_request(f.body, enc);
                let _ = codec::decode_entity_config(f.body, enc);
            }
        }
    }
});
