//! What a Consul agent does with bytes a server sent, without a socket:
//! shared by the property tests (`tests/hostile.rs`, `mod receive`) and the
//! fuzz targets `consul_event`, `consul_grpc_stream` and
//! `consul_http_answer` (`#[path = "../../crates/consul/tests/receive/mod.rs"]`),
//! so that both drive the same code.

#![allow(dead_code)] // each includer (test file, fuzz target) uses a part

use agent_sim_consul::codec::{MAX_EVENT_MESSAGE, SmallCodec, unknown_event_fields};
use agent_sim_consul::conn::{FirstBytes, FirstRead, SNIFF_LEN, what_answered};
use agent_sim_consul::http::{
    self, EntryHead, Expected, HttpError, SessionCreated, SessionEntry, TxnResponse,
};
use agent_sim_consul::view::{View, ViewKind};
use agent_sim_proto::consul::subscribe::Event;
use prost::Message as _;
use tonic::codec::{Codec as _, Streaming};

/// One Subscribe message: the unknown-field scan, prost's `Event` decode,
/// both kinds of view applying it twice (a register after a register, a
/// deregister of what was never there), and the encoder on it.
pub fn event(msg: &[u8]) {
    let _ = unknown_event_fields(msg);
    let Ok(ev) = Event::decode(msg) else {
        return;
    };
    for kind in [ViewKind::Health, ViewKind::Intentions] {
        let mut v = View::new(kind);
        let _ = v.apply(&ev, &mut |_| {});
        let _ = v.apply(&ev, &mut |_| {});
        let _ = v.take_dropped();
        let _ = v.resume_index();
    }
    let _ = ev.encode_to_vec();
}

/// A Subscribe response body of raw bytes through tonic's gRPC framing
/// (5-byte length prefixes) with the agents' decoder and limit: the events
/// decoded, and the status that ended the stream (a body without trailers
/// ends with "missing grpc-status trailer").
pub fn stream(body: Vec<u8>) -> (Vec<Event>, tonic::Status) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let body = http_body_util::Full::new(bytes::Bytes::from(body));
        let mut s = Streaming::new_response(
            SmallCodec::default().decoder(),
            body,
            ::http::StatusCode::OK,
            None,
            Some(MAX_EVENT_MESSAGE),
        );
        let mut out = Vec::new();
        loop {
            match s.message().await {
                Ok(Some(ev)) => out.push(ev),
                Ok(None) => return (out, tonic::Status::ok("")),
                Err(e) => return (out, e),
            }
        }
    })
}

/// The first bytes a server sent on a connection that failed: what
/// answered (`conn::what_answered`), if it can be named.
pub fn first_bytes(b: &[u8]) -> Option<(&'static str, String)> {
    let first = FirstBytes::default();
    let _ = first.set(FirstRead::Bytes(b[..b.len().min(SNIFF_LEN)].into()));
    what_answered(&first)
}

/// An HTTP API answer as agents (and `agent-sim cleanup`) parse it:
/// `true`/`false`, a node's services, session create/renew, txn errors, a
/// config entry's head, the leader string, the error kind and words.
pub fn http_answer(body: &[u8]) {
    let _ = http::parse_bool(body);
    let expected = [Expected {
        id: "app-1-0".into(),
        service: "app".into(),
        port: 8080,
    }];
    let _ = http::node_in_sync(body, "10.0.0.1", &expected);
    let _ = serde_json::from_slice::<SessionCreated>(body);
    let _ = serde_json::from_slice::<Vec<SessionEntry>>(body);
    let _ = serde_json::from_slice::<TxnResponse>(body);
    let _ = serde_json::from_slice::<EntryHead>(body);
    let _ = serde_json::from_slice::<String>(body);
    for status in [409, 500] {
        let _ = http::answer_kind(status, body);
    }
    let e = HttpError {
        kind: "http_5xx",
        status: Some(500),
        body: bytes::Bytes::copy_from_slice(body),
        detail: None,
    };
    let _ = e.words();
}
