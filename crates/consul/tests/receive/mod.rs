//! What a Consul agent does with bytes a server sent, without a socket:
//! shared by the property tests (`tests/hostile.rs`, `mod receive`) and the
//! fuzz targets `consul_event`, `consul_grpc_stream` (a Subscribe body, and
//! raw bytes as a server's on the agent's HTTP/2 connection) and
//! `consul_http_answer` (`#[path = "../../crates/consul/tests/receive/mod.rs"]`),
//! so that both drive the same code.

#![allow(dead_code)] // each includer (test file, fuzz target) uses a part

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use agent_sim_consul::codec::{
    MAX_EVENT_MESSAGE, SUBSCRIBE_PATH, decode_event, unknown_event_fields,
};
use agent_sim_consul::conn::{FirstBytes, FirstRead, SNIFF_LEN, what_answered};
use agent_sim_consul::h2::{Conn, ConnError, Got, Keepalive, frame, hpack};
use agent_sim_consul::http::{
    self, EntryHead, Expected, HttpError, SessionCreated, SessionEntry, TxnResponse,
};
use agent_sim_consul::view::{View, ViewKind};
use agent_sim_proto::consul::subscribe::Event;
use prost::Message as _;

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

/// A Subscribe response body (gRPC's 5-byte-prefixed messages) as a server
/// sends it on the agent's HTTP/2 connection: the response's headers, the
/// body in DATA frames of at most 16 KiB, the last ending the stream (no
/// trailers). What [`connection`] makes of it.
pub fn stream(body: Vec<u8>) -> (Vec<Event>, Ended) {
    let mut raw = Vec::new();
    frame::put_head(&mut raw, 1, frame::HEADERS, frame::END_HEADERS, 1);
    hpack::put_indexed(&mut raw, 8); // :status 200
    let chunks: Vec<&[u8]> = body.chunks(frame::MAX_FRAME).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let flags = if last { frame::END_STREAM } else { 0 };
        frame::put_head(&mut raw, c.len(), frame::DATA, flags, 1);
        raw.extend_from_slice(c);
    }
    connection(raw, usize::MAX)
}

/// How a [`connection`] ended: the call's status, if the call ended, and
/// the connection's end.
#[derive(Debug)]
pub struct Ended {
    /// How the call ended (`None`: still open when the connection closed).
    pub call: Option<tonic::Status>,
    /// How the connection ended.
    pub conn: ConnError,
}

/// Bytes a server sent on an agent's streaming connection after the
/// agent's Subscribe call (stream 1) went out, read `chunk` octets at a
/// time: the events decoded (as the agent decodes them, until a message
/// fails to decode) and how the call and the connection ended.
pub fn connection(raw: Vec<u8>, chunk: usize) -> (Vec<Event>, Ended) {
    let io = Script {
        input: raw,
        at: 0,
        chunk: chunk.max(1),
    };
    let keepalive = Keepalive {
        interval: Duration::from_secs(30),
        timeout: Duration::from_secs(10),
    };
    let mut conn = Conn::new(io, "127.0.0.1:8300", keepalive, MAX_EVENT_MESSAGE);
    conn.start(0, SUBSCRIBE_PATH, |w| w.extend_from_slice(b"request"));
    let mut cx = Context::from_waker(Waker::noop());
    let (mut events, mut call) = (Vec::new(), None);
    loop {
        let got = match conn.poll_next(&mut cx, &mut |_, m| decode_event(m, None)) {
            Poll::Ready(got) => got,
            Poll::Pending => unreachable!("the script never waits"),
        };
        match got {
            Got::Message(_, Ok(ev)) if call.is_none() => events.push(ev),
            Got::Message(_, Err(status)) if call.is_none() => {
                conn.cancel(0);
                call = Some(status);
            }
            Got::Ended(_, status) => call = call.or(Some(status)),
            Got::Started(_) | Got::Message(..) => {}
            Got::Closed(conn) => return (events, Ended { call, conn }),
        }
    }
}

/// A server's bytes, read a chunk at a time; what the client writes is
/// dropped.
struct Script {
    input: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl tokio::io::AsyncRead for Script {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self
            .chunk
            .min(buf.remaining())
            .min(self.input.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.input[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Script {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
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
