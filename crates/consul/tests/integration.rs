//! The crate's integration tests as one binary: each file beside this one
//! is a module (one link instead of one per file); the folders hold what
//! several of them share.
//! `memory.rs` is a target of its own: it reads the process's RSS, so no
//! other test may share its process.

mod agent_rpc_vectors;
mod chain;
mod cluster;
mod common;
mod connect;
mod connect_ca_vectors;
mod fleet;
mod gossip_news;
mod hostile;
mod kv_vectors;
mod kv_watch;
mod receive;
mod rpc_vectors;
mod steady;
mod storm;
mod vault;
mod vectors;
mod watching;
