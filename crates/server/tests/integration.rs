//! The crate's integration tests as one binary: each file beside this one
//! is a module (one link instead of one per file); the folders hold what
//! several of them share.

#[cfg(feature = "consul")]
mod common;
mod consul_acl;
mod consul_auto_encrypt;
mod consul_kv;
mod consul_kv_rpc;
mod consul_target;
#[cfg(feature = "consul")]
mod gossip_member;
#[cfg(all(feature = "sensu", feature = "consul"))]
mod hostile;
#[cfg(all(feature = "sensu", feature = "consul"))]
mod receive;
mod sensu_auth;
mod sensu_target;
mod serf;
mod serf_storm;
