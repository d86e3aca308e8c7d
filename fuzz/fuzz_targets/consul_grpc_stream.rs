//! A Subscribe response body as a server streams it: tonic's gRPC framing
//! (5-byte length prefixes) with the agents' decoder and message limit; and
//! the same bytes as the first bytes a server sent on a connection that
//! failed (`conn::what_answered`). The same code as the property tests
//! (`crates/consul/tests/receive`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/consul/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|body: &[u8]| {
    let _ = receive::first_bytes(body);
    let _ = receive::stream(body.to_vec());
});
