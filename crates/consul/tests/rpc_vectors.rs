//! Blocking queries captured from a real Consul 1.20.1 over its RPC port
//! (`testdata/vectors/consul/rpc/`, see its README): our request bytes are
//! the ones Consul's own client wrote, our decoder recovers the manifest's
//! values from the server's answers, and the message scanner finds where
//! each value ends in the captured stream.

use std::path::Path;

use agent_sim_consul::codec::instance_key;
use agent_sim_consul::watch::msgpack::{
    ServiceNodesArgs, decode_response, encode_request, value_len,
};
use agent_sim_consul::watch::{Digest, next_index};
use serde_json::Value;

const RPC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/vectors/consul/rpc"
);

fn read(file: &str) -> Vec<u8> {
    std::fs::read(Path::new(RPC).join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn fields(file: &str) -> Value {
    let m: Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    m.as_array()
        .unwrap()
        .iter()
        .find(|e| e["file"] == format!("consul/rpc/{file}"))
        .unwrap_or_else(|| panic!("{file} not in the manifest"))["expected_decoded_fields"]
        .clone()
}

/// A yamux header: (version, type, flags, stream, length).
fn yamux_header(b: &[u8]) -> (u8, u8, u16, u32, u32) {
    (
        b[0],
        b[1],
        u16::from_be_bytes([b[2], b[3]]),
        u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
    )
}

#[test]
fn stream_open_and_ack_headers() {
    for file in ["000-client-stream-open.bin", "001-server-stream-ack.bin"] {
        let f = fields(file);
        let (v, t, flags, id, len) = yamux_header(&read(file));
        assert_eq!(v as u64, f["version"].as_u64().unwrap(), "{file}");
        assert_eq!(t as u64, f["type"].as_u64().unwrap(), "{file}");
        assert_eq!(flags as u64, f["flags"].as_u64().unwrap(), "{file}");
        assert_eq!(id as u64, f["stream_id"].as_u64().unwrap(), "{file}");
        assert_eq!(len as u64, f["length"].as_u64().unwrap(), "{file}");
    }
}

#[test]
fn our_requests_are_the_bytes_consul_wrote() {
    for file in [
        "002-client-request-first.bin",
        "004-client-request-blocking.bin",
        "006-client-request-timeout.bin",
    ] {
        let f = fields(file);
        let frame = read(file);
        let (_, t, _, id, len) = yamux_header(&frame);
        assert_eq!(t, 0, "{file}: a data frame");
        assert_eq!(id as u64, f["yamux_stream"].as_u64().unwrap());
        assert_eq!(len as u64, f["payload_len"].as_u64().unwrap());
        let payload = &frame[12..];
        let args = ServiceNodesArgs {
            datacenter: f["Datacenter"].as_str().unwrap(),
            service: f["ServiceName"].as_str().unwrap(),
            min_index: f["MinQueryIndex"].as_u64().unwrap(),
            max_query_time_ns: f["MaxQueryTime_ns"].as_u64().unwrap(),
            token: "",
        };
        let mut ours = Vec::new();
        encode_request(f["Seq"].as_u64().unwrap(), &args, &mut ours);
        assert_eq!(ours, payload, "{file}: our request differs from Consul's");
        // Two values: the header and the arguments, nothing after.
        let h = value_len(payload).unwrap().unwrap();
        let a = value_len(&payload[h..]).unwrap().unwrap();
        assert_eq!(h + a, payload.len());
    }
}

fn decode(file: &str) -> (u64, Digest) {
    let frame = read(file);
    let payload = &frame[12..];
    let h = value_len(payload).unwrap().unwrap();
    let b = value_len(&payload[h..]).unwrap().unwrap();
    assert_eq!(h + b, payload.len(), "{file}");
    let (header, digest) = decode_response(&payload[..h], &payload[h..]).unwrap();
    let f = fields(file);
    assert_eq!(header.seq, f["Seq"].as_u64().unwrap(), "{file}");
    assert_eq!(header.service_method, f["ServiceMethod"].as_str().unwrap());
    assert_eq!(header.error, f["Error"].as_str().unwrap());
    let digest = digest.expect("a result");
    assert_eq!(digest.index, f["Index"].as_u64().unwrap(), "{file}");
    let nodes = f["nodes"].as_array().unwrap();
    assert_eq!(digest.items.len(), nodes.len(), "{file}");
    for n in nodes {
        let key = instance_key(
            n["Node"].as_str().unwrap(),
            n["ServiceID"].as_str().unwrap(),
        );
        let item = digest
            .items
            .iter()
            .find(|i| i.key == key)
            .unwrap_or_else(|| panic!("{file}: {n} not decoded"));
        // The instance's last change is at least its service's.
        assert!(
            item.modify >= n["ModifyIndex"].as_u64().unwrap(),
            "{file}: {n}"
        );
        assert!(item.modify <= digest.index, "{file}: {n}");
    }
    (f["Seq"].as_u64().unwrap(), digest)
}

#[test]
fn answers_decode_to_the_manifest_values() {
    let (_, first) = decode("003-server-response-first.bin");
    let (_, changed) = decode("005-server-response-blocking.bin");
    let (_, same) = decode("007-server-response-timeout.bin");
    let web1 = instance_key("sim-node-1", "web-1");
    let web2 = instance_key("sim-node-2", "web-2");
    let m = |d: &Digest, k| d.items.iter().find(|i| i.key == k).unwrap().modify;
    // The meta change shows as web-1's modify index moving; web-2 stays.
    assert!(m(&first, web1) < m(&changed, web1));
    assert_eq!(m(&first, web2), m(&changed, web2));
    // The wait that ended without a change answers the same result.
    assert_eq!(changed, same);
    // The watcher's next indexes: past 19, then 22, then 22 again.
    assert_eq!(next_index(0, first.index), 19);
    assert_eq!(next_index(19, changed.index), 22);
    assert_eq!(next_index(22, same.index), 22);
}

#[test]
fn the_captured_streams_split_into_whole_messages() {
    // Client side: 0x04, then yamux frames; every data payload is exactly
    // two msgpack values.
    let c = read("client-to-server.bin");
    assert_eq!(
        c[0] as u64,
        fields("client-to-server.bin")["first_byte"]
            .as_u64()
            .unwrap()
    );
    for (bytes, file) in [
        (&c[1..], "client-to-server.bin"),
        (&read("server-to-client.bin")[..], "server-to-client.bin"),
    ] {
        let mut at = 0;
        let mut frames = 0;
        let mut data = Vec::new();
        while at < bytes.len() {
            let (_, t, _, _, len) = yamux_header(&bytes[at..]);
            at += 12;
            if t == 0 {
                data.extend_from_slice(&bytes[at..at + len as usize]);
                at += len as usize;
            }
            frames += 1;
        }
        assert_eq!(
            frames,
            fields(file)["yamux_frames"].as_u64().unwrap(),
            "{file}"
        );
        let mut values = 0;
        let mut off = 0;
        while let Some(n) = value_len(&data[off..]).unwrap() {
            off += n;
            values += 1;
            if off == data.len() {
                break;
            }
        }
        assert_eq!(off, data.len(), "{file}");
        assert_eq!(values, 6, "{file}: three calls of two values each");
    }
}
