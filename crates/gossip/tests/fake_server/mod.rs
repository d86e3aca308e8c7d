//! A stand-in Consul server for the pool's tests: it answers every
//! push-pull (TCP) with one Consul server, `srv`, itself: its address both
//! TCP and UDP, the UDP socket never read, so its probes are never acked. It can be told to stop answering
//! (streams are then read and held open, never answered), and keeps, for
//! each push-pull it took, the state it was shown of each member. A
//! member's join can be answered otherwise ([`JoinAnswer`]).
#![allow(dead_code)] // each includer uses a part

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use agent_sim_gossip::Security;
use agent_sim_gossip::serf::{self, SerfState};
use agent_sim_gossip::wire::msgs::{NodeState, PushPull, PushPullHeader};
use agent_sim_gossip::wire::{self, MAX_STATE_BYTES, kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// What each push-pull taken showed: (member name, state) per node.
pub type Heard = Vec<Vec<(String, u8)>>;

/// How a member's join (a push-pull with `Join` set) is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinAnswer {
    /// As any push-pull: the server alone.
    Usual,
    /// A plain push-pull of the server and members taking at least this
    /// many bytes, written a batch at a time (never built whole).
    Bulk(usize),
    /// An encrypted frame whose header claims more than memberlist's 20 MiB
    /// (then the stream is held open).
    Oversized,
}

/// The server, listening on 127.0.0.1.
pub struct FakeServer {
    /// Its serf LAN address, the pool's join address.
    pub join: SocketAddr,
    /// UDP on the same address (bound, never read).
    udp: UdpSocket,
    shared: Arc<Shared>,
}

/// What the server's streams share.
struct Shared {
    /// The server's UDP address, as it lists itself.
    at: SocketAddr,
    sec: Security,
    answering: AtomicBool,
    joins: Mutex<JoinAnswer>,
    heard: Mutex<Heard>,
}

impl FakeServer {
    /// Starts answering on an ephemeral port.
    pub async fn start() -> FakeServer {
        Self::start_with(Security::default()).await
    }

    /// Starts answering on an ephemeral port, its streams wrapped by `sec`
    /// (no label: a key, or nothing).
    pub async fn start_with(sec: Security) -> FakeServer {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let join = l.local_addr().unwrap();
        let udp = UdpSocket::bind(join).await.unwrap();
        let shared = Arc::new(Shared {
            at: udp.local_addr().unwrap(),
            sec,
            answering: AtomicBool::new(true),
            joins: Mutex::new(JoinAnswer::Usual),
            heard: Mutex::default(),
        });
        let server = FakeServer {
            join,
            udp,
            shared: shared.clone(),
        };
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                tokio::spawn(serve(c, shared.clone()));
            }
        });
        server
    }

    /// From now on, push-pulls are read and never answered.
    pub fn go_silent(&self) {
        self.shared.answering.store(false, Ordering::Release);
    }

    /// From now on, members' joins are answered so.
    pub fn answer_joins(&self, how: JoinAnswer) {
        *self.shared.joins.lock().unwrap() = how;
    }

    /// The push-pulls taken so far.
    pub fn heard(&self) -> Heard {
        self.shared.heard.lock().unwrap().clone()
    }
}

/// One stream: reads the push-pull, keeps what it showed, answers it (or
/// holds the stream open, silent).
async fn serve(mut c: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let msg = loop {
        let Ok(n) = c.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Ok(Some((msg, _))) = shared.sec.open_stream(&buf) {
            break msg;
        }
    };
    let mut join = false;
    if let Some((&kind::PUSH_PULL, body)) = msg.split_first()
        && let Ok(pp) = PushPull::decode(body)
    {
        let shown = pp.nodes.iter().map(|n| (n.name.to_string(), n.state));
        shared.heard.lock().unwrap().push(shown.collect());
        join = pp.join;
    }
    let how = match join {
        true => *shared.joins.lock().unwrap(),
        false => JoinAnswer::Usual,
    };
    if !shared.answering.load(Ordering::Acquire) {
        // Held open until the pool gives up on it.
        let _ = c.read(&mut chunk).await;
        return;
    }
    match how {
        JoinAnswer::Usual => {
            let _ = c
                .write_all(&shared.sec.seal_stream(&answer(shared.at)))
                .await;
        }
        JoinAnswer::Bulk(bytes) => {
            let _ = write_bulk(&mut c, shared.at, bytes).await;
        }
        JoinAnswer::Oversized => {
            let mut head = vec![kind::ENCRYPT];
            head.extend_from_slice(&(MAX_STATE_BYTES as u32 + 1).to_be_bytes());
            let _ = c.write_all(&head).await;
            let _ = c.read(&mut chunk).await;
        }
    }
}

/// A member as a Consul 1.20.1 client shows in a push-pull.
fn member<'a>(name: &'a str, ip: &'a [u8], meta: &'a [u8]) -> NodeState<'a> {
    NodeState {
        name,
        addr: ip,
        port: 8301,
        meta,
        incarnation: 1,
        state: 0,
        vsn: &[1, 5, 2, 2, 5, 4],
    }
}

/// Writes a plain push-pull: the server, then members `bulk-<i>` taking
/// at least `bytes`, 16 KiB at a time.
async fn write_bulk(c: &mut TcpStream, udp: SocketAddr, bytes: usize) -> std::io::Result<()> {
    let ip = [10, 0, 0, 1];
    let meta = serf::encode_tags(&[
        ("role", "node"),
        ("dc", "dc1"),
        ("segment", ""),
        ("id", "7c1d4f0e-3b2a-4c5d-9e8f-0a1b2c3d4e5f"),
        ("vsn", "2"),
        ("vsn_min", "2"),
        ("vsn_max", "3"),
        ("build", "1.20.1:"),
    ]);
    let mut one = Vec::new();
    member("bulk-00000000", &ip, &meta).encode(&mut one);
    let members = bytes.div_ceil(one.len());
    // The server first, as in its usual answer; then the members.
    let usual = answer(udp);
    let server = PushPull::decode(&usual[1..]).unwrap();
    let mut batch = Vec::with_capacity(32 * 1024);
    PushPullHeader {
        nodes: members + 1,
        user_state_len: server.user_state.len(),
        join: false,
    }
    .encode(&mut batch);
    server.nodes[0].encode(&mut batch);
    let mut name = String::new();
    for i in 0..members {
        name.clear();
        std::fmt::Write::write_fmt(&mut name, format_args!("bulk-{i:08}")).unwrap();
        member(&name, &ip, &meta).encode(&mut batch);
        if batch.len() >= 16 * 1024 {
            c.write_all(&batch).await?;
            batch.clear();
        }
    }
    batch.extend_from_slice(server.user_state);
    c.write_all(&batch).await
}

/// A push-pull listing one Consul server, `srv`, at `udp`.
fn answer(udp: SocketAddr) -> Vec<u8> {
    let meta = serf::encode_tags(&[("role", "consul"), ("dc", "dc1")]);
    let mut user = Vec::new();
    SerfState {
        ltime: 1,
        status: vec![("srv", 1)],
        ..Default::default()
    }
    .encode(&mut user);
    let ip = wire::ip_bytes(udp.ip());
    let mut out = Vec::new();
    PushPull {
        join: false,
        nodes: vec![NodeState {
            name: "srv",
            addr: &ip,
            port: udp.port(),
            meta: &meta,
            incarnation: 1,
            state: 0,
            vsn: &[1, 5, 2, 2, 5, 4],
        }],
        user_state: &user,
    }
    .encode(&mut out);
    out
}
