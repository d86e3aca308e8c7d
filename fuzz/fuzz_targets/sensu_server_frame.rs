//! Bytes an agent sends the embedded Sensu endpoint: tungstenite in server
//! role with the endpoint's config, then `inbound::classify` (decode and
//! validate a keepalive or event) in both encodings.
#![no_main]

use std::io::Cursor;

use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_server::sensu::{inbound, ws_config};
use libfuzzer_sys::fuzz_target;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};

fuzz_target!(|bytes: &[u8]| {
    // The bytes as one payload, and as a stream of masked client frames.
    for enc in [Encoding::Protobuf, Encoding::Json] {
        let _ = inbound::classify(bytes, enc);
    }
    let mut ws =
        WebSocket::from_raw_socket(Cursor::new(bytes.to_vec()), Role::Server, Some(ws_config()));
    for _ in 0..64 {
        let Ok(m) = ws.read() else {
            return;
        };
        let data = m.into_data();
        assert!(data.len() <= codec::MAX_MESSAGE);
        let _ = inbound::classify(&data, Encoding::Protobuf);
    }
});
