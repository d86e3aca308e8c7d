//! Envoy resources of one connect proxy, built from the catalog the way a
//! Consul 1.20 server builds them for a dataplane, reduced to clusters and
//! endpoints:
//!
//! - one EDS cluster per upstream, named `<svc>.default.<dc>.internal.<trust
//!   domain>.consul` (as captured from a real server), and `local_app`
//!   (STATIC, the proxied service's local port);
//! - per upstream cluster, a `ClusterLoadAssignment` with the mesh
//!   endpoints of the service (its proxies' address and port, or a
//!   Connect-native instance's own), `HEALTHY` unless a check is critical —
//!   an explicit empty assignment when there are none, as Consul sends;
//! - each resource's version is the sha256 (hex) of its encoding, as
//!   Consul's delta server computes it.
//!
//! Pure functions of the store; no I/O.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig,
};
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, HealthStatus, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use prost::Message;
use sha2::{Digest, Sha256};

use super::state::{InstanceKey, ServiceDef, Store};

/// `type_url` of clusters.
pub(crate) const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// `type_url` of endpoints.
pub(crate) const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// The cluster of the proxied service on the proxy's host.
pub(crate) const LOCAL_APP: &str = "local_app";

/// One resource ready to send: its version and `Any`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Built {
    pub version: String,
    pub any: Any,
}

/// Resources of one type, by name.
pub(crate) type Resources = BTreeMap<String, Built>;

/// Everything a proxy is sent: clusters and endpoints.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ProxyResources {
    pub clusters: Resources,
    pub endpoints: Resources,
}

impl ProxyResources {
    pub(crate) fn of_type(&self, type_url: &str) -> Option<&Resources> {
        match type_url {
            CLUSTER_TYPE => Some(&self.clusters),
            ENDPOINT_TYPE => Some(&self.endpoints),
            _ => None,
        }
    }
}

/// Consul's cluster name of an upstream service in the default namespace
/// and partition.
pub(crate) fn cluster_name(service: &str, datacenter: &str, trust_domain: &str) -> String {
    format!("{service}.default.{datacenter}.internal.{trust_domain}.consul")
}

fn built<M: Message>(type_url: &str, m: &M) -> Built {
    let value = m.encode_to_vec();
    let version = Sha256::digest(&value)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Built {
        version,
        any: Any {
            type_url: type_url.to_owned(),
            value,
        },
    }
}

fn socket(address: &str, port: u32) -> Address {
    Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: address.to_owned(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

fn lb_endpoint(address: &str, port: u32, health: HealthStatus) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(socket(address, port)),
            ..Default::default()
        })),
        health_status: health as i32,
        ..Default::default()
    }
}

/// The upstream service names of a proxy (`Proxy.Upstreams[].DestinationName`).
pub(crate) fn upstreams(def: &ServiceDef) -> Vec<String> {
    def.proxy
        .as_ref()
        .and_then(|p| p.get("Upstreams"))
        .and_then(|u| u.as_array())
        .map(|ups| {
            ups.iter()
                .filter_map(|u| u.get("DestinationName")?.as_str())
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The endpoints of one instance key: address (the service's, else its
/// node's), port, health (critical → `UNHEALTHY`).
fn endpoint_of(store: &Store, key: &InstanceKey) -> Option<LbEndpoint> {
    let node = store.nodes.get(&key.0)?;
    let svc = node.services.get(&key.1)?;
    let address = if svc.def.address.is_empty() {
        &node.def.address
    } else {
        &svc.def.address
    };
    let critical = node.checks.values().any(|c| {
        (c.def.service_id.is_empty() || c.def.service_id == svc.def.id)
            && c.def.status == "critical"
    });
    let health = if critical {
        HealthStatus::Unhealthy
    } else {
        HealthStatus::Healthy
    };
    Some(lb_endpoint(
        address,
        u32::try_from(svc.def.port).unwrap_or(0),
        health,
    ))
}

/// The resources of proxy `def` (`None` when it is not a connect proxy).
pub(crate) fn build(store: &Store, trust_domain: &str, def: &ServiceDef) -> Option<ProxyResources> {
    def.connect_destination()?;
    let mut out = ProxyResources::default();
    for up in upstreams(def) {
        let name = cluster_name(&up, &store.datacenter, trust_domain);
        let cluster = Cluster {
            name: name.clone(),
            alt_stat_name: name.clone(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(EdsClusterConfig {
                eds_config: Some(ads()),
                service_name: String::new(),
            }),
            connect_timeout: Some(PbDuration {
                seconds: 5,
                nanos: 0,
            }),
            ..Default::default()
        };
        out.clusters
            .insert(name.clone(), built(CLUSTER_TYPE, &cluster));
        let lb_endpoints = store
            .connect_instances(&up)
            .filter_map(|k| endpoint_of(store, k))
            .collect();
        let cla = ClusterLoadAssignment {
            cluster_name: name.clone(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }],
            ..Default::default()
        };
        out.endpoints.insert(name, built(ENDPOINT_TYPE, &cla));
    }
    let local_port = def
        .proxy
        .as_ref()
        .and_then(|p| p.get("LocalServicePort"))
        .and_then(|p| p.as_u64())
        .unwrap_or(0) as u32;
    let local = Cluster {
        name: LOCAL_APP.into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout: Some(PbDuration {
            seconds: 5,
            nanos: 0,
        }),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: LOCAL_APP.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![lb_endpoint("127.0.0.1", local_port, HealthStatus::Unknown)],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    out.clusters
        .insert(LOCAL_APP.into(), built(CLUSTER_TYPE, &local));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::state::{NodeDef, Touched};

    fn proxy(upstreams: &[&str]) -> ServiceDef {
        let ups: Vec<_> = upstreams
            .iter()
            .map(|u| serde_json::json!({"DestinationName": u, "LocalBindPort": 9191}))
            .collect();
        ServiceDef {
            kind: "connect-proxy".into(),
            id: "web-sidecar-proxy".into(),
            service: "web-sidecar-proxy".into(),
            port: 21000,
            proxy: Some(serde_json::json!({"DestinationServiceName": "web",
                "LocalServicePort": 8080, "Upstreams": ups})),
            ..ServiceDef::default()
        }
    }

    #[test]
    fn clusters_and_endpoints_follow_the_catalog() {
        let mut s = Store::new("dc1".into(), 8);
        let idx = s.next_index();
        let mut t = Touched::default();
        s.ensure_node(
            "n2",
            NodeDef {
                address: "10.0.0.2".into(),
                ..NodeDef::default()
            },
            idx,
            &mut t,
        );
        let mut api = proxy(&[]);
        api.id = "api-1-sidecar-proxy".into();
        api.service = "api-sidecar-proxy".into();
        api.proxy = Some(serde_json::json!({"DestinationServiceName": "api"}));
        s.ensure_service("n2", api, idx, &mut t).unwrap();
        let native = ServiceDef {
            id: "probe-1".into(),
            service: "probe".into(),
            address: "127.0.0.1".into(),
            port: 1,
            connect_native: true,
            ..ServiceDef::default()
        };
        s.ensure_service("n2", native, idx, &mut t).unwrap();
        s.commit(idx, t);

        let r = build(&s, "td", &proxy(&["api", "probe", "none"])).unwrap();
        let names: Vec<&str> = r.clusters.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            vec![
                "api.default.dc1.internal.td.consul",
                "local_app",
                "none.default.dc1.internal.td.consul",
                "probe.default.dc1.internal.td.consul"
            ]
        );
        assert_eq!(r.endpoints.len(), 3, "an empty assignment for `none`");
        let cla = |n: &str| ClusterLoadAssignment::decode(&*r.endpoints[n].any.value).unwrap();
        let eps = |c: ClusterLoadAssignment| c.endpoints[0].lb_endpoints.len();
        assert_eq!(eps(cla("api.default.dc1.internal.td.consul")), 1);
        assert_eq!(eps(cla("probe.default.dc1.internal.td.consul")), 1);
        assert_eq!(eps(cla("none.default.dc1.internal.td.consul")), 0);
        // Versions are content hashes: the same catalog gives the same ones.
        let again = build(&s, "td", &proxy(&["api", "probe", "none"])).unwrap();
        assert_eq!(r, again);
        assert_eq!(r.clusters["local_app"].version.len(), 64);
        assert!(build(&s, "td", &ServiceDef::default()).is_none());
    }
}
