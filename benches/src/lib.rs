//! Fixtures and measuring aids of agent-sim's serialization benchmarks
//! (`benches/serialization.rs`, `cargo bench -p agent-sim-benches`).
//!
//! Main parts:
//! - [`vector`]: the captured golden vectors under `testdata/vectors`.
//! - [`alloc`]: a counting global allocator (declared by the bench binary)
//!   and an allocations-per-op probe run outside criterion's timing loops.
//! - [`sensu`]: message builders configured as the fleet configures them.
//! - [`consul`]: ServiceHealth snapshots synthesized from the captured event
//!   by rewriting its strings on the wire (so every field Consul sent stays),
//!   and [`consul::rpc`], serde mirrors of Consul's blocking-query response
//!   (`Health.ServiceNodes` → `IndexedCheckServiceNodes`) for msgpack.
//! - [`ws`]: a client-role tungstenite `WebSocket` over a discarding stream,
//!   so a keepalive is framed and masked exactly as the session's socket does.
//!
//! What it is not: a benchmark itself (the criterion groups live in
//! `benches/`), nor a test of the codecs (the protocol crates own those).

use std::path::PathBuf;

/// Directory of the captured vectors (`testdata/vectors`, a copy of the captured data).
pub const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/vectors");

/// Reads a vector file, e.g. `vector("sensu/protobuf/003-backend-check_request.bin")`.
///
/// # Panics
/// When the file is missing: the benchmarks are meaningless without it.
pub fn vector(rel: &str) -> Vec<u8> {
    let p = PathBuf::from(VECTORS).join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("vector {}: {e}", p.display()))
}

pub mod alloc {
    //! Counting allocator: `#[global_allocator] static A: Counting = Counting;`
    //! in the bench binary, then [`per_op`] around a closure.

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::time::{Duration, Instant};

    static ALLOCS: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);

    /// The system allocator, counting allocations (`alloc`, `alloc_zeroed`
    /// and `realloc` calls) and the bytes they asked for.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Counting;

    // SAFETY: every call forwards to `System` unchanged; the counters are
    // plain relaxed atomics and never allocate.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES.fetch_add(l.size() as u64, Relaxed);
            // SAFETY: same contract as the caller's.
            unsafe { System.alloc(l) }
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES.fetch_add(l.size() as u64, Relaxed);
            // SAFETY: same contract as the caller's.
            unsafe { System.alloc_zeroed(l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES.fetch_add(new as u64, Relaxed);
            // SAFETY: same contract as the caller's.
            unsafe { System.realloc(p, l, new) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: same contract as the caller's.
            unsafe { System.dealloc(p, l) }
        }
    }

    /// Allocations and allocated bytes per call of an operation.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct PerOp {
        /// Allocation calls per op (alloc + realloc).
        pub allocs: f64,
        /// Bytes requested per op.
        pub bytes: f64,
    }

    /// Runs `f` a few times to warm up, then enough times for ~10 ms (at most
    /// 1,000) and returns its allocations per call. Only meaningful when the
    /// binary's global allocator is [`Counting`] (zero otherwise).
    pub fn per_op<R>(mut f: impl FnMut() -> R) -> PerOp {
        for _ in 0..3 {
            std::hint::black_box(f());
        }
        let t = Instant::now();
        std::hint::black_box(f());
        let one = t.elapsed().max(Duration::from_nanos(50));
        let n = (Duration::from_millis(10).as_nanos() / one.as_nanos()).clamp(1, 1000) as u64;
        let (a0, b0) = (ALLOCS.load(Relaxed), BYTES.load(Relaxed));
        for _ in 0..n {
            std::hint::black_box(f());
        }
        let (a1, b1) = (ALLOCS.load(Relaxed), BYTES.load(Relaxed));
        PerOp {
            allocs: (a1 - a0) as f64 / n as f64,
            bytes: (b1 - b0) as f64 / n as f64,
        }
    }
}

pub mod sensu {
    //! Sensu agents as the fleet builds them: [`Templates`] from a
    //! [`SensuConfig`], one [`MessageBuilder`] per agent, the backend's
    //! entity config applied.

    use std::sync::Arc;

    use agent_sim_proto::sensu::{v2, v3};
    use agent_sim_sensu::SensuConfig;
    use agent_sim_sensu::codec::{self, Encoding};
    use agent_sim_sensu::messages::{MessageBuilder, Templates, agent_name};

    /// Index of the benchmarked agent (a five-digit name, as in a large fleet).
    pub const AGENT_INDEX: u64 = 12_345;
    /// A fixed wall clock (2026-11-21), so sizes do not drift between runs.
    pub const NOW: i64 = 1_795_300_844;

    pub use agent_sim_sensu::messages::{KEEPALIVE_FRAME_CAPACITY, new_id, unix_now};

    /// The backend's entity config for agent `name` (vector 002 with the name
    /// and the `entity:<name>` subscription of this agent).
    pub fn entity_config(name: &str) -> v3::EntityConfig {
        let payload = crate::vector("sensu/protobuf/002-backend-entity_config.bin");
        let frame = codec::split_frame(&payload).expect("entity_config frame");
        let mut ec = codec::decode_entity_config(frame.body, Encoding::Protobuf)
            .expect("entity_config vector decodes");
        if let Some(m) = ec.metadata.as_mut() {
            m.name = name.to_owned();
        }
        for s in &mut ec.subscriptions {
            if s.starts_with("entity:") {
                *s = format!("entity:{name}");
            }
        }
        ec
    }

    /// The builder of agent [`AGENT_INDEX`] in a fleet using `enc` with the
    /// default configuration, after the backend's entity config arrived.
    pub fn builder(enc: Encoding) -> MessageBuilder {
        let cfg = SensuConfig {
            encoding: enc,
            ..Default::default()
        };
        let name = agent_name(&cfg.name_prefix, AGENT_INDEX);
        let mut b = MessageBuilder::new(Arc::new(Templates::new(&cfg)), name.clone(), AGENT_INDEX);
        assert!(b.apply_entity_config(entity_config(&name)));
        b
    }

    /// The captured check request (vector 003) in `enc`, as a whole payload.
    pub fn check_request_payload(enc: Encoding) -> Vec<u8> {
        crate::vector(&format!("sensu/{}/003-backend-check_request.bin", dir(enc)))
    }

    /// The captured check request (vector 003), decoded.
    pub fn check_request() -> v2::CheckRequest {
        let p = check_request_payload(Encoding::Protobuf);
        let f = codec::split_frame(&p).expect("check_request frame");
        codec::decode_check_request(f.body, Encoding::Protobuf).expect("check_request decodes")
    }

    /// Vector subdirectory of an encoding.
    pub fn dir(enc: Encoding) -> &'static str {
        match enc {
            Encoding::Protobuf => "protobuf",
            Encoding::Json => "json",
        }
    }
}

pub mod consul {
    //! ServiceHealth events and snapshots for the Subscribe stream, and the
    //! same content as a blocking-query msgpack response ([`rpc`]).

    use prost::bytes::Buf as _;
    use prost::encoding::{decode_varint, encode_varint};

    /// The captured `ServiceHealth` register event (`sim-node-1` / `web-1`).
    pub const VECTOR_000: &str = "consul/subscribe/000-service-health-register-web-1.bin";
    /// The captured `EndOfSnapshot` event.
    pub const VECTOR_EOS: &str = "consul/subscribe/002-end-of-snapshot.bin";

    /// Names and addresses of instance `i` (instance 0 is the vector's).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Names {
        /// Node name, `sim-node-<i+1>`.
        pub node: String,
        /// Node and service address, `10.0.<hi>.<lo+1>`.
        pub address: String,
        /// Service id, `web-<i+1>`.
        pub service_id: String,
        /// Check id, `web-<i+1>-ttl`.
        pub check_id: String,
    }

    impl Names {
        /// The names of instance `i`.
        pub fn of(i: usize) -> Names {
            let n = i + 1;
            Names {
                node: format!("sim-node-{n}"),
                address: format!("10.0.{}.{}", n >> 8, n & 0xff),
                service_id: format!("web-{n}"),
                check_id: format!("web-{n}-ttl"),
            }
        }
    }

    /// Where a length-delimited field sits: the field numbers from the Event
    /// down (e.g. `[10, 2, 1, 2]` = ServiceHealth / CSN / Node / Node.node).
    type Path = [u32];

    /// Submessages to descend into: Event.10 ServiceHealthUpdate, .2
    /// CheckServiceNode, then .1 Node, .2 NodeService, .3 HealthCheck.
    fn is_message(path: &Path) -> bool {
        matches!(path, [10] | [10, 2] | [10, 2, 1] | [10, 2, 2] | [10, 2, 3])
    }

    /// Copies a protobuf message, replacing the strings `f` maps (by path)
    /// and fixing every enclosing length. Unknown fields are kept verbatim.
    fn rewrite(msg: &[u8], path: &mut Vec<u32>, f: &dyn Fn(&Path) -> Option<String>) -> Vec<u8> {
        let mut out = Vec::with_capacity(msg.len() + 16);
        let mut buf = msg;
        while buf.has_remaining() {
            let start = buf;
            let key = decode_varint(&mut buf).expect("key");
            let (field, wire) = ((key >> 3) as u32, key & 7);
            match wire {
                0 => {
                    decode_varint(&mut buf).expect("varint");
                }
                1 => buf.advance(8),
                5 => buf.advance(4),
                2 => {
                    let len = decode_varint(&mut buf).expect("len") as usize;
                    let body = &buf[..len];
                    buf.advance(len);
                    path.push(field);
                    let new = if is_message(path) {
                        Some(rewrite(body, path, f))
                    } else {
                        f(path).map(String::into_bytes)
                    };
                    path.pop();
                    if let Some(new) = new {
                        encode_varint(key, &mut out);
                        encode_varint(new.len() as u64, &mut out);
                        out.extend_from_slice(&new);
                        continue;
                    }
                }
                w => panic!("unexpected wire type {w}"),
            }
            let used = start.len() - buf.len();
            out.extend_from_slice(&start[..used]);
        }
        out
    }

    /// The captured register event, re-targeted at instance `i`: node name,
    /// node and service address, service id, check node/id/service id.
    /// Everything else (weights, proxy, definition, raft indexes, ...) is
    /// Consul's own bytes. `health_event(&v, 0) == v`.
    pub fn health_event(vector_000: &[u8], i: usize) -> Vec<u8> {
        let n = Names::of(i);
        rewrite(vector_000, &mut Vec::new(), &|p: &Path| match p {
            [10, 2, 1, 2] | [10, 2, 3, 1] => Some(n.node.clone()),
            [10, 2, 1, 3] | [10, 2, 2, 5] => Some(n.address.clone()),
            [10, 2, 2, 2] | [10, 2, 3, 7] => Some(n.service_id.clone()),
            [10, 2, 3, 2] => Some(n.check_id.clone()),
            _ => None,
        })
    }

    /// A snapshot of `n` instances as the stream carries it: one encoded
    /// `Event` per instance (no batching), then `EndOfSnapshot`.
    pub fn snapshot(n: usize) -> Vec<Vec<u8>> {
        let v = crate::vector(VECTOR_000);
        let mut events: Vec<Vec<u8>> = (0..n).map(|i| health_event(&v, i)).collect();
        events.push(crate::vector(VECTOR_EOS));
        events
    }

    pub mod rpc {
        //! Serde mirrors of what Consul's net/rpc msgpack codec writes for a
        //! blocking `Health.ServiceNodes` query (the HTTP API's
        //! `/v1/health/service/:name?index=`): `structs.IndexedCheckServiceNodes`.
        //! Go's codec writes structs as maps keyed by field name, every
        //! exported field including zero values, embedded structs (RaftIndex,
        //! QueryMeta) inlined. Nested Proxy/Connect/Definition are mirrored to
        //! their leaf fields as Consul 1.x declares them, all zero here.

        use std::collections::HashMap;

        use serde::{Deserialize, Serialize};

        use super::Names;

        type Map = HashMap<String, String>;

        /// `structs.IndexedCheckServiceNodes`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct IndexedCheckServiceNodes {
            pub nodes: Vec<CheckServiceNode>,
            pub imported_nodes: Vec<CheckServiceNode>,
            // QueryMeta, inlined.
            pub index: u64,
            pub last_contact: i64,
            pub known_leader: bool,
            pub consistency_level: String,
            pub not_modified: bool,
            pub backend: i32,
            #[serde(rename = "ResultsFilteredByACLs")]
            pub results_filtered_by_acls: bool,
        }

        /// `structs.CheckServiceNode`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct CheckServiceNode {
            pub node: Node,
            pub service: NodeService,
            pub checks: Vec<HealthCheck>,
        }

        /// `structs.Node`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct Node {
            #[serde(rename = "ID")]
            pub id: String,
            pub node: String,
            pub address: String,
            pub datacenter: String,
            pub partition: String,
            pub peer_name: String,
            pub tagged_addresses: Map,
            pub meta: Map,
            pub create_index: u64,
            pub modify_index: u64,
        }

        /// `structs.Weights`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct Weights {
            pub passing: i32,
            pub warning: i32,
        }

        /// `structs.ConnectProxyConfig` (zero unless a sidecar).
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct Proxy {
            pub envoy_extensions: Vec<Map>,
            pub destination_service_name: String,
            #[serde(rename = "DestinationServiceID")]
            pub destination_service_id: String,
            pub local_service_address: String,
            pub local_service_port: i32,
            pub local_service_socket_path: String,
            pub mode: String,
            pub config: Map,
            pub upstreams: Vec<Map>,
            pub mesh_gateway: MeshGateway,
            pub expose: Expose,
            pub transparent_proxy: TransparentProxy,
            pub access_logs: AccessLogs,
        }

        /// `structs.MeshGatewayConfig`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct MeshGateway {
            pub mode: String,
        }

        /// `structs.ExposeConfig`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct Expose {
            pub checks: bool,
            pub paths: Vec<Map>,
        }

        /// `structs.TransparentProxyConfig`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct TransparentProxy {
            pub outbound_listener_port: i32,
            pub dialed_directly: bool,
        }

        /// `structs.AccessLogsConfig`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct AccessLogs {
            pub enabled: bool,
            pub disable_listener_logs: bool,
            #[serde(rename = "Type")]
            pub kind: String,
            pub path: String,
            #[serde(rename = "JSONFormat")]
            pub json_format: String,
            pub text_format: String,
        }

        /// `structs.ServiceConnect`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct Connect {
            pub native: bool,
            pub sidecar_service: Option<Box<NodeService>>,
            pub peer_meta: Option<Map>,
        }

        /// `structs.NodeService`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct NodeService {
            pub kind: String,
            #[serde(rename = "ID")]
            pub id: String,
            pub service: String,
            pub tags: Vec<String>,
            pub address: String,
            pub tagged_addresses: Map,
            pub meta: Map,
            pub port: i32,
            pub socket_path: String,
            pub weights: Option<Weights>,
            pub enable_tag_override: bool,
            pub proxy: Proxy,
            pub connect: Connect,
            pub peer_name: String,
            pub create_index: u64,
            pub modify_index: u64,
        }

        /// `structs.HealthCheckDefinition` (the fields a TTL check leaves zero).
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct Definition {
            #[serde(rename = "HTTP")]
            pub http: String,
            #[serde(rename = "TLSServerName")]
            pub tls_server_name: String,
            #[serde(rename = "TLSSkipVerify")]
            pub tls_skip_verify: bool,
            pub header: HashMap<String, Vec<String>>,
            pub method: String,
            pub body: String,
            pub disable_redirects: bool,
            #[serde(rename = "TCP")]
            pub tcp: String,
            #[serde(rename = "TCPUseTLS")]
            pub tcp_use_tls: bool,
            #[serde(rename = "UDP")]
            pub udp: String,
            #[serde(rename = "H2PING")]
            pub h2ping: String,
            #[serde(rename = "H2PingUseTLS")]
            pub h2ping_use_tls: bool,
            #[serde(rename = "OSService")]
            pub os_service: String,
            pub interval: i64,
            pub output_max_size: u32,
            pub timeout: i64,
            pub deregister_critical_service_after: i64,
            pub script_args: Vec<String>,
            #[serde(rename = "DockerContainerID")]
            pub docker_container_id: String,
            pub shell: String,
            #[serde(rename = "GRPC")]
            pub grpc: String,
            #[serde(rename = "GRPCUseTLS")]
            pub grpc_use_tls: bool,
            pub alias_node: String,
            pub alias_service: String,
            #[serde(rename = "TTL")]
            pub ttl: i64,
        }

        /// `structs.HealthCheck`.
        #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
        #[serde(rename_all = "PascalCase")]
        pub struct HealthCheck {
            pub node: String,
            #[serde(rename = "CheckID")]
            pub check_id: String,
            pub name: String,
            pub status: String,
            pub notes: String,
            pub output: String,
            #[serde(rename = "ServiceID")]
            pub service_id: String,
            pub service_name: String,
            pub service_tags: Vec<String>,
            #[serde(rename = "Type")]
            pub kind: String,
            pub interval: String,
            pub timeout: String,
            pub exposed_port: i32,
            pub peer_name: String,
            pub definition: Definition,
            pub create_index: u64,
            pub modify_index: u64,
        }

        /// Instance `i` with the content of the captured Subscribe event
        /// (node `dc1`, service `web` port 8080 weights 1/1, one passing TTL
        /// check `web ttl`, raft index 27).
        pub fn check_service_node(i: usize) -> CheckServiceNode {
            let n = Names::of(i);
            CheckServiceNode {
                node: Node {
                    node: n.node.clone(),
                    address: n.address.clone(),
                    datacenter: "dc1".into(),
                    create_index: 27,
                    modify_index: 27,
                    ..Default::default()
                },
                service: NodeService {
                    id: n.service_id.clone(),
                    service: "web".into(),
                    address: n.address,
                    port: 8080,
                    weights: Some(Weights {
                        passing: 1,
                        warning: 1,
                    }),
                    create_index: 27,
                    modify_index: 27,
                    ..Default::default()
                },
                checks: vec![HealthCheck {
                    node: n.node,
                    check_id: n.check_id,
                    name: "web ttl".into(),
                    status: "passing".into(),
                    service_id: n.service_id,
                    service_name: "web".into(),
                    create_index: 27,
                    modify_index: 27,
                    ..Default::default()
                }],
            }
        }

        /// The blocking-query response for a service of `n` instances.
        pub fn response(n: usize) -> IndexedCheckServiceNodes {
            IndexedCheckServiceNodes {
                nodes: (0..n).map(check_service_node).collect(),
                index: 30,
                known_leader: true,
                consistency_level: "leader".into(),
                ..Default::default()
            }
        }

        /// Encodes as Consul's codec does (structs as maps keyed by name).
        pub fn encode(r: &IndexedCheckServiceNodes) -> Vec<u8> {
            agent_sim_proto::msgpack::encode_named(r).expect("msgpack encode")
        }

        /// Decodes a response.
        pub fn decode(
            b: &[u8],
        ) -> Result<IndexedCheckServiceNodes, agent_sim_proto::msgpack::DecodeError> {
            agent_sim_proto::msgpack::decode(b)
        }
    }
}

pub mod ws {
    //! A client-role tungstenite `WebSocket` whose socket discards writes:
    //! `send(Message::Binary(..))` formats, masks and writes the frame as the
    //! session's `WebSocketStream` does, without a network.

    use std::io::{self, Read, Write};

    use agent_sim_sensu::session::ws_config;
    use tokio_tungstenite::tungstenite::WebSocket;
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// A socket that accepts every write and never has anything to read.
    #[derive(Debug, Default)]
    pub struct Discard {
        /// Bytes written so far.
        pub written: u64,
        /// The last write (kept only when `keep_last` is set).
        pub last: Vec<u8>,
        /// Whether to keep a copy of the last write.
        pub keep_last: bool,
    }

    impl Read for Discard {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    impl Write for Discard {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.written += b.len() as u64;
            if self.keep_last {
                self.last.clear();
                self.last.extend_from_slice(b);
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A client WebSocket with the session's buffer configuration.
    pub fn client(keep_last: bool) -> WebSocket<Discard> {
        WebSocket::from_raw_socket(
            Discard {
                keep_last,
                ..Default::default()
            },
            Role::Client,
            Some(ws_config()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sim_consul::view::{Signal, View, ViewKind};
    use agent_sim_proto::consul::subscribe::Event;
    use agent_sim_sensu::codec::{self, Encoding};
    use prost::Message as _;
    use tokio_tungstenite::tungstenite::Message;

    #[test]
    fn instance_zero_is_the_captured_event() {
        let v = vector(consul::VECTOR_000);
        assert_eq!(consul::health_event(&v, 0), v);
        let e = Event::decode(&consul::health_event(&v, 999)[..]).unwrap();
        let Some(agent_sim_proto::consul::subscribe::event::Payload::ServiceHealth(u)) = e.payload
        else {
            panic!("not a ServiceHealth event")
        };
        let csn = u.check_service_node.unwrap();
        assert_eq!(csn.node.unwrap().node, "sim-node-1000");
        assert_eq!(csn.service.unwrap().id, "web-1000");
        assert_eq!(csn.checks[0].check_id, "web-1000-ttl");
    }

    #[test]
    fn a_snapshot_fills_a_view() {
        let mut v = View::new(ViewKind::Health);
        let snap = consul::snapshot(100);
        let mut last = Signal::Ignored;
        for b in &snap {
            last = v.apply(&Event::decode(&b[..]).unwrap(), &mut |_| {});
        }
        assert_eq!(last, Signal::EndOfSnapshot);
        assert_eq!(v.len(), 100);
    }

    #[test]
    fn msgpack_response_round_trips_with_field_names() {
        let r = consul::rpc::response(3);
        let b = consul::rpc::encode(&r);
        assert_eq!(consul::rpc::decode(&b).unwrap(), r);
        let s = String::from_utf8_lossy(&b);
        assert!(s.contains("CheckID") && s.contains("ModifyIndex"));
    }

    #[test]
    fn keepalives_are_framed_and_masked() {
        let b = sensu::builder(Encoding::Protobuf);
        let mut out = Vec::new();
        b.write_keepalive_frame(&mut out, sensu::NOW, sensu::new_id(), 1)
            .unwrap();
        let payload_len = out.len();
        assert_eq!(codec::split_frame(&out).unwrap().kind, "keepalive");
        let mut ws = ws::client(true);
        ws.send(Message::Binary(out.into())).unwrap();
        let wire = &ws.get_ref().last;
        assert_eq!(wire[0], 0x82, "FIN + binary");
        assert_ne!(wire[1] & 0x80, 0, "client frames are masked");
        assert_eq!(wire.len(), payload_len + 4 + 4);
    }

    #[test]
    fn sensu_vectors_decode_in_both_encodings() {
        for enc in [Encoding::Protobuf, Encoding::Json] {
            let p = sensu::check_request_payload(enc);
            let f = codec::split_frame(&p).unwrap();
            codec::decode_check_request(f.body, enc).unwrap();
            let p = vector(&format!(
                "sensu/{}/007-agent-keepalive.bin",
                sensu::dir(enc)
            ));
            codec::decode_event(codec::split_frame(&p).unwrap().body, enc).unwrap();
            let p = vector(&format!("sensu/{}/004-agent-event.bin", sensu::dir(enc)));
            codec::decode_event(codec::split_frame(&p).unwrap().body, enc).unwrap();
        }
    }
}
