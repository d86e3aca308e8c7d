//! Bytes an agent sends the embedded Sensu endpoint: as one payload, and
//! through tungstenite in server role with the endpoint's config; each
//! message then `inbound::classify` (decode and validate a keepalive or
//! event) in both encodings. The same code as the property tests
//! (`crates/server/tests/receive`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/server/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|bytes: &[u8]| {
    receive::agent_message(bytes);
    receive::endpoint_socket(bytes);
});
