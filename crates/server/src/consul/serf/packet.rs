//! The UDP side of the serf port: each packet is opened (label, keyring,
//! CRC), its messages walked (compound and compressed layers) and each
//! answered or handed on as memberlist's `handleCommand` does: a ping gets
//! an ack with this server's coordinate, an indirect ping becomes a ping of
//! its target whose ack is relayed (or a nack after the probe timeout),
//! acks and nacks go to the probe waiting for them; alive, suspect, dead
//! and user (serf) messages go to the handler queue (`handoff`), whose
//! task changes the table with them (serf's messages: `on_user` here, for
//! streams too). Sending is here too: every packet sealed and counted by
//! the types of its messages.
//!
//! Bad input (undecryptable, truncated, malformed, unknown types) is
//! counted by cause and dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sim_gossip::serf::decode_intent;
use agent_sim_gossip::serf::event::UserEvent;
use agent_sim_gossip::wire::msgs::{Ack, IndirectPing, Nack, Ping};
use agent_sim_gossip::wire::{WireError, each_message, kind};
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::members::ip_of;
use super::{MAX_WAITERS, Reply, Serf, Waiter, lock};

/// memberlist's receive buffer: the largest UDP payload.
// Bound: PACKET_BUFFER bytes per packet, one buffer per server.
const PACKET_BUFFER: usize = 65_536;

/// Messages to send once a packet is handled: where, and what (type byte
/// first).
type Sends = Vec<(SocketAddr, Vec<u8>)>;

/// Reads packets until `shutdown`.
pub(super) async fn receive(serf: Arc<Serf>, sock: Arc<UdpSocket>, shutdown: CancellationToken) {
    let mut buf = vec![0u8; PACKET_BUFFER];
    loop {
        let got = tokio::select! {
            r = sock.recv_from(&mut buf) => r,
            () = shutdown.cancelled() => return,
        };
        // A failed receive (an ICMP error reported late) is not the end.
        if let Ok((n, from)) = got {
            serf.on_packet(&buf[..n], from).await;
        }
    }
}

/// The address a message asks answers at: its source fields when it has
/// them, else where it came from.
fn reply_to(source_addr: &[u8], source_port: u16, from: SocketAddr) -> SocketAddr {
    match ip_of(source_addr) {
        Some(ip) if source_port > 0 => SocketAddr::new(ip, source_port),
        _ => from,
    }
}

impl Serf {
    /// Seals `msg` (type byte first) into a packet and sends it to `to`.
    pub(super) async fn send(&self, to: SocketAddr, msg: &[u8]) {
        let Some(sock) = lock(&self.socket).clone() else {
            return;
        };
        let packet = self.cfg.security.seal_packet(msg);
        if sock.send_to(&packet, to).await.is_err() {
            return;
        }
        let c = &self.counters;
        c.bump(&c.udp_packets_sent);
        c.add(&c.udp_bytes_sent, packet.len());
        let _ = each_message(msg, &mut |t, body| {
            c.sent(t, body.len() + 1);
            if t == kind::USER {
                lock(&c.samples.msgs_sent).record(body.len() as f64);
            }
        });
    }

    /// Handles one packet from `from`.
    pub(super) async fn on_packet(self: &Arc<Self>, packet: &[u8], from: SocketAddr) {
        let c = &self.counters;
        c.bump(&c.udp_packets_received);
        c.add(&c.udp_bytes_received, packet.len());
        let plain = match self.cfg.security.open_packet(packet) {
            Ok(p) => p,
            Err(e) => return c.bad(e.cause()),
        };
        let now = Instant::now();
        let mut sends = Sends::new();
        let walked = each_message(&plain, &mut |t, body| {
            c.received(t, body.len() + 1);
            if let Err(e) = self.on_message(t, body, from, now, &mut sends) {
                c.bad(e.cause());
            }
        });
        if let Err(e) = walked {
            c.bad(e.cause());
        }
        for (to, msg) in sends {
            self.send(to, &msg).await;
        }
    }

    fn on_message(
        self: &Arc<Self>,
        t: u8,
        body: &[u8],
        from: SocketAddr,
        now: Instant,
        sends: &mut Sends,
    ) -> Result<(), WireError> {
        match t {
            kind::PING => self.on_ping(body, from, sends),
            kind::INDIRECT_PING => self.on_indirect_ping(body, from, sends),
            kind::ACK => {
                let a = Ack::decode(body)?;
                self.on_ack(a.seq, now, sends);
                Ok(())
            }
            kind::NACK => {
                let n = Nack::decode(body)?;
                if let Some(Waiter::Probe { tx, .. }) = lock(&self.waiters).get(&n.seq) {
                    let _ = tx.try_send(Reply::Nack);
                }
                Ok(())
            }
            kind::ALIVE | kind::SUSPECT | kind::DEAD | kind::USER => {
                self.hand_off(t, body, from);
                Ok(())
            }
            other => Err(WireError::Unknown(other)),
        }
    }

    /// A serf message (after memberlist's user type byte), as serf's
    /// `NotifyMsg` takes it: its size sampled, join and leave intents and
    /// user events applied (and passed on when new); queries and the rest
    /// only counted.
    pub(super) fn on_user(&self, body: &[u8], now: Instant) -> Result<(), WireError> {
        if !body.is_empty() {
            lock(&self.counters.samples.msgs_received).record(body.len() as f64);
        }
        if let Some((leave, ltime, node)) = decode_intent(body)? {
            self.with_table(|tb| tb.intent(leave, ltime, node, now));
        } else if let Some(ev) = UserEvent::decode(body)? {
            self.with_table(|tb| tb.heard_event(&ev, body));
        }
        Ok(())
    }

    fn on_ping(&self, body: &[u8], from: SocketAddr, sends: &mut Sends) -> Result<(), WireError> {
        let p = Ping::decode(body)?;
        if !p.node.is_empty() && p.node != &*self.me {
            self.counters.bad("unexpected_node");
            return Ok(());
        }
        let mut ack = Vec::with_capacity(16 + self.ack_payload.len());
        Ack {
            seq: p.seq,
            payload: &self.ack_payload,
        }
        .encode(&mut ack);
        sends.push((reply_to(p.source_addr, p.source_port, from), ack));
        Ok(())
    }

    /// Pings the target for the asker; its ack is relayed by `on_ack`, and
    /// a nack goes back when none came within the probe timeout.
    fn on_indirect_ping(
        self: &Arc<Self>,
        body: &[u8],
        from: SocketAddr,
        sends: &mut Sends,
    ) -> Result<(), WireError> {
        let ind = IndirectPing::decode(body)?;
        let Some(ip) = ip_of(ind.target) else {
            self.counters.bad("bad_address");
            return Ok(());
        };
        let (my_addr, my_port) = self.me_addr();
        let target = SocketAddr::new(ip, if ind.port == 0 { my_port } else { ind.port });
        let asker = reply_to(ind.source_addr, ind.source_port, from);
        let local = self.next_seq();
        {
            let mut w = lock(&self.waiters);
            if w.len() >= MAX_WAITERS {
                drop(w);
                self.counters.bad("busy");
                return Ok(());
            }
            w.insert(
                local,
                Waiter::Relay {
                    to: asker,
                    seq: ind.seq,
                },
            );
        }
        let mut ping = Vec::with_capacity(64);
        Ping {
            seq: local,
            node: ind.node,
            source_addr: &my_addr,
            source_port: my_port,
            source_node: &self.me,
        }
        .encode(&mut ping);
        sends.push((target, ping));
        self.counters.bump(&self.counters.relayed);
        let (serf, nack, asked) = (self.clone(), ind.nack, ind.seq);
        tokio::spawn(async move {
            tokio::time::sleep(serf.cfg.probe_timeout).await;
            let pending = lock(&serf.waiters).remove(&local).is_some();
            if pending && nack {
                let mut msg = Vec::with_capacity(16);
                Nack { seq: asked }.encode(&mut msg);
                serf.send(asker, &msg).await;
            }
        });
        Ok(())
    }

    fn on_ack(&self, seq: u32, now: Instant, sends: &mut Sends) {
        let mut w = lock(&self.waiters);
        let relay = match w.get(&seq) {
            Some(Waiter::Probe { tx, direct_until }) => {
                if now > *direct_until {
                    self.counters.bump(&self.counters.acks_late);
                }
                let _ = tx.try_send(Reply::Ack);
                None
            }
            Some(Waiter::Relay { to, seq: asked }) => Some((*to, *asked)),
            None => {
                self.counters.bump(&self.counters.acks_unexpected);
                None
            }
        };
        if let Some((to, asked)) = relay {
            w.remove(&seq);
            let mut ack = Vec::with_capacity(16);
            Ack {
                seq: asked,
                payload: &[],
            }
            .encode(&mut ack);
            sends.push((to, ack));
        }
    }
}
