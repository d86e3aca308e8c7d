//! Why a call on the multiplexed RPC port failed: the error answer net/rpc
//! sends back in the response header's `Error`. Each cause is its own
//! variant; the Display is the exact words a Consul 1.20 server answers
//! (the tests compare them to a real server's), so the words stay as they
//! are and the cause stays matchable.

use super::acl::{AclError, Denied};
use super::connect_ca::CaError;
use super::kv;
use super::write_error::WriteError;
use super::writes::LockDelayError;
use crate::faults::RETRY_LATER;

/// A call's error answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RpcError {
    /// The arguments are not the msgpack the method takes.
    #[error("rpc: decoding the request: {0}")]
    Decode(#[from] agent_sim_proto::msgpack::DecodeError),
    /// A field carried as JSON inside the arguments is not what it should
    /// be (a session's body).
    #[error("rpc: decoding the request: {0}")]
    DecodeField(#[source] serde_json::Error),
    /// The token is not one this server knows (`ACL not found`), or it
    /// lacks a permission (`Permission denied: ...`).
    #[error(transparent)]
    Acl(#[from] AclError),
    /// The call names another datacenter.
    #[error("No path to datacenter")]
    NoPathToDatacenter,
    /// `Health.ServiceNodes` without a service name.
    #[error("Must provide service name")]
    NoServiceName,
    /// A KV check made before the raft apply failed.
    #[error(transparent)]
    Kv(#[from] kv::Error),
    /// A `KVS.Apply` op failed in the state store.
    #[error("raft apply failed: {0}")]
    RaftApply(#[source] kv::Error),
    /// A `KVS.Apply` of a verb that is no write.
    #[error("raft apply failed: Invalid KVS operation '{0}'")]
    NotAWrite(String),
    /// A catalog or session write refused.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// A session's `LockDelay` that is no duration.
    #[error(transparent)]
    LockDelay(#[from] LockDelayError),
    /// `Coordinate.Update` with a coordinate Consul refuses.
    #[error("invalid coordinate")]
    InvalidCoordinate,
    /// `Session.Apply` with an op Consul does not know.
    #[error("Invalid session operation '{0}'")]
    InvalidSessionOp(String),
    /// A Connect CA call failed.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// A method of a service this server registers but does not serve.
    #[error("rpc: can't find method {0}")]
    NoMethod(String),
    /// A service this server does not register.
    #[error("rpc: can't find service {0}")]
    NoService(String),
    /// A `consul.rpc` fault answering as a rate-limited server does.
    #[error("rpc error: {}", RETRY_LATER)]
    RateLimited,
}

impl From<Denied> for RpcError {
    fn from(d: Denied) -> Self {
        RpcError::Acl(AclError::Denied(d))
    }
}
