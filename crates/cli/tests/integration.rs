//! The crate's integration tests as one binary: each file beside this one
//! is a module (one link instead of one per file); the folders hold what
//! several of them share.

mod acl_tokens;
mod auto_encrypt;
mod capacity;
mod ceiling;
mod cleanup;
mod cli;
mod codecs;
mod common;
mod consul_fleet;
mod consul_proxies;
mod consul_tls;
mod dataplane_fleet;
mod docs;
mod doctor;
mod failover;
mod faults;
mod imports;
mod local;
mod observe;
mod orchestrators;
mod outcomes;
mod report_html;
mod scenarios;
mod sensu_auth;
mod sensu_fleet;
mod sizes;
mod studies;
mod swarm;
mod vault;
