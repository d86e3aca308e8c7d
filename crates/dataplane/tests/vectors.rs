//! Golden vectors captured from a real Consul 1.20.1 server's Delta ADS
//! (`testdata/vectors/consul/xds/`, see its README): every captured message
//! decodes to the manifest's values, and a sidecar's xDS state, fed the
//! captured responses, sends the captured requests byte for byte (the first
//! one field for field: its metadata map has no fixed order).

use std::path::{Path, PathBuf};

use agent_sim_dataplane::xds::{
    self, CLUSTER_TYPE, ENDPOINT_TYPE, NodeInfo, XdsState, endpoints, is_eds,
};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use prost::Message;
use serde_json::Value;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/vectors");

fn dir() -> PathBuf {
    Path::new(VECTORS).to_path_buf()
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(dir().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn xds_entries() -> Vec<Value> {
    let v: Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    let out: Vec<Value> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["file"].as_str().unwrap().starts_with("consul/xds/"))
        .cloned()
        .collect();
    assert_eq!(out.len(), 8, "the xds capture has 8 messages");
    out
}

fn strs(v: &Value) -> Vec<String> {
    match v {
        Value::Null => Vec::new(),
        v => v
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect(),
    }
}

fn check_request(file: &str, r: &DeltaDiscoveryRequest, want: &Value) {
    for (k, v) in want.as_object().unwrap() {
        let node = r.node.as_ref();
        let got = match k.as_str() {
            "TypeUrl" => Value::from(r.type_url.clone()),
            "ResponseNonce" => Value::from(r.response_nonce.clone()),
            "ResourceNamesSubscribe" => Value::from(r.resource_names_subscribe.clone()),
            "Node.Id" => Value::from(node.unwrap().id.clone()),
            "Node.Cluster" => Value::from(node.unwrap().cluster.clone()),
            "Node.Metadata.node_name" => {
                let f = &node.unwrap().metadata.as_ref().unwrap().fields["node_name"];
                match &f.kind {
                    Some(Kind::StringValue(s)) => Value::from(s.clone()),
                    other => panic!("{file}: node_name {other:?}"),
                }
            }
            other => panic!("{file}: no check for {other}"),
        };
        assert_eq!(&got, v, "{file} {k}");
    }
}

fn health(h: i32) -> &'static str {
    match HealthStatus::try_from(h) {
        Ok(HealthStatus::Healthy) => "HEALTHY",
        Ok(HealthStatus::Unhealthy) => "UNHEALTHY",
        Ok(HealthStatus::Unknown) => "UNKNOWN",
        _ => "OTHER",
    }
}

fn check_response(file: &str, r: &DeltaDiscoveryResponse, want: &Value) {
    assert_eq!(r.nonce, want["Nonce"].as_str().unwrap(), "{file} Nonce");
    assert_eq!(
        r.type_url,
        want["TypeUrl"].as_str().unwrap(),
        "{file} TypeUrl"
    );
    assert_eq!(
        r.system_version_info,
        want["SystemVersionInfo"].as_str().unwrap(),
        "{file} SystemVersionInfo"
    );
    assert_eq!(
        r.removed_resources,
        strs(&want["RemovedResources"]),
        "{file} RemovedResources"
    );
    let wanted = want["Resources"].as_array().unwrap();
    assert_eq!(r.resources.len(), wanted.len(), "{file} Resources");
    for (res, w) in r.resources.iter().zip(wanted) {
        assert_eq!(res.name, w["Name"].as_str().unwrap(), "{file} Name");
        assert!(
            !res.version.is_empty(),
            "{file}: {} has a version",
            res.name
        );
        let any = res.resource.as_ref().unwrap();
        assert_eq!(any.type_url, r.type_url, "{file}: resource type");
        if r.type_url == CLUSTER_TYPE {
            let c = Cluster::decode(&*any.value).unwrap();
            assert_eq!(c.name, w["ClusterName"].as_str().unwrap(), "{file}");
            assert_eq!(is_eds(&c), w["EDS"].as_bool().unwrap(), "{file} EDS");
            let t = if is_eds(&c) { "EDS" } else { "STATIC" };
            assert_eq!(t, w["ClusterType"].as_str().unwrap(), "{file} ClusterType");
        } else {
            let cla = ClusterLoadAssignment::decode(&*any.value).unwrap();
            assert_eq!(
                cla.cluster_name,
                w["ClusterName"].as_str().unwrap(),
                "{file}"
            );
            let eps: Vec<String> = endpoints(&cla)
                .into_iter()
                .map(|(e, h)| format!("{e} {}", health(h)))
                .collect();
            assert_eq!(eps, strs(&w["Endpoints"]), "{file} Endpoints");
        }
    }
}

#[test]
fn every_captured_message_decodes_to_the_manifest_values() {
    for e in xds_entries() {
        let file = e["file"].as_str().unwrap();
        let bytes = read(file);
        assert_eq!(
            bytes.len() as u64,
            e["size"].as_u64().unwrap(),
            "{file} size"
        );
        let want = &e["expected_decoded_fields"];
        match e["message_type"].as_str().unwrap() {
            "envoy.service.discovery.v3.DeltaDiscoveryRequest" => {
                let r = DeltaDiscoveryRequest::decode(&*bytes).unwrap();
                check_request(file, &r, want);
            }
            "envoy.service.discovery.v3.DeltaDiscoveryResponse" => {
                let r = DeltaDiscoveryResponse::decode(&*bytes).unwrap();
                check_response(file, &r, want);
            }
            other => panic!("{file}: unexpected type {other}"),
        }
    }
}

fn response(n: &str) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse::decode(&*read(&format!("consul/xds/{n}"))).unwrap()
}

#[test]
fn fed_the_captured_responses_a_sidecar_sends_the_captured_requests() {
    let node = NodeInfo {
        id: "web-sidecar-proxy".into(),
        cluster: "web".into(),
        node_name: "sim-node-1".into(),
        namespace: "default".into(),
        partition: "default".into(),
        envoy_version: Some((1, 29, 7)),
    };
    let mut x = XdsState::new(None);
    let first = x.stream_start(node.node());
    assert_eq!(first.len(), 1);
    let captured =
        DeltaDiscoveryRequest::decode(&*read("consul/xds/000-request-cds-initial.bin")).unwrap();
    assert_eq!(first[0], captured, "the first request, field by field");

    let h = x.handle(&response("001-response-cds-initial.bin"));
    assert_eq!(h.requests.len(), 2, "ACK, then the EDS subscription");
    assert_eq!(
        xds::encode(&h.requests[0]),
        read("consul/xds/002-request-cds-ack.bin")
    );
    assert_eq!(
        xds::encode(&h.requests[1]),
        read("consul/xds/003-request-eds-subscribe.bin")
    );
    assert!(!x.ready());

    let h = x.handle(&response("004-response-eds-initial.bin"));
    assert_eq!(h.requests.len(), 1);
    assert_eq!(
        xds::encode(&h.requests[0]),
        read("consul/xds/005-request-eds-ack.bin")
    );
    assert!(x.ready());

    let h = x.handle(&response(
        "006-response-eds-after-deregister-api-2-sidecar.bin",
    ));
    assert!(h.eds && h.nacked.is_none());
    assert_eq!(
        xds::encode(&h.requests[0]),
        read("consul/xds/007-request-ack.bin")
    );
    let api = "api.default.dc1.internal.b5311007-08ff-f6c8-5d97-ba72dfa2036f.consul";
    assert_eq!(x.cluster_names(), vec![api, "local_app"]);
    let v = x.version(ENDPOINT_TYPE, api).unwrap();
    assert_eq!(
        v,
        response("006-response-eds-after-deregister-api-2-sidecar.bin").resources[0].version
    );
}

#[test]
fn a_reconnect_offers_what_the_real_server_sent() {
    let mut x = XdsState::new(None);
    let node = || {
        NodeInfo {
            id: "web-sidecar-proxy".into(),
            cluster: "web".into(),
            node_name: "sim-node-1".into(),
            namespace: "default".into(),
            partition: "default".into(),
            envoy_version: None,
        }
        .node()
    };
    x.stream_start(node());
    let cds = response("001-response-cds-initial.bin");
    let eds = response("004-response-eds-initial.bin");
    x.handle(&cds);
    x.handle(&eds);
    let again = x.stream_start(node());
    assert_eq!(again.len(), 2);
    for r in &cds.resources {
        assert_eq!(again[0].initial_resource_versions[&r.name], r.version);
    }
    let name = &eds.resources[0].name;
    assert_eq!(again[1].resource_names_subscribe, vec![name.clone()]);
    assert_eq!(
        again[1].initial_resource_versions[name],
        eds.resources[0].version
    );
}
