//! One backend message as a Sensu agent receives it: the `<kind>\n<body>`
//! split, the unknown-field scan and every body decoder, in both encodings,
//! then what the agent builds from it (a check reply, keepalives carrying
//! the entity config). The same code as the property tests
//! (`crates/sensu/tests/receive`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/sensu/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|payload: &[u8]| receive::message(payload));
