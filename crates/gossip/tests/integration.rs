//! The crate's integration tests as one binary: each file beside this one
//! is a module (one link instead of one per file); the folders hold what
//! several of them share.

mod events;
mod fake_server;
mod golden;
mod hostile;
mod join_answer;
mod member_server;
mod real_server;
mod reannounce;
mod receive;
mod serf_vectors;
mod silent_server;
mod suspicion;
mod vectors;
