//! A gossip packet as a simulated member receives it: every layer (label,
//! encryption, CRC, compression, compound), every message decoder, and
//! the shared view taking in what decoded. The same code as the property
//! tests (`crates/gossip/tests/hostile.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/gossip/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|bytes: &[u8]| receive::packet(bytes));
