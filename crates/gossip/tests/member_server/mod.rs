//! A stand-in Consul server for the events and suspicion tests, on
//! 127.0.0.1: its push-pull answer lists itself (`srv`, role `consul`) and
//! `others` client members the pool does not simulate (never probed: they
//! only make the pool larger), with its event clock; its UDP socket acks
//! the pings for `srv` while told to, and hands the test every message it
//! receives, stamped with the (tokio) time it came.
#![allow(dead_code)] // each includer uses a part

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use agent_sim_gossip::Security;
use agent_sim_gossip::serf::{self, SerfState};
use agent_sim_gossip::wire::msgs::{Ack, NodeState, Ping, PushPull};
use agent_sim_gossip::wire::{self, each_message, kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// One message the server received.
#[derive(Debug, Clone)]
pub struct Heard {
    /// When it came.
    pub at: Instant,
    /// Its memberlist type.
    pub t: u8,
    /// Its body (after the type byte).
    pub body: Vec<u8>,
    /// The packet it came in, as sent (sealed).
    pub packet: Arc<[u8]>,
}

/// What the server's tasks share.
struct Shared {
    /// Opens what comes (a ring may hold several keys).
    open: Security,
    /// Seals what it sends.
    seal: Mutex<Security>,
    acking: AtomicBool,
    /// Each push-pull taken: when, and whether it was a join.
    streams: mpsc::UnboundedSender<(Instant, bool)>,
    others: usize,
    event_ltime: u64,
    udp: SocketAddr,
}

/// The server.
pub struct MemberServer {
    /// Its serf LAN address (TCP and UDP), the pool's join address.
    pub join: SocketAddr,
    sock: Arc<UdpSocket>,
    shared: Arc<Shared>,
    heard: mpsc::UnboundedReceiver<Heard>,
    streams: mpsc::UnboundedReceiver<(Instant, bool)>,
}

impl MemberServer {
    /// Starts on an ephemeral port: `sec` opens and seals, `others`
    /// client members listed beside it, its event clock at `event_ltime`.
    pub async fn start(sec: Security, others: usize, event_ltime: u64) -> MemberServer {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let join = l.local_addr().unwrap();
        let sock = Arc::new(UdpSocket::bind(join).await.unwrap());
        let (streams_tx, streams) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            streams: streams_tx,
            seal: Mutex::new(sec.clone()),
            open: sec,
            acking: AtomicBool::new(true),
            others,
            event_ltime,
            udp: join,
        });
        let (tx, heard) = mpsc::unbounded_channel();
        tokio::spawn(listen(sock.clone(), shared.clone(), tx));
        let s = shared.clone();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                tokio::spawn(serve(c, s.clone()));
            }
        });
        MemberServer {
            join,
            sock,
            shared,
            heard,
            streams,
        }
    }

    /// The next push-pull taken: when, and whether it was a join.
    pub async fn next_push_pull(&mut self) -> (Instant, bool) {
        self.streams.recv().await.expect("the server runs")
    }

    /// From now on, pings go unanswered.
    pub fn stop_acking(&self) {
        self.shared.acking.store(false, Ordering::Release);
    }

    /// From now on, what it sends is sealed so.
    pub fn seal_with(&self, sec: Security) {
        *self.shared.seal.lock().unwrap() = sec;
    }

    /// Sends `msg` (type byte first) to `to`, sealed.
    pub async fn send(&self, to: SocketAddr, msg: &[u8]) {
        let packet = self.shared.seal.lock().unwrap().seal_packet(msg);
        self.sock.send_to(&packet, to).await.unwrap();
    }

    /// Sends `msg` to `to` sealed by `sec` (this once).
    pub async fn send_sealed(&self, to: SocketAddr, msg: &[u8], sec: &Security) {
        self.sock.send_to(&sec.seal_packet(msg), to).await.unwrap();
    }

    /// The next message received.
    pub async fn next(&mut self) -> Heard {
        self.heard.recv().await.expect("the listener runs")
    }

    /// The next message received of type `t` for which `f` holds.
    pub async fn next_of(&mut self, t: u8, f: impl Fn(&[u8]) -> bool) -> Heard {
        loop {
            let h = self.next().await;
            if h.t == t && f(&h.body) {
                return h;
            }
        }
    }

    /// Every message received until `until`.
    pub async fn until(&mut self, until: Instant) -> Vec<Heard> {
        let mut out = Vec::new();
        while let Ok(h) = tokio::time::timeout_at(until, self.next()).await {
            out.push(h);
        }
        out
    }
}

/// The UDP side: every message passed to the test, pings for `srv` acked
/// while acking.
async fn listen(sock: Arc<UdpSocket>, shared: Arc<Shared>, tx: mpsc::UnboundedSender<Heard>) {
    let mut buf = vec![0u8; 65_536];
    while let Ok((n, from)) = sock.recv_from(&mut buf).await {
        let packet: Arc<[u8]> = buf[..n].into();
        let Ok(msg) = shared.open.open_packet(&packet) else {
            continue;
        };
        let mut parts = Vec::new();
        let _ = each_message(&msg, &mut |t, b| parts.push((t, b.to_vec())));
        for (t, body) in parts {
            if t == kind::PING && shared.acking.load(Ordering::Acquire) {
                let p = Ping::decode(&body).unwrap();
                if p.node == "srv" {
                    let to = wire::socket_addr(p.source_addr, p.source_port).unwrap_or(from);
                    let mut ack = Vec::new();
                    Ack {
                        seq: p.seq,
                        payload: &[],
                    }
                    .encode(&mut ack);
                    let sealed = shared.seal.lock().unwrap().seal_packet(&ack);
                    let _ = sock.send_to(&sealed, to).await;
                }
            }
            let h = Heard {
                at: Instant::now(),
                t,
                body,
                packet: packet.clone(),
            };
            if tx.send(h).is_err() {
                return;
            }
        }
    }
}

/// One stream: a push-pull read and answered with the server's list.
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
        if let Ok(Some((msg, _))) = shared.open.open_stream(&buf) {
            break msg;
        }
    };
    if let Some((&kind::PUSH_PULL, body)) = msg.split_first()
        && let Ok(pp) = PushPull::decode(body)
    {
        let _ = shared.streams.send((Instant::now(), pp.join));
    }
    let answer = shared.seal.lock().unwrap().seal_stream(&answer(&shared));
    let _ = c.write_all(&answer).await;
}

/// The server's push-pull: itself, then the other members.
fn answer(shared: &Shared) -> Vec<u8> {
    let server_meta = serf::encode_tags(&[("role", "consul"), ("dc", "dc1")]);
    let client_meta = serf::encode_tags(&[("role", "node"), ("dc", "dc1")]);
    let names: Vec<String> = (0..shared.others).map(|i| format!("c-{i}")).collect();
    let ip = wire::ip_bytes(shared.udp.ip());
    let other_ip = [127, 0, 0, 99];
    let mut nodes = vec![NodeState {
        name: "srv",
        addr: &ip,
        port: shared.udp.port(),
        meta: &server_meta,
        incarnation: 1,
        state: 0,
        vsn: &[1, 5, 2, 2, 5, 4],
    }];
    for n in &names {
        nodes.push(NodeState {
            name: n,
            addr: &other_ip,
            port: 8301,
            meta: &client_meta,
            incarnation: 1,
            state: 0,
            vsn: &[1, 5, 2, 2, 5, 4],
        });
    }
    let mut status = vec![("srv", 1)];
    status.extend(names.iter().map(|n| (n.as_str(), 1)));
    let mut user = Vec::new();
    SerfState {
        ltime: 1,
        status,
        event_ltime: shared.event_ltime,
        ..Default::default()
    }
    .encode(&mut user);
    let mut out = Vec::new();
    PushPull {
        join: false,
        nodes,
        user_state: &user,
    }
    .encode(&mut out);
    out
}
