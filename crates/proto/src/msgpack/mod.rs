//! Consul's msgpack, as its RPC port speaks it (net/rpc over yamux), shared
//! by the agents (requests) and the embedded server (answers):
//!
//! - [`scan`]: where one value ends in a growing buffer ([`Scanner`]), and
//!   where a whole message does ([`MessageScan`]): a request or an answer is
//!   two values back to back with no length in front.
//! - [`write`]: values written the way Consul's Go codec writes them (the
//!   msgpack spec before `str8` and `bin`), so that requests are byte for
//!   byte those of a real agent.
//!
//! What it is not: no struct knows its Consul type here; the protocol
//! crates write their fields in order with [`Writer`], and read answers
//! with `rmp-serde`.

pub mod scan;
pub mod write;

pub use scan::{MAX_DEPTH, MessageScan, MsgpackError, Scanner, value_len};
pub use write::Writer;
