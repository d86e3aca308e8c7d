//! The Delta xDS client state of one simulated proxy: what Envoy keeps of
//! its ADS stream, reduced to what a load simulator needs.
//!
//! - The first request of a stream names the proxy ([`NodeInfo`]: `id` = the
//!   proxy's service ID, `cluster` = its service, `metadata.node_name` /
//!   `namespace` / `partition` as consul-dataplane's bootstrap sets them,
//!   the Envoy version) and asks for clusters (CDS wildcard), with the
//!   versions it already holds in `initial_resource_versions` after a
//!   reconnect.
//! - Every response is ACKed with its nonce, or NACKed (`error_detail`) when
//!   one of its resources does not parse; a NACKed response changes nothing.
//! - Clusters of type EDS are subscribed to for their endpoints (names
//!   subscribed and unsubscribed as CDS changes); on a new stream the EDS
//!   request lists every name and the versions held, as Envoy does.
//! - The probe cluster's endpoints are watched for the probe instance's
//!   address ([`ProbeWatch`]).
//!
//! Pure state, no I/O; tested on the captured messages of a real Consul
//! server (`testdata/vectors/consul/xds`).

use std::collections::BTreeMap;

use bytes::Bytes;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{BuildVersion, Node};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use envoy_types::pb::envoy::r#type::v3::SemanticVersion;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status;
use prost::Message;

/// `type_url` of clusters (CDS).
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// `type_url` of endpoints (EDS).
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// gRPC code of a NACK's `error_detail`: the resource is invalid.
pub const INVALID_ARGUMENT: i32 = 3;

/// Who the proxy is (Envoy's `node`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The proxy's service ID.
    pub id: String,
    /// The service it fronts (bootstrap params' `service`).
    pub cluster: String,
    /// The catalog node of the proxy (without it a server looks on its own
    /// node and finds nothing).
    pub node_name: String,
    /// Namespace (`default` on Consul CE).
    pub namespace: String,
    /// Partition (`default` on Consul CE).
    pub partition: String,
    /// Envoy version announced (`None`: not sent).
    pub envoy_version: Option<(u32, u32, u32)>,
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

impl NodeInfo {
    /// Envoy's `Node` as consul-dataplane's bootstrap makes it.
    pub fn node(&self) -> Node {
        let mut fields = std::collections::HashMap::new();
        fields.insert("node_name".to_owned(), string_value(&self.node_name));
        fields.insert("namespace".to_owned(), string_value(&self.namespace));
        fields.insert("partition".to_owned(), string_value(&self.partition));
        Node {
            id: self.id.clone(),
            cluster: self.cluster.clone(),
            metadata: Some(Struct { fields }),
            user_agent_name: "envoy".into(),
            user_agent_version_type: self.envoy_version.map(|(major, minor, patch)| {
                UserAgentVersionType::UserAgentBuildVersion(BuildVersion {
                    version: Some(SemanticVersion {
                        major_number: major,
                        minor_number: minor,
                        patch,
                    }),
                    metadata: None,
                })
            }),
            ..Node::default()
        }
    }
}

/// Encodes a request for the outbox.
pub fn encode(req: &DeltaDiscoveryRequest) -> Bytes {
    Bytes::from(req.encode_to_vec())
}

/// The ACK of a response: its type and nonce only.
pub fn ack(type_url: &str, nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.to_owned(),
        response_nonce: nonce.to_owned(),
        ..Default::default()
    }
}

/// The NACK of a response: its type and nonce, and why in `error_detail`.
pub fn nack(type_url: &str, nonce: &str, why: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        error_detail: Some(Status {
            code: INVALID_ARGUMENT,
            message: why.to_owned(),
            details: Vec::new(),
        }),
        ..ack(type_url, nonce)
    }
}

/// Subscribes to (and unsubscribes from) EDS cluster names.
pub fn eds_subscribe(subscribe: Vec<String>, unsubscribe: Vec<String>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: ENDPOINT_TYPE.to_owned(),
        resource_names_subscribe: subscribe,
        resource_names_unsubscribe: unsubscribe,
        ..Default::default()
    }
}

/// The `ip:port` endpoints of a load assignment with their health
/// (`HEALTHY`, `UNHEALTHY`, ...), in order.
pub fn endpoints(cla: &ClusterLoadAssignment) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for locality in &cla.endpoints {
        for lb in &locality.lb_endpoints {
            let Some(HostIdentifier::Endpoint(ep)) = &lb.host_identifier else {
                continue;
            };
            let Some(AddressKind::SocketAddress(sa)) =
                ep.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                continue;
            };
            let port = match sa.port_specifier {
                Some(PortSpecifier::PortValue(p)) => p,
                _ => 0,
            };
            out.push((format!("{}:{port}", sa.address), lb.health_status));
        }
    }
    out
}

/// Why a response is NACKed: a resource that does not decode. Its words
/// go to the server as the NACK's `error_detail` and into the run's
/// `xds_nack` count.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NackError {
    /// The wrapper holds no resource.
    #[error("{what} {name:?}: no resource")]
    Missing {
        /// `cluster` or `endpoints`.
        what: &'static str,
        /// The resource's name.
        name: String,
    },
    /// The resource is of another type than the response's.
    #[error("{what} {name:?}: type {type_url}")]
    WrongType {
        /// `cluster` or `endpoints`.
        what: &'static str,
        /// The resource's name.
        name: String,
        /// The type it says it is.
        type_url: String,
    },
    /// The resource's bytes do not decode.
    #[error("{what} {name:?}: {source}")]
    Decode {
        /// `cluster` or `endpoints`.
        what: &'static str,
        /// The resource's name.
        name: String,
        /// What the decoder said.
        source: prost::DecodeError,
    },
}

impl NackError {
    /// The error kind a NACK is counted as (every variant: `xds_nack`).
    pub fn kind(&self) -> &'static str {
        match self {
            NackError::Missing { .. } | NackError::WrongType { .. } | NackError::Decode { .. } => {
                "xds_nack"
            }
        }
    }
}

/// The message of a response resource of type `type_url` (`what` names it
/// in the NACK's words).
fn decode_resource<M: Message + Default>(
    r: &Resource,
    type_url: &str,
    what: &'static str,
) -> Result<M, NackError> {
    let name = || r.name.clone();
    let Some(any) = &r.resource else {
        return Err(NackError::Missing { what, name: name() });
    };
    if any.type_url != type_url {
        return Err(NackError::WrongType {
            what,
            name: name(),
            type_url: any.type_url.clone(),
        });
    }
    M::decode(&*any.value).map_err(|source| NackError::Decode {
        what,
        name: name(),
        source,
    })
}

/// Decodes every resource of `resp` before anything changes (a NACK
/// changes nothing): its name (the wrapper's, else `own_name` of the
/// resource), its version, and what `read` takes from it and its name.
fn decode_all<M: Message + Default, X>(
    resp: &DeltaDiscoveryResponse,
    type_url: &str,
    what: &'static str,
    own_name: impl Fn(&M) -> String,
    read: impl Fn(&M, &str) -> X,
) -> Result<Vec<(String, String, X)>, NackError> {
    let mut parsed = Vec::with_capacity(resp.resources.len());
    for r in &resp.resources {
        let m: M = decode_resource(r, type_url, what)?;
        let name = if r.name.is_empty() {
            own_name(&m)
        } else {
            r.name.clone()
        };
        let x = read(&m, &name);
        parsed.push((name, r.version.clone(), x));
    }
    Ok(parsed)
}

/// Whether a cluster gets its endpoints by EDS.
pub fn is_eds(c: &Cluster) -> bool {
    matches!(c.cluster_discovery_type, Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32)
}

/// Which endpoint of which cluster the probe adds and removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeWatch {
    /// Clusters of the probe service are named `<service>.…`.
    pub cluster_prefix: String,
    /// `ip:port` of the probe instance.
    pub endpoint: String,
}

impl ProbeWatch {
    /// Watches `service`'s clusters for `ip:port`.
    pub fn new(service: &str, endpoint: (&str, u32)) -> Self {
        ProbeWatch {
            cluster_prefix: format!("{service}."),
            endpoint: format!("{}:{}", endpoint.0, endpoint.1),
        }
    }

    fn is_probe_cluster(&self, name: &str) -> bool {
        name.starts_with(&self.cluster_prefix)
    }
}

/// What handling one response asks the session to do.
#[derive(Debug, Default)]
pub struct Handled {
    /// Requests to send, in order (the ACK or NACK first).
    pub requests: Vec<DeltaDiscoveryRequest>,
    /// The response was NACKed (why).
    pub nacked: Option<NackError>,
    /// The response carried endpoints (an EDS update).
    pub eds: bool,
    /// The probe endpoint's presence changed to this (a probe delivery).
    pub probe: Option<bool>,
}

/// The xDS state of one proxy; survives reconnects (its versions go into
/// the next stream's first requests).
#[derive(Debug)]
pub struct XdsState {
    /// Cluster name → version (ACKed).
    clusters: BTreeMap<Box<str>, Box<str>>,
    /// EDS cluster names subscribed, and the version of their endpoints
    /// (empty until received).
    endpoints: BTreeMap<Box<str>, Box<str>>,
    probe: Option<ProbeWatch>,
    /// The probe cluster and whether the probe endpoint is in it (`None`:
    /// no probe cluster, or its endpoints not received yet).
    probe_present: Option<bool>,
    /// Responses of this stream so far, per type.
    cds_this_stream: bool,
}

impl XdsState {
    /// A fresh proxy; `probe`: what to watch, when a probe runs.
    pub fn new(probe: Option<ProbeWatch>) -> Self {
        XdsState {
            clusters: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            probe,
            probe_present: None,
            cds_this_stream: false,
        }
    }

    /// The first requests of a new stream: CDS (wildcard, with `node` and
    /// the cluster versions held), then EDS for every name held (with their
    /// versions), as Envoy sends them after a reconnect.
    pub fn stream_start(&mut self, node: Node) -> Vec<DeltaDiscoveryRequest> {
        self.cds_this_stream = false;
        let mut out = vec![DeltaDiscoveryRequest {
            node: Some(node),
            type_url: CLUSTER_TYPE.to_owned(),
            initial_resource_versions: self
                .clusters
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }];
        if !self.endpoints.is_empty() {
            let mut eds = eds_subscribe(
                self.endpoints.keys().map(|k| k.to_string()).collect(),
                vec![],
            );
            eds.initial_resource_versions = self
                .endpoints
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            out.push(eds);
        }
        out
    }

    /// Clusters and every EDS cluster's endpoints are in (this stream has
    /// had its CDS answer): the proxy has its configuration.
    pub fn ready(&self) -> bool {
        self.cds_this_stream && self.endpoints.values().all(|v| !v.is_empty())
    }

    /// Whether the proxy has the probe service's cluster with its endpoints.
    pub fn watches_probe(&self) -> bool {
        self.probe_present.is_some()
    }

    /// Cluster names held (tests, debugging).
    pub fn cluster_names(&self) -> Vec<&str> {
        self.clusters.keys().map(|k| &**k).collect()
    }

    /// The version held of a resource (tests, debugging).
    pub fn version(&self, type_url: &str, name: &str) -> Option<&str> {
        let m = match type_url {
            CLUSTER_TYPE => &self.clusters,
            ENDPOINT_TYPE => &self.endpoints,
            _ => return None,
        };
        m.get(name).map(|v| &**v)
    }

    /// Handles one response: ACK or NACK, new subscriptions, probe change.
    pub fn handle(&mut self, resp: &DeltaDiscoveryResponse) -> Handled {
        let mut out = Handled::default();
        let r = match resp.type_url.as_str() {
            CLUSTER_TYPE => self.clusters_update(resp, &mut out),
            ENDPOINT_TYPE => self.endpoints_update(resp, &mut out),
            // Not asked for: acknowledged and ignored.
            _ => Ok(()),
        };
        match r {
            Ok(()) => out.requests.insert(0, ack(&resp.type_url, &resp.nonce)),
            Err(why) => {
                out.requests = vec![nack(&resp.type_url, &resp.nonce, &why.to_string())];
                out.probe = None;
                out.eds = false;
                out.nacked = Some(why);
            }
        }
        out
    }

    fn clusters_update(
        &mut self,
        resp: &DeltaDiscoveryResponse,
        out: &mut Handled,
    ) -> Result<(), NackError> {
        let own_name = |c: &Cluster| c.name.clone();
        let parsed = decode_all(resp, CLUSTER_TYPE, "cluster", own_name, |c, _| is_eds(c))?;
        self.cds_this_stream = true;
        let mut subscribe = Vec::new();
        let mut unsubscribe = Vec::new();
        for (name, version, eds) in parsed {
            if eds && !self.endpoints.contains_key(name.as_str()) {
                self.endpoints.insert(name.clone().into(), "".into());
                subscribe.push(name.clone());
            }
            if !eds && self.endpoints.remove(name.as_str()).is_some() {
                unsubscribe.push(name.clone());
            }
            self.clusters.insert(name.into(), version.into());
        }
        for name in &resp.removed_resources {
            self.clusters.remove(name.as_str());
            if self.endpoints.remove(name.as_str()).is_some() {
                unsubscribe.push(name.clone());
                if self.is_probe(name) {
                    self.probe_present = None;
                }
            }
        }
        if !subscribe.is_empty() || !unsubscribe.is_empty() {
            out.requests.push(eds_subscribe(subscribe, unsubscribe));
        }
        Ok(())
    }

    fn is_probe(&self, name: &str) -> bool {
        self.probe
            .as_ref()
            .is_some_and(|p| p.is_probe_cluster(name))
    }

    fn endpoints_update(
        &mut self,
        resp: &DeltaDiscoveryResponse,
        out: &mut Handled,
    ) -> Result<(), NackError> {
        let own_name = |cla: &ClusterLoadAssignment| cla.cluster_name.clone();
        // Whether the probe endpoint is in the probe cluster's assignment.
        let probe = |cla: &ClusterLoadAssignment, name: &str| match &self.probe {
            Some(p) if p.is_probe_cluster(name) => {
                Some(endpoints(cla).iter().any(|(e, _)| *e == p.endpoint))
            }
            _ => None,
        };
        let parsed = decode_all(resp, ENDPOINT_TYPE, "endpoints", own_name, probe)?;
        out.eds = true;
        for (name, version, probe) in parsed {
            self.endpoints.insert(name.into(), version.into());
            if let Some(now) = probe {
                if self.probe_present.is_some_and(|was| was != now) {
                    out.probe = Some(now);
                }
                self.probe_present = Some(now);
            }
        }
        for name in &resp.removed_resources {
            if let Some(v) = self.endpoints.get_mut(name.as_str()) {
                *v = "".into();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress};
    use envoy_types::pb::envoy::config::endpoint::v3::{Endpoint, LbEndpoint, LocalityLbEndpoints};
    use envoy_types::pb::envoy::service::discovery::v3::Resource;
    use envoy_types::pb::google::protobuf::Any;

    fn any_of<M: Message>(type_url: &str, m: &M) -> Option<Any> {
        Some(Any {
            type_url: type_url.into(),
            value: m.encode_to_vec(),
        })
    }

    fn cluster(name: &str, eds: bool) -> Resource {
        let t = if eds {
            DiscoveryType::Eds
        } else {
            DiscoveryType::Static
        };
        let c = Cluster {
            name: name.into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(t as i32)),
            ..Default::default()
        };
        Resource {
            name: name.into(),
            version: format!("v-{name}-{eds}"),
            resource: any_of(CLUSTER_TYPE, &c),
            ..Default::default()
        }
    }

    fn cla(name: &str, eps: &[(&str, u32)], version: &str) -> Resource {
        let lb = eps
            .iter()
            .map(|(ip, port)| LbEndpoint {
                host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                    address: Some(Address {
                        address: Some(AddressKind::SocketAddress(SocketAddress {
                            address: (*ip).into(),
                            port_specifier: Some(PortSpecifier::PortValue(*port)),
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                })),
                health_status: 1,
                ..Default::default()
            })
            .collect();
        let c = ClusterLoadAssignment {
            cluster_name: name.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: lb,
                ..Default::default()
            }],
            ..Default::default()
        };
        Resource {
            name: name.into(),
            version: version.into(),
            resource: any_of(ENDPOINT_TYPE, &c),
            ..Default::default()
        }
    }

    fn response(type_url: &str, nonce: &str, resources: Vec<Resource>) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            type_url: type_url.into(),
            nonce: nonce.into(),
            resources,
            ..Default::default()
        }
    }

    const PROBE: &str = "agent-sim-probe.default.dc1.internal.td.consul";

    fn node() -> Node {
        NodeInfo {
            id: "app-1-0-sidecar-proxy".into(),
            cluster: "app".into(),
            node_name: "agent-sim-dp-1".into(),
            namespace: "default".into(),
            partition: "default".into(),
            envoy_version: Some((1, 29, 7)),
        }
        .node()
    }

    #[test]
    fn clusters_then_endpoints_then_a_probe_change() {
        let mut x = XdsState::new(Some(ProbeWatch::new("agent-sim-probe", ("127.0.0.1", 1))));
        let first = x.stream_start(node());
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].type_url, CLUSTER_TYPE);
        assert!(first[0].resource_names_subscribe.is_empty(), "wildcard");
        assert!(!x.ready());

        let h = x.handle(&response(
            CLUSTER_TYPE,
            "00000001",
            vec![cluster(PROBE, true), cluster("local_app", false)],
        ));
        assert_eq!(h.requests.len(), 2);
        assert_eq!(h.requests[0], ack(CLUSTER_TYPE, "00000001"));
        assert_eq!(
            h.requests[1].resource_names_subscribe,
            vec![PROBE.to_string()]
        );
        assert!(!x.ready(), "endpoints not in yet");

        let h = x.handle(&response(
            ENDPOINT_TYPE,
            "00000002",
            vec![cla(PROBE, &[("127.0.0.1", 1)], "e1")],
        ));
        assert_eq!(h.requests, vec![ack(ENDPOINT_TYPE, "00000002")]);
        assert!(h.eds);
        assert_eq!(h.probe, None, "the first view is not a change");
        assert!(x.ready() && x.watches_probe());

        let h = x.handle(&response(
            ENDPOINT_TYPE,
            "00000003",
            vec![cla(PROBE, &[], "e2")],
        ));
        assert_eq!(h.probe, Some(false));
        let h = x.handle(&response(
            ENDPOINT_TYPE,
            "00000004",
            vec![cla(PROBE, &[("127.0.0.1", 1)], "e3")],
        ));
        assert_eq!(h.probe, Some(true));
        assert_eq!(x.version(ENDPOINT_TYPE, PROBE), Some("e3"));
    }

    #[test]
    fn a_resource_that_does_not_parse_is_nacked_and_changes_nothing() {
        let mut x = XdsState::new(None);
        x.stream_start(node());
        let mut bad = cluster("web.x", true);
        bad.resource.as_mut().unwrap().value = vec![0xff, 0xff, 0xff];
        let h = x.handle(&response(
            CLUSTER_TYPE,
            "00000001",
            vec![cluster("api.x", true), bad],
        ));
        assert_eq!(h.requests.len(), 1);
        let n = &h.requests[0];
        assert_eq!(n.response_nonce, "00000001");
        assert_eq!(n.error_detail.as_ref().unwrap().code, INVALID_ARGUMENT);
        assert!(h.nacked.unwrap().to_string().contains("web.x"));
        assert!(x.cluster_names().is_empty());
        // A wrongly typed resource too.
        let mut wrong = cluster("web.x", true);
        wrong.resource.as_mut().unwrap().type_url = ENDPOINT_TYPE.into();
        assert!(
            x.handle(&response(CLUSTER_TYPE, "00000002", vec![wrong]))
                .nacked
                .is_some()
        );
    }

    #[test]
    fn a_new_stream_offers_the_versions_held() {
        let mut x = XdsState::new(None);
        x.stream_start(node());
        x.handle(&response(
            CLUSTER_TYPE,
            "1",
            vec![cluster("api.x", true), cluster("local_app", false)],
        ));
        x.handle(&response(
            ENDPOINT_TYPE,
            "2",
            vec![cla("api.x", &[("10.0.0.2", 21000)], "e1")],
        ));
        let again = x.stream_start(node());
        assert!(!x.ready(), "no CDS answer on this stream yet");
        assert_eq!(again.len(), 2);
        let cds = &again[0];
        assert_eq!(cds.initial_resource_versions.len(), 2);
        assert_eq!(cds.initial_resource_versions["api.x"], "v-api.x-true");
        let eds = &again[1];
        assert_eq!(eds.type_url, ENDPOINT_TYPE);
        assert_eq!(eds.resource_names_subscribe, vec!["api.x".to_string()]);
        assert_eq!(eds.initial_resource_versions["api.x"], "e1");
        assert!(eds.node.is_none());
        // An empty CDS answer (nothing changed) makes the proxy ready.
        x.handle(&response(CLUSTER_TYPE, "1", vec![]));
        assert!(x.ready());
    }

    #[test]
    fn removed_clusters_are_unsubscribed() {
        let mut x = XdsState::new(None);
        x.stream_start(node());
        x.handle(&response(
            CLUSTER_TYPE,
            "1",
            vec![cluster("api.x", true), cluster("web.x", true)],
        ));
        let mut r = response(CLUSTER_TYPE, "2", vec![]);
        r.removed_resources = vec!["web.x".into()];
        let h = x.handle(&r);
        assert_eq!(
            h.requests[1].resource_names_unsubscribe,
            vec!["web.x".to_string()]
        );
        assert_eq!(x.cluster_names(), vec!["api.x"]);
    }
}
