//! A client agent's own certificate at boot, as a Consul 1.20 agent with
//! `auto_encrypt { tls = true }` gets it before it does anything else
//! (`agent/auto-config`): a new key and CSR for its node
//! (`spiffe://unknown/agent/client/dc/<dc>/id/<node>`), then rounds of
//! `AutoEncrypt.Sign` over the servers, each call on a TLS connection of
//! its own (`0x07`, [`crate::rpc::auto_encrypt`]), until one signs; after a
//! round where none did, Consul's waiter (0, 1, 2, 4 … s up to 10 minutes,
//! plus up to 25 %: [`crate::connect::auto_encrypt`]).
//!
//! The servers are tried in the run's order, as a real agent tries its
//! `retry_join` addresses. The TLS is the run's when it has TLS settings
//! (its CA, server name and client certificate); without any, the server's
//! certificate is not verified, as an agent without a `ca_file` does not.
//! What is kept of the certificate is its validity (16 bytes): the key and
//! the PEM are dropped, and the agent's later connections use the run's
//! TLS settings, not this certificate.

use std::future::Future;
use std::net::IpAddr;

use agent_sim_fleet::{BoxFuture, SessionCx, SessionEnd};
use agent_sim_metrics::{ErrorKindSpec, Speaker};
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt as _;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_util::compat::TokioAsyncReadCompatExt as _;
use tokio_util::sync::CancellationToken;

use super::link::{CALL_TIMEOUT, count_denial};
use super::{ConsulAgent, Shared};
use crate::ConsulError;
use crate::config::{ConsulConfig, ConsulTls};
use crate::conn::{self, CONNECT_TIMEOUT, ConnectError, Counted, Dialer};
use crate::connect::auto_encrypt::Waiter;
use crate::connect::{UNKNOWN_TRUST_DOMAIN, new_agent_csr, spiffe_agent_id};
use crate::http::Refusal;
use crate::modes::AgentWire;
use crate::rpc::auto_encrypt::{MAX_ANSWER, RPC_TLS_INSECURE, SIGN, decode_signed, encode_sign};
use crate::rpc::connect_ca::RATE_LIMITED;
use crate::rpc::mux::{CallError, read_answer};

/// A server refused `AutoEncrypt.Sign` (an error kind).
pub(crate) const REFUSED: ErrorKindSpec = ErrorKindSpec {
    kind: "auto_encrypt_refused",
    hint: "a server refused AutoEncrypt.Sign (the sample is its words): auto_encrypt { \
           allow_tls = true } and connect { enabled = true } on the servers, a servers' \
           datacenter of dc1 (what the agents say, a real agent's default), a token with \
           node:write on the agent's node; the agent tries the next server, then waits (up to \
           10 min) and tries them all again",
    heals: false,
    said_by: Speaker::Server,
};

/// A server answered `AutoEncrypt.Sign` with its signing rate limit (a
/// warning kind: the agent tries again, as a real one does).
pub(crate) const RATE_LIMITED_KIND: ErrorKindSpec = ErrorKindSpec {
    kind: "auto_encrypt_rate_limited",
    hint: "the servers ration certificate signing (connect.ca_config.csr_max_per_second, 50/s \
           by default, shared with leaf certificates): agents booting faster wait and try again \
           (the next server at once, then 0, 1, 2, 4 ... s); raise the rate or ramp slower",
    heals: true,
    said_by: Speaker::Server,
};

/// Each server's TLS for `AutoEncrypt.Sign`, in the run's order.
pub(super) type InsecureTls = Box<[(TlsConnector, ServerName<'static>)]>;

/// What an agent keeps of its certificate: its validity (Unix seconds),
/// what a renewal would be timed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AgentCert {
    pub(super) valid_after: i64,
    pub(super) valid_before: i64,
}

/// The TLS of each server's `AutoEncrypt.Sign` connection when the run's
/// agents ask for their certificate (`auto_encrypt`, client wire): the
/// dialer's when the run has TLS settings, else one that accepts any
/// server certificate (made once, shared).
pub(super) fn insecure_tls(
    cfg: &ConsulConfig,
    dialers: &[Dialer],
    hosts: &[String],
) -> Result<Option<InsecureTls>, ConsulError> {
    if !cfg.connect.auto_encrypt || cfg.agent != AgentWire::Client {
        return Ok(None);
    }
    let unverified = ConsulTls {
        insecure_skip_verify: true,
        ..ConsulTls::default()
    };
    let mut any: Option<TlsConnector> = None;
    let mut out = Vec::with_capacity(dialers.len());
    for (d, host) in dialers.iter().zip(hosts) {
        let pair = match &d.tls {
            Some(t) => t.clone(),
            None => {
                let c = match &any {
                    Some(c) => c.clone(),
                    None => TlsConnector::from(conn::tls_client_config(&unverified)?),
                };
                any = Some(c.clone());
                (c, conn::server_name(&unverified, host)?)
            }
        };
        out.push(pair);
    }
    Ok(Some(out.into_boxed_slice()))
}

/// Rounds (`round(n)` for the `n`-th) until one gives a value; between
/// failed rounds the waiter's wait (`draw` gives its random draws), before
/// which `backing_off` is called. `None` when `cancel` fires first.
pub(super) async fn until_signed<T, Fut>(
    mut round: impl FnMut(u32) -> Fut,
    mut draw: impl FnMut() -> f64,
    mut backing_off: impl FnMut(),
    cancel: &CancellationToken,
) -> Option<T>
where
    Fut: Future<Output = Option<T>>,
{
    let mut waiter = Waiter::default();
    let mut n = 0u32;
    loop {
        let got = tokio::select! {
            biased;
            _ = cancel.cancelled() => return None,
            got = round(n) => got,
        };
        if got.is_some() {
            return got;
        }
        n = n.wrapping_add(1);
        let wait = waiter.failed(draw());
        if !wait.is_zero() {
            backing_off();
            tokio::select! {
                _ = cancel.cancelled() => return None,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

impl ConsulAgent {
    /// Whether this agent still has to ask for its certificate.
    fn wants_agent_cert(&self) -> bool {
        self.shared.auto_encrypt.is_some()
            && self.extra.as_ref().is_none_or(|e| e.agent_cert.is_none())
    }

    /// Before anything else of its first session: the agent's certificate
    /// (`None`: nothing to do, it is held or not asked for). Boxed, as the
    /// connect step is: the session future stays small.
    pub(super) fn auto_encrypt<'a>(
        &'a mut self,
        cx: &'a SessionCx,
    ) -> Option<BoxFuture<'a, Result<(), SessionEnd>>> {
        if !self.wants_agent_cert() {
            return None;
        }
        Some(Box::pin(self.obtain_cert(cx)))
    }

    /// The certificate, timed as the `auto_encrypt` latency from the first
    /// round. The dial slot is given back before the first wait, so that
    /// agents waiting for the servers' signing rate do not hold up the
    /// others' handshakes. `Err`: the session was cancelled meanwhile, or
    /// no CSR could be made.
    async fn obtain_cert(&mut self, cx: &SessionCx) -> Result<(), SessionEnd> {
        let sh = self.shared.clone();
        let start = Instant::now();
        let dc = match sh.cfg.conn.datacenter.as_str() {
            "" => "dc1",
            dc => dc,
        };
        let id = spiffe_agent_id(UNKNOWN_TRUST_DOMAIN, dc, &self.node());
        let csr = new_agent_csr(&id).map_err(|e| SessionEnd::lost_with(e.kind(), e.to_string()))?;
        let ask = Ask {
            sh: &sh,
            csr: &csr.pem,
            dc,
            token: self.token(),
            bind: cx.bind_addr,
        };
        let ask = &ask;
        let servers = sh.dialers.len();
        let round = move |n: u32| async move {
            for server in 0..servers {
                // One sequence of call numbers, as the agent's process has.
                let seq = u64::from(n) * servers as u64 + server as u64 + 1;
                match ask.sign_at(server, seq).await {
                    Ok(cert) => return Some(cert),
                    Err(r) => ask.count(&r),
                }
            }
            None
        };
        let release = || cx.release_dial_slot();
        let Some(cert) = until_signed(round, fastrand::f64, release, &cx.cancel).await else {
            return Err(SessionEnd::Shutdown);
        };
        sh.metrics
            .record(sh.ids.auto_encrypt, self.index as usize, start.elapsed());
        self.extra.get_or_insert_default().agent_cert = Some(cert);
        Ok(())
    }
}

/// One agent's request, the same on every server.
struct Ask<'a> {
    sh: &'a Shared,
    csr: &'a str,
    dc: &'a str,
    token: &'a str,
    bind: Option<IpAddr>,
}

impl Ask<'_> {
    /// `AutoEncrypt.Sign` on `server` as call `seq`: a connection of its
    /// own (`0x07`, TLS), the call, the whole answer; closed after it.
    async fn sign_at(&self, server: usize, seq: u64) -> Result<AgentCert, Refusal> {
        let sh = self.sh;
        let Some((connector, name)) = sh.auto_encrypt.as_deref().and_then(|t| t.get(server)) else {
            return Err(Refusal::kind("auto_encrypt_refused"));
        };
        let addr = sh.dialers[server].addr;
        let bind = self.bind;
        let dial = async {
            let mut tcp = agent_sim_net::dial(addr, bind)
                .await
                .map_err(ConnectError::Dial)?;
            tcp.write_all(&[RPC_TLS_INSECURE])
                .await
                .map_err(ConnectError::Prefix)?;
            connector
                .connect(name.clone(), tcp)
                .await
                .map_err(ConnectError::Tls)
        };
        let tls = match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
            Err(_) => return Err(Refusal::kind("connect_timeout")),
            Ok(Err(e)) => {
                return Err(Refusal {
                    kind: e.kind(),
                    words: Some(e.to_string()),
                });
            }
            Ok(Ok(tls)) => tls,
        };
        let mut req = Vec::with_capacity(self.csr.len() + 128);
        encode_sign(seq, self.csr, self.dc, self.token, &mut req);
        let mut io = Counted::new(tls, Some(sh.bytes(false)));
        let call = async {
            let written = async {
                io.write_all(&req).await?;
                io.flush().await
            };
            written
                .await
                .map_err(|e| CallError::of("conn_error", "writing the call: ", &e))?;
            read_answer(&mut (&mut io).compat(), seq, MAX_ANSWER).await
        };
        let reply = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Err(_) => {
                let words = format!("no answer within {}s", CALL_TIMEOUT.as_secs());
                return Err(Refusal {
                    kind: "rpc_timeout",
                    words: Some(words),
                });
            }
            Ok(r) => r?.0,
        };
        if !reply.header.error.is_empty() {
            return Err(refusal(reply.header.error));
        }
        let s = decode_signed(&reply.body)?;
        Ok(AgentCert {
            valid_after: s.issued.valid_after.0,
            valid_before: s.issued.valid_before.0,
        })
    }

    /// Counts a failed call: the rate limit as its counter and a warning,
    /// anything else as an error of its kind, with the server's words.
    fn count(&self, r: &Refusal) {
        let (m, ids) = (&self.sh.metrics, &self.sh.ids);
        if r.kind == RATE_LIMITED_KIND.kind {
            m.incr(ids.auto_encrypt_rate_limited);
            m.warn(r.kind, r.words.as_deref());
        } else {
            count_denial(m, r.kind, SIGN);
            m.error_with(r.kind, r.words.as_deref());
        }
    }
}

/// The server's error answer as a failure of its kind.
fn refusal(words: String) -> Refusal {
    let kind = if words == RATE_LIMITED {
        RATE_LIMITED_KIND.kind
    } else {
        crate::http::cause_kind(&words).unwrap_or(REFUSED.kind)
    };
    Refusal {
        kind,
        words: Some(words),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn failed_rounds_wait_0_1_2_4_s_then_one_signs() {
        let t0 = Instant::now();
        let starts = RefCell::new(Vec::new());
        let backoffs = RefCell::new(0);
        let round = |n: u32| {
            starts.borrow_mut().push(t0.elapsed().as_millis() as u64);
            async move { (n == 4).then_some(n) }
        };
        let cancel = CancellationToken::new();
        let got = until_signed(round, || 0.0, || *backoffs.borrow_mut() += 1, &cancel).await;
        assert_eq!(got, Some(4));
        assert_eq!(*starts.borrow(), [0, 0, 1000, 3000, 7000]);
        assert_eq!(t0.elapsed(), Duration::from_secs(7));
        // Three of the waits were more than nothing.
        assert_eq!(*backoffs.borrow(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_jitter_lengthens_each_wait_and_cancel_ends_the_rounds() {
        let t0 = Instant::now();
        let cancel = CancellationToken::new();
        let starts = RefCell::new(Vec::new());
        let round = |_: u32| {
            starts.borrow_mut().push(t0.elapsed().as_millis() as u64);
            async { None::<()> }
        };
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            stop.cancel();
        });
        // A draw of 0.5: each wait an eighth longer (half of 25 %).
        let got = until_signed(round, || 0.5, || {}, &cancel).await;
        assert_eq!(got, None);
        assert_eq!(*starts.borrow(), [0, 0, 1125, 3375, 7875, 16875, 34875]);
        assert_eq!(t0.elapsed(), Duration::from_secs(60));
    }

    #[test]
    fn the_servers_words_say_the_kind() {
        assert_eq!(refusal(RATE_LIMITED.into()).kind, RATE_LIMITED_KIND.kind);
        let acl = refusal("Permission denied: token lacks 'node:write'".into());
        assert_eq!(acl.kind, "acl_denied");
        let words = "mismatched datacenter (client_dc='dc2' server_dc='dc1')";
        let dc = refusal(words.into());
        assert_eq!((dc.kind, dc.words.as_deref()), (REFUSED.kind, Some(words)));
    }
}
