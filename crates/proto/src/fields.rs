//! Top-level field numbers of the requests the embedded server reads on its
//! public gRPC port and scans for fields it does not know
//! ([`crate::scan::unknown_fields`]): the fields the API defines, whether or
//! not the server decodes them, so that only fields of a newer (or another)
//! API are counted.
//!
//! Envoy's messages as `envoy-types` 0.7.7 defines them (Envoy's v3 API);
//! Consul's as Consul 1.20.1 (`proto-public` v0.6.2) defines them.

/// `envoy.service.discovery.v3.DeltaDiscoveryRequest`: node 1, type_url 2,
/// resource_names_subscribe 3, resource_names_unsubscribe 4,
/// initial_resource_versions 5, response_nonce 6, error_detail 7,
/// resource_locators_subscribe 8, resource_locators_unsubscribe 9.
pub const DELTA_DISCOVERY_REQUEST: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8, 9];

/// `hashicorp.consul.dataplane.GetEnvoyBootstrapParamsRequest`: node_id 1,
/// node_name 2, service_id 3, partition 4, namespace 5, proxy_id 6.
pub const BOOTSTRAP_REQUEST: &[u32] = &[1, 2, 3, 4, 5, 6];

/// `hashicorp.consul.serverdiscovery.WatchServersRequest`: wan 1.
pub const WATCH_SERVERS_REQUEST: &[u32] = &[1];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_sorted_and_distinct() {
        for l in [
            DELTA_DISCOVERY_REQUEST,
            BOOTSTRAP_REQUEST,
            WATCH_SERVERS_REQUEST,
        ] {
            assert!(l.windows(2).all(|w| w[0] < w[1]), "{l:?}");
        }
    }

    #[test]
    fn a_field_of_a_newer_api_is_unknown() {
        // field 10, length-delimited, 1 byte; field 6 (response_nonce) known.
        let msg = [0x52, 0x01, 0x00, 0x32, 0x00];
        assert_eq!(
            crate::scan::unknown_fields(&msg, DELTA_DISCOVERY_REQUEST).map(|(n, ..)| n),
            Some(10)
        );
        assert_eq!(
            crate::scan::unknown_fields(&[0x32, 0x00], DELTA_DISCOVERY_REQUEST),
            None
        );
    }
}
