//! The crate's integration tests as one binary: each file beside this one
//! is a module (one link instead of one per file); the folders hold what
//! several of them share.
//! `memory.rs` is a target of its own: it reads the process's RSS, so no
//! other test may share its process.

mod common;
mod faults;
mod fleet;
mod pacing;
mod replay;
mod vectors;
mod xds_protocol;
