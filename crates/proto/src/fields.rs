//! Top-level field numbers of the messages agent-sim reads from a peer and
//! scans for fields it does not know ([`crate::scan::unknown_fields`]): the
//! fields the API defines, whether or not agent-sim decodes them, so that
//! only fields of a newer (or another) API are counted.
//!
//! Envoy's messages as `envoy-types` 0.7.7 defines them (Envoy's v3 API);
//! Consul's as Consul 1.20.1 (`proto-public` v0.6.2) defines them, with the
//! numbers older servers used (`service_kind` 1, `node_id` 7 of the bootstrap
//! params, reserved since) counted as known.

/// `envoy.service.discovery.v3.DeltaDiscoveryRequest`: node 1, type_url 2,
/// resource_names_subscribe 3, resource_names_unsubscribe 4,
/// initial_resource_versions 5, response_nonce 6, error_detail 7,
/// resource_locators_subscribe 8, resource_locators_unsubscribe 9.
pub const DELTA_DISCOVERY_REQUEST: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8, 9];

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`: system_version_info
/// 1, resources 2, type_url 4, nonce 5, removed_resources 6, control_plane
/// 7, removed_resource_names 8, resource_errors 9.
pub const DELTA_DISCOVERY_RESPONSE: &[u32] = &[1, 2, 4, 5, 6, 7, 8, 9];

/// `envoy.service.discovery.v3.Resource`: name 3, resource_name 8, aliases
/// 4, version 1, resource 2, ttl 6, cache_control 7, metadata 9.
pub const RESOURCE: &[u32] = &[1, 2, 3, 4, 6, 7, 8, 9];

/// `envoy.config.cluster.v3.Cluster` (7, 11, 12, 15 and 35 are reserved).
pub const CLUSTER: &[u32] = &[
    1, 2, 3, 4, 5, 6, 8, 9, 10, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
    31, 32, 33, 34, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55,
    56, 57, 58, 59, 60, 61, 62,
];

/// `envoy.config.endpoint.v3.ClusterLoadAssignment`: cluster_name 1,
/// endpoints 2, policy 4, named_endpoints 5.
pub const CLUSTER_LOAD_ASSIGNMENT: &[u32] = &[1, 2, 4, 5];

/// `hashicorp.consul.dataplane.GetEnvoyBootstrapParamsRequest`: node_id 1,
/// node_name 2, service_id 3, partition 4, namespace 5, proxy_id 6.
pub const BOOTSTRAP_REQUEST: &[u32] = &[1, 2, 3, 4, 5, 6];

/// `hashicorp.consul.dataplane.GetEnvoyBootstrapParamsResponse`: (1
/// service_kind before 1.15), service 2, namespace 3, partition 4,
/// datacenter 5, config 6, (7 node_id before 1.15), node_name 8,
/// access_logs 9, identity 10, bootstrap_config 11.
pub const BOOTSTRAP_RESPONSE: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];

/// `hashicorp.consul.serverdiscovery.WatchServersRequest`: wan 1.
pub const WATCH_SERVERS_REQUEST: &[u32] = &[1];

/// `hashicorp.consul.serverdiscovery.WatchServersResponse`: servers 1.
pub const WATCH_SERVERS_RESPONSE: &[u32] = &[1];

/// The unknown top-level fields of `msg` (a message of type `name` whose
/// fields are `known`) in words: `DeltaDiscoveryResponse field 12 (wire
/// type 2)`, and how many when several.
pub fn unknown_in(name: &str, msg: &[u8], known: &[u32]) -> Option<String> {
    let (n, wire, count) = crate::scan::unknown_fields(msg, known)?;
    Some(if count > 1 {
        format!("{name} field {n} (wire type {wire}), {count} unknown fields")
    } else {
        format!("{name} field {n} (wire type {wire})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_message_and_the_field() {
        // field 12, length-delimited, 1 byte; field 5 known.
        let msg = [0x62, 0x01, 0x00, 0x2a, 0x00];
        assert_eq!(
            unknown_in("DeltaDiscoveryResponse", &msg, DELTA_DISCOVERY_RESPONSE).as_deref(),
            Some("DeltaDiscoveryResponse field 12 (wire type 2)")
        );
        assert_eq!(
            unknown_in("X", &[0x2a, 0x00], DELTA_DISCOVERY_RESPONSE),
            None
        );
        let two = [0x62, 0x00, 0x6a, 0x00];
        assert!(
            unknown_in("X", &two, &[])
                .unwrap()
                .ends_with("2 unknown fields")
        );
    }

    #[test]
    fn lists_are_sorted_and_distinct() {
        for l in [
            DELTA_DISCOVERY_REQUEST,
            DELTA_DISCOVERY_RESPONSE,
            RESOURCE,
            CLUSTER,
            CLUSTER_LOAD_ASSIGNMENT,
            BOOTSTRAP_REQUEST,
            BOOTSTRAP_RESPONSE,
        ] {
            assert!(l.windows(2).all(|w| w[0] < w[1]), "{l:?}");
        }
    }
}
