//! The crate's integration tests as one binary: each file beside this one
//! is a module (one link instead of one per file); the folders hold what
//! several of them share.

mod bootstrap;
mod vectors_manifest;
