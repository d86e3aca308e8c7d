//! The flags of `agent-sim serve` (the embedded reference backend).

use std::net::SocketAddr;
use std::path::PathBuf;

use agent_sim_fleet::Rate;
use clap::Args;

use super::heading;
use crate::values::{List, Secs, Toggle};

/// `agent-sim serve ...`
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Sensu agent WebSocket endpoint address (e.g. 127.0.0.1:8081).
    #[arg(long, value_name = "ADDR")]
    pub sensu: Option<SocketAddr>,
    /// Consul RPC port address (0x08 + gRPC Subscribe), e.g. 127.0.0.1:8300.
    #[arg(long = "consul-rpc", value_name = "ADDR")]
    pub consul_rpc: Option<SocketAddr>,
    /// Consul: serve --consul-rpc as a follower of the server whose RPC
    /// port is ADDR: every call and Subscribe stream agents send here goes
    /// on to it over a few connections (as a Consul follower forwards to its
    /// leader), so one catalog serves more agents than one process has
    /// descriptors for. Agents join the leader's serf port and the probe
    /// writes to its HTTP API.
    #[arg(long = "consul-leader", value_name = "ADDR")]
    pub consul_leader: Option<SocketAddr>,
    /// Consul HTTP API address (catalog, txn, sessions), e.g. 127.0.0.1:8500.
    #[arg(long = "consul-http", value_name = "ADDR")]
    pub consul_http: Option<SocketAddr>,
    /// Consul public gRPC port (dataplanes: bootstrap params, WatchServers,
    /// Delta xDS), e.g. 127.0.0.1:8502; with --consul-rpc and --consul-http.
    #[arg(long = "consul-grpc", value_name = "ADDR")]
    pub consul_grpc: Option<SocketAddr>,
    /// Consul serf LAN port, UDP and TCP on one address (e.g.
    /// 127.0.0.1:8301): the server is a gossip member that probes the
    /// agents, answers their push-pulls, keeps serfHealth in its catalog
    /// and lists them at /v1/agent/members; with --consul-rpc and
    /// --consul-http.
    #[arg(long = "consul-serf", value_name = "ADDR")]
    pub consul_serf: Option<SocketAddr>,
    /// Consul: the gossip key of --consul-serf (the agents' --gossip-key:
    /// base64 of 16 or 32 bytes, as consul keygen prints; several,
    /// comma-separated or repeated, primary first).
    #[arg(long = "consul-serf-key", value_name = "KEY", value_delimiter = ',')]
    pub consul_serf_keys: Vec<String>,
    /// Consul: the gossip label of --consul-serf (the agents' --gossip-label).
    #[arg(long = "consul-serf-label", value_name = "LABEL")]
    pub consul_serf_label: Option<String>,
    /// Consul: how long the xDS server waits after a catalog change before
    /// it rebuilds a proxy's resources (Consul coalesces for 200ms).
    #[arg(long, value_name = "DURATION", default_value = "200ms")]
    pub xds_coalesce: Secs,
    /// Consul: most xDS streams at once; more are refused RESOURCE_EXHAUSTED
    /// (0 = no cap).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub xds_max_streams: usize,
    /// Consul: most proxy updates delivered per second across all xDS
    /// streams (Consul's xds.update_max_per_second, 250/s): an update waits
    /// for the longer of its turn and the coalescing delay; `off`: no limit.
    #[arg(long, value_name = "RATE", default_value = "250/s")]
    pub xds_update_rate: Toggle<Rate>,
    /// Set SO_REUSEPORT so several serve processes share the ports.
    #[arg(long)]
    pub reuse_port: bool,
    /// Interval of the scheduled Sensu check.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub check_interval: Secs,
    /// Subscriptions the scheduled Sensu check goes to (comma-separated).
    #[arg(long, value_name = "LIST", default_value = "linux")]
    pub check_subscriptions: List,
    /// Agent user the Sensu endpoint accepts.
    #[arg(long, default_value = "agent")]
    pub user: String,
    /// Agent password the Sensu endpoint accepts.
    #[arg(
        long,
        env = "AGENT_SIM_SENSU_PASSWORD",
        default_value = "P@ssw0rd!",
        hide_env_values = true
    )]
    pub password: String,
    /// Print target counters every interval (0 = never).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub stats_every: Secs,
    /// Serve Prometheus `/metrics` here: this process's CPU, RSS, fds and
    /// threads, and the backend's counters (what `--observe URL` reads).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Worker threads (default: number of cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Sensu: answer 404 `namespace "X" not found` for this long after start,
    /// like a real backend whose namespace cache lags a new namespace.
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub namespace_ready_after: Secs,
    /// Consul: close RPC connections beyond this many per client IP right
    /// after accept, as Consul's limits.rpc_max_conns_per_client does (0 = no cap).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub rpc_max_conns_per_client: usize,
    /// Consul: turn ACLs on (default deny) with this management token (repeatable);
    /// it creates the tokens agents carry (node and service identities, policies).
    #[arg(long = "acl-token", value_name = "TOKEN")]
    pub acl_tokens: Vec<String>,
    /// Consul: PEM certificate of the TLS listeners (RPC 0x03 + TLS, HTTPS);
    /// with --tls-key-file.
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Consul: PEM key of --tls-cert-file.
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// Consul: require client certificates signed by this CA (verify_incoming).
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Sensu: check the agent password with bcrypt at this cost (4 to 14;
    /// a real backend's is 10, ~50-80 ms of CPU) on every connect, as a
    /// real backend does; default: compared as text, at no cost.
    #[arg(long, value_name = "COST")]
    pub sensu_password_cost: Option<u32>,
    /// Sensu: serve wss:// with this PEM certificate; with
    /// --sensu-tls-key-file.
    #[arg(long, value_name = "FILE")]
    pub sensu_tls_cert_file: Option<PathBuf>,
    /// Sensu: PEM key of --sensu-tls-cert-file.
    #[arg(long, value_name = "FILE")]
    pub sensu_tls_key_file: Option<PathBuf>,
    /// Sensu: ask agents for a client certificate signed by this CA (with
    /// --sensu-tls-cert-file): one lets the agent in without the password
    /// check, as its CN; none: the password; one from another CA fails the
    /// TLS handshake.
    #[arg(long, value_name = "FILE")]
    pub sensu_agent_ca_file: Option<PathBuf>,
    /// Inject a fault (repeatable): TARGET=ACTION@WHEN[,ITEM...] or
    /// restart@at:DUR[,every:DUR],down:DUR,state:keep|lose (grammar below).
    #[arg(long = "faults", value_name = "SPEC", help_heading = heading::FAULTS)]
    pub faults: Vec<String>,
    /// Seed of the faults' dice: the same seed makes the same decisions in
    /// the same order (default: random, printed at start).
    #[arg(long, value_name = "N", help_heading = heading::FAULTS)]
    pub faults_seed: Option<u64>,
}
