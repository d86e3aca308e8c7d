//! Consul's LAN gossip for agent-sim: what a Consul client agent sends and
//! answers on its serf LAN port (memberlist for membership and failure
//! detection, serf on top of it for tags, join and leave intents), and a
//! pool in which thousands of simulated agents are gossip members at once.
//!
//! Parts, each importing only those after it:
//! - `pool`: the members of one process sharing one membership view, its
//!   sockets and the timers that make servers see what N real members would
//!   send them (probes, gossip, push-pulls, leaves).
//! - [`serf`]: serf's messages, tags and the coordinate in a probe's ack.
//! - [`wire`]: memberlist's messages and the layers around them (label,
//!   encryption, CRC, compression, compound).
//!
//! What it is not: a full memberlist. The simulated members do not gossip
//! among themselves on the network; see docs/gossip.md for the model.

pub mod serf;
pub mod wire;

pub use wire::{Keyring, Security, WireError};
