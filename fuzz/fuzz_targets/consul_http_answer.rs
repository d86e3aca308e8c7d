//! An HTTP API answer as a Consul agent (and `agent-sim cleanup`) parses
//! it: `true`/`false`, a node's services, session create/renew, txn errors,
//! a config entry's head, the leader string, the error kind and words. The
//! same code as the property tests (`crates/consul/tests/receive`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/consul/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|body: &[u8]| receive::http_answer(body));
