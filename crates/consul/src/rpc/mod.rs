//! A client agent's own RPCs on the server's multiplexed port (`0x04`,
//! yamux, net/rpc in Consul's msgpack), as Consul 1.20's agent writes them:
//!
//! - [`catalog`]: anti-entropy's reads and writes (`Catalog.Register`,
//!   `Catalog.Deregister`, `Catalog.NodeServiceList`, `Health.NodeChecks`);
//! - [`session`]: `Session.Apply` and `Session.Renew`;
//! - [`connect_ca`]: `ConnectCA.Roots` (blocking) and `ConnectCA.Sign`;
//! - [`auto_encrypt`]: `AutoEncrypt.Sign` (at boot, on a TLS connection of
//!   its own: `0x07`);
//! - [`coordinate`]: the Vivaldi estimate and `Coordinate.Update`;
//! - [`mux`]: the connection (`0x04`, yamux) and one call on a stream;
//! - here: net/rpc's request and response headers, and `Status.Ping` (what
//!   the agent's server router asks a server it moves to).
//!
//! The codecs are pure encode and decode, checked on bytes a real agent
//! sent (`testdata/vectors/consul/agent-rpc/`); the calls' scheduling is
//! the agent's.

pub mod auto_encrypt;
pub mod catalog;
pub mod connect_ca;
pub mod coordinate;
pub mod mux;
pub mod session;

use agent_sim_proto::msgpack::Writer;
pub use agent_sim_proto::msgpack::{MessageScan, MsgpackError, Scanner};
use serde::Deserialize;

/// `Status.Ping`.
pub const PING: &str = "Status.Ping";

/// net/rpc's request header: the call's sequence number and method.
pub fn request_header(out: &mut Vec<u8>, seq: u64, method: &str) {
    Writer(out)
        .map(2)
        .kv_uint("Seq", seq)
        .kv_str("ServiceMethod", method);
}

/// `Status.Ping` (no arguments; the answer is empty).
pub fn encode_ping(seq: u64, out: &mut Vec<u8>) {
    request_header(out, seq, PING);
    Writer(out).map(0);
}

/// net/rpc's response header.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ResponseHeader {
    /// The method answered.
    #[serde(rename = "ServiceMethod", default)]
    pub service_method: String,
    /// The call it answers.
    #[serde(rename = "Seq", default)]
    pub seq: u64,
    /// What went wrong (`""`: nothing), in the server's words.
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// Decodes a response header.
pub fn decode_header(header: &[u8]) -> Result<ResponseHeader, MsgpackError> {
    agent_sim_proto::msgpack::decode_as("response header", header)
}
