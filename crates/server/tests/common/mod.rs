//! What the Consul target's integration tests share: the target started on
//! `127.0.0.1:0` (its RPC and HTTP ports) and stopped when dropped, the
//! bound every step waits within, and a one-request HTTP/1 client.

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use agent_sim_server::consul::{ConsulState, ConsulTargetConfig, serve_http, serve_rpc};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Longest a test step may take.
pub const BOUND: Duration = Duration::from_secs(10);

/// `f`, failing the test when it takes longer than [`BOUND`].
pub async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("test step took too long")
}

/// A running target: its state, its ports, and its servers' tasks.
pub struct Target {
    pub state: ConsulState,
    pub rpc: SocketAddr,
    pub http: SocketAddr,
    pub shutdown: CancellationToken,
    pub servers: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Drop for Target {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts a target of `cfg`: the RPC and HTTP ports, each on
/// `127.0.0.1:0`.
pub async fn start(cfg: ConsulTargetConfig) -> Target {
    let state = ConsulState::new(cfg);
    let shutdown = CancellationToken::new();
    let rpc_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (rpc, http) = (rpc_l.local_addr().unwrap(), http_l.local_addr().unwrap());
    let servers = vec![
        tokio::spawn(serve_rpc(rpc_l, state.clone(), shutdown.clone())),
        tokio::spawn(serve_http(http_l, state.clone(), shutdown.clone())),
    ];
    Target {
        state,
        rpc,
        http,
        shutdown,
        servers,
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A header's value ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or(""))
    }

    /// `X-Consul-Index` (0 when absent).
    pub fn index(&self) -> u64 {
        self.header("x-consul-index").parse().unwrap_or(0)
    }
}

/// One request on a connection of its own to `addr`.
pub async fn call_at(
    addr: SocketAddr,
    method: &str,
    path: impl AsRef<str>,
    body: impl Into<Bytes>,
) -> Reply {
    call_with_token(addr, method, path.as_ref(), "", body.into()).await
}

/// [`call_at`] with `token` in `X-Consul-Token` ("" sends none).
pub async fn call_with_token(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Bytes,
) -> Reply {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if !token.is_empty() {
        req = req.header("X-Consul-Token", token);
    }
    let resp = send
        .send_request(req.body(Full::new(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

#[derive(serde::Serialize)]
struct RpcHeader<'a> {
    #[serde(rename = "ServiceMethod")]
    method: &'a str,
    #[serde(rename = "Seq")]
    seq: u64,
}

#[derive(serde::Deserialize)]
struct RpcAnswerHeader {
    #[serde(rename = "Error")]
    error: String,
}

/// One net/rpc call on the RPC port (`0x04`, yamux, msgpack) on its own
/// connection: the answer's error words and its body.
pub async fn rpc_call<A: serde::Serialize>(
    addr: SocketAddr,
    method: &str,
    args: &A,
) -> (String, Vec<u8>) {
    use futures_util::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::io::AsyncWriteExt as _;
    use tokio_util::compat::TokioAsyncReadCompatExt as _;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&[0x04]).await.unwrap();
    let mut conn =
        yamux::Connection::new(tcp.compat(), yamux::Config::default(), yamux::Mode::Client);
    let mut s = std::future::poll_fn(|cx| conn.poll_new_outbound(cx))
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        while let Some(Ok(_)) = std::future::poll_fn(|cx| conn.poll_next_inbound(cx)).await {}
    });
    let mut req = agent_sim_proto::msgpack::encode_named(&RpcHeader { method, seq: 1 }).unwrap();
    req.extend(agent_sim_proto::msgpack::encode_named(args).unwrap());
    s.write_all(&req).await.unwrap();
    s.flush().await.unwrap();
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
    let mut scan = agent_sim_proto::msgpack::MessageScan::default();
    let (h, end) = loop {
        if let Some(done) = scan.scan(&buf).unwrap() {
            break done;
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "stream closed before the answer");
        buf.extend_from_slice(&chunk[..n]);
    };
    driver.abort();
    let header: RpcAnswerHeader = agent_sim_proto::msgpack::decode(&buf[..h]).unwrap();
    (header.error, buf[h..end].to_vec())
}
