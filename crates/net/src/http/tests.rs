use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http_body_util::{Empty, Full};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::*;
use crate::count::Counted;
use crate::count::tests::Sums;

/// A loopback server that answers each request on a connection with the
/// next of `answers`, and sends back the heads it read. Counts accepts.
async fn server(
    answers: Vec<&'static [u8]>,
) -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<String>,
    Arc<AtomicU64>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let accepts = Arc::new(AtomicU64::new(0));
    let seen = accepts.clone();
    tokio::spawn(async move {
        let mut answers = answers.into_iter();
        while let Ok((s, _)) = l.accept().await {
            seen.fetch_add(1, Ordering::Relaxed);
            let mut s = BufReader::new(s);
            loop {
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                        break;
                    }
                    head.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                if head.is_empty() {
                    break;
                }
                let _ = tx.send(head);
                let Some(a) = answers.next() else { return };
                if s.get_mut().write_all(a).await.is_err() {
                    break;
                }
            }
        }
    });
    (addr, rx, accepts)
}

fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::get(path)
        .header(http::header::HOST, "test")
        .body(Empty::new())
        .unwrap()
}

/// A loopback port nothing listens on.
fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn a_kept_alive_connection_answers_twice_and_names_agent_sim() {
    let (addr, mut heads, accepts) = server(vec![
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-index: 7\r\n\r\nhi",
        b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\ngone",
    ])
    .await;
    let sums = Sums::default();
    let peer = Peer {
        bind: Some("127.0.0.3".parse().unwrap()),
        ..Peer::plain(addr)
    };
    let io = peer.open_with(|t| t).await.unwrap();
    let mut c = Conn::handshake(Counted::new(io, Some(sums.clone())))
        .await
        .unwrap();
    let a = c.send(get("/one"), 1024).await.unwrap();
    assert_eq!((a.status, &a.body[..]), (StatusCode::OK, &b"hi"[..]));
    assert_eq!(a.headers["x-index"], "7");
    let head = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(head.starts_with("get /one http/1.1"), "{head}");
    assert!(
        head.contains(&format!("user-agent: {USER_AGENT}")),
        "{head}"
    );
    let e = c.send(get("/two"), 1024).await.unwrap().ok().unwrap_err();
    assert!(matches!(e, Error::Status { status, .. } if status == StatusCode::NOT_FOUND));
    assert_eq!(e.to_string(), "HTTP 404: gone");
    assert_eq!(accepts.load(Ordering::Relaxed), 1);
    let (read, written) = sums.totals();
    assert!(read > 0 && written > 0);
}

#[tokio::test]
async fn an_answer_over_the_limit_is_refused() {
    let (addr, _heads, _) = server(vec![
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789",
    ])
    .await;
    let io = Peer::plain(addr).open_with(|t| t).await.unwrap();
    let mut c = Conn::handshake(io).await.unwrap();
    let e = c.send(get("/"), 4).await.unwrap_err();
    assert!(matches!(e, Error::TooLarge { limit: 4, .. }), "{e:?}");
    assert_eq!(e.to_string(), "HTTP 200: answer over the 4-byte limit");
}

#[tokio::test]
async fn a_refused_dial_keeps_its_cause() {
    let addr = closed_port();
    let peer = Peer {
        dest: Dest::Host("127.0.0.1".into(), addr.port()),
        ..Peer::plain(addr)
    };
    let e = peer.dial().await.unwrap_err();
    let Error::Dial { source, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(crate::dial_error_kind(source), "connect_refused");
    assert!(
        e.to_string()
            .starts_with(&format!("connect 127.0.0.1:{}: ", addr.port())),
        "{e}"
    );
}

#[tokio::test]
async fn tls_to_a_server_that_hangs_up_is_a_tls_error() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
    let cfg = crate::client_config(
        &crate::ClientTls {
            insecure_skip_verify: true,
            ..crate::ClientTls::default()
        },
        &[],
    )
    .unwrap();
    let peer = Peer {
        tls: Some((
            TlsConnector::from(cfg),
            ServerName::try_from("localhost").unwrap(),
        )),
        ..Peer::plain(addr)
    };
    let e = peer.open_with(|t| t).await.unwrap_err();
    assert!(matches!(e, Error::Tls(_)), "{e:?}");
}

fn limits() -> PoolLimits {
    PoolLimits {
        max_conns: 2,
        idle: Duration::from_secs(20),
        dial_timeout: Duration::from_secs(5),
        timeout: Duration::from_secs(10),
    }
}

fn put(addr: SocketAddr) -> Request<Full<Bytes>> {
    Request::put(format!("http://{addr}/v1/x"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

#[tokio::test]
async fn a_pool_reuses_its_connection_and_counts_bytes() {
    let ok: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ntrue";
    let (addr, mut heads, accepts) = server(vec![ok, ok]).await;
    let sums = Sums::default();
    let pool = Pool::new(Peer::plain(addr), Some(sums.clone()), limits());
    for _ in 0..2 {
        let body = pool.send(put(addr), 64).await.unwrap().ok().unwrap();
        assert_eq!(&body[..], b"true");
    }
    assert_eq!(accepts.load(Ordering::Relaxed), 1);
    let head = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(
        head.contains(&format!("user-agent: {USER_AGENT}")),
        "{head}"
    );
    let (read, written) = sums.totals();
    assert!(read > 0 && written > 0);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_pooled_call_times_out() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    // Accepts, then never answers.
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        std::future::pending::<()>().await;
        drop(s);
    });
    let pool = Pool::<Sums>::new(Peer::plain(addr), None, limits());
    let e = pool.send(put(addr), 64).await.unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert_eq!(e.to_string(), "no answer within 10s");
}

#[tokio::test]
async fn a_pooled_dial_that_fails_says_why() {
    let addr = closed_port();
    let pool = Pool::<Sums>::new(Peer::plain(addr), None, limits());
    let e = pool.send(put(addr), 64).await.unwrap_err();
    assert!(matches!(e, Error::Pool(_)), "{e:?}");
    assert!(
        error_chain(&e).contains("Connection refused"),
        "{}",
        error_chain(&e)
    );
}

#[test]
fn cause_words_drop_the_clients_framing() {
    let e = Error::Body("cut short".into());
    assert_eq!(e.to_string(), "reading the answer: cut short");
    assert_eq!(e.cause_words(), "cut short");
    assert_eq!(Dest::Host("::1".into(), 80).to_string(), "[::1]:80");
    assert_eq!(status_words(429, b" slow down \n"), "HTTP 429: slow down");
    assert_eq!(status_words(502, b""), "HTTP 502");
}
