//! `KVS.List` as a real Consul 1.20.1 client agent sent it to its server
//! and what the server answered (`testdata/vectors/consul/agent-rpc/041`–
//! `052`, see its README): our requests for the same values are the
//! agent's bytes exactly (a `KeyRequest` holds no Go map, so no entry
//! order to even out), and our decoder recovers the manifest's values.

use agent_sim_consul::kv::rpc::{ListArgs, decode_list, encode_list};
use agent_sim_consul::rpc::{MessageScan, decode_header};

use crate::common::agent_rpc::{fields, payload};

const REQUESTS: &[&str] = &[
    "041-kvs-list-first.request.bin",
    "043-kvs-list-blocking.request.bin",
    "045-kvs-list-empty.request.bin",
    "047-kvs-list-stale.request.bin",
    "049-kvs-list-token.request.bin",
    "051-kvs-list-no-dc.request.bin",
];

#[test]
fn kvs_list_requests_are_the_agents_bytes() {
    for file in REQUESTS {
        let f = fields(file);
        let s = |k: &str| f[k].as_str().unwrap().to_owned();
        let (dc, key, token) = (s("Datacenter"), s("Key"), s("Token"));
        let args = ListArgs {
            datacenter: &dc,
            key: &key,
            min_index: f["MinQueryIndex"].as_u64().unwrap(),
            max_query_time_ns: f["MaxQueryTime"].as_u64().unwrap(),
            allow_stale: f["AllowStale"].as_bool().unwrap(),
            token: &token,
        };
        let mut ours = Vec::new();
        encode_list(f["Seq"].as_u64().unwrap(), &args, &mut ours);
        assert_eq!(ours, payload(file), "{file}");
    }
}

/// Header and body of a reply frame.
fn reply(file: &str) -> (agent_sim_consul::rpc::ResponseHeader, Vec<u8>) {
    let p = payload(file);
    let (h, end) = MessageScan::default()
        .scan(&p)
        .unwrap()
        .expect("a whole answer");
    assert_eq!(end, p.len(), "{file}: one answer per frame");
    (decode_header(&p[..h]).unwrap(), p[h..].to_vec())
}

#[test]
fn kvs_list_answers_decode_to_the_manifest() {
    for (file, keys) in [
        ("042-kvs-list-first.reply.bin", 3),
        ("044-kvs-list-blocking.reply.bin", 4),
        ("046-kvs-list-empty.reply.bin", 0),
        ("048-kvs-list-stale.reply.bin", 4),
        ("050-kvs-list-token.reply.bin", 4),
    ] {
        let f = fields(file);
        let (header, body) = reply(file);
        assert_eq!(header.error, "");
        assert_eq!(header.seq, f["Seq"].as_u64().unwrap());
        let d = decode_list(&body, Some("kvw/probe")).unwrap();
        assert_eq!(d.index, f["Index"].as_u64().unwrap(), "{file}");
        assert_eq!(d.keys, keys, "{file}");
        // The probe key holds "probe-1" there: not a probe id.
        assert_eq!(d.probe, None);
    }
    let (a, b) = (
        reply("042-kvs-list-first.reply.bin").1,
        reply("044-kvs-list-blocking.reply.bin").1,
    );
    let (a, b) = (
        decode_list(&a, None).unwrap(),
        decode_list(&b, None).unwrap(),
    );
    assert_ne!(a.hash, b.hash, "a new key is a changed result");
    let (a2, _) = (reply("048-kvs-list-stale.reply.bin").1, ());
    assert_eq!(
        decode_list(&a2, None).unwrap().hash,
        b.hash,
        "same keys, same hash"
    );
}

#[test]
fn a_refused_list_keeps_the_servers_words() {
    let (header, body) = reply("052-kvs-list-no-dc.reply.bin");
    assert_eq!(
        header.error,
        fields("052-kvs-list-no-dc.reply.bin")["Error"]
    );
    assert_eq!(header.error, "No path to datacenter");
    assert_eq!(body, [0x80], "an empty body");
}
