//! What a Consul agent does with bytes a server sent, without a socket:
//! shared by the property tests (`tests/hostile.rs`, `mod receive`) and the
//! fuzz targets `consul_event`, `consul_grpc_stream` (a Subscribe body, raw
//! bytes as a server's on the agent's HTTP/2 connection, and the same on a
//! sidecar's bidirectional call, [`bidi`]) and
//! `consul_http_answer` (`#[path = "../../crates/consul/tests/receive/mod.rs"]`),
//! so that both drive the same code.

#![allow(dead_code)] // each includer (test file, fuzz target) uses a part

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
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
        written: None,
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

/// What a client did on a bidirectional call ([`bidi`]).
#[derive(Debug)]
pub struct Bidi {
    /// Messages the server's bytes delivered on the call.
    pub messages: usize,
    /// How the call and the connection ended.
    pub ended: Ended,
    /// Octets of request DATA the client wrote on the call (gRPC prefixes
    /// included).
    pub sent: usize,
    /// Whether a DATA frame the client wrote was over 16 KiB.
    pub oversized_frame: bool,
}

/// Bytes a server sent on a sidecar's gRPC connection, read `chunk` octets
/// at a time, after the sidecar opened a bidirectional call (stream 1, with
/// a token as metadata) and sent the first of `requests` (their sizes), one
/// more after each message the server sent (as a sidecar ACKs): what the
/// client delivered and wrote. The server's SETTINGS, WINDOW_UPDATEs and
/// resets in `raw` decide when requests may go out.
pub fn bidi(raw: Vec<u8>, chunk: usize, requests: &[usize]) -> Bidi {
    let written = Rc::new(RefCell::new(Vec::new()));
    let io = Script {
        input: raw,
        at: 0,
        chunk: chunk.max(1),
        written: Some(written.clone()),
    };
    let keepalive = Keepalive {
        interval: Duration::from_secs(30),
        timeout: Duration::from_secs(10),
    };
    let mut conn = Conn::new(io, "127.0.0.1:8502", keepalive, MAX_EVENT_MESSAGE);
    let path = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
    conn.open(0, path, &[("x-consul-token", "a-token")]);
    let mut next = requests.iter();
    let mut send = |conn: &mut Conn<Script>| {
        if let Some(&n) = next.next() {
            conn.send(0, |w| w.resize(w.len() + n, 0x5a));
        }
    };
    send(&mut conn);
    let mut cx = Context::from_waker(Waker::noop());
    let (mut messages, mut call) = (0, None);
    let conn_end = loop {
        let got = match conn.poll_next(&mut cx, &mut |_, m| m.len()) {
            Poll::Ready(got) => got,
            Poll::Pending => unreachable!("the script never waits"),
        };
        match got {
            Got::Message(..) => {
                messages += 1;
                send(&mut conn);
            }
            Got::Ended(_, status) => call = call.or(Some(status)),
            Got::Started(_) => {}
            Got::Closed(e) => break e,
        }
    };
    let (sent, oversized_frame) = data_written(&written.borrow(), 1);
    Bidi {
        messages,
        ended: Ended {
            call,
            conn: conn_end,
        },
        sent,
        oversized_frame,
    }
}

/// Octets of DATA a client wrote on `stream` (its frames after the
/// preface), and whether one frame was over 16 KiB.
fn data_written(out: &[u8], stream: u32) -> (usize, bool) {
    let mut b = out.strip_prefix(frame::PREFACE).unwrap_or_default();
    let (mut sum, mut over) = (0, false);
    while let Some(h) = frame::head(b) {
        if h.kind == frame::DATA && h.stream == stream {
            sum += h.len;
            over |= h.len > frame::MAX_FRAME;
        }
        b = b.get(9 + h.len..).unwrap_or_default();
    }
    (sum, over)
}

/// A server's bytes, read a chunk at a time; what the client writes is
/// kept when `written` is given, else dropped.
struct Script {
    input: Vec<u8>,
    at: usize,
    chunk: usize,
    written: Option<Rc<RefCell<Vec<u8>>>>,
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
        if let Some(w) = &self.written {
            w.borrow_mut().extend_from_slice(b);
        }
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
