//! An agent's KV watches (`--watch-kv`) inside its session: each prefix
//! read with one blocking query after another, as consul-template reads
//! through its local agent. On the client wire (`--consul-agent client`,
//! not `--watch http`) each read is `KVS.List` on a stream of its own on
//! the agent's RPC connection, the stream kept for the next read; API
//! agents and `--watch http` long-poll the HTTP API on a connection of
//! their own per prefix. Between reads: the index rules and the rate limit
//! of [`crate::kv`], consul-template's retry after a failure. With `--probe
//! kv` each agent is timed on its first prefix that holds the probe key.
//!
//! The session loop (`session`) calls [`KvSession`]'s `due`, `poll` and
//! `on_io` beside the mode's own watches; what outlives a session (index,
//! last result, probe marks) is the agent's [`KvWatch`].

use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_sim_metrics::{CounterId, Metrics};
use agent_sim_net::RxStamp;
use tokio::time::Instant;

use super::ConsulAgent;
use super::subscriptions::{Arrival, delivered};
use crate::config::{ConsulConfig, NamePattern, ProbeKind};
use crate::kv::rpc::{KvAnswer, ListArgs, ReadFuture};
use crate::kv::{self, KvDigest};
use crate::modes::{AgentWire, WatchMode};
use crate::names;
use crate::probe::{Expect, Owed, ProbeBoard};
use crate::rpc::mux::{CallError, MAX_ANSWER, Mux};
use crate::watch::http::HttpWatch;

/// An HTTP connection being made (as `watching` makes them).
type HttpConnect =
    std::pin::Pin<Box<dyn Future<Output = Result<(HttpWatch, Option<RxStamp>), CallError>> + Send>>;

/// The KV counters, resolved once.
#[derive(Debug, Clone, Copy)]
pub(super) struct KvIds {
    calls: CounterId,
    answers: CounterId,
    changed: CounterId,
    bytes: CounterId,
}

impl KvIds {
    pub(super) fn resolve(m: &Metrics) -> Self {
        KvIds {
            calls: m.counter(names::KV_WATCH_CALLS),
            answers: m.counter(names::KV_WATCH_ANSWERS),
            changed: m.counter(names::KV_WATCH_CHANGED),
            bytes: m.counter(names::KV_WATCH_BYTES),
        }
    }
}

/// What every agent's KV watches share.
pub(super) struct KvShared {
    /// The prefixes (a fixed one expanded once).
    prefixes: Vec<(NamePattern, Option<Arc<str>>)>,
    /// The key `--probe kv` writes.
    probe_key: Option<Arc<str>>,
    /// `KVS.List` on the agent's RPC connection (else HTTP long polls).
    rpc: bool,
    /// `MaxQueryTime` / `wait`.
    wait: Duration,
    /// Largest answer read.
    max: usize,
}

impl KvShared {
    pub(super) fn new(cfg: &ConsulConfig, prefixes: Vec<NamePattern>) -> Self {
        let prefixes = prefixes
            .into_iter()
            .map(|p| {
                let fixed = p
                    .is_fixed()
                    .then(|| Arc::from(kv::normal_prefix(&p.expand(0))));
                (p, fixed)
            })
            .collect();
        KvShared {
            prefixes,
            probe_key: (cfg.probe.kind == Some(ProbeKind::Kv))
                .then(|| Arc::from(kv::probe_key(&cfg.conn.name_prefix))),
            rpc: cfg.agent == AgentWire::Client && cfg.watch != WatchMode::Http,
            wait: cfg.blocking_wait,
            max: MAX_ANSWER,
        }
    }

    /// Agent `index`'s watches (`None`: none); the probe is timed on the
    /// first prefix that holds its key.
    pub(super) fn watches(&self, index: u64) -> Option<Box<Box<[KvWatch]>>> {
        if self.prefixes.is_empty() {
            return None;
        }
        let timed = self
            .probe_key
            .as_ref()
            .and_then(|k| self.prefixes.iter().position(|(p, _)| p.holds(k)));
        let watches = self
            .prefixes
            .iter()
            .enumerate()
            .map(|(i, (p, fixed))| KvWatch {
                prefix: fixed
                    .clone()
                    .unwrap_or_else(|| Arc::from(kv::normal_prefix(&p.expand(index)))),
                index: 0,
                hash: None,
                first: true,
                probe: timed == Some(i),
                probe_seen: 0,
                owed: Owed::default(),
            })
            .collect::<Box<[KvWatch]>>();
        Some(Box::new(watches))
    }
}

/// One watched prefix of an agent, across its sessions.
pub(super) struct KvWatch {
    prefix: Arc<str>,
    /// The index the next read asks past.
    index: u64,
    /// The last result's hash (`None`: none yet).
    hash: Option<u64>,
    /// No read answered yet (consul-template's first pass: no rate limit).
    first: bool,
    /// Timed on the probe key.
    probe: bool,
    /// The last probe id seen in the key.
    probe_seen: u64,
    /// Probes that counted on this watch when a session ended.
    owed: Owed,
}

/// Where one prefix's read is.
enum Call {
    Idle { at: Instant },
    Rpc(ReadFuture<yamux::Stream>),
    Connecting(HttpConnect),
    Http(ReadFuture<HttpWatch>),
}

/// A prefix's state in one session.
struct KvCall {
    call: Call,
    stream: Option<yamux::Stream>,
    http: Option<HttpWatch>,
    /// Kernel receive stamps of the HTTP connection.
    stamp: Option<RxStamp>,
    seq: u64,
    failures: u32,
    /// When the read in flight was sent.
    sent: Instant,
    /// The probe board's mark since this watch is live in the session.
    mark: Option<u64>,
}

/// What a KV read brought.
pub(super) enum KvIo {
    Rpc(
        usize,
        Instant,
        Option<yamux::Stream>,
        Result<KvAnswer, CallError>,
    ),
    Http(
        usize,
        Instant,
        Option<HttpWatch>,
        Result<KvAnswer, CallError>,
    ),
    Connected(usize, Result<(HttpWatch, Option<RxStamp>), CallError>),
}

/// The KV watches of one session.
pub(super) struct KvSession {
    calls: Vec<KvCall>,
    /// Kernel receive stamps of the RPC connection.
    stamp: Option<RxStamp>,
    bind: Option<IpAddr>,
    rpc: bool,
}

impl KvSession {
    /// Whether the reads ride the agent's RPC connection (its end is the
    /// session's then).
    pub(super) fn on_link(&self) -> bool {
        self.rpc && !self.calls.is_empty()
    }

    /// The first read that finished, from `rotate` on.
    pub(super) fn poll(&mut self, rotate: usize, tcx: &mut Context<'_>) -> Poll<KvIo> {
        let n = self.calls.len();
        for j in 0..n {
            let i = (j + rotate) % n;
            match &mut self.calls[i].call {
                Call::Rpc(f) => {
                    if let Poll::Ready((s, r)) = f.as_mut().poll(tcx) {
                        return Poll::Ready(KvIo::Rpc(i, Instant::now(), s, r));
                    }
                }
                Call::Http(f) => {
                    if let Poll::Ready((c, r)) = f.as_mut().poll(tcx) {
                        return Poll::Ready(KvIo::Http(i, Instant::now(), c, r));
                    }
                }
                Call::Connecting(f) => {
                    if let Poll::Ready(r) = f.as_mut().poll(tcx) {
                        return Poll::Ready(KvIo::Connected(i, r));
                    }
                }
                Call::Idle { .. } => {}
            }
        }
        Poll::Pending
    }
}

impl ConsulAgent {
    fn kv_watches(&self) -> &[KvWatch] {
        self.kv.as_deref().map_or(&[], |w| &w[..])
    }

    fn kv_watches_mut(&mut self) -> &mut [KvWatch] {
        self.kv.as_deref_mut().map_or(&mut [], |w| &mut w[..])
    }

    /// The KV watches of a session starting at `now`, each at its index.
    pub(super) fn kv_session(
        &self,
        now: Instant,
        stamp: Option<RxStamp>,
        bind: Option<IpAddr>,
    ) -> KvSession {
        KvSession {
            calls: self
                .kv_watches()
                .iter()
                .map(|_| KvCall {
                    call: Call::Idle { at: now },
                    stream: None,
                    http: None,
                    stamp: None,
                    seq: 0,
                    failures: 0,
                    sent: now,
                    mark: None,
                })
                .collect(),
            stamp,
            bind,
            rpc: self.shared.kv.rpc,
        }
    }

    /// Sends the reads that are due; the next instant one is.
    pub(super) fn kv_due(
        &mut self,
        s: &mut KvSession,
        mut mux: Option<&mut Mux>,
        now: Instant,
    ) -> Instant {
        // Nothing due within a session: an hour on.
        let mut next = now + Duration::from_secs(3600);
        for i in 0..s.calls.len() {
            if let Call::Idle { at } = s.calls[i].call
                && at <= now
                && let Err(e) = self.kv_start(s, i, mux.as_deref_mut(), now)
            {
                self.kv_failed(&mut s.calls[i], &e, now);
            }
            if let Call::Idle { at } = s.calls[i].call {
                next = next.min(at);
            }
        }
        next
    }

    /// Sends prefix `i`'s next read (an HTTP watch without a connection
    /// first makes one).
    fn kv_start(
        &mut self,
        s: &mut KvSession,
        i: usize,
        mux: Option<&mut Mux>,
        now: Instant,
    ) -> Result<(), CallError> {
        let sh = self.shared.clone();
        let (w, c) = (&self.kv_watches()[i], &mut s.calls[i]);
        let probe_key = w.probe.then(|| sh.kv.probe_key.clone()).flatten();
        if s.rpc {
            let stream = match c.stream.take() {
                Some(st) => st,
                None => match mux.map(|m| m.open_now()) {
                    None => return Err(CallError::new("conn_closed", "no RPC connection")),
                    Some(Some(r)) => r?,
                    Some(None) => {
                        // No room for a stream now: try again shortly.
                        c.call = Call::Idle {
                            at: now + Duration::from_millis(50),
                        };
                        return Ok(());
                    }
                },
            };
            c.seq += 1;
            let args = ListArgs {
                datacenter: &sh.cfg.conn.datacenter,
                key: &w.prefix,
                min_index: w.index,
                max_query_time_ns: sh.kv.wait.as_nanos() as u64,
                // consul-template's default max_stale (2 s) reads stale.
                allow_stale: true,
                token: self.token(),
            };
            c.call = Call::Rpc(kv::rpc::call(stream, c.seq, args, probe_key, sh.kv.max));
        } else {
            let Some(conn) = c.http.take() else {
                c.call = Call::Connecting(self.http_connect(s.bind));
                return Ok(());
            };
            let path = kv::http::path(
                &w.prefix,
                &sh.cfg.conn.datacenter,
                w.index,
                sh.kv.wait.as_secs(),
                true,
            );
            let token = Some(self.token().to_owned()).filter(|t| !t.is_empty());
            let deadline = kv::read_deadline(sh.kv.wait);
            c.call = Call::Http(kv::http::read(
                conn, path, token, probe_key, sh.kv.max, deadline,
            ));
        }
        c.sent = now;
        sh.metrics.incr(sh.ids.kv.calls);
        Ok(())
    }

    /// A read failed: counted in the server's words, retried later.
    fn kv_failed(&self, c: &mut KvCall, e: &CallError, now: Instant) {
        self.shared.metrics.error_with(e.kind, Some(&e.detail));
        super::link::count_denial(&self.shared.metrics, e.kind, crate::kv::rpc::KVS_LIST);
        c.failures += 1;
        c.call = Call::Idle {
            at: now + kv::retry_wait(c.failures),
        };
    }

    /// What a KV read brought.
    pub(super) fn on_kv(&mut self, s: &mut KvSession, io: KvIo) {
        let (i, decoded, r, stamp) = match io {
            KvIo::Rpc(i, at, stream, r) => {
                s.calls[i].stream = stream;
                (i, at, r, s.stamp.as_ref())
            }
            KvIo::Http(i, at, conn, r) => {
                s.calls[i].http = conn;
                (i, at, r, s.calls[i].stamp.as_ref())
            }
            KvIo::Connected(i, r) => {
                let now = Instant::now();
                match r {
                    Ok((conn, st)) => {
                        let c = &mut s.calls[i];
                        c.http = Some(conn);
                        c.stamp = st;
                        c.call = Call::Idle { at: now };
                    }
                    Err(e) => self.kv_failed(&mut s.calls[i], &e, now),
                }
                return;
            }
        };
        let arrival = Arrival {
            decoded,
            kernel: stamp.and_then(|st| st.instant(decoded)),
        };
        let sh = self.shared.clone();
        let digest = match r {
            Ok(a) => {
                sh.metrics.incr(sh.ids.kv.answers);
                sh.metrics.add(sh.ids.kv.bytes, a.bytes as u64);
                a.result
            }
            Err(e) => Err(e),
        };
        match digest {
            Ok(d) => self.kv_result(i, &mut s.calls[i], arrival, d),
            Err(e) => self.kv_failed(&mut s.calls[i], &e, decoded),
        }
    }

    /// A result of prefix `i`: the index rules, the change count, the
    /// probe, and when the next read goes.
    fn kv_result(&mut self, i: usize, c: &mut KvCall, arrival: Arrival, d: KvDigest) {
        let sh = self.shared.clone();
        let agent = self.index as usize;
        let w = &mut self.kv_watches_mut()[i];
        c.failures = 0;
        let wait = if w.first {
            Duration::ZERO
        } else {
            kv::rate_limit(arrival.decoded.saturating_duration_since(c.sent))
        };
        w.first = false;
        c.call = Call::Idle {
            at: arrival.decoded + wait,
        };
        let next = kv::next_index(w.index, d.index);
        if next == 0 && w.index > 0 {
            sh.metrics.warn(
                "watch_index_reset",
                Some(&format!(
                    "kv {}: the index went from {} to {}: reading again from 0",
                    w.prefix, w.index, d.index
                )),
            );
            w.index = 0;
            return;
        }
        if d.index != w.index && w.hash.is_some_and(|h| h != d.hash) {
            sh.metrics.incr(sh.ids.kv.changed);
        }
        w.hash = Some(d.hash);
        w.index = next;
        let Some(b) = sh.board.as_deref().filter(|_| w.probe) else {
            return;
        };
        let mark = *c.mark.get_or_insert_with(|| b.sub_up());
        if let Some(v) = d.probe
            && v != w.probe_seen
        {
            w.probe_seen = v;
            if b.armed() == Some((v, Expect::KvSet))
                && ProbeBoard::expects(Some(mark), w.owed, v)
                && b.arrive(v, arrival.at(), d.index)
            {
                delivered(&sh, agent, arrival);
            }
        }
    }

    /// The end of a session's KV watches: off the probe board.
    pub(super) fn kv_close(&mut self, s: &mut KvSession) {
        let Some(b) = self.shared.board.clone() else {
            return;
        };
        for (w, c) in self.kv_watches_mut().iter_mut().zip(&mut s.calls) {
            if let Some(mark) = c.mark.take() {
                b.sub_down(mark, &mut w.owed);
            }
        }
    }
}
