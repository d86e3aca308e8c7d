//! The catalog calls of a client agent's anti-entropy, written as Consul
//! 1.20's agent writes them (`agent/local`'s sync): `Catalog.Register` of
//! the node, of a service (its checks riding along) or of a check,
//! `Catalog.Deregister`, and the two reads of a full sync,
//! `Catalog.NodeServiceList` and `Health.NodeChecks`; and those reads'
//! answers reduced to what a sync compares.
//!
//! Byte for byte the requests captured from a real agent
//! (`testdata/vectors/consul/agent-rpc/`), but for the order of Go maps
//! (`NodeMeta`, `TaggedAddresses`), which Go writes at random.

use std::borrow::Cow;

use agent_sim_proto::msgpack::Writer;
use serde::Deserialize;

use super::{MsgpackError, request_header};

/// `Catalog.Register`.
pub const REGISTER: &str = "Catalog.Register";
/// `Catalog.Deregister`.
pub const DEREGISTER: &str = "Catalog.Deregister";
/// The services of one node (the first read of a full sync).
pub const NODE_SERVICE_LIST: &str = "Catalog.NodeServiceList";
/// The checks of one node (the second read).
pub const NODE_CHECKS: &str = "Health.NodeChecks";

/// A stale read may be this old (`MaxStaleDuration`, the agent's 2 s).
const MAX_STALE_NS: u64 = 2_000_000_000;

/// The node an agent is, as every one of its catalog calls carries it.
#[derive(Debug, Clone, Copy)]
pub struct NodeIdent<'a> {
    /// Datacenter (empty: the server's own).
    pub datacenter: &'a str,
    /// Node ID (a UUID).
    pub id: &'a str,
    /// Node name.
    pub node: &'a str,
    /// Advertised address (also every tagged address: lan, lan_ipv4,
    /// wan, wan_ipv4).
    pub address: &'a str,
    /// Node metadata (Consul's own `consul-network-segment` and
    /// `consul-version` first).
    pub meta: &'a [(&'a str, &'a str)],
    /// ACL token.
    pub token: &'a str,
}

/// What kind of service, with what a proxy adds.
#[derive(Debug, Clone, Copy)]
pub enum ServiceKind<'a> {
    /// A plain service.
    Plain,
    /// A Connect sidecar proxy of `destination` (its service name and ID),
    /// local service at `local_address:local_port`, with its upstreams
    /// (name, local bind port).
    Sidecar {
        /// The proxied service's name.
        destination: &'a str,
        /// The proxied service's ID.
        destination_id: &'a str,
        /// Where the proxied service listens.
        local_address: &'a str,
        /// Its port.
        local_port: u16,
        /// Upstreams: name and local bind port.
        upstreams: &'a [(&'a str, u16)],
    },
}

/// One service of the node.
#[derive(Debug, Clone, Copy)]
pub struct ServiceDef<'a> {
    /// Service ID.
    pub id: &'a str,
    /// Service name.
    pub service: &'a str,
    /// Port.
    pub port: u16,
    /// Service address (empty: the node's).
    pub address: &'a str,
    /// Tags.
    pub tags: &'a [&'a str],
    /// Plain or a sidecar.
    pub kind: ServiceKind<'a>,
}

/// One check of a service: a TTL check, as an application that reports its
/// own health registers it (`kind` `ttl`), or a sidecar's own (`tcp`,
/// `alias`).
#[derive(Debug, Clone, Copy)]
pub struct CheckDef<'a> {
    /// Check ID.
    pub check_id: &'a str,
    /// Check name.
    pub name: &'a str,
    /// `passing`, `warning` or `critical`.
    pub status: &'a str,
    /// The service it belongs to.
    pub service_id: &'a str,
    /// That service's name.
    pub service_name: &'a str,
    /// The check's type (`ttl`, `tcp`, `alias`).
    pub kind: &'a str,
    /// Its interval as Consul writes it (`"10s"`; empty for TTL and alias).
    pub interval: &'a str,
    /// Its last output.
    pub output: &'a str,
}

/// `Catalog.Register` of the node alone (no service, no checks,
/// `SkipNodeUpdate` false: the first sync of a node the catalog lacks), of
/// a service with its checks riding along, or of a check with its service.
/// One check goes in `Check`, several in `Checks` (as the agent keeps
/// Consul < 0.5 working).
pub fn encode_register(
    seq: u64,
    n: &NodeIdent<'_>,
    service: Option<&ServiceDef<'_>>,
    checks: &[CheckDef<'_>],
    skip_node_update: bool,
    out: &mut Vec<u8>,
) {
    request_header(out, seq, REGISTER);
    let mut w = Writer(out);
    // RegisterRequest's 15 fields, sorted (RaftIndex and WriteRequest
    // flattened; the CE EnterpriseMeta has none).
    w.map(15);
    w.kv_str("Address", n.address);
    w.str("Check");
    match checks {
        [c] => write_check(&mut w, n, c),
        _ => {
            w.nil();
        }
    }
    w.str("Checks");
    if checks.len() > 1 {
        w.array(checks.len() as u32);
        for c in checks {
            write_check(&mut w, n, c);
        }
    } else {
        w.nil();
    }
    w.kv_uint("CreateIndex", 0);
    w.kv_str("Datacenter", n.datacenter).kv_str("ID", n.id);
    w.kv_nil("Locality").kv_uint("ModifyIndex", 0);
    w.kv_str("Node", n.node);
    w.str("NodeMeta").str_map(n.meta);
    w.kv_str("PeerName", "");
    w.str("Service");
    match service {
        Some(s) => write_service(&mut w, s),
        None => {
            w.nil();
        }
    }
    w.kv_bool("SkipNodeUpdate", skip_node_update);
    w.str("TaggedAddresses").str_map(&[
        ("lan", n.address),
        ("lan_ipv4", n.address),
        ("wan", n.address),
        ("wan_ipv4", n.address),
    ]);
    w.kv_str("Token", n.token);
}

/// A `NodeService` (18 fields).
fn write_service(w: &mut Writer<'_>, s: &ServiceDef<'_>) {
    w.map(18);
    w.kv_str("Address", s.address);
    w.str("Connect").map(3);
    w.kv_bool("Native", false)
        .kv_nil("PeerMeta")
        .kv_nil("SidecarService");
    w.kv_uint("CreateIndex", 0)
        .kv_bool("EnableTagOverride", false);
    w.kv_str("ID", s.id);
    let sidecar = matches!(s.kind, ServiceKind::Sidecar { .. });
    w.kv_str("Kind", if sidecar { "connect-proxy" } else { "" });
    w.kv_nil("Locality")
        .kv_bool("LocallyRegisteredAsSidecar", sidecar);
    w.kv_nil("Meta")
        .kv_uint("ModifyIndex", 0)
        .kv_str("PeerName", "");
    w.kv_uint("Port", u64::from(s.port));
    w.str("Proxy");
    write_proxy(w, &s.kind);
    w.kv_str("Service", s.service).kv_str("SocketPath", "");
    w.str("TaggedAddresses").map(0);
    w.str("Tags");
    if s.tags.is_empty() {
        w.nil();
    } else {
        w.array(s.tags.len() as u32);
        for t in s.tags {
            w.str(t);
        }
    }
    w.str("Weights").map(2);
    w.kv_uint("Passing", 1).kv_uint("Warning", 1);
}

/// A `ConnectProxyConfig` (14 fields): all zero for a plain service.
fn write_proxy(w: &mut Writer<'_>, kind: &ServiceKind<'_>) {
    let (dest, dest_id, local_addr, local_port, upstreams) = match *kind {
        ServiceKind::Plain => ("", "", "", 0, &[][..]),
        ServiceKind::Sidecar {
            destination,
            destination_id,
            local_address,
            local_port,
            upstreams,
        } => (
            destination,
            destination_id,
            local_address,
            local_port,
            upstreams,
        ),
    };
    w.map(14);
    w.str("AccessLogs").map(6);
    w.kv_bool("DisableListenerLogs", false)
        .kv_bool("Enabled", false);
    w.empties(&["JSONFormat", "Path", "TextFormat", "Type"]);
    w.kv_nil("Config");
    w.kv_str("DestinationServiceID", dest_id);
    w.kv_str("DestinationServiceName", dest);
    w.kv_nil("EnvoyExtensions");
    w.str("Expose").map(2);
    w.kv_bool("Checks", false).kv_nil("Paths");
    w.kv_str("LocalServiceAddress", local_addr);
    w.kv_uint("LocalServicePort", u64::from(local_port));
    w.kv_str("LocalServiceSocketPath", "");
    w.str("MeshGateway").map(1).kv_str("Mode", "");
    w.kv_str("Mode", "").kv_str("MutualTLSMode", "");
    w.str("TransparentProxy").map(2);
    w.kv_bool("DialedDirectly", false)
        .kv_uint("OutboundListenerPort", 0);
    w.str("Upstreams");
    if upstreams.is_empty() {
        w.nil();
    } else {
        w.array(upstreams.len() as u32);
        for (name, port) in upstreams {
            write_upstream(w, name, *port);
        }
    }
}

/// One `Upstream` of a sidecar (a service by name, bound locally): 14
/// fields.
fn write_upstream(w: &mut Writer<'_>, name: &str, port: u16) {
    w.map(14);
    w.kv_bool("CentrallyConfigured", false).kv_nil("Config");
    w.kv_str("Datacenter", "").kv_str("DestinationName", name);
    w.empties(&[
        "DestinationNamespace",
        "DestinationPartition",
        "DestinationPeer",
    ]);
    w.kv_str("DestinationType", "service");
    w.kv_nil("IngressHosts").kv_str("LocalBindAddress", "");
    w.kv_uint("LocalBindPort", u64::from(port));
    w.empties(&["LocalBindSocketMode", "LocalBindSocketPath"]);
    w.str("MeshGateway").map(1).kv_str("Mode", "");
}

/// A `HealthCheck` (17 fields) with its empty `Definition` (25).
fn write_check(w: &mut Writer<'_>, n: &NodeIdent<'_>, c: &CheckDef<'_>) {
    w.map(17);
    w.kv_str("CheckID", c.check_id).kv_uint("CreateIndex", 0);
    w.str("Definition").map(25);
    w.empties(&["AliasNode", "AliasService", "Body"]);
    w.kv_uint("DeregisterCriticalServiceAfter", 0);
    w.kv_bool("DisableRedirects", false);
    w.empties(&["DockerContainerID", "GRPC"]);
    w.kv_bool("GRPCUseTLS", false).kv_str("H2PING", "");
    w.kv_bool("H2PingUseTLS", false).kv_str("HTTP", "");
    w.kv_nil("Header").kv_uint("Interval", 0);
    w.empties(&["Method", "OSService"]);
    w.kv_uint("OutputMaxSize", 0).kv_nil("ScriptArgs");
    w.empties(&["Shell", "TCP"]);
    w.kv_bool("TCPUseTLS", false).kv_str("TLSServerName", "");
    w.kv_bool("TLSSkipVerify", false);
    w.zeros(&["TTL", "Timeout"]).kv_str("UDP", "");
    w.kv_uint("ExposedPort", 0).kv_str("Interval", c.interval);
    w.kv_uint("ModifyIndex", 0).kv_str("Name", c.name);
    w.kv_str("Node", n.node).kv_str("Notes", "");
    w.kv_str("Output", c.output).kv_str("PeerName", "");
    w.kv_str("ServiceID", c.service_id);
    w.kv_str("ServiceName", c.service_name);
    w.kv_nil("ServiceTags").kv_str("Status", c.status);
    w.kv_str("Timeout", "").kv_str("Type", c.kind);
}

/// `Catalog.Deregister` of one service of the node (`service_id`), or of
/// the whole node (`service_id` empty: its services, checks and sessions
/// go with it).
pub fn encode_deregister(seq: u64, n: &NodeIdent<'_>, service_id: &str, out: &mut Vec<u8>) {
    request_header(out, seq, DEREGISTER);
    let mut w = Writer(out);
    w.map(6);
    w.kv_str("CheckID", "").kv_str("Datacenter", n.datacenter);
    w.kv_str("Node", n.node).kv_str("PeerName", "");
    w.kv_str("ServiceID", service_id).kv_str("Token", n.token);
}

/// A full sync's read of the node's services ([`NODE_SERVICE_LIST`]) or
/// checks ([`NODE_CHECKS`]): a stale read, as the agent makes it.
pub fn encode_node_read(seq: u64, method: &str, n: &NodeIdent<'_>, out: &mut Vec<u8>) {
    request_header(out, seq, method);
    let mut w = Writer(out);
    // NodeSpecificRequest: 16 fields with QueryOptions flattened.
    w.map(16);
    w.kv_bool("AllowNotModifiedResponse", false)
        .kv_bool("AllowStale", true);
    w.kv_str("Datacenter", n.datacenter).kv_str("Filter", "");
    w.zeros(&["MaxAge", "MaxQueryTime"]);
    w.kv_uint("MaxStaleDuration", MAX_STALE_NS);
    w.kv_bool("MergeCentralConfig", false)
        .kv_uint("MinQueryIndex", 0);
    w.kv_bool("MustRevalidate", false).kv_str("Node", n.node);
    w.kv_str("PeerName", "").kv_bool("RequireConsistent", false);
    w.kv_uint("StaleIfError", 0).kv_str("Token", n.token);
    w.kv_bool("UseCache", false);
}

/// A service of the node as the catalog holds it: what a sync compares.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RemoteService<'a> {
    /// Service ID.
    #[serde(rename = "ID", borrow, default)]
    pub id: Cow<'a, str>,
    /// Service name.
    #[serde(rename = "Service", borrow, default)]
    pub service: Cow<'a, str>,
    /// Port.
    #[serde(rename = "Port", default)]
    pub port: u32,
    /// Kind (`""` or `connect-proxy`).
    #[serde(rename = "Kind", borrow, default)]
    pub kind: Cow<'a, str>,
}

/// A check of the node as the catalog holds it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RemoteCheck<'a> {
    /// Check ID.
    #[serde(rename = "CheckID", borrow, default)]
    pub check_id: Cow<'a, str>,
    /// Status.
    #[serde(rename = "Status", borrow, default)]
    pub status: Cow<'a, str>,
    /// The service it belongs to (empty: a node check).
    #[serde(rename = "ServiceID", borrow, default)]
    pub service_id: Cow<'a, str>,
}

#[derive(Deserialize)]
struct NodeRef<'a> {
    #[serde(rename = "Address", borrow, default)]
    address: Cow<'a, str>,
    #[serde(rename = "Meta", borrow, default)]
    meta: Option<std::collections::BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
}

#[derive(Deserialize)]
struct NodeServices<'a> {
    #[serde(rename = "Node", borrow, default)]
    node: Option<NodeRef<'a>>,
    #[serde(rename = "Services", borrow, default)]
    services: Option<Vec<RemoteService<'a>>>,
}

#[derive(Deserialize)]
struct IndexedNodeServiceList<'a> {
    #[serde(rename = "Index", default)]
    index: u64,
    #[serde(rename = "NodeServices", borrow, default)]
    node_services: Option<NodeServices<'a>>,
}

#[derive(Deserialize)]
struct IndexedHealthChecks<'a> {
    #[serde(rename = "Index", default)]
    index: u64,
    #[serde(rename = "HealthChecks", borrow, default)]
    checks: Option<Vec<RemoteCheck<'a>>>,
}

/// What `Catalog.NodeServiceList` said of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeServiceList<'a> {
    /// The answer's raft index.
    pub index: u64,
    /// Whether the catalog holds the node at all.
    pub node_known: bool,
    /// The node's address in the catalog.
    pub node_address: Option<Cow<'a, str>>,
    /// The node's meta in the catalog, sorted by key.
    pub node_meta: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// Its services.
    pub services: Vec<RemoteService<'a>>,
}

/// Decodes a `Catalog.NodeServiceList` answer's body.
pub fn decode_node_services(body: &[u8]) -> Result<NodeServiceList<'_>, MsgpackError> {
    let r: IndexedNodeServiceList<'_> =
        agent_sim_proto::msgpack::decode_as("NodeServiceList", body)?;
    let ns = r.node_services.unwrap_or(NodeServices {
        node: None,
        services: None,
    });
    let (node_known, node_address, node_meta) = match ns.node {
        Some(n) => (
            true,
            Some(n.address),
            n.meta.unwrap_or_default().into_iter().collect(),
        ),
        None => (false, None, Vec::new()),
    };
    Ok(NodeServiceList {
        index: r.index,
        node_known,
        node_address,
        node_meta,
        services: ns.services.unwrap_or_default(),
    })
}

/// Decodes a `Health.NodeChecks` answer's body: its index and checks.
pub fn decode_node_checks(body: &[u8]) -> Result<(u64, Vec<RemoteCheck<'_>>), MsgpackError> {
    let r: IndexedHealthChecks<'_> = agent_sim_proto::msgpack::decode_as("NodeChecks", body)?;
    Ok((r.index, r.checks.unwrap_or_default()))
}
