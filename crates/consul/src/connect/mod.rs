//! Connect leaf certificates as a Consul 1.20 client agent keeps them for
//! its sidecars (`agent/leafcert`): a new key and CSR per certificate
//! ([`csr`]), and when to sign again ([`schedule`]): within the renewal
//! window of a certificate's life, after a root rotation within a random
//! 30 s, and on the servers' rate-limit answer by leafcert's back-off.
//!
//! The calls themselves (`ConnectCA.Roots`, `ConnectCA.Sign`) are in
//! [`crate::rpc::connect_ca`]; the agent's state and handlers in
//! `agent::connect`. This module holds no socket and no timer.

pub mod csr;
pub mod schedule;

pub use csr::{Csr, authority_key_id, new_csr, spiffe_service_id};
