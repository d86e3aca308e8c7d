//! The crate's integration tests as one binary: each file beside this one
//! is a module (one link instead of one per file); the folders hold what
//! several of them share.

mod common;
mod hostile;
mod receive;
mod roundtrip;
mod session;
mod vectors;
