//! A stand-in Consul server for the pool's tests: it answers every
//! push-pull (TCP) with one Consul server, `srv`, itself: its address both
//! TCP and UDP, the UDP socket never read, so its probes are never acked. It can be told to stop answering
//! (streams are then read and held open, never answered), and keeps, for
//! each push-pull it took, the state it was shown of each member.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use agent_sim_gossip::Security;
use agent_sim_gossip::serf::{self, SerfState};
use agent_sim_gossip::wire::msgs::{NodeState, PushPull};
use agent_sim_gossip::wire::{self, kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// What each push-pull taken showed: (member name, state) per node.
pub type Heard = Vec<Vec<(String, u8)>>;

/// The server, listening on 127.0.0.1.
pub struct FakeServer {
    /// Its serf LAN address, the pool's join address.
    pub join: SocketAddr,
    /// UDP on the same address (bound, never read).
    udp: UdpSocket,
    answering: Arc<AtomicBool>,
    heard: Arc<Mutex<Heard>>,
}

impl FakeServer {
    /// Starts answering on an ephemeral port.
    pub async fn start() -> FakeServer {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let join = l.local_addr().unwrap();
        let udp = UdpSocket::bind(join).await.unwrap();
        let server = FakeServer {
            join,
            answering: Arc::new(AtomicBool::new(true)),
            heard: Arc::default(),
            udp,
        };
        let at = server.udp.local_addr().unwrap();
        let (answering, heard) = (server.answering.clone(), server.heard.clone());
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                let (answering, heard) = (answering.clone(), heard.clone());
                tokio::spawn(serve(c, at, answering, heard));
            }
        });
        server
    }

    /// From now on, push-pulls are read and never answered.
    pub fn go_silent(&self) {
        self.answering.store(false, Ordering::Release);
    }

    /// The push-pulls taken so far.
    pub fn heard(&self) -> Heard {
        self.heard.lock().unwrap().clone()
    }
}

/// One stream: reads the push-pull, keeps what it showed, answers it (or
/// holds the stream open, silent).
async fn serve(
    mut c: TcpStream,
    udp: SocketAddr,
    answering: Arc<AtomicBool>,
    heard: Arc<Mutex<Heard>>,
) {
    let sec = Security::default();
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
        if let Ok(Some((msg, _))) = sec.open_stream(&buf) {
            break msg;
        }
    };
    if let Some((&kind::PUSH_PULL, body)) = msg.split_first()
        && let Ok(pp) = PushPull::decode(body)
    {
        let shown = pp.nodes.iter().map(|n| (n.name.to_string(), n.state));
        heard.lock().unwrap().push(shown.collect());
    }
    if !answering.load(Ordering::Acquire) {
        // Held open until the pool gives up on it.
        let _ = c.read(&mut chunk).await;
        return;
    }
    let _ = c.write_all(&sec.seal_stream(&answer(udp))).await;
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
