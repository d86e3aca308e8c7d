//! Protobuf bindings used by agent-sim, generated from the project's own
//! `proto/*.proto` files (written from the wire facts, with only the fields we use).
//!
//! - [`sensu::v2`]: Sensu Go `sensu.core.v2` messages: `Event`, `Entity`, `Check`,
//!   `CheckRequest`, ... (agent keepalives, events and check requests).
//! - [`sensu::v3`]: `sensu.core.v3.EntityConfig` (the backend's first frame).
//! - [`consul::subscribe`]: Consul's `subscribe.StateChangeSubscription` service
//!   (client and server stubs) and its `Event` stream payloads.
//! - [`consul::dataplane`], Consul's `hashicorp.consul.dataplane.DataplaneService`
//!   (`GetEnvoyBootstrapParams`, what consul-dataplane asks before Envoy starts).
//! - [`consul::serverdiscovery`], the `WatchServers` stream of
//!   `hashicorp.consul.serverdiscovery`.
//!
//! The Rust code under `src/gen/` is checked in so that a fresh machine needs no
//! `protoc`; `tests/bootstrap.rs` regenerates it with protox and fails on drift.
//! Besides the bindings, small pieces of logic: [`scan`], a top-level
//! field scan the protocol crates use to count unknown fields, and
//! [`fields`], the field numbers of the Envoy and Consul dataplane requests
//! the embedded server scans that way; [`codec`], the one gRPC codec of
//! the clients and the embedded server (buffers sized by the caller, a
//! look at each incoming message, pre-encoded messages); [`msgpack`], the
//! msgpack value scanner of the blocking-query RPCs.

#![allow(missing_docs)]

pub mod codec;
pub mod fields;
pub mod msgpack;
pub mod scan;

/// Sensu Go agent protocol messages.
#[allow(clippy::all)]
pub mod sensu {
    /// `sensu.core.v2`: events, entities, checks and check requests.
    pub mod v2 {
        include!("gen/sensu.core.v2.rs");
    }
    /// `sensu.core.v3`: entity configuration pushed by the backend.
    pub mod v3 {
        include!("gen/sensu.core.v3.rs");
    }
}

/// Consul streaming (`subscribe` package).
#[allow(clippy::all)]
pub mod consul {
    /// `subscribe.StateChangeSubscription/Subscribe` and its messages.
    pub mod subscribe {
        include!("gen/subscribe.rs");
    }
    /// `hashicorp.consul.dataplane.DataplaneService` and its messages.
    pub mod dataplane {
        include!("gen/hashicorp.consul.dataplane.rs");
    }
    /// `hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers`.
    pub mod serverdiscovery {
        include!("gen/hashicorp.consul.serverdiscovery.rs");
    }
}
