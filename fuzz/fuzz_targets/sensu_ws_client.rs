//! Bytes a backend sends on an agent's socket, read by tungstenite with the
//! session's WebSocket config (message and frame limits), each message then
//! handled as the session does. The same code as the property tests
//! (`crates/sensu/tests/receive`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/sensu/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|bytes: &[u8]| receive::socket(bytes));
