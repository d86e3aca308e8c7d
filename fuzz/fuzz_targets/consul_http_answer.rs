//! An HTTP API answer as a Consul agent (and `agent-sim cleanup`) parses
//! it: `true`/`false`, a node's services, session create/renew, txn errors,
//! a config entry's head, the leader string, the error kind and words.
#![no_main]

use agent_sim_consul::http::{
    self, EntryHead, Expected, HttpError, SessionCreated, SessionEntry, TxnResponse,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let _ = http::parse_bool(body);
    let expected = [Expected {
        id: "app-1-0".into(),
        service: "app".into(),
        port: 8080,
    }];
    let _ = http::node_in_sync(body, "10.0.0.1", &expected);
    let _ = serde_json_from::<SessionCreated>(body);
    let _ = serde_json_from::<Vec<SessionEntry>>(body);
    let _ = serde_json_from::<TxnResponse>(body);
    let _ = serde_json_from::<EntryHead>(body);
    let _ = serde_json_from::<String>(body);
    let _ = http::answer_kind(409, body);
    let e = HttpError {
        kind: "http_5xx",
        status: Some(500),
        body: bytes::Bytes::copy_from_slice(body),
        detail: None,
    };
    let _ = e.words();
});

fn serde_json_from<T: for<'de> serde::Deserialize<'de>>(b: &[u8]) -> Option<T> {
    serde_json::from_slice(b).ok()
}
