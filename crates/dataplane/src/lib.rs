//! Simulated Consul dataplane sidecars for agent-sim: each sidecar does what
//! a consul-dataplane with its Envoy does against a Consul server since
//! Consul 1.14 — ONE HTTP/2 connection to the server's public gRPC port
//! (8502, TLS 8503) carrying `DataplaneService/GetEnvoyBootstrapParams`,
//! Envoy's `DeltaAggregatedResources` stream (CDS wildcard, EDS for the
//! clusters it names; every response ACKed or NACKed, resource versions kept
//! across reconnects) and optionally `ServerDiscoveryService/WatchServers` —
//! and times how long a catalog change takes to reach every proxy.
//!
//! Main parts:
//! - [`config`]: [`DataplaneConfig`] and its validation.
//! - [`xds`]: the Delta xDS client state of one proxy (pure: requests,
//!   ACK/NACK, versions, the EDS view of the probe endpoint).
//! - [`codec`]: gRPC paths, small-buffer codecs, the request outbox stream,
//!   the bootstrap request.
//! - [`DataplaneFactory`] / [`DataplaneAgent`]: the `agent_sim_fleet` agent.
//!
//! Shared with the Consul client agents (`agent-sim-consul`): the connector
//! ([`agent_sim_consul::conn::Dialer`] on [`agent_sim_consul::conn::Port::Grpc`]),
//! the HTTP API client and the `/v1/txn` batcher (registration of each
//! sidecar's node, service and connect-proxy, node meta `agent-sim-prefix`
//! so `agent-sim cleanup` finds them), and the propagation probe (the same
//! [`agent_sim_consul::ProbeRunner`] and board; a mixed run times one change
//! at both fleets).
//!
//! What it is not: an Envoy (no listeners, no traffic), nor a server (see
//! `agent-sim-server`), nor a CLI; it prints nothing.

pub mod codec;
pub mod config;
pub mod xds;

mod agent;

pub use agent::{DataplaneAgent, DataplaneFactory, node_name};
pub use config::{Adopt, ConfigError, DataplaneConfig};

use agent_sim_metrics::MetricsSpec;

/// The fleet kind of dataplane sidecars (`--kind`, `ProbeSummary::fleet`).
pub const KIND: &str = "consul-dataplane";

/// Errors of this crate (configuration time only: sidecar failures are
/// counted outcomes, not errors).
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// A setting of [`DataplaneConfig`] is invalid: the field (as named in
    /// the struct, `adopt.node` for nested ones) and why, in one line.
    #[error("{field}: {0}", field = .0.field())]
    Invalid(#[from] config::ConfigError),
    /// The configuration cannot be used (setup: TLS, the HTTP API client).
    #[error("consul-dataplane: {0}")]
    Consul(#[source] agent_sim_consul::ConsulError),
    /// The metrics recorder lacks a name of [`metrics_spec`].
    #[error("consul-dataplane metrics: {0}")]
    Metrics(#[from] agent_sim_consul::Undeclared),
}

impl From<agent_sim_consul::ConsulError> for DataplaneError {
    fn from(e: agent_sim_consul::ConsulError) -> Self {
        match e {
            agent_sim_consul::ConsulError::Invalid(e) => DataplaneError::Invalid(e.into()),
            e => DataplaneError::Consul(e),
        }
    }
}

/// Metric names this crate records (shared ones keep the Consul crate's
/// names: `connect`, `registrations`, `probe_overhead`, ...).
pub mod names {
    pub use agent_sim_consul::names::{
        ARRIVALS_USER_TIME, CONNECT, DEREGISTRATIONS, PROBE_OVERHEAD, PROBE_WRITE,
        PROBES_INTERRUPTED, REGISTRATIONS, TXN_REQUESTS,
    };
    /// `GetEnvoyBootstrapParams` calls answered.
    pub const BOOTSTRAPS: &str = "xds_bootstraps";
    /// `DeltaAggregatedResources` streams opened.
    pub const XDS_STREAMS: &str = "xds_streams";
    /// Delta xDS responses received (every type).
    pub const XDS_RESPONSES: &str = "xds_responses";
    /// Responses ACKed.
    pub const XDS_ACKS: &str = "xds_acks";
    /// Responses NACKed (a resource that does not parse).
    pub const XDS_NACKS: &str = "xds_nacks";
    /// EDS responses (endpoint updates) received.
    pub const EDS_UPDATES: &str = "eds_updates";
    /// `WatchServers` messages (server lists) received.
    pub const SERVER_LISTS: &str = "server_lists";
    /// `GetEnvoyBootstrapParams` round trip.
    pub const BOOTSTRAP: &str = "xds_bootstrap";
    /// Stream opened → clusters and every cluster's endpoints received.
    pub const XDS_INITIAL: &str = "xds_initial";
    /// Probe deliveries at the proxies: kernel arrival of the EDS update
    /// that reflects the change − T0.
    pub const PROPAGATION_XDS: &str = "propagation_xds";
}

/// Counters whose rate per second means something in the run's table
/// (the rest are totals).
pub const RATED_COUNTERS: &[&str] = &[names::XDS_RESPONSES, names::XDS_ACKS, names::EDS_UPDATES];

/// Counters and latencies this crate records; merge into the run's spec.
pub fn metrics_spec() -> MetricsSpec {
    MetricsSpec {
        counters: vec![
            names::BOOTSTRAPS,
            names::XDS_STREAMS,
            names::XDS_RESPONSES,
            names::XDS_ACKS,
            names::XDS_NACKS,
            names::EDS_UPDATES,
            names::SERVER_LISTS,
            names::REGISTRATIONS,
            names::DEREGISTRATIONS,
            names::TXN_REQUESTS,
            names::PROBES_INTERRUPTED,
            names::ARRIVALS_USER_TIME,
        ],
        latencies: vec![
            names::CONNECT,
            names::BOOTSTRAP,
            names::XDS_INITIAL,
            names::PROPAGATION_XDS,
            names::PROBE_OVERHEAD,
            names::PROBE_WRITE,
        ],
        errors: ERROR_KINDS.to_vec(),
    }
}

/// The error kinds of a dataplane sidecar, with what to check.
const ERROR_KINDS: &[agent_sim_metrics::ErrorKindSpec] = {
    use agent_sim_metrics::ErrorKindSpec as K;
    &[
        K {
            kind: "xds_stream_cap",
            hint: "the server caps xDS streams at ceil(proxies / healthy servers × 1.1) and said \
                   RESOURCE_EXHAUSTED: sidecars try the next --target after a backoff; give \
                   several servers, or fewer sidecars per server",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "proxy_not_found",
            hint: "the server does not know the proxy (GetEnvoyBootstrapParams: Service not \
                   found / node not found): with --adopt, check the pattern and --adopt-node; \
                   otherwise the registration was lost (the sidecar registers again)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "envoy_version_unsupported",
            hint: "the server refused the Envoy version the sidecars announce (Consul 1.20: \
                   'Envoy 1.20.0 is too old and is not supported by Consul'; it refuses versions \
                   older than it supports, newer ones pass): set --envoy-version",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "xds_decode",
            hint: "a Delta xDS message did not decode as a DeltaDiscoveryResponse (garbage on \
                   the stream): the session ends and the sidecar reconnects with backoff, \
                   offering the versions it holds",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "xds_invalid_request",
            hint: "the server refused the xDS stream (INVALID_ARGUMENT); its words say why",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "wrong_port_rpc",
            hint: "--target is the server RPC port 8300: dataplanes connect to the gRPC port \
                   (8502, TLS 8503)",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        agent_sim_consul::ACL_NOT_FOUND,
        K {
            kind: "acl_denied",
            hint: "--token: the token lacks service:write on the proxies' services (or \
                   node:write to register them)",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        K {
            kind: "grpc_unavailable",
            hint: "the server closed the stream or is not reachable on its gRPC port; sidecars \
                   reconnect with backoff and resume with their resource versions",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Server,
        },
        agent_sim_consul::TXN_ROLLBACK,
        agent_sim_consul::PROBE_OVERHEAD_HIGH,
        agent_sim_consul::H2_HANDSHAKE,
        K {
            kind: "xds_nack",
            hint: "a resource of a Delta xDS response did not decode (another type than the \
                   response's, or bytes that are not the message): the sidecar NACKs the \
                   response as Envoy does and keeps what it had; the sample names the resource",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Local,
        },
        K {
            kind: "tls_handshake",
            hint: "TLS to the gRPC port failed: --ca-file, --tls-server-name, --cert-file / \
                   --key-file; or the port is the plaintext 8502",
            heals: false,
            said_by: agent_sim_metrics::Speaker::Server,
        },
    ]
};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_saturated_box_warns_with_what_to_check() {
        let m = agent_sim_metrics::Metrics::new(&super::metrics_spec(), 1);
        let id = m.latency(super::names::PROBE_OVERHEAD);
        m.record(id, 0, Duration::from_millis(50));
        m.collect();
        agent_sim_consul::check_overhead(&m);
        let warned = m.snapshot().warnings;
        assert!(warned.contains_key("probe_overhead_high"), "{warned:?}");
        let spec = m.error_kind("probe_overhead_high").expect("declared");
        assert!(spec.hint.contains("saturated"), "{spec:?}");
    }
}
