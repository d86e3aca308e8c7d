//! gRPC plumbing of a sidecar: method paths, the token's header, and the
//! bootstrap request. Requests and responses are encoded and decoded by
//! prost where the HTTP/2 client frames them (`agent::session`). No I/O
//! here.

use agent_sim_proto::consul::dataplane::{
    GetEnvoyBootstrapParamsRequest, get_envoy_bootstrap_params_request::NodeSpec,
};

/// `DataplaneService/GetEnvoyBootstrapParams`.
pub const BOOTSTRAP_PATH: &str =
    "/hashicorp.consul.dataplane.DataplaneService/GetEnvoyBootstrapParams";
/// `ServerDiscoveryService/WatchServers`.
pub const WATCH_SERVERS_PATH: &str =
    "/hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers";
/// Envoy's Delta ADS method (the only xDS flavour Consul serves).
pub const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
/// The ACL token's gRPC metadata key.
pub const TOKEN_HEADER: &str = "x-consul-token";

/// The bootstrap request consul-dataplane sends for proxy `proxy_id` on
/// `node` (both the old `service_id` and the new `proxy_id` field).
pub fn bootstrap_request(proxy_id: &str, node: &str) -> GetEnvoyBootstrapParamsRequest {
    GetEnvoyBootstrapParamsRequest {
        node_spec: Some(NodeSpec::NodeName(node.to_owned())),
        service_id: proxy_id.to_owned(),
        proxy_id: proxy_id.to_owned(),
        partition: String::new(),
        namespace: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_request_names_the_proxy_both_ways() {
        use prost::Message;
        let r = bootstrap_request("web-sidecar-proxy", "sim-node-1");
        let back = GetEnvoyBootstrapParamsRequest::decode(&*r.encode_to_vec()).unwrap();
        assert_eq!(back.service_id, "web-sidecar-proxy");
        assert_eq!(back.proxy_id, "web-sidecar-proxy");
        assert_eq!(
            back.node_spec,
            Some(NodeSpec::NodeName("sim-node-1".into()))
        );
    }
}
