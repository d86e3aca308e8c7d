//! The client against a scripted server on an in-memory pipe: the frames
//! it writes, and what it makes of the frames a gRPC server sends.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tonic::Code;

use super::frame::{self, Head};
use super::hpack::{self, put_field, put_indexed};
use super::{Conn, ConnError, Got, Keepalive};

const PATH: &str = "/subscribe.StateChangeSubscription/Subscribe";
const KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(30),
    timeout: Duration::from_secs(10),
};

/// The server's end: frames out, the client's frames in.
struct Server {
    io: DuplexStream,
    hpack: hpack::Decoder,
}

impl Server {
    async fn send(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        let mut out = Vec::new();
        f(&mut out);
        self.io.write_all(&out).await.unwrap();
    }

    async fn frame(&mut self) -> (Head, Vec<u8>) {
        let mut h = [0u8; 9];
        self.io.read_exact(&mut h).await.unwrap();
        let h = frame::head(&h).unwrap();
        let mut p = vec![0; h.len];
        self.io.read_exact(&mut p).await.unwrap();
        (h, p)
    }

    /// The next frame of `kind`, skipping others (settings, acks).
    async fn next_of(&mut self, kind: u8) -> (Head, Vec<u8>) {
        loop {
            let (h, p) = self.frame().await;
            if h.kind == kind {
                return (h, p);
            }
        }
    }

    fn fields(&mut self, block: &[u8]) -> Vec<(String, String)> {
        let mut v = Vec::new();
        self.hpack
            .decode(block, |n, val| {
                v.push((
                    String::from_utf8_lossy(n).into(),
                    String::from_utf8_lossy(val).into(),
                ))
            })
            .unwrap();
        v
    }
}

fn headers(out: &mut Vec<u8>, stream: u32, end_stream: bool, block: &[u8]) {
    let flags = frame::END_HEADERS | if end_stream { frame::END_STREAM } else { 0 };
    frame::put_head(out, block.len(), frame::HEADERS, flags, stream);
    out.extend_from_slice(block);
}

/// `:status 200` and a Huffman-coded `content-type`, indexed into the
/// table as grpc-go's encoder does.
fn response_block() -> Vec<u8> {
    let mut b = Vec::new();
    put_indexed(&mut b, 8);
    let coded = super::huffman::encode(b"application/grpc");
    hpack::put_integer(&mut b, 0x40, 6, 31);
    hpack::put_integer(&mut b, 0x80, 7, coded.len());
    b.extend_from_slice(&coded);
    b
}

fn trailers_block(status: u32, message: &str) -> Vec<u8> {
    let mut b = Vec::new();
    put_field(&mut b, 0, "grpc-status", &status.to_string());
    if !message.is_empty() {
        put_field(&mut b, 0, "grpc-message", message);
    }
    b
}

fn message(out: &mut Vec<u8>, body: &[u8]) {
    out.push(0);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
}

fn data(out: &mut Vec<u8>, stream: u32, end_stream: bool, payload: &[u8]) {
    let flags = if end_stream { frame::END_STREAM } else { 0 };
    frame::put_head(out, payload.len(), frame::DATA, flags, stream);
    out.extend_from_slice(payload);
}

/// A client that has sent a call tagged 5 (stream 1), and the server
/// having read its preface.
async fn pair() -> (Conn<DuplexStream>, Server) {
    let (mut conn, server) = connected("127.0.0.1:8300", 1024).await;
    conn.start(5, PATH, |w| w.extend_from_slice(b"request"));
    (conn, server)
}

/// A client with no call yet (messages up to `max_message`), the server
/// having read its preface.
async fn connected(authority: &str, max_message: usize) -> (Conn<DuplexStream>, Server) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut conn = Conn::new(a, authority, KEEPALIVE, max_message);
    conn.handshake().await.unwrap();
    let mut server = Server {
        io: b,
        hpack: hpack::Decoder::default(),
    };
    let mut preface = vec![0; frame::PREFACE.len()];
    server.io.read_exact(&mut preface).await.unwrap();
    assert_eq!(preface, frame::PREFACE);
    (conn, server)
}

async fn next(conn: &mut Conn<DuplexStream>) -> Got<Vec<u8>> {
    std::future::poll_fn(|cx| conn.poll_next(cx, &mut |_, m: &[u8]| m.to_vec())).await
}

#[tokio::test]
async fn a_call_goes_out_as_grpc_asks() {
    let (mut conn, mut server) = pair().await;
    // The settings: no header table, no push, a 16 KiB header list.
    let (h, p) = server.frame().await;
    assert_eq!((h.kind, h.stream), (frame::SETTINGS, 0));
    assert_eq!(p, [0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 6, 0, 0, 0x40, 0]);
    // Nothing is written before the connection is polled.
    server
        .send(|o| frame::put_ping(o, false, *b"12345678"))
        .await;
    tokio::select! {
        _ = next(&mut conn) => unreachable!("nothing to tell"),
        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
    let (h, block) = server.frame().await;
    assert_eq!(h.kind, frame::HEADERS);
    assert_eq!((h.stream, h.flags), (1, frame::END_HEADERS));
    let f = server.fields(&block);
    let want = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", "127.0.0.1:8300"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", super::USER_AGENT),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(f, want);
    let (h, p) = server.frame().await;
    assert_eq!(
        (h.kind, h.flags, h.stream),
        (frame::DATA, frame::END_STREAM, 1)
    );
    assert_eq!(p, b"\0\0\0\0\x07request");
    // The server's ping is answered with its payload.
    let (h, p) = server.next_of(frame::PING).await;
    assert_eq!((h.flags, &p[..]), (frame::ACK, &b"12345678"[..]));
}

#[tokio::test]
async fn messages_are_split_from_frames_and_the_trailers_end_the_call() {
    let (mut conn, mut server) = pair().await;
    server
        .send(|o| {
            frame::put_settings(o, &[(0x3, 100)]);
            headers(o, 1, false, &response_block());
            // Two messages in one frame, then one over three frames
            // (its prefix split too), one of them padded.
            let mut two = Vec::new();
            message(&mut two, b"first");
            message(&mut two, b"second");
            data(o, 1, false, &two);
            let mut big = Vec::new();
            message(&mut big, &[7u8; 300]);
            data(o, 1, false, &big[..3]);
            frame::put_head(o, 1 + 100 + 4, frame::DATA, frame::PADDED, 1);
            o.push(4);
            o.extend_from_slice(&big[3..103]);
            o.extend_from_slice(&[0; 4]);
            data(o, 1, false, &big[103..]);
            headers(o, 1, true, &trailers_block(0, ""));
        })
        .await;
    assert!(matches!(next(&mut conn).await, Got::Started(5)));
    assert!(matches!(next(&mut conn).await, Got::Message(5, m) if m == b"first"));
    assert!(matches!(next(&mut conn).await, Got::Message(5, m) if m == b"second"));
    assert!(matches!(next(&mut conn).await, Got::Message(5, m) if m == [7u8; 300]));
    match next(&mut conn).await {
        Got::Ended(5, s) => assert_eq!(s.code(), Code::Ok),
        other => panic!("{other:?}"),
    }
    // The server's settings were acknowledged.
    let (h, _) = server.next_of(frame::SETTINGS).await;
    assert_eq!(h.flags & frame::ACK, 0);
    let (h, _) = server.next_of(frame::SETTINGS).await;
    assert_eq!(h.flags, frame::ACK);
    // All read and handled: no buffer is kept.
    tokio::select! {
        _ = next(&mut conn) => unreachable!(),
        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
    assert_eq!(conn.held(), 0);
}

#[tokio::test]
async fn reading_a_quarter_window_opens_it_again() {
    let (mut conn, mut server) = pair().await;
    let body = vec![1u8; 1000];
    server
        .send(|o| {
            headers(o, 1, false, &response_block());
            for _ in 0..17 {
                let mut m = Vec::new();
                message(&mut m, &body);
                data(o, 1, false, &m);
            }
        })
        .await;
    assert!(matches!(next(&mut conn).await, Got::Started(5)));
    for _ in 0..17 {
        assert!(matches!(next(&mut conn).await, Got::Message(5, _)));
    }
    tokio::select! {
        _ = next(&mut conn) => unreachable!(),
        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
    let (h, p) = server.next_of(frame::WINDOW_UPDATE).await;
    assert_eq!(h.stream, 0);
    assert_eq!(u32::from_be_bytes(p[..].try_into().unwrap()), 17 * 1005);
    let (h, _) = server.next_of(frame::WINDOW_UPDATE).await;
    assert_eq!(h.stream, 1);
}

#[tokio::test]
async fn a_refusal_in_trailers_only_and_a_reset_end_their_calls() {
    let (mut conn, mut server) = pair().await;
    conn.start(6, PATH, |_| {});
    server
        .send(|o| {
            let mut b = Vec::new();
            put_indexed(&mut b, 8);
            b.extend(trailers_block(7, "Permission%20denied: token %22x%22"));
            headers(o, 1, true, &b);
            frame::put_word(o, frame::RST_STREAM, 3, 0x7);
        })
        .await;
    match next(&mut conn).await {
        Got::Ended(5, s) => {
            assert_eq!(s.code(), Code::PermissionDenied);
            assert_eq!(s.message(), "Permission denied: token \"x\"");
            assert!(std::error::Error::source(&s).is_none(), "an answer");
        }
        other => panic!("{other:?}"),
    }
    match next(&mut conn).await {
        Got::Ended(6, s) => {
            assert_eq!(s.code(), Code::Unavailable);
            assert!(std::error::Error::source(&s).is_some(), "a reset");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_oversized_message_ends_its_call_and_resets_the_stream() {
    let (mut conn, mut server) = pair().await;
    server
        .send(|o| {
            headers(o, 1, false, &response_block());
            data(o, 1, false, &[0, 0, 0, 0x10, 0]);
        })
        .await;
    assert!(matches!(next(&mut conn).await, Got::Started(5)));
    match next(&mut conn).await {
        Got::Ended(5, s) => {
            assert_eq!(s.code(), Code::OutOfRange);
            assert!(s.message().contains("message length too large"), "{s:?}");
        }
        other => panic!("{other:?}"),
    }
    tokio::select! {
        _ = next(&mut conn) => unreachable!(),
        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
    let (h, p) = server.next_of(frame::RST_STREAM).await;
    assert_eq!((h.stream, &p[..]), (1, &[0, 0, 0, 8][..]));
}

#[tokio::test]
async fn goaway_refuses_later_calls_and_names_the_cause_at_the_close() {
    let (mut conn, mut server) = pair().await;
    conn.start(6, PATH, |_| {});
    server
        .send(|o| {
            frame::put_head(o, 8 + 14, frame::GOAWAY, 0, 0);
            o.extend_from_slice(&1u32.to_be_bytes());
            o.extend_from_slice(&0xbu32.to_be_bytes());
            o.extend_from_slice(b"too_many_pings");
        })
        .await;
    match next(&mut conn).await {
        Got::Ended(6, s) => assert_eq!(s.code(), Code::Unavailable),
        other => panic!("{other:?}"),
    }
    conn.start(7, PATH, |_| {});
    assert!(matches!(next(&mut conn).await, Got::Ended(7, _)));
    drop(server);
    match next(&mut conn).await {
        Got::Closed(e) => {
            assert_eq!(e.kind(), "conn_error");
            assert_eq!(
                e.to_string(),
                "the server sent GOAWAY (ENHANCE_YOUR_CALM: too_many_pings)"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn hostile_frames_end_the_connection() {
    let (mut conn, mut server) = pair().await;
    server
        .send(|o| frame::put_head(o, 1 << 20, frame::DATA, 0, 1))
        .await;
    assert!(matches!(
        next(&mut conn).await,
        Got::Closed(ConnError::FrameSize { .. })
    ));
    let (mut conn, mut server) = pair().await;
    server
        .send(|o| {
            frame::put_head(o, 4, frame::PUSH_PROMISE, frame::END_HEADERS, 1);
            o.extend_from_slice(&[0, 0, 0, 2]);
        })
        .await;
    assert!(matches!(
        next(&mut conn).await,
        Got::Closed(ConnError::Protocol(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_keepalive_ping_loses_the_connection() {
    let (mut conn, mut server) = pair().await;
    let due = conn.keepalive_due().expect("a call is open");
    tokio::time::sleep_until(due).await;
    conn.on_timer(tokio::time::Instant::now());
    tokio::select! {
        _ = next(&mut conn) => unreachable!(),
        _ = tokio::time::sleep(Duration::from_millis(1)) => {}
    }
    let (h, p) = server.next_of(frame::PING).await;
    assert_eq!((h.flags, &p[..]), (0, &b"agentsim"[..]));
    let deadline = conn.keepalive_due().unwrap();
    assert_eq!(deadline - due, KEEPALIVE.timeout);
    tokio::time::sleep_until(deadline).await;
    conn.on_timer(tokio::time::Instant::now());
    match next(&mut conn).await {
        Got::Closed(e) => assert_eq!(e.kind(), "keepalive_timeout"),
        other => panic!("{other:?}"),
    }
}

/// The bytes a real Consul 1.20.1 server sent on a Subscribe stream
/// (`testdata/vectors/consul/h2/`): grpc-go's settings, ping, window
/// update, a header block with a table-size update and Huffman, and five
/// events, each one gRPC message.
#[tokio::test]
async fn a_real_servers_stream_reads_back() {
    use agent_sim_proto::consul::subscribe::{Event, event::Payload};
    let real = include_bytes!("../../../../testdata/vectors/consul/h2/subscribe-s2c.bin");
    let (mut conn, mut server) = pair().await;
    server.send(|o| o.extend_from_slice(real)).await;
    assert!(matches!(next(&mut conn).await, Got::Started(5)));
    let mut kinds = Vec::new();
    for _ in 0..5 {
        match next(&mut conn).await {
            Got::Message(5, m) => {
                let ev: Event = prost::Message::decode(&m[..]).unwrap();
                kinds.push(match ev.payload.unwrap() {
                    Payload::ServiceHealth(h) => format!("health op {}", h.op),
                    Payload::EndOfSnapshot(_) => "end of snapshot".into(),
                    other => format!("{other:?}"),
                });
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        kinds,
        [
            "health op 0",
            "end of snapshot",
            "health op 1",
            "health op 0",
            "health op 1"
        ]
    );
    // Its ping answered with its payload, its settings acknowledged.
    let (h, p) = server.next_of(frame::PING).await;
    assert_eq!((h.flags, p), (frame::ACK, vec![2, 4, 16, 16, 9, 14, 7, 7]));
    drop(server);
    assert!(matches!(next(&mut conn).await, Got::Closed(ConnError::Eof)));
    assert_eq!(conn.held(), 0);
}

/// A client with no call yet, the server having read its preface.
async fn bare() -> (Conn<DuplexStream>, Server) {
    connected("127.0.0.1:8502", 1 << 20).await
}

/// Polls the connection until it has nothing to tell (its writes go out).
async fn settle(conn: &mut Conn<DuplexStream>) {
    tokio::select! {
        got = next(conn) => panic!("nothing to tell: {got:?}"),
        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
}

#[tokio::test]
async fn a_bidirectional_call_sends_requests_on_its_open_stream() {
    let (mut conn, mut server) = bare().await;
    assert!(conn.open(7, "/x.Y/Z", &[("x-consul-token", "secret")]));
    assert!(conn.send(7, |w| w.extend_from_slice(b"first")));
    settle(&mut conn).await;
    let (h, block) = server.next_of(frame::HEADERS).await;
    assert_eq!((h.stream, h.flags), (1, frame::END_HEADERS));
    let f = server.fields(&block);
    assert_eq!(f[2], (":path".into(), "/x.Y/Z".into()));
    assert_eq!(
        f.last().unwrap(),
        &("x-consul-token".into(), "secret".into())
    );
    let (h, p) = server.next_of(frame::DATA).await;
    assert_eq!((h.stream, h.flags), (1, 0));
    assert_eq!(p, b"\0\0\0\0\x05first");
    // The server answers; the client goes on sending on the same stream.
    server
        .send(|o| {
            headers(o, 1, false, &response_block());
            let mut m = Vec::new();
            message(&mut m, b"answer");
            data(o, 1, false, &m);
        })
        .await;
    assert!(matches!(next(&mut conn).await, Got::Started(7)));
    assert!(matches!(next(&mut conn).await, Got::Message(7, m) if m == b"answer"));
    assert!(conn.send(7, |w| w.extend_from_slice(b"ack")));
    conn.close_send(7);
    assert!(
        !conn.send(7, |w| w.extend_from_slice(b"late")),
        "no request after the end"
    );
    settle(&mut conn).await;
    let (h, p) = server.next_of(frame::DATA).await;
    assert_eq!((h.flags, &p[..]), (0, &b"\0\0\0\0\x03ack"[..]));
    let (h, p) = server.next_of(frame::DATA).await;
    assert_eq!((h.flags, p.len()), (frame::END_STREAM, 0));
    // The call ends with the server's trailers.
    server
        .send(|o| headers(o, 1, true, &trailers_block(0, "")))
        .await;
    assert!(matches!(next(&mut conn).await, Got::Ended(7, s) if s.code() == Code::Ok));
    assert!(!conn.send(7, |w| w.push(1)), "the call is over");
    settle(&mut conn).await;
    assert_eq!(conn.held(), 0, "an idle connection holds nothing");
}

#[tokio::test]
async fn requests_wait_for_the_servers_windows_and_split_at_a_frame() {
    let (mut conn, mut server) = bare().await;
    // The server's calls open with a 10-octet window.
    server
        .send(|o| frame::put_settings(o, &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 10)]))
        .await;
    settle(&mut conn).await;
    assert!(conn.open(1, "/x.Y/Z", &[]));
    assert!(conn.send(1, |w| w.extend_from_slice(&[9; 20])));
    settle(&mut conn).await;
    let (h, p) = server.next_of(frame::DATA).await;
    assert_eq!((h.len, &p[..5]), (10, &[0, 0, 0, 0, 20][..]));
    assert!(conn.held() >= 15, "the rest waits on the call");
    // The call's window opens by 100: the other 15 octets go out.
    server
        .send(|o| frame::put_word(o, frame::WINDOW_UPDATE, 1, 100))
        .await;
    settle(&mut conn).await;
    let (h, p) = server.next_of(frame::DATA).await;
    assert_eq!((h.len, p), (15, vec![9; 15]));
    // A bigger initial window opens the open call too (by the change).
    server
        .send(|o| {
            frame::put_settings(o, &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20)]);
            frame::put_word(o, frame::WINDOW_UPDATE, 0, 1 << 20);
        })
        .await;
    settle(&mut conn).await;
    // A request over a frame is split into frames of at most 16 KiB.
    assert!(conn.send(1, |w| w.extend_from_slice(&vec![7; 20_000])));
    conn.close_send(1);
    settle(&mut conn).await;
    let (h, _) = server.next_of(frame::DATA).await;
    assert_eq!((h.len, h.flags), (frame::MAX_FRAME, 0));
    let (h, _) = server.next_of(frame::DATA).await;
    assert_eq!((h.len, h.flags), (20_005 - frame::MAX_FRAME, 0));
    let (h, _) = server.next_of(frame::DATA).await;
    assert_eq!((h.len, h.flags), (0, frame::END_STREAM));
    assert_eq!(conn.held(), 0, "nothing is kept once sent");
}

#[tokio::test]
async fn the_connection_window_holds_every_call_until_it_opens() {
    let (mut conn, mut server) = bare().await;
    assert!(conn.open(1, "/a", &[]));
    assert!(conn.open(2, "/b", &[]));
    // 65,535 octets: a little under the connection's window.
    assert!(conn.send(1, |w| w.extend_from_slice(&vec![1; 65_000])));
    assert!(conn.send(2, |w| w.extend_from_slice(&[2; 600])));
    settle(&mut conn).await;
    let mut sent = [0usize; 2];
    for _ in 0..5 {
        let (h, _) = server.next_of(frame::DATA).await;
        sent[h.stream as usize / 2] += h.len;
    }
    assert_eq!(sent, [65_005, 530], "the window's last 530 octets");
    server
        .send(|o| frame::put_word(o, frame::WINDOW_UPDATE, 0, 1000))
        .await;
    settle(&mut conn).await;
    let (h, p) = server.next_of(frame::DATA).await;
    assert_eq!((h.stream, p.len()), (3, 75));
    // A window update over 2^31-1 in settings ends the connection.
    server
        .send(|o| frame::put_settings(o, &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 1 << 31)]))
        .await;
    assert!(matches!(
        next(&mut conn).await,
        Got::Closed(ConnError::Protocol(_))
    ));
}
