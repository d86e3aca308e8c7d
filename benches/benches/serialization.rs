//! What serialization costs on agent-sim's agent paths (issue 5): one
//! criterion group per question, time per op from criterion, bytes per
//! message as criterion throughput, allocations per op from a counting
//! global allocator (measured outside the timing loops), and a closing
//! markdown summary with the ratios BENCHMARKS.md quotes.
//!
//! Groups:
//! 1. `sensu_event`: keepalive and check-result `Event`, protobuf vs JSON,
//!    encode and decode; the frame build per keepalive (pre-encoded template
//!    vs build + encode); decode of the real agent's captured events.
//! 2. `sensu_check_request`: decode of the captured check request, and the
//!    whole reply (decode → check result → `event` frame).
//! 3. `consul_subscribe`: ServiceHealth events (1 / 100 / 1,000 instances)
//!    decoded from the stream's protobuf, the same content as a blocking
//!    query's msgpack response, and the materialized view applying them.
//! 4. `keepalive_path`: the session's per-keepalive work end to end: clock,
//!    id, frame build, tungstenite client framing with masking.
//! 5. `observe_scrape`: what `--observe` costs per scrape on the load box:
//!    parsing what real servers expose (Consul 1.20.1's Prometheus text and
//!    JSON, Sensu 6.12's Prometheus text, captured under load) with the
//!    kind's default series kept, and one interval's figures from two.
//!
//! Run: `cargo bench -p agent-sim-benches` (add `-- --quick` for the quick
//! profile, `-- <filter>` for one group).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use agent_sim_benches::alloc::{self, PerOp};
use agent_sim_benches::consul::{self, rpc};
use agent_sim_benches::sensu::{self, NOW};
use agent_sim_benches::{vector, ws};
use agent_sim_consul::view::{View, ViewKind};
use agent_sim_proto::consul::subscribe::Event;
use agent_sim_sensu::codec::{self, Encoding, KIND_KEEPALIVE};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use prost::Message as _;
use tokio_tungstenite::tungstenite::Message;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

const ID: [u8; 16] = [
    0x5c, 0x2b, 0x1e, 0x63, 0x8d, 0x1f, 0x4a, 0x4b, 0x9d, 0x06, 0x42, 0x0f, 0x77, 0x31, 0xc0, 0x11,
];
const ENCODINGS: [Encoding; 2] = [Encoding::Protobuf, Encoding::Json];
const SNAPSHOTS: [usize; 2] = [100, 1000];

/// One benchmark's static facts, joined with criterion's estimate at the end.
struct Row {
    group: &'static str,
    func: String,
    param: String,
    bytes: usize,
    per_op: PerOp,
}

/// A criterion group that also records bytes and allocations per op.
struct Group<'a> {
    name: &'static str,
    g: BenchmarkGroup<'a, WallTime>,
    rows: &'a mut Vec<Row>,
}

impl<'a> Group<'a> {
    fn new(c: &'a mut Criterion, rows: &'a mut Vec<Row>, name: &'static str) -> Self {
        Group {
            name,
            g: c.benchmark_group(name),
            rows,
        }
    }

    /// Benchmarks `f` as `<func>/<param>`; `bytes` is the message size it
    /// produces or consumes (criterion throughput).
    fn bench<R>(
        &mut self,
        func: &str,
        param: impl ToString,
        bytes: usize,
        mut f: impl FnMut() -> R,
    ) {
        let param = param.to_string();
        let per_op = alloc::per_op(&mut f);
        self.g.throughput(Throughput::Bytes(bytes as u64));
        self.g
            .bench_function(BenchmarkId::new(func, &param), |b| b.iter(&mut f));
        self.rows.push(Row {
            group: self.name,
            func: func.to_owned(),
            param,
            bytes,
            per_op,
        });
    }

    fn finish(self) {
        self.g.finish();
    }
}

fn enc_name(enc: Encoding) -> &'static str {
    sensu::dir(enc)
}

/// Group 1: Sensu events, protobuf vs JSON.
fn sensu_event(c: &mut Criterion, rows: &mut Vec<Row>) {
    let pb = sensu::builder(Encoding::Protobuf);
    let req = sensu::check_request();
    let keepalive = pb.keepalive(NOW, ID, 1);
    let check_result = pb.event(pb.check_result(&req, NOW), NOW, ID, 1);

    let mut g = Group::new(c, rows, "sensu_event");
    for (what, ev) in [("keepalive", &keepalive), ("check_result", &check_result)] {
        for enc in ENCODINGS {
            let body = codec::encode_event(ev, enc).expect("encode");
            eprintln!("sensu_event: {what} body, {enc}: {} bytes", body.len());
            g.bench(&format!("{what}_encode"), enc_name(enc), body.len(), || {
                codec::encode_event(black_box(ev), enc).expect("encode")
            });
            g.bench(&format!("{what}_decode"), enc_name(enc), body.len(), || {
                codec::decode_event(black_box(&body), enc).expect("decode")
            });
        }
    }

    // The whole frame build per keepalive, as the session does it (a fresh
    // Vec per keepalive), and the same without the pre-encoded template.
    for enc in ENCODINGS {
        let b = sensu::builder(enc);
        let mut out = Vec::new();
        b.write_keepalive_frame(&mut out, NOW, ID, 1)
            .expect("frame");
        eprintln!("sensu_event: keepalive frame, {enc}: {} bytes", out.len());
        g.bench("keepalive_frame", enc_name(enc), out.len(), || {
            let mut out = Vec::new();
            b.write_keepalive_frame(&mut out, black_box(NOW), ID, 1)
                .expect("frame");
            out
        });
    }
    let naive = codec::encode_frame(
        KIND_KEEPALIVE,
        &codec::encode_event(&keepalive, Encoding::Protobuf).expect("encode"),
    );
    g.bench(
        "keepalive_frame_no_template",
        "protobuf",
        naive.len(),
        || {
            let ev = pb.keepalive(black_box(NOW), ID, 1);
            codec::encode_frame(
                KIND_KEEPALIVE,
                &codec::encode_event(&ev, Encoding::Protobuf).expect("encode"),
            )
        },
    );

    // What the real sensu-agent 6.x sent (captured): decode cost and size.
    for enc in ENCODINGS {
        for (what, file) in [
            ("agent_keepalive_decode", "007-agent-keepalive.bin"),
            ("agent_event_decode", "004-agent-event.bin"),
        ] {
            let payload = vector(&format!("sensu/{}/{file}", enc_name(enc)));
            eprintln!(
                "sensu_event: real agent {file}, {enc}: {} bytes",
                payload.len()
            );
            g.bench(what, enc_name(enc), payload.len(), || {
                let f = codec::split_frame(black_box(&payload)).expect("frame");
                codec::decode_event(f.body, enc).expect("decode")
            });
        }
    }
    g.finish();
}

/// Group 2: Sensu check requests from the captured vectors.
fn sensu_check_request(c: &mut Criterion, rows: &mut Vec<Row>) {
    let mut g = Group::new(c, rows, "sensu_check_request");
    for enc in ENCODINGS {
        let payload = sensu::check_request_payload(enc);
        eprintln!(
            "sensu_check_request: vector 003, {enc}: {} bytes",
            payload.len()
        );
        g.bench("decode", enc_name(enc), payload.len(), || {
            let f = codec::split_frame(black_box(&payload)).expect("frame");
            codec::decode_check_request(f.body, enc).expect("decode")
        });
        // What the session adds per backend message to count unknown fields.
        g.bench("unknown_fields", enc_name(enc), payload.len(), || {
            let f = codec::split_frame(black_box(&payload)).expect("frame");
            codec::unknown_fields(f.kind, f.body, enc)
        });
    }
    // The session's work per check request: decode, build the result,
    // write the `event` frame (the 6.x `issued` bookkeeping is not here).
    for enc in ENCODINGS {
        let payload = sensu::check_request_payload(enc);
        let b = sensu::builder(enc);
        let mut out = Vec::new();
        let req = sensu::check_request();
        b.write_event_frame(&mut out, b.check_result(&req, NOW), NOW, ID, 1)
            .expect("frame");
        eprintln!(
            "sensu_check_request: reply frame, {enc}: {} bytes",
            out.len()
        );
        g.bench("reply", enc_name(enc), out.len(), || {
            let f = codec::split_frame(black_box(&payload)).expect("frame");
            let req = codec::decode_check_request(f.body, enc).expect("decode");
            let check = b.check_result(&req, NOW);
            let mut out = Vec::new();
            b.write_event_frame(&mut out, check, NOW, ID, 1)
                .expect("frame");
            out
        });
    }
    g.finish();
}

/// Group 3: Consul Subscribe (protobuf stream) vs blocking query (msgpack).
fn consul_subscribe(c: &mut Criterion, rows: &mut Vec<Row>) {
    let mut g = Group::new(c, rows, "consul_subscribe");

    // Protobuf: the captured event, then snapshots of N events + EndOfSnapshot.
    let single = vector(consul::VECTOR_000);
    eprintln!(
        "consul_subscribe: protobuf event (vector 000): {} bytes",
        single.len()
    );
    g.bench("protobuf_decode", 1, single.len(), || {
        Event::decode(black_box(&single[..])).expect("decode")
    });
    // The decoder's top-level tag scan for unknown payloads, per event.
    g.bench("unknown_fields", 1, single.len(), || {
        agent_sim_consul::codec::unknown_event_fields(black_box(&single[..]))
    });
    let snaps: Vec<(usize, Vec<Vec<u8>>)> = SNAPSHOTS
        .iter()
        .map(|&n| (n, consul::snapshot(n)))
        .collect();
    for (n, snap) in &snaps {
        let bytes: usize = snap.iter().map(Vec::len).sum();
        eprintln!(
            "consul_subscribe: protobuf snapshot of {n}: {} events, {bytes} bytes",
            snap.len()
        );
        g.bench("protobuf_decode", n, bytes, || {
            snap.iter()
                .map(|b| Event::decode(black_box(&b[..])).expect("decode"))
                .collect::<Vec<_>>()
        });
    }

    // The materialized view: one live update into a synced view of 1,000,
    // and whole snapshots into a fresh view.
    let decoded: Vec<(usize, Vec<Event>)> = snaps
        .iter()
        .map(|(n, s)| {
            let evs = s
                .iter()
                .map(|b| Event::decode(&b[..]).expect("decode"))
                .collect();
            (*n, evs)
        })
        .collect();
    let live = Event::decode(&single[..]).expect("decode");
    let mut synced = View::new(ViewKind::Health);
    for ev in &decoded[decoded.len() - 1].1 {
        synced.apply(ev, &mut |_| {});
    }
    g.bench("view_apply", 1, single.len(), || {
        synced.apply(black_box(&live), &mut |c| {
            black_box(c);
        })
    });
    for (n, evs) in &decoded {
        g.bench("view_apply", n, 0, || {
            let mut v = View::new(ViewKind::Health);
            for ev in evs {
                v.apply(black_box(ev), &mut |c| {
                    black_box(c);
                });
            }
            v
        });
    }
    // The streaming client's whole receive cost for a snapshot.
    for (n, snap) in &snaps {
        let bytes: usize = snap.iter().map(Vec::len).sum();
        g.bench("protobuf_decode_apply", n, bytes, || {
            let mut v = View::new(ViewKind::Health);
            for b in snap {
                let ev = Event::decode(black_box(&b[..])).expect("decode");
                v.apply(&ev, &mut |c| {
                    black_box(c);
                });
            }
            v
        });
    }

    // msgpack: the blocking query's whole response for a service of N.
    for n in [1, SNAPSHOTS[0], SNAPSHOTS[1]] {
        let resp = rpc::response(n);
        let body = rpc::encode(&resp);
        eprintln!(
            "consul_subscribe: msgpack response of {n}: {} bytes",
            body.len()
        );
        g.bench("msgpack_encode", n, body.len(), || {
            rpc::encode(black_box(&resp))
        });
        g.bench("msgpack_decode", n, body.len(), || {
            rpc::decode(black_box(&body)).expect("decode")
        });
    }
    g.finish();
}

/// Group 4: the session's per-keepalive path end to end.
fn keepalive_path(c: &mut Criterion, rows: &mut Vec<Row>) {
    let mut g = Group::new(c, rows, "keepalive_path");
    for enc in ENCODINGS {
        let b = sensu::builder(enc);
        let mut seq = 0i64;
        let mut one = || {
            // session.rs, `Wake::Timer` keepalive branch + `Steady::send`
            // (which masks the frame itself and writes it to the socket).
            seq += 1;
            let mut out = Vec::with_capacity(sensu::KEEPALIVE_FRAME_CAPACITY);
            let wall = sensu::unix_now();
            b.write_keepalive_frame(&mut out, wall, sensu::new_id(), seq)
                .expect("frame");
            let wire = agent_sim_sensu::session::masked_binary_frame(
                &out,
                fastrand::u32(..).to_be_bytes(),
            );
            drop(out);
            black_box(&wire);
            wire.len()
        };
        let wire = one();
        eprintln!("keepalive_path: {enc}: {wire} bytes on the wire (masked frame)");
        g.bench("session", enc_name(enc), wire, one);
    }

    // Without the pre-encoded entity: build the Event, encode, frame.
    let pb = sensu::builder(Encoding::Protobuf);
    let mut sock = ws::client(false);
    g.bench("session_no_template", "protobuf", 0, || {
        let ev = pb.keepalive(sensu::unix_now(), sensu::new_id(), 1);
        let out = codec::encode_frame(
            KIND_KEEPALIVE,
            &codec::encode_event(&ev, Encoding::Protobuf).expect("encode"),
        );
        sock.send(Message::Binary(out.into())).expect("send");
    });

    // The WebSocket framing + masking share alone.
    let mut out = Vec::new();
    pb.write_keepalive_frame(&mut out, NOW, ID, 1)
        .expect("frame");
    let mut sock = ws::client(false);
    g.bench("ws_send_only", "protobuf", out.len(), || {
        sock.send(Message::Binary(black_box(out.clone()).into()))
            .expect("send");
    });
    g.finish();
}

/// Criterion's output directory (`$CRITERION_HOME`, else `<target>/criterion`
/// from the bench executable's location `<target>/<profile>/deps/`).
fn observe_scrape(c: &mut Criterion, rows: &mut Vec<Row>) {
    use agent_sim_observe::figures::{RunState, sample};
    use agent_sim_observe::kinds::{self, ServerKind};
    use agent_sim_observe::reading::{parse_consul_json, parse_prometheus};
    let keep = |k: ServerKind, n: &str| kinds::kept(k, n, &[]);
    let consul =
        String::from_utf8(vector("consul/metrics/server-1.20.1-1000-agents.prom")).unwrap();
    let json = String::from_utf8(vector("consul/metrics/server-1.20.1-1000-agents.json")).unwrap();
    let sensu = String::from_utf8(vector("sensu/metrics/backend-6.12.0-500-agents.prom")).unwrap();
    let mut g = Group::new(c, rows, "observe_scrape");
    g.bench("parse", "consul-prometheus", consul.len(), || {
        black_box(parse_prometheus(black_box(&consul), &keep))
    });
    g.bench("parse", "consul-json", json.len(), || {
        black_box(parse_consul_json(black_box(&json), &keep))
    });
    g.bench("parse", "sensu-prometheus", sensu.len(), || {
        black_box(parse_prometheus(black_box(&sensu), &keep))
    });
    let (a, b) = (
        parse_prometheus(&sensu, &keep),
        parse_prometheus(&sensu, &keep),
    );
    let run = RunState {
        t_s: 5.0,
        agents: 500,
        ramp_done: true,
        ending: false,
    };
    g.bench("interval", "sensu", 0, || {
        black_box(sample(Some((black_box(&a), 0.0)), black_box(&b), run))
    });
    g.finish();
}

fn criterion_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("CRITERION_HOME") {
        return Some(h.into());
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(t).join("criterion"));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.parent()?.join("criterion"))
}

/// The point estimate (ns per op) criterion saved during this run.
fn estimate_ns(dir: &std::path::Path, r: &Row, since: SystemTime) -> Option<f64> {
    let p = dir
        .join(r.group)
        .join(&r.func)
        .join(&r.param)
        .join("new/estimates.json");
    if std::fs::metadata(&p).ok()?.modified().ok()? < since {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).ok()?).ok()?;
    let pick = |k: &str| v.get(k)?.get("point_estimate")?.as_f64();
    pick("slope").or_else(|| pick("mean"))
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 100_000.0 {
        format!("{:.0} µs", ns / 1000.0)
    } else if ns >= 10_000.0 {
        format!("{:.1} µs", ns / 1000.0)
    } else {
        format!("{ns:.0} ns")
    }
}

fn summary(rows: &[Row], since: SystemTime) {
    let Some(dir) = criterion_dir() else {
        return;
    };
    let ns: Vec<Option<f64>> = rows.iter().map(|r| estimate_ns(&dir, r, since)).collect();
    if ns.iter().all(Option::is_none) {
        return;
    }
    let get = |g: &str, f: &str, p: &str| -> Option<(f64, usize)> {
        rows.iter()
            .zip(&ns)
            .find(|(r, _)| r.group == g && r.func == f && r.param == p)
            .and_then(|(r, n)| n.map(|n| (n, r.bytes)))
    };
    println!("\n## Summary (time per op from criterion; allocations counted separately)\n");
    println!("| group | benchmark | time/op | bytes | allocs/op | alloc bytes/op |");
    println!("|---|---|---:|---:|---:|---:|");
    for (r, n) in rows.iter().zip(&ns) {
        let Some(n) = n else { continue };
        let bytes = if r.bytes == 0 {
            "–".to_owned()
        } else {
            r.bytes.to_string()
        };
        println!(
            "| {} | {}/{} | {} | {} | {:.1} | {:.0} |",
            r.group,
            r.func,
            r.param,
            fmt_ns(*n),
            bytes,
            r.per_op.allocs,
            r.per_op.bytes
        );
    }
    println!("\n### Ratios\n");
    let ratio = |label: &str, a: Option<(f64, usize)>, b: Option<(f64, usize)>| {
        if let (Some((ta, sa)), Some((tb, sb))) = (a, b) {
            let size = if sa > 0 && sb > 0 {
                format!("size {:.2}x, ", sa as f64 / sb as f64)
            } else {
                String::new()
            };
            println!("- {label}: {size}time {:.2}x", ta / tb);
        }
    };
    let s = "sensu_event";
    for what in ["keepalive", "check_result"] {
        for op in ["encode", "decode"] {
            let f = format!("{what}_{op}");
            ratio(
                &format!("Sensu {what} {op}, JSON / protobuf"),
                get(s, &f, "json"),
                get(s, &f, "protobuf"),
            );
        }
    }
    ratio(
        "Sensu keepalive frame build, JSON / protobuf (template)",
        get(s, "keepalive_frame", "json"),
        get(s, "keepalive_frame", "protobuf"),
    );
    ratio(
        "Sensu keepalive frame build, protobuf no template / template",
        get(s, "keepalive_frame_no_template", "protobuf"),
        get(s, "keepalive_frame", "protobuf"),
    );
    for f in ["agent_keepalive_decode", "agent_event_decode"] {
        ratio(
            &format!("real sensu-agent capture, {f}, JSON / protobuf"),
            get(s, f, "json"),
            get(s, f, "protobuf"),
        );
    }
    let s = "sensu_check_request";
    for f in ["decode", "reply"] {
        ratio(
            &format!("Sensu check_request {f}, JSON / protobuf"),
            get(s, f, "json"),
            get(s, f, "protobuf"),
        );
    }
    let s = "consul_subscribe";
    for n in ["1", "100", "1000"] {
        ratio(
            &format!("Consul {n} instance(s), msgpack decode / protobuf decode"),
            get(s, "msgpack_decode", n),
            get(s, "protobuf_decode", n),
        );
    }
    for n in ["100", "1000"] {
        ratio(
            &format!(
                "Consul {n}: msgpack decode (blocking query) / protobuf decode + view apply (stream)"
            ),
            get(s, "msgpack_decode", n),
            get(s, "protobuf_decode_apply", n),
        );
    }
    ratio(
        "Consul one change in a service of 1000: blocking query re-reads the list (msgpack decode/1000) / stream event (protobuf decode/1 + view apply/1)",
        get(s, "msgpack_decode", "1000"),
        get(s, "protobuf_decode", "1")
            .zip(get(s, "view_apply", "1"))
            .map(|((a, sa), (b, _))| (a + b, sa)),
    );
    if let Some((t, _)) = get("keepalive_path", "session", "protobuf") {
        println!(
            "\nPer-keepalive CPU path (protobuf, session form): {} — target < 5 µs: {}",
            fmt_ns(t),
            if t < 5000.0 { "met" } else { "NOT met" }
        );
    }
}

fn main() {
    let since = SystemTime::now();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .nresamples(20_000)
        .configure_from_args();
    let mut rows = Vec::new();
    sensu_event(&mut c, &mut rows);
    sensu_check_request(&mut c, &mut rows);
    consul_subscribe(&mut c, &mut rows);
    keepalive_path(&mut c, &mut rows);
    observe_scrape(&mut c, &mut rows);
    c.final_summary();
    // Without `--bench` (cargo test) criterion runs each routine once.
    if std::env::args().any(|a| a == "--bench") {
        summary(&rows, since);
    }
}
