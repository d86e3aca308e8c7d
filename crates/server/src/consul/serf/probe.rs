//! The serf port's timers, as memberlist schedules them on a LAN:
//!
//! - [`probes`]: one member per probe interval (`probe` below): a ping
//!   (with the suspicion attached when it is suspected), then after the
//!   probe timeout indirect pings through up to `indirect_checks` alive
//!   members and a TCP ping; no ack by the end of the interval (stretched
//!   by the health awareness, `awareness`): suspect. An answered probe
//!   lowers the awareness score; a failed one raises it by the nacks
//!   missing (by one when no peer could nack).
//! - [`gossip`]: every gossip interval, what is queued to a few members,
//!   packed into compound packets of at most 1400 bytes.
//! - [`timers`]: suspicions whose time ran out become failures; serf's
//!   reaper removes long-left and long-failed members.
//! - [`push_pulls`]: a push-pull with a random alive member every
//!   interval, longer as the pool grows past 32 (memberlist's scale).
//! - [`queue_checks`]: the queues' depths sampled every 30 s, as serf's
//!   and memberlist's `QueueCheckInterval` has them.

use std::sync::Arc;
use std::time::Duration;

use agent_sim_gossip::wire::msgs::{IndirectPing, Ping, Verdict};
use agent_sim_gossip::wire::{UDP_BUFFER, compound, crypt, kind};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::view::Target;
use super::{Reply, Serf, Waiter, lock};

/// The longest the timers task sleeps between looks at the suspicions.
const TIMERS_EVERY: Duration = Duration::from_millis(250);
/// Pool size up to which push-pulls are not spread out (memberlist's
/// `pushPullScaleThreshold`).
const PUSH_PULL_SCALE_FROM: usize = 32;
/// serf's and memberlist's `QueueCheckInterval`.
const QUEUE_CHECK_EVERY: Duration = Duration::from_secs(30);

/// A ticker of `period` whose first tick comes after a random part of it
/// (memberlist staggers its timers so servers do not tick together).
fn ticker(period: Duration) -> tokio::time::Interval {
    let first = Instant::now() + period.mul_f64(fastrand::f64());
    let mut t = tokio::time::interval_at(first, period);
    t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    t
}

/// Probes until `shutdown`.
pub(super) async fn probes(serf: Arc<Serf>, shutdown: CancellationToken) {
    let mut tick = ticker(serf.cfg.probe_interval);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let Some(target) = serf.with_table(|t| t.next_probe(Instant::now())) else {
            continue;
        };
        tokio::select! {
            () = serf.probe(target) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Waits for an ack, counting the nacks heard meanwhile (a nack only says
/// a peer tried).
async fn acked(rx: &mut mpsc::Receiver<Reply>, nacks: &mut i32) {
    loop {
        match rx.recv().await {
            Some(Reply::Ack) => return,
            Some(Reply::Nack) => *nacks += 1,
            None => std::future::pending().await,
        }
    }
}

/// How a probe went.
struct Probed {
    answered: bool,
    /// Nacks expected (peers speaking protocol 4 asked) and heard.
    expected_nacks: i32,
    nacks: i32,
}

impl Probed {
    /// memberlist's awareness delta for it: answered, better by one;
    /// failed, worse by the nacks missing (the peers' nacks say the target
    /// is at fault), or by one when no peer could send any.
    fn awareness_delta(&self) -> i32 {
        if self.answered {
            -1
        } else if self.expected_nacks == 0 {
            1
        } else {
            (self.expected_nacks - self.nacks).max(0)
        }
    }
}

impl Serf {
    /// One probe of `target` (memberlist's `probeNode`).
    async fn probe(self: &Arc<Self>, target: Target) {
        let c = &self.counters;
        let seq = self.next_seq();
        let start = Instant::now();
        let awareness = lock(&self.table).awareness;
        if awareness.score() > 0 {
            c.bump(&c.degraded_probes);
        }
        let deadline = start + awareness.scale(self.cfg.probe_interval);
        let (tx, mut rx) = mpsc::channel(self.cfg.indirect_checks + 2);
        let direct_until = start + self.cfg.probe_timeout;
        lock(&self.waiters).insert(seq, Waiter::Probe { tx, direct_until });
        let (my_addr, my_port) = self.me_addr();
        let mut ping = Vec::with_capacity(64 + target.name.len());
        Ping {
            seq,
            node: &target.name,
            source_addr: &my_addr,
            source_port: my_port,
            source_node: &self.me,
        }
        .encode(&mut ping);
        if target.suspect {
            let mut suspect = Vec::with_capacity(32 + target.name.len());
            Verdict {
                incarnation: target.incarnation,
                node: &target.name,
                from: &self.me,
            }
            .encode(kind::SUSPECT, &mut suspect);
            self.send(target.to, &compound(&[&ping, &suspect])).await;
        } else {
            self.send(target.to, &ping).await;
        }
        c.bump(&c.probes);
        let mut further = Probed {
            answered: true,
            expected_nacks: 0,
            nacks: 0,
        };
        let direct = acked(&mut rx, &mut further.nacks);
        if tokio::time::timeout_at(direct_until, direct).await.is_err() {
            further = self
                .probe_further(&target, &ping, seq, deadline, &mut rx)
                .await;
        }
        lock(&self.waiters).remove(&seq);
        let took = start.elapsed().as_secs_f64() * 1e3;
        lock(&c.samples.probe_node).record(took);
        let delta = further.awareness_delta();
        self.with_table(|t| t.awareness.apply(delta));
        if further.answered {
            return;
        }
        c.bump(&c.probes_failed);
        let accused = Verdict {
            incarnation: target.incarnation,
            node: &target.name,
            from: &self.me,
        };
        self.with_table(|t| t.suspect(&accused, Instant::now()));
    }

    /// After a missed ack: indirect pings and a TCP ping (`ping` again),
    /// waiting until `deadline` for any ack.
    async fn probe_further(
        self: &Arc<Self>,
        target: &Target,
        ping: &[u8],
        seq: u32,
        deadline: Instant,
        rx: &mut mpsc::Receiver<Reply>,
    ) -> Probed {
        let c = &self.counters;
        let peers = lock(&self.table).indirect_peers(self.cfg.indirect_checks, &target.name);
        let (my_addr, my_port) = self.me_addr();
        let mut out = Probed {
            answered: false,
            expected_nacks: 0,
            nacks: 0,
        };
        for (peer, pmax) in peers {
            let mut msg = Vec::with_capacity(96 + target.name.len());
            IndirectPing {
                seq,
                target: &target.addr_raw,
                port: target.to.port(),
                node: &target.name,
                nack: pmax >= 4,
                source_addr: &my_addr,
                source_port: my_port,
                source_node: &self.me,
            }
            .encode(&mut msg);
            out.expected_nacks += i32::from(pmax >= 4);
            self.send(peer, &msg).await;
            c.bump(&c.probes_indirect);
        }
        let tcp = (target.pmax >= 3).then(|| {
            c.bump(&c.probes_tcp);
            let (serf, to, ping) = (self.clone(), target.to, ping.to_vec());
            tokio::spawn(async move { serf.tcp_ping(to, &ping, seq, deadline).await })
        });
        let heard = acked(rx, &mut out.nacks);
        out.answered = tokio::time::timeout_at(deadline, heard).await.is_ok();
        match tcp {
            Some(t) if out.answered => t.abort(),
            Some(t) => out.answered = t.await.unwrap_or(false),
            None => {}
        }
        out
    }

    /// The room a gossip packet has for messages (memberlist's UDP buffer
    /// less the compound header, the label and the encryption).
    fn gossip_budget(&self) -> usize {
        let sec = &self.cfg.security;
        let label = if sec.label.is_empty() {
            0
        } else {
            2 + sec.label.len()
        };
        let crypt = if sec.keyring.is_some() {
            crypt::OVERHEAD
        } else {
            0
        };
        UDP_BUFFER.saturating_sub(2 + label + crypt)
    }
}

/// Gossips until `shutdown`.
pub(super) async fn gossip(serf: Arc<Serf>, shutdown: CancellationToken) {
    let mut tick = ticker(serf.cfg.gossip_interval);
    let budget = serf.gossip_budget();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let packets = {
            let mut t = lock(&serf.table);
            if t.queue.len() == 0 {
                continue;
            }
            let limit = t.retransmit_limit();
            let to = t.gossip_targets(serf.cfg.gossip_nodes, Instant::now());
            to.into_iter()
                .map(|addr| (addr, t.queue.take(budget, 2, limit)))
                .filter(|(_, msgs)| !msgs.is_empty())
                .collect::<Vec<_>>()
        };
        for (to, msgs) in packets {
            if let [one] = &msgs[..] {
                serf.send(to, one).await;
            } else {
                let parts: Vec<&[u8]> = msgs.iter().map(Vec::as_slice).collect();
                serf.send(to, &compound(&parts)).await;
            }
        }
    }
}

/// Expires suspicions and reaps members until `shutdown`.
pub(super) async fn timers(serf: Arc<Serf>, shutdown: CancellationToken) {
    loop {
        let now = Instant::now();
        let next = lock(&serf.table)
            .next_deadline()
            .map_or(now + TIMERS_EVERY, |d| d.min(now + TIMERS_EVERY));
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = shutdown.cancelled() => return,
        }
        let now = Instant::now();
        serf.with_table(|t| {
            t.expire(now);
            t.reap(now);
        });
    }
}

/// Samples the queues' depths every QUEUE_CHECK_EVERY until `shutdown`
/// (serf's `checkQueueDepth`, memberlist's `checkBroadcastQueueDepth`).
pub(super) async fn queue_checks(serf: Arc<Serf>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(QUEUE_CHECK_EVERY) => {}
            () = shutdown.cancelled() => return,
        }
        let depths = lock(&serf.table).queue.depths();
        serf.counters.samples.queues(depths);
    }
}

/// memberlist's `pushPullScale`: the interval, times
/// `ceil(log2(n) - log2(32)) + 1` beyond 32 members.
fn push_pull_every(interval: Duration, n: usize) -> Duration {
    if n <= PUSH_PULL_SCALE_FROM {
        return interval;
    }
    let m = ((n as f64).log2() - (PUSH_PULL_SCALE_FROM as f64).log2()).ceil() + 1.0;
    interval * m as u32
}

/// Push-pulls with a random member until `shutdown`.
pub(super) async fn push_pulls(serf: Arc<Serf>, shutdown: CancellationToken) {
    let base = serf.cfg.push_pull_interval;
    if base.is_zero() {
        return;
    }
    let mut wait = base.mul_f64(fastrand::f64());
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
        let (to, n) = {
            let t = lock(&serf.table);
            (t.push_pull_target(), t.len())
        };
        wait = push_pull_every(base, n);
        let Some(to) = to else { continue };
        let c = &serf.counters;
        c.bump(&c.push_pulls_sent);
        let done = tokio::select! {
            r = serf.push_pull_with(to) => r,
            () = shutdown.cancelled() => return,
        };
        if let Err(cause) = done {
            c.bump(&c.push_pulls_failed);
            if cause != "connect" {
                c.bad(cause);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pulls_spread_out_past_32_members() {
        let s = Duration::from_secs(30);
        assert_eq!(push_pull_every(s, 32), s);
        assert_eq!(push_pull_every(s, 33), s * 2);
        assert_eq!(push_pull_every(s, 64), s * 2);
        assert_eq!(push_pull_every(s, 10_000), s * 10);
    }
}
