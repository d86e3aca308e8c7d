//! A gossip member for the serf tests: a memberlist/serf peer on its own
//! loopback address and port (UDP and TCP), built on agent-sim-gossip's
//! codec, that answers pings (until muted), answers push-pulls and TCP
//! pings, push-pulls with a server, sends packets, and keeps what else it
//! hears.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sim_gossip::Security;
use agent_sim_gossip::serf::{SerfState, encode_tags};
use agent_sim_gossip::wire::msgs::{Ack, NodeState, Ping, PushPull, state};
use agent_sim_gossip::wire::{each_message, kind};
use agent_sim_server::consul::bind_serf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::task::JoinHandle;

/// memberlist and serf versions of a Consul 1.20 agent.
pub const VSN: [u8; 6] = [1, 5, 2, 2, 5, 4];

/// The tags a Consul 1.20 client agent sets, but its `id`.
pub const CLIENT_TAGS: [(&str, &str); 7] = [
    ("build", "1.20.1:"),
    ("dc", "dc1"),
    ("role", "node"),
    ("segment", ""),
    ("vsn", "2"),
    ("vsn_max", "3"),
    ("vsn_min", "2"),
];

/// Those tags with `id`, encoded.
pub fn client_meta(id: &str) -> Vec<u8> {
    let mut tags = CLIENT_TAGS.to_vec();
    tags.push(("id", id));
    encode_tags(&tags)
}

/// Messages heard: (type, body).
type Heard = Arc<Mutex<Vec<(u8, Vec<u8>)>>>;

/// One member.
pub struct Member {
    pub name: String,
    pub addr: SocketAddr,
    pub sec: Security,
    pub meta: Vec<u8>,
    pub muted: Arc<AtomicBool>,
    /// Messages heard other than pings: (type, body).
    pub heard: Heard,
    udp: Arc<UdpSocket>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Member {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Reads one stream message (no label header expected).
pub async fn read_stream(s: &mut TcpStream, sec: &Security) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if let Some((msg, _)) = sec.open_stream(&buf).ok()? {
            return Some(msg);
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn ack(seq: u32) -> Vec<u8> {
    let mut out = Vec::new();
    Ack { seq, payload: &[] }.encode(&mut out);
    out
}

impl Member {
    /// A member named `name`, alive, listening on 127.0.0.1.
    pub async fn start(name: &str, sec: Security) -> Member {
        let (udp, tcp) = bind_serf("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = tcp.local_addr().unwrap();
        let udp = Arc::new(udp);
        let muted = Arc::new(AtomicBool::new(false));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let mut m = Member {
            name: name.into(),
            addr,
            meta: client_meta(&format!("00000000-0000-0000-0000-{:012}", addr.port())),
            sec,
            muted,
            heard,
            udp,
            tasks: Vec::new(),
        };
        let (udp, sec, muted, heard) = (
            m.udp.clone(),
            m.sec.clone(),
            m.muted.clone(),
            m.heard.clone(),
        );
        m.tasks.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            loop {
                let Ok((n, from)) = udp.recv_from(&mut buf).await else {
                    continue;
                };
                let Ok(plain) = sec.open_packet(&buf[..n]) else {
                    continue;
                };
                let mut acks = Vec::new();
                let _ = each_message(&plain, &mut |t, body| {
                    if t == kind::PING {
                        if let Ok(p) = Ping::decode(body) {
                            let to = if p.source_port > 0 && p.source_addr.len() == 4 {
                                let ip: [u8; 4] = p.source_addr.try_into().unwrap();
                                SocketAddr::from((ip, p.source_port))
                            } else {
                                from
                            };
                            acks.push((to, p.seq));
                        }
                    } else {
                        heard.lock().unwrap().push((t, body.to_vec()));
                    }
                });
                if muted.load(Ordering::Relaxed) {
                    continue;
                }
                for (to, seq) in acks {
                    let _ = udp.send_to(&sec.seal_packet(&ack(seq)), to).await;
                }
            }
        }));
        let (state, sec, muted) = (m.state(false), m.sec.clone(), m.muted.clone());
        m.tasks.push(tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = tcp.accept().await else {
                    continue;
                };
                if muted.load(Ordering::Relaxed) {
                    continue;
                }
                let mut pre = vec![0u8; sec.stream_preamble().len()];
                if s.read_exact(&mut pre).await.is_err() {
                    continue;
                }
                let Some(msg) = read_stream(&mut s, &sec).await else {
                    continue;
                };
                let reply = match msg[0] {
                    kind::PUSH_PULL => state.clone(),
                    kind::PING => ack(Ping::decode(&msg[1..]).unwrap().seq),
                    _ => continue,
                };
                let _ = s.write_all(&sec.seal_stream(&reply)).await;
            }
        }));
        m
    }

    /// Its push-pull message (type byte first): itself alive, serf's state.
    pub fn state(&self, join: bool) -> Vec<u8> {
        let mut user = Vec::new();
        SerfState {
            ltime: 2,
            status: vec![(&self.name, 1)],
            left: vec![],
            event_ltime: 1,
            query_ltime: 1,
        }
        .encode(&mut user);
        let mut out = Vec::new();
        PushPull {
            join,
            nodes: vec![NodeState {
                name: &self.name,
                addr: &[127, 0, 0, 1],
                port: self.addr.port(),
                meta: &self.meta,
                incarnation: 1,
                state: state::ALIVE,
                vsn: &VSN,
            }],
            user_state: &user,
        }
        .encode(&mut out);
        out
    }

    /// Push-pulls with `server`: the answer (type byte first), or `None`
    /// when the server closed the stream without one.
    pub async fn push_pull(&self, server: SocketAddr, join: bool) -> Option<Vec<u8>> {
        let mut s = TcpStream::connect(server).await.unwrap();
        let mut out = self.sec.stream_preamble();
        out.extend_from_slice(&self.sec.seal_stream(&self.state(join)));
        s.write_all(&out).await.unwrap();
        tokio::time::timeout(Duration::from_secs(20), read_stream(&mut s, &self.sec))
            .await
            .ok()
            .flatten()
    }

    /// Sends `msg` (type byte first) in one packet from its own port.
    pub async fn send(&self, to: SocketAddr, msg: &[u8]) {
        self.udp
            .send_to(&self.sec.seal_packet(msg), to)
            .await
            .unwrap();
    }

    /// Stops answering (UDP and TCP).
    pub fn mute(&self) {
        self.muted.store(true, Ordering::Relaxed);
    }

    /// Whether it heard a message of type `t` whose body `pred` accepts.
    pub fn heard(&self, t: u8, pred: impl Fn(&[u8]) -> bool) -> bool {
        self.heard
            .lock()
            .unwrap()
            .iter()
            .any(|(k, b)| *k == t && pred(b))
    }
}
