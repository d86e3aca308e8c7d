//! Requests a client sends the embedded Consul HTTP API: the first byte
//! picks a write route, the rest is the body; each input runs against a
//! catalog that already holds a node, a service and a session, then every
//! read route answers. Also decodes the bytes as a SubscribeRequest. The
//! same code as the property tests (`crates/server/tests/receive`).
#![no_main]

use agent_sim_proto::consul::subscribe::SubscribeRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

#[path = "../../crates/server/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|data: &[u8]| {
    let _ = SubscribeRequest::decode(data);
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    // A fresh catalog per input keeps runs independent (and bounded).
    receive::write_then_read(&receive::seeded(), pick as usize, body);
});
