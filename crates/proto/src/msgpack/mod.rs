//! Consul's msgpack, as its RPC port speaks it (net/rpc over yamux), shared
//! by the agents (requests) and the embedded server (answers):
//!
//! - [`scan`]: where one value ends in a growing buffer ([`Scanner`]), and
//!   where a whole message does ([`MessageScan`]): a request or an answer is
//!   two values back to back with no length in front.
//! - [`read`]: values read one at a time from a slice, borrowing strings and
//!   bytes ([`Reader`]): how the gossip crate reads memberlist and serf.
//! - [`write`]: values written the way Consul's Go codec writes them (the
//!   msgpack spec before `str8` and `bin`), so that requests are byte for
//!   byte those of a real agent.
//!
//! - [`serde`]: whole values into and out of serde types ([`decode`],
//!   [`decode_as`], [`encode_named`]), the one place the tree reaches
//!   `rmp-serde`: the protocol crates read answers and the embedded server
//!   reads requests through it.
//!
//! What it is not: no struct knows its Consul type here; the protocol
//! crates write their fields in order with [`Writer`] and name their
//! types' fields with serde attributes.

pub mod read;
pub mod scan;
pub mod serde;
pub mod write;

pub use read::{READ_MAX_DEPTH, ReadError, Reader};
pub use scan::{MAX_DEPTH, MessageScan, MsgpackError, Scanner, value_len};
pub use serde::{DecodeError, EncodeError, decode, decode_as, encode_named};
pub use write::Writer;
