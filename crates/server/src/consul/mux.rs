//! The multiplexed RPC port (`0x04`, then yamux): each stream the client
//! opens carries net/rpc calls in msgpack, a request or an answer being two
//! msgpack values back to back (one yamux frame per answer, as a real
//! server writes it). Calls are answered one after another per stream:
//! blocking queries (`Health.ServiceNodes`, [`super::blocking`]), KV
//! reads and writes (`KVS.*`, `Txn.*`, `super::kv_rpc`) and a
//! client agent's own calls ([`super::agent_rpc`]); any other method gets
//! net/rpc's words for it. Faults (`consul.rpc`) delay, stall, refuse or
//! close calls.

use std::future::poll_fn;

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::compat::{FuturesAsyncReadCompatExt as _, TokioAsyncReadCompatExt as _};
use tokio_util::sync::CancellationToken;

use agent_sim_proto::msgpack::{MessageScan, Writer};
use bytes::Bytes;

use super::acl::{Access, Resource};
use super::blocking::{SERVICE_NODES, service_nodes};
use super::rpc_error::RpcError;
use super::{ConsulState, Gauge, agent_rpc, connect_ca, kv_rpc};
use crate::faults::{Action, STALL_LIMIT, Target};

/// `pool.RPCMultiplexV2`: the byte that starts yamux on an RPC connection.
pub(crate) const RPC_MULTIPLEX_V2: u8 = 0x04;
/// Largest request read: a header and a `ServiceSpecificRequest` are
/// ≈0.5 KiB, a client agent's `Catalog.Register` of a sidecar ≈2 KiB, a
/// `KVS.Apply` up to a value of Consul's default `kv_max_value_size`; a
/// stream sending more is closed.
const MAX_REQUEST: usize = 64 * 1024 + super::KV_MAX_VALUE_SIZE;
/// Streams one connection may hold at once (an agent opens one per
/// watched service, and one for its own calls).
const MAX_STREAMS: usize = 1024;

/// One call: its answer's body, or the error net/rpc sends back.
async fn call(
    state: &ConsulState,
    method: &str,
    args: &[u8],
    shutdown: &CancellationToken,
) -> Result<Bytes, RpcError> {
    if let Some(answer) = kv_rpc::answer(state, method, args, shutdown).await {
        return answer;
    }
    match method {
        SERVICE_NODES => service_nodes(state, args, shutdown).await,
        connect_ca::ROOTS => Ok(state.ca().roots(args, shutdown).await?),
        connect_ca::SIGN => {
            let authorize = |token: &str, service: &str| {
                let authz = state.acl(token)?;
                Ok(authz.check(Resource::Service, Access::Write, service)?)
            };
            Ok(state.ca().sign(args, authorize).await?)
        }
        m => match agent_rpc::answer(state, m, args) {
            Some(answer) => answer,
            None => Err(unknown_method(m)),
        },
    }
}

/// net/rpc's request header.
/// A net/rpc request's header.
#[derive(Deserialize)]
pub(super) struct RequestHeader {
    /// `Service.Method`.
    #[serde(rename = "ServiceMethod", default)]
    pub(super) service_method: String,
    /// The call's number, echoed in its answer.
    #[serde(rename = "Seq", default)]
    pub(super) seq: u64,
}

/// Serves yamux on an RPC connection whose `0x04` was read: each stream
/// the client opens gets a task answering its calls one after another.
pub(crate) async fn serve_mux<I>(io: I, state: ConsulState, shutdown: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let counters = &state.inner.counters;
    counters.bump(&counters.rpc_connections);
    counters.bump(&counters.rpc_mux_connections);
    let _open = Gauge::up(&state, |c| &c.rpc_connections_open);
    let _held = state.faults().hold(crate::faults::Load::ConsulRpc);
    let mut cfg = yamux::Config::default();
    cfg.set_max_num_streams(MAX_STREAMS);
    // Writes gathered until yamux flushes: one write a frame, as Consul sends.
    let io = agent_sim_net::Coalesced::new(io);
    let mut conn = yamux::Connection::new(io.compat(), cfg, yamux::Mode::Server);
    // Bound: at most MAX_STREAMS streams (yamux refuses more), one task each.
    let mut calls = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            next = poll_fn(|cx| conn.poll_next_inbound(cx)) => match next {
                Some(Ok(stream)) => {
                    calls.spawn(serve_stream(stream, state.clone(), shutdown.clone()));
                }
                Some(Err(_)) | None => break,
            },
            Some(_) = calls.join_next(), if !calls.is_empty() => {}
        }
    }
    // Dropping the set ends the streams' tasks, and the connection with it.
}

/// Reads one net/rpc request (its header, then its arguments: two msgpack
/// values) into `buf`: the header, where it ends and where the request
/// does; `None` when the peer closed or sent what is not msgpack, a header
/// that is not one, or more than `limit` bytes, or the server stops.
pub(super) async fn read_request<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut Vec<u8>,
    limit: usize,
    shutdown: &CancellationToken,
) -> Option<(RequestHeader, usize, usize)> {
    let mut chunk = [0u8; 4096];
    let mut scan = MessageScan::default();
    loop {
        match scan.scan(buf) {
            Ok(Some((h, end))) => {
                let header = agent_sim_proto::msgpack::decode::<RequestHeader>(&buf[..h]).ok()?;
                return Some((header, h, end));
            }
            Ok(None) if buf.len() <= limit => {}
            _ => return None,
        }
        let n = tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = io.read(&mut chunk) => match r {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            },
        };
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One yamux stream: requests in, answers out, in order.
async fn serve_stream(s: yamux::Stream, state: ConsulState, shutdown: CancellationToken) {
    let mut s = s.compat();
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    loop {
        // Not msgpack, too long or closed: the stream is closed.
        let Some((header, h, end)) = read_request(&mut s, &mut buf, MAX_REQUEST, &shutdown).await
        else {
            return;
        };
        let method = header.service_method.as_str();
        let answer = match call_fault(&state, method, &shutdown).await {
            Some(CallFault::Close) => return,
            Some(CallFault::Error(e)) => Err(e),
            None => call(&state, method, &buf[h..end], &shutdown).await,
        };
        buf.drain(..end);
        state.count_call(method, answer.is_err());
        let out = answer_frame(method, header.seq, answer.as_ref().map(|b| &b[..]));
        if s.write_all(&out).await.is_err() || s.flush().await.is_err() {
            return;
        }
    }
}

/// net/rpc's answer to call `seq` of `method`: its header, with the keys
/// in the order a 1.20 server writes them (`Error`, `Seq`, `ServiceMethod`,
/// as in testdata/vectors/consul/agent-rpc), then the body, or an empty
/// struct after an error. One message, one frame, as a real server writes it.
pub(super) fn answer_frame(method: &str, seq: u64, answer: Result<&[u8], &RpcError>) -> Vec<u8> {
    let error = answer.err().map(ToString::to_string);
    let body = answer.unwrap_or(&[0x80]);
    let mut out = Vec::with_capacity(64 + method.len() + body.len());
    Writer(&mut out)
        .map(3)
        .kv_str("Error", error.as_deref().unwrap_or(""))
        .kv_uint("Seq", seq)
        .kv_str("ServiceMethod", method);
    out.extend_from_slice(body);
    out
}

/// net/rpc's error for a method it does not serve.
fn unknown_method(m: &str) -> RpcError {
    // Services a Consul 1.20 server registers: a method it lacks is "can't
    // find method"; an unknown service is "can't find service".
    const SERVICES: &[&str] = &[
        "ACL",
        "Catalog",
        "ConfigEntry",
        "ConnectCA",
        "Coordinate",
        "DiscoveryChain",
        "Health",
        "Intention",
        "Internal",
        "KVS",
        "Operator",
        "PreparedQuery",
        "Session",
        "Status",
        "Txn",
    ];
    match m.split_once('.') {
        Some((s, _)) if SERVICES.contains(&s) => RpcError::NoMethod(m.to_owned()),
        _ => RpcError::NoService(m.to_owned()),
    }
}

enum CallFault {
    /// The call's stream ends without an answer.
    Close,
    /// The call is answered with this error.
    Error(RpcError),
}

/// What a `consul.rpc` fault does to one call: delays it, answers it with
/// Consul's rate-limit words, or closes its stream (a stall holds it until
/// the limit or shutdown first).
async fn call_fault(
    state: &ConsulState,
    method: &str,
    shutdown: &CancellationToken,
) -> Option<CallFault> {
    let hit = state.faults().pick(Target::ConsulRpc, Some(method))?;
    match hit.action {
        Action::Delay(d) => {
            tokio::select! {
                _ = shutdown.cancelled() => Some(CallFault::Close),
                () = tokio::time::sleep(d) => None,
            }
        }
        Action::Stall => {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                () = tokio::time::sleep(STALL_LIMIT) => {}
            }
            Some(CallFault::Close)
        }
        Action::Drop | Action::Reset | Action::Truncated | Action::Garbage => {
            Some(CallFault::Close)
        }
        Action::Status(_) | Action::Unavailable | Action::ResourceExhausted | Action::Aborted => {
            Some(CallFault::Error(RpcError::RateLimited))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_methods_in_net_rpcs_words() {
        assert_eq!(
            unknown_method("Health.Nope").to_string(),
            "rpc: can't find method Health.Nope"
        );
        assert_eq!(
            unknown_method("Foo.Bar").to_string(),
            "rpc: can't find service Foo.Bar"
        );
    }
}
