//! What the agents send the HTTP API: the names of what a run creates
//! (nodes, instances, checks, the probe's node and instance, the meta that
//! marks them as the run's own) and the request bodies (txn ops, catalog
//! registrations, sessions, the probe's intentions), as JSON text.
//!
//! What it is not: no I/O (the client is [`crate::http::HttpApi`]) and no
//! answer decoding ([`crate::http::answer`]).

use serde_json::json;

/// Node name of the probe controller's instance.
pub const PROBE_NODE: &str = "agent-sim-probe";
/// Source name in probe intentions.
pub const PROBE_SOURCE: &str = "agent-sim-probe";

/// Node name of agent `index`.
pub fn node_name(prefix: &str, index: u64) -> String {
    format!("{prefix}-{index}")
}

/// A unique 10.x.y.z address for agent `index`.
pub fn node_address(index: u64) -> String {
    format!(
        "10.{}.{}.{}",
        (index >> 16) & 0xff,
        (index >> 8) & 0xff,
        index & 0xff
    )
}

/// Service ID of instance `k` of agent `index`.
pub fn instance_id(service: &str, index: u64, k: u32) -> String {
    format!("{service}-{index}-{k}")
}

/// Check ID of an instance's health check.
pub fn check_id(service_id: &str) -> String {
    format!("service:{service_id}")
}

/// Service ID of the probe controller's instance.
pub fn probe_instance_id(prefix: &str) -> String {
    format!("{PROBE_NODE}-{prefix}")
}

/// The node the catalog probe registers its instance on.
pub fn probe_node(prefix: &str) -> String {
    format!("{prefix}-probe")
}

/// Node meta key naming the run's `name_prefix` on every node (and config
/// entry) a run creates: what `agent-sim cleanup` selects on.
pub const META_PREFIX: &str = "agent-sim-prefix";

/// Node or config-entry meta, as the API prints it (absent or `null`: none).
pub type Meta = Option<std::collections::HashMap<String, String>>;

/// Whether `meta` marks an object as created by runs with name `prefix`.
pub fn marked_by(meta: &Meta, prefix: &str) -> bool {
    meta.as_ref()
        .and_then(|m| m.get(META_PREFIX))
        .is_some_and(|p| p == prefix)
}

/// What one agent registers.
#[derive(Debug, Clone)]
pub struct Registration<'a> {
    /// Node name.
    pub node: &'a str,
    /// Node address.
    pub address: &'a str,
    /// Agent index.
    pub index: u64,
    /// Service name of the instances.
    pub service: &'a str,
    /// Instances.
    pub instances: u32,
    /// With a connect-proxy sidecar per instance.
    pub sidecars: bool,
    /// Upstreams of the sidecars.
    pub upstreams: &'a [String],
    /// The run's name prefix (node meta [`META_PREFIX`]).
    pub prefix: &'a str,
}

/// One service instance as registered: ID, service name, port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Service ID.
    pub id: String,
    /// Service name.
    pub service: String,
    /// Port.
    pub port: u32,
}

/// The instances (and sidecars) [`registration_ops`] registers.
pub fn expected_services(r: &Registration<'_>) -> Vec<Expected> {
    let mut out = Vec::new();
    for k in 0..r.instances {
        let id = instance_id(r.service, r.index, k);
        if r.sidecars {
            out.push(Expected {
                id: format!("{id}-sidecar-proxy"),
                service: format!("{}-sidecar-proxy", r.service),
                port: 21000 + k,
            });
        }
        out.push(Expected {
            id,
            service: r.service.to_owned(),
            port: 8080 + k,
        });
    }
    out
}

/// Txn ops (JSON, one per element) that register an agent's node, its
/// instances with one passing check each, and optional sidecars. Never a
/// `serfHealth` check.
pub fn registration_ops(r: &Registration<'_>) -> Vec<String> {
    let mut ops = Vec::with_capacity(1 + r.instances as usize * 3);
    ops.push(
        json!({"Node": {"Verb": "set", "Node": {
            "Node": r.node, "Address": r.address,
            "Meta": {"agent-sim": "1", META_PREFIX: r.prefix}}}})
        .to_string(),
    );
    for k in 0..r.instances {
        let id = instance_id(r.service, r.index, k);
        let port = 8080 + k;
        ops.push(
            json!({"Service": {"Verb": "set", "Node": r.node, "Service": {
                "ID": id, "Service": r.service, "Port": port, "Address": r.address,
                "Tags": ["agent-sim"]}}})
            .to_string(),
        );
        ops.push(
            json!({"Check": {"Verb": "set", "Check": {
                "Node": r.node, "CheckID": check_id(&id), "Name": format!("{} health", r.service),
                "Status": "passing", "ServiceID": id, "ServiceName": r.service}}})
            .to_string(),
        );
        if r.sidecars {
            let upstreams: Vec<_> = r
                .upstreams
                .iter()
                .enumerate()
                .map(|(j, u)| json!({"DestinationName": u, "LocalBindPort": 9191 + j}))
                .collect();
            ops.push(
                json!({"Service": {"Verb": "set", "Node": r.node, "Service": {
                    "ID": format!("{id}-sidecar-proxy"),
                    "Service": format!("{}-sidecar-proxy", r.service),
                    "Kind": "connect-proxy", "Port": 21000 + k, "Address": r.address,
                    "Proxy": {"DestinationServiceName": r.service, "DestinationServiceID": id,
                              "LocalServiceAddress": "127.0.0.1", "LocalServicePort": port,
                              "Upstreams": upstreams}}}})
                .to_string(),
            );
        }
    }
    ops
}

/// Txn op that removes a node with its services and checks.
pub fn deregistration_op(node: &str) -> String {
    json!({"Node": {"Verb": "delete", "Node": {"Node": node}}}).to_string()
}

/// `PUT /v1/catalog/register` body that sets one check's status only.
pub fn check_status_body(
    node: &str,
    address: &str,
    service_id: &str,
    service: &str,
    status: &str,
) -> String {
    json!({"Node": node, "Address": address, "SkipNodeUpdate": true, "Check": {
        "Node": node, "CheckID": check_id(service_id), "Name": format!("{service} health"),
        "Status": status, "ServiceID": service_id, "ServiceName": service}})
    .to_string()
}

/// `PUT /v1/session/create` body: a TTL session on a catalog-only node.
pub fn session_create_body(node: &str, ttl: &str) -> String {
    json!({"Node": node, "Name": "agent-sim", "TTL": ttl, "Behavior": "release",
           "NodeChecks": []})
    .to_string()
}

/// Address and port of the probe instance: the endpoint dataplane sidecars
/// see appear and disappear in the probe service's EDS cluster.
pub const PROBE_ENDPOINT: (&str, u32) = ("127.0.0.1", 1);

/// `PUT /v1/catalog/register` body of the probe instance, on the run's
/// own probe node. It is Connect-native, so it is also an endpoint of the
/// probe service's Envoy cluster (what dataplane sidecars watch).
pub fn probe_register_body(prefix: &str, service: &str, instance_id: &str) -> String {
    probe_change_body(prefix, service, instance_id, None)
}

/// [`probe_register_body`] with change number `change` in the instance's
/// metadata (`agent-sim-change`): each number is a new version of the
/// instance, the change `--change-every` makes.
pub fn probe_change_body(
    prefix: &str,
    service: &str,
    instance_id: &str,
    change: Option<u64>,
) -> String {
    let meta = match change {
        Some(n) => json!({"agent-sim-change": n.to_string()}),
        None => json!({}),
    };
    json!({"Node": probe_node(prefix), "Address": PROBE_ENDPOINT.0,
           "NodeMeta": {"agent-sim": "probe", META_PREFIX: prefix},
           "Service": {"ID": instance_id, "Service": service, "Port": PROBE_ENDPOINT.1,
                       "Address": PROBE_ENDPOINT.0, "Tags": ["agent-sim-probe"],
                       "Meta": meta, "Connect": {"Native": true}}})
    .to_string()
}

/// `PUT /v1/catalog/deregister` body of the probe instance.
pub fn probe_deregister_body(prefix: &str, instance_id: &str) -> String {
    json!({"Node": probe_node(prefix), "ServiceID": instance_id}).to_string()
}

/// `PUT /v1/catalog/deregister` body that removes a whole node (its
/// services, checks and sessions go with it).
pub fn node_deregister_body(node: &str) -> String {
    json!({ "Node": node }).to_string()
}

/// `PUT /v1/config` body of the probe's service-intentions entry, marked
/// as the run's own (`Meta`).
pub fn intentions_body(prefix: &str, service: &str, allow: bool) -> String {
    json!({"Kind": "service-intentions", "Name": service,
           "Meta": {"agent-sim": "probe", META_PREFIX: prefix},
           "Sources": [
        {"Name": PROBE_SOURCE, "Action": if allow { "allow" } else { "deny" }}]})
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::status_kind;

    #[test]
    fn registration_has_no_serf_health_and_counts_ops() {
        let ups = vec!["web".to_string(), "api".to_string()];
        let r = Registration {
            node: "agent-sim-7",
            address: &node_address(7),
            index: 7,
            service: "app",
            instances: 2,
            sidecars: true,
            upstreams: &ups,
            prefix: "agent-sim",
        };
        let ops = registration_ops(&r);
        assert_eq!(ops.len(), 7);
        assert!(ops.iter().all(|o| !o.contains("serfHealth")));
        let v: serde_json::Value = serde_json::from_str(&ops[0]).unwrap();
        assert_eq!(v["Node"]["Node"]["Address"], "10.0.0.7");
        let v: serde_json::Value = serde_json::from_str(&ops[3]).unwrap();
        assert_eq!(v["Service"]["Service"]["Kind"], "connect-proxy");
        assert_eq!(
            v["Service"]["Service"]["Proxy"]["Upstreams"][1]["DestinationName"],
            "api"
        );
        let v: serde_json::Value = serde_json::from_str(&ops[2]).unwrap();
        assert_eq!(v["Check"]["Check"]["CheckID"], "service:app-7-0");

        // What anti-entropy expects is what the ops register.
        let mut registered: Vec<Expected> = ops
            .iter()
            .filter_map(|o| {
                let v: serde_json::Value = serde_json::from_str(o).unwrap();
                let s = v.get("Service")?.get("Service")?.clone();
                Some(Expected {
                    id: s["ID"].as_str()?.to_owned(),
                    service: s["Service"].as_str()?.to_owned(),
                    port: s["Port"].as_u64()? as u32,
                })
            })
            .collect();
        let mut expected = expected_services(&r);
        registered.sort_by(|a, b| a.id.cmp(&b.id));
        expected.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(registered, expected);
    }

    #[test]
    fn bodies_have_the_documented_shape() {
        let v: serde_json::Value = serde_json::from_str(&session_create_body("n", "30s")).unwrap();
        assert_eq!(v["NodeChecks"], json!([]));
        assert_eq!(v["TTL"], "30s");
        let v: serde_json::Value =
            serde_json::from_str(&check_status_body("n", "10.0.0.1", "s-1", "s", "warning"))
                .unwrap();
        assert_eq!(v["SkipNodeUpdate"], true);
        assert_eq!(v["Check"]["Status"], "warning");
        assert_eq!(status_kind(429), "http_429");
        assert_eq!(status_kind(503), "http_5xx");
        assert_eq!(node_address(70000), "10.1.17.112");
    }
}
