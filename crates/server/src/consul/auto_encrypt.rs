//! `AutoEncrypt.Sign` as a Consul 1.20 server answers it
//! (`agent/consul/auto_encrypt_endpoint.go`): on an RPC connection that
//! starts with `0x07` (`pool.RPCTLSInsecure`), a TLS handshake that asks
//! for no client certificate (`IncomingInsecureRPCConfig`), then net/rpc
//! calls in msgpack straight on the TLS stream, served by the server's
//! insecure RPC server, where `AutoEncrypt.Sign` is the only method.
//!
//! The call: the agent's datacenter must be the server's (Consul's words
//! otherwise), then what `ConnectCA.Sign` does for an agent's SPIFFE ID:
//! the CSR parsed, the token resolved, one URI naming a client agent, the
//! token allowed `node:write` on it, the CSR's trust domain replaced with
//! the cluster's, the signing rationed as every signing is
//! (`csr_max_per_second`: [`super::connect_ca`]), a raft index taken (the
//! leader's `ApplyCALeafRequest`). The answer, `SignedResponse`, holds the
//! agent's `IssuedCert`, the Connect CA's roots, `ManualCARoots` (nil: the
//! embedded server keeps no CA file of its TLS) and
//! `VerifyServerHostname` (false).
//!
//! A real server answers this only over TLS (`auto_encrypt.allow_tls`
//! needs its TLS settings). The embedded one uses its TLS certificate when
//! it has one; without TLS settings it answers with a self-signed
//! certificate made for the purpose (`server.<dc>.consul`), so that agents
//! can ask at all; they verify it only if told to.

use std::sync::Arc;

use bytes::Bytes;
use rustls::ServerConfig;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

use agent_sim_proto::msgpack::Writer;

use super::acl::{Access, Resource};
use super::conn::tls_accept;
use super::connect_ca::{CaError, Leaf};
use super::mux::{answer_frame, read_request};
use super::rpc_error::RpcError;
use super::writes::nullable;
use super::{ConsulState, Gauge};

/// First byte of an `AutoEncrypt.Sign` connection (`pool.RPCTLSInsecure`).
pub(crate) const RPC_TLS_INSECURE: u8 = 0x07;
/// The method.
pub(crate) const SIGN: &str = "AutoEncrypt.Sign";
/// Largest request read: a header and a CSR are ≈1 KiB.
const MAX_REQUEST: usize = 64 * 1024;

#[derive(Deserialize, Default)]
#[serde(default)]
struct SignArgs {
    #[serde(rename = "CSR", deserialize_with = "nullable")]
    csr: String,
    #[serde(rename = "Datacenter", deserialize_with = "nullable")]
    datacenter: String,
    #[serde(rename = "Token", deserialize_with = "nullable")]
    token: String,
}

/// Serves a connection whose `0x07` was read: the TLS handshake, then its
/// calls one after another until the client closes it.
pub(crate) async fn serve_insecure<S>(stream: S, state: ConsulState, shutdown: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let counters = &state.inner.counters;
    let tls = state
        .ca()
        .insecure_tls
        .get_or_init(|| insecure_config(state.inner.cfg.tls.as_ref(), state.ca().datacenter()))
        .clone();
    let mut io = match tls {
        None => return counters.bump(&counters.rpc_rejected_tls),
        Some(tls) => match tls_accept(stream, tls, &shutdown).await {
            None => return,
            Some(Ok(io)) => io,
            Some(Err(_)) => return counters.bump(&counters.rpc_rejected_tls),
        },
    };
    counters.bump(&counters.rpc_connections);
    let _open = Gauge::up(&state, |c| &c.rpc_connections_open);
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    loop {
        // Not msgpack, too long or closed: the connection is closed.
        let Some((header, h, end)) = read_request(&mut io, &mut buf, MAX_REQUEST, &shutdown).await
        else {
            return;
        };
        let method = header.service_method.as_str();
        let answer = match method {
            SIGN => sign(&state, &buf[h..end]).await.map_err(RpcError::from),
            m if m.starts_with("AutoEncrypt.") => Err(RpcError::NoMethod(m.to_owned())),
            m => Err(RpcError::NoService(m.to_owned())),
        };
        state.count_call(method, answer.is_err());
        let out = answer_frame(method, header.seq, answer.as_ref().map(|b| &b[..]));
        buf.drain(..end);
        if io.write_all(&out).await.is_err() || io.flush().await.is_err() {
            return;
        }
    }
}

/// `AutoEncrypt.Sign`: a `SignedResponse`, or why not in Consul's words.
async fn sign(state: &ConsulState, args: &[u8]) -> Result<Bytes, CaError> {
    let a: SignArgs = agent_sim_proto::msgpack::decode(args)?;
    let ca = state.ca();
    if a.datacenter != ca.datacenter() {
        return Err(CaError::MismatchedDatacenter {
            client: a.datacenter,
            server: ca.datacenter().to_owned(),
        });
    }
    let csr = ca.parse_csr(&a.csr)?;
    let authz = state.acl(&a.token)?;
    let node = ca.agent_of(&csr.params)?;
    authz
        .check(Resource::Node, Access::Write, &node)
        .map_err(|d| CaError::Acl(d.into()))?;
    let roots = ca.roots_msgpack()?;
    // The leader's raft write of the signing, once the rate admits it.
    let index = || Some(state.store().next_index());
    let cert = ca.sign_leaf(csr, Leaf::Agent(&node), index).await?;
    let mut out = Vec::with_capacity(roots.len() + cert.len() + 128);
    Writer(&mut out).map(5).str("ConnectCARoots");
    out.extend_from_slice(&roots);
    Writer(&mut out).kv_str("GossipKey", "").str("IssuedCert");
    out.extend_from_slice(&cert);
    Writer(&mut out)
        .kv_nil("ManualCARoots")
        .kv_bool("VerifyServerHostname", false);
    Ok(Bytes::from(out))
}

/// The TLS of `0x07` connections: the server's certificate without asking
/// for the client's, or (no TLS settings) a self-signed one for
/// `server.<datacenter>.consul`; `None` if it cannot be made.
fn insecure_config(tls: Option<&Arc<ServerConfig>>, datacenter: &str) -> Option<Arc<ServerConfig>> {
    let provider = match tls {
        Some(t) => t.crypto_provider().clone(),
        None => Arc::new(rustls::crypto::ring::default_provider()),
    };
    let builder = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_no_client_auth();
    let config = match tls {
        Some(t) => builder.with_cert_resolver(t.cert_resolver.clone()),
        None => {
            let names = vec![format!("server.{datacenter}.consul"), "localhost".into()];
            let made = rcgen::generate_simple_self_signed(names).ok()?;
            let key =
                rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
            builder
                .with_single_cert(vec![made.cert.der().clone()], key)
                .ok()?
        }
    };
    Some(Arc::new(config))
}
