//! One Subscribe message as a Consul agent receives it: the unknown-field
//! scan, prost's `Event` decode, and both kinds of view applying it (twice:
//! a register after a register, a deregister of what was never there). The
//! same code as the property tests (`crates/consul/tests/receive`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/consul/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|msg: &[u8]| receive::event(msg));
