//! Blocking queries on the agent's RPC connection ([`crate::rpc::mux`]):
//! what a Consul client agent with streaming off asks for each watched
//! service, `Health.ServiceNodes` on a stream of its own, the stream kept
//! for the next query as Consul's `agent/pool` keeps idle streams. The
//! whole result comes back each time and is reduced to a [`Digest`].

use std::pin::Pin;

use super::digest::Digest;
use super::msgpack::{self, ServiceNodesArgs};
use crate::rpc::mux::{CallError, MAX_ANSWER, exchange};

/// What one call brought back.
#[derive(Debug)]
pub struct Answer {
    /// The result, or the error the server answered with.
    pub result: Result<Digest, CallError>,
    /// The answer's size (its msgpack: header and body).
    pub bytes: usize,
}

/// A call's future: the stream comes back for the next call unless the
/// call broke it.
pub type CallFuture = Pin<
    Box<
        dyn std::future::Future<Output = (Option<yamux::Stream>, Result<Answer, CallError>)> + Send,
    >,
>;

/// One `Health.ServiceNodes` call on `stream` with sequence number `seq`.
pub fn call(stream: yamux::Stream, seq: u64, args: ServiceNodesArgs<'_>) -> CallFuture {
    let mut req = Vec::with_capacity(512);
    msgpack::encode_request(seq, &args, &mut req);
    let call = exchange(stream, seq, req, MAX_ANSWER);
    Box::pin(async move {
        let (stream, reply) = call.await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => return (stream, Err(e)),
        };
        if !reply.header.error.is_empty() {
            let kind = crate::http::cause_kind(&reply.header.error).unwrap_or("rpc_error");
            let result = Err(CallError::new(kind, reply.header.error));
            return (
                stream,
                Ok(Answer {
                    result,
                    bytes: reply.bytes,
                }),
            );
        }
        match msgpack::decode_body(&reply.body) {
            Ok(d) => (
                stream,
                Ok(Answer {
                    result: Ok(d),
                    bytes: reply.bytes,
                }),
            ),
            Err(e) => (None, Err(CallError::new(e.kind(), e.to_string()))),
        }
    })
}
