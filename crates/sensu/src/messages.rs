//! What a simulated agent says: its entity, keepalives, check replies and
//! agent-side events, built as the real 6.x agent builds them. Pure (no
//! sockets, no clock): callers pass `now`, ids and sequence numbers.
//!
//! Main parts:
//! - [`Templates`]: everything derived from [`SensuConfig`] once per fleet
//!   (shared by `Arc`), including pre-encoded protobuf pieces (the keepalive
//!   check and the event metadata).
//! - [`MessageBuilder`]: one agent's identity (name, index, the backend's
//!   entity config once received) plus its pre-encoded protobuf entity, so a
//!   protobuf keepalive is written by concatenating bytes: no `Entity` is
//!   built or cloned per keepalive. The JSON path builds full `v2::Event`s.
//!
//! Not here: framing rules (`codec`), sockets and timers (`session`).

use std::sync::Arc;

use agent_sim_proto::sensu::{v2, v3};
use prost::Message as _;
use prost::encoding::{self, WireType};

use crate::SensuConfig;
use crate::codec::{self, CodecError, Encoding, KIND_EVENT, KIND_KEEPALIVE};

/// Name of the keepalive check.
pub const KEEPALIVE_CHECK: &str = "keepalive";
/// Name of the check of agent-side events (`event_rate`).
pub const AGENT_EVENT_CHECK: &str = "agent-sim-event";
/// First line of the output of every simulated check execution.
pub const CHECK_OUTPUT: &str = "agent-sim: OK\n";
/// Bytes of the output of every simulated check execution: the size of the
/// canned text a real 6.12 agent answers `!sensu_test_check!` with (vector
/// 004), so check events cost the backend what real ones cost. Our text is
/// [`CHECK_OUTPUT`] padded with filler lines, not the real agent's text.
pub const CHECK_OUTPUT_LEN: usize = 799;
/// Duration (seconds) reported for a simulated check execution: the real
/// agent reports 0 for `!sensu_test_check!` (vector 004), which runs nothing.
pub const CHECK_DURATION: f64 = 0.0;

/// Fleet-wide message templates derived from the configuration.
#[derive(Debug)]
pub struct Templates {
    namespace: String,
    subscriptions: Vec<String>,
    user: String,
    deregister: bool,
    agent_version: String,
    handlers: Vec<String>,
    encoding: Encoding,
    keepalive_check: v2::Check,
    agent_event_output: String,
    check_output: String,
    /// Field 3 (key, length, body) of a keepalive event.
    pb_keepalive_check: Vec<u8>,
    /// Field 5 (key, length, body) of every event: `metadata{namespace}`.
    pb_event_meta: Vec<u8>,
}

impl Templates {
    /// Builds the templates of a fleet.
    pub fn new(cfg: &SensuConfig) -> Self {
        let keepalive_check = v2::Check {
            interval: interval_secs(cfg.keepalive_interval),
            timeout: cfg.keepalive_warning_timeout,
            ttl: i64::from(cfg.keepalive_critical_timeout),
            metadata: Some(meta(KEEPALIVE_CHECK, &cfg.namespace)),
            ..Default::default()
        };
        let mut pb_keepalive_check = Vec::new();
        encoding::message::encode(3, &keepalive_check, &mut pb_keepalive_check);
        let mut pb_event_meta = Vec::new();
        encoding::message::encode(5, &meta("", &cfg.namespace), &mut pb_event_meta);
        let agent_event_output = filler(cfg.event_output_size);
        let mut check_output = String::with_capacity(CHECK_OUTPUT_LEN);
        check_output.push_str(CHECK_OUTPUT);
        check_output.push_str(&filler(CHECK_OUTPUT_LEN - CHECK_OUTPUT.len()));
        Templates {
            namespace: cfg.namespace.clone(),
            subscriptions: cfg.subscriptions.clone(),
            user: cfg.user.clone(),
            deregister: cfg.deregister,
            agent_version: cfg.agent_version.clone(),
            handlers: cfg.handlers.clone(),
            encoding: cfg.encoding,
            keepalive_check,
            agent_event_output,
            check_output,
            pb_keepalive_check,
            pb_event_meta,
        }
    }

    /// The session encoding.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }
}

/// Printable filler of `len` bytes (lines of 64 characters).
fn filler(len: usize) -> String {
    (0..len)
        .map(|i| {
            if i % 64 == 63 {
                '\n'
            } else {
                (b'a' + (i % 26) as u8) as char
            }
        })
        .collect()
}

fn meta(name: &str, namespace: &str) -> v2::ObjectMeta {
    v2::ObjectMeta {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        ..Default::default()
    }
}

/// Whole seconds of an interval as a check `interval` (at least 1).
pub fn interval_secs(d: std::time::Duration) -> u32 {
    d.as_secs_f64().round().clamp(1.0, f64::from(u32::MAX)) as u32
}

/// Entity name of agent `index`: `<prefix>-<index>`.
pub fn agent_name(prefix: &str, index: u64) -> String {
    format!("{prefix}-{index}")
}

/// One agent's message builder (lives as long as the agent).
#[derive(Debug)]
pub struct MessageBuilder {
    t: Arc<Templates>,
    name: Box<str>,
    index: u64,
    /// The backend's entity config, once it sent a real one (not "not found").
    // Bound: the latest one only, decoded from one message ≤ codec::MAX_MESSAGE
    // (the pre-encoded entity below is its re-encoding, of similar size).
    entity_config: Option<Box<v3::EntityConfig>>,
    /// Protobuf entity without `last_seen`: fields < 5, then fields > 5.
    pb_entity: Vec<u8>,
    pb_entity_split: u32,
}

impl MessageBuilder {
    /// A builder for agent `index` named `name`.
    pub fn new(t: Arc<Templates>, name: String, index: u64) -> Self {
        let mut b = MessageBuilder {
            t,
            name: name.into_boxed_str(),
            index,
            entity_config: None,
            pb_entity: Vec::new(),
            pb_entity_split: 0,
        };
        b.rebuild_pb_entity();
        b
    }

    /// The agent (entity) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Applies an `entity_config` from the backend, as the real agent does:
    /// the placeholder named `"not found"` is ignored; a real one replaces the
    /// agent's own configuration of its entity. Returns whether it applied.
    pub fn apply_entity_config(&mut self, ec: v3::EntityConfig) -> bool {
        let name = ec.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
        if name == "not found" || name.is_empty() {
            return false;
        }
        self.entity_config = Some(Box::new(ec));
        self.rebuild_pb_entity();
        true
    }

    fn system(&self) -> v2::System {
        let i = self.index;
        let (a, b, c) = ((i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff);
        v2::System {
            hostname: self.name.to_string(),
            os: "linux".into(),
            platform: "ubuntu".into(),
            platform_family: "debian".into(),
            platform_version: "22.04".into(),
            network: Some(v2::Network {
                interfaces: vec![v2::NetworkInterface {
                    name: "eth0".into(),
                    mac: format!(
                        "02:00:{:02x}:{:02x}:{:02x}:{:02x}",
                        (i >> 24) & 0xff,
                        a,
                        b,
                        c
                    ),
                    addresses: vec![format!("10.{a}.{b}.{c}/8")],
                }],
            }),
            arch: "amd64".into(),
            libc_type: "glibc".into(),
            ..Default::default()
        }
    }

    /// The agent's entity as sent in keepalives and events.
    pub fn entity(&self, last_seen: i64) -> v2::Entity {
        let t = &*self.t;
        let mut e = v2::Entity {
            entity_class: "agent".into(),
            system: Some(self.system()),
            subscriptions: t.subscriptions.clone(),
            last_seen,
            deregister: t.deregister,
            deregistration: Some(v2::Deregistration::default()),
            user: t.user.clone(),
            metadata: Some(meta(&self.name, &t.namespace)),
            sensu_agent_version: t.agent_version.clone(),
            ..Default::default()
        };
        if let Some(ec) = &self.entity_config {
            let ec = &**ec;
            e.metadata = ec.metadata.clone();
            e.entity_class = ec.entity_class.clone();
            e.user = ec.user.clone();
            e.subscriptions = ec.subscriptions.clone();
            e.deregister = ec.deregister;
            e.deregistration = Some(ec.deregistration.clone().unwrap_or_default());
            e.keepalive_handlers = ec.keepalive_handlers.clone();
            e.redact = ec.redact.clone();
        }
        e
    }

    fn rebuild_pb_entity(&mut self) {
        if self.t.encoding != Encoding::Protobuf {
            self.pb_entity = Vec::new();
            return;
        }
        // prost writes fields in tag order and skips defaults, so the entity
        // with last_seen = 0, split before tag 6, plus `5: last_seen` in the
        // gap, is byte-for-byte the canonical encoding.
        let e = self.entity(0);
        let head = v2::Entity {
            entity_class: e.entity_class.clone(),
            system: e.system.clone(),
            subscriptions: e.subscriptions.clone(),
            ..Default::default()
        };
        let mut buf = head.encode_to_vec();
        let split = buf.len();
        let tail = v2::Entity {
            entity_class: String::new(),
            system: None,
            subscriptions: Vec::new(),
            ..e
        };
        tail.encode(&mut buf).unwrap_or_default();
        buf.shrink_to_fit();
        self.pb_entity = buf;
        self.pb_entity_split = split as u32;
    }

    /// A keepalive event.
    pub fn keepalive(&self, now: i64, id: [u8; 16], sequence: i64) -> v2::Event {
        v2::Event {
            timestamp: now,
            entity: Some(self.entity(now)),
            check: Some(self.t.keepalive_check.clone()),
            metadata: Some(meta("", &self.t.namespace)),
            id: id.to_vec(),
            sequence,
            ..Default::default()
        }
    }

    /// The check result the real agent sends for a check request whose
    /// command is `!sensu_test_check!`: a copy of the request's check config
    /// plus execution fields, processed by this agent.
    pub fn check_result(&self, req: &v2::CheckRequest, now: i64) -> v2::Check {
        let cfg = req.config.clone().unwrap_or_default();
        let m = cfg.metadata.unwrap_or_default();
        v2::Check {
            command: cfg.command,
            handlers: if self.t.handlers.is_empty() {
                cfg.handlers
            } else {
                self.t.handlers.clone()
            },
            high_flap_threshold: cfg.high_flap_threshold,
            interval: cfg.interval,
            low_flap_threshold: cfg.low_flap_threshold,
            publish: cfg.publish,
            runtime_assets: cfg.runtime_assets,
            subscriptions: cfg.subscriptions,
            proxy_entity_name: cfg.proxy_entity_name,
            stdin: cfg.stdin,
            cron: cfg.cron,
            ttl: cfg.ttl,
            timeout: cfg.timeout,
            round_robin: cfg.round_robin,
            duration: CHECK_DURATION,
            executed: now,
            issued: req.issued,
            output: self.t.check_output.clone(),
            status: 0,
            output_metric_format: cfg.output_metric_format,
            output_metric_handlers: cfg.output_metric_handlers,
            env_vars: cfg.env_vars,
            metadata: Some(v2::ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                labels: m.labels,
                annotations: m.annotations,
                created_by: String::new(),
            }),
            max_output_size: cfg.max_output_size,
            discard_output: cfg.discard_output,
            scheduler: cfg.scheduler,
            processed_by: self.name.to_string(),
            check_hooks: cfg.check_hooks,
            subdue: cfg.subdue,
            proxy_requests: cfg.proxy_requests,
            secrets: cfg.secrets,
            output_metric_tags: cfg.output_metric_tags,
            pipelines: cfg.pipelines,
            ..Default::default()
        }
    }

    /// The check of an agent-side event (`event_rate`).
    pub fn agent_event_check(&self, now: i64) -> v2::Check {
        v2::Check {
            handlers: self.t.handlers.clone(),
            executed: now,
            issued: now,
            duration: CHECK_DURATION,
            output: self.t.agent_event_output.clone(),
            status: 0,
            metadata: Some(meta(AGENT_EVENT_CHECK, &self.t.namespace)),
            processed_by: self.name.to_string(),
            ..Default::default()
        }
    }

    /// A check result event around `check`.
    pub fn event(&self, check: v2::Check, now: i64, id: [u8; 16], sequence: i64) -> v2::Event {
        v2::Event {
            timestamp: now,
            entity: Some(self.entity(now)),
            check: Some(check),
            metadata: Some(meta("", &self.t.namespace)),
            id: id.to_vec(),
            sequence,
            ..Default::default()
        }
    }

    /// Writes a whole keepalive frame (`keepalive\n` + body) into `out`
    /// (cleared first). Protobuf takes the pre-encoded fast path.
    pub fn write_keepalive_frame(
        &self,
        out: &mut Vec<u8>,
        now: i64,
        id: [u8; 16],
        sequence: i64,
    ) -> Result<(), CodecError> {
        out.clear();
        out.extend_from_slice(KIND_KEEPALIVE.as_bytes());
        out.push(b'\n');
        match self.t.encoding {
            Encoding::Protobuf => {
                self.write_pb_event(
                    out,
                    now,
                    CheckPart::Raw(&self.t.pb_keepalive_check),
                    id,
                    sequence,
                );
                Ok(())
            }
            Encoding::Json => {
                let ev = self.keepalive(now, id, sequence);
                out.extend_from_slice(&codec::encode_event(&ev, Encoding::Json)?);
                Ok(())
            }
        }
    }

    /// Writes a whole `event` frame carrying `check` into `out` (cleared first).
    pub fn write_event_frame(
        &self,
        out: &mut Vec<u8>,
        check: v2::Check,
        now: i64,
        id: [u8; 16],
        sequence: i64,
    ) -> Result<(), CodecError> {
        out.clear();
        out.extend_from_slice(KIND_EVENT.as_bytes());
        out.push(b'\n');
        match self.t.encoding {
            Encoding::Protobuf => {
                self.write_pb_event(out, now, CheckPart::Msg(&check), id, sequence);
                Ok(())
            }
            Encoding::Json => {
                let ev = self.event(check, now, id, sequence);
                out.extend_from_slice(&codec::encode_event(&ev, Encoding::Json)?);
                Ok(())
            }
        }
    }

    /// Event fields in tag order: 1 timestamp, 2 entity, 3 check,
    /// 5 metadata, 6 id, 7 sequence (canonical prost/gogo layout).
    fn write_pb_event(
        &self,
        out: &mut Vec<u8>,
        now: i64,
        check: CheckPart<'_>,
        id: [u8; 16],
        sequence: i64,
    ) {
        if now != 0 {
            encoding::int64::encode(1, &now, out);
        }
        let split = self.pb_entity_split as usize;
        let last_seen_len = if now != 0 {
            encoding::key_len(5) + encoding::encoded_len_varint(now as u64)
        } else {
            0
        };
        encoding::encode_key(2, WireType::LengthDelimited, out);
        encoding::encode_varint((self.pb_entity.len() + last_seen_len) as u64, out);
        out.extend_from_slice(&self.pb_entity[..split]);
        if now != 0 {
            encoding::int64::encode(5, &now, out);
        }
        out.extend_from_slice(&self.pb_entity[split..]);
        match check {
            CheckPart::Raw(b) => out.extend_from_slice(b),
            CheckPart::Msg(c) => encoding::message::encode(3, c, out),
        }
        out.extend_from_slice(&self.t.pb_event_meta);
        encoding::encode_key(6, WireType::LengthDelimited, out);
        encoding::encode_varint(id.len() as u64, out);
        out.extend_from_slice(&id);
        if sequence != 0 {
            encoding::int64::encode(7, &sequence, out);
        }
    }
}

enum CheckPart<'a> {
    Raw(&'a [u8]),
    Msg(&'a v2::Check),
}

/// Unix time in seconds (what every message's `timestamp` carries).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A fresh event id: 16 random bytes shaped as a version-4 UUID, as the real
/// agent sends.
pub fn new_id() -> [u8; 16] {
    let mut id = fastrand::u128(..).to_le_bytes();
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

/// Initial capacity of a keepalive frame buffer: a protobuf keepalive frame
/// is ~250-400 bytes, so one allocation covers it (JSON frames grow once).
pub const KEEPALIVE_FRAME_CAPACITY: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_event, split_frame, validate_event};

    fn builder(enc: Encoding) -> MessageBuilder {
        let cfg = SensuConfig {
            encoding: enc,
            ..Default::default()
        };
        MessageBuilder::new(
            Arc::new(Templates::new(&cfg)),
            agent_name("agent-sim", 70000),
            70000,
        )
    }

    #[test]
    fn check_results_carry_the_configs_hooks_subdue_secrets_and_pipelines() {
        // Embedded messages as raw protobuf: a HookList {hooks: ["h"]}, a
        // TimeWindowWhen, a ProxyRequests, a secret, a metric tag, a pipeline ref.
        let hook = vec![0x0a, 0x01, b'h'];
        let req = v2::CheckRequest {
            config: Some(v2::CheckConfig {
                command: "!sensu_test_check!".into(),
                check_hooks: vec![hook.clone()],
                subdue: vec![0x0a, 0x00],
                proxy_requests: vec![0x08, 0x01],
                secrets: vec![vec![0x0a, 0x01, b's']],
                output_metric_tags: vec![vec![0x0a, 0x01, b't']],
                pipelines: vec![vec![0x0a, 0x01, b'p']],
                metadata: Some(meta("c", "default")),
                ..Default::default()
            }),
            issued: 42,
            ..Default::default()
        };
        let check = builder(Encoding::Protobuf).check_result(&req, 43);
        assert_eq!(check.check_hooks, vec![hook]);
        assert_eq!(check.subdue, vec![0x0a, 0x00]);
        assert_eq!(check.proxy_requests, vec![0x08, 0x01]);
        assert_eq!(check.secrets.len(), 1);
        assert_eq!(check.output_metric_tags.len(), 1);
        assert_eq!(check.pipelines.len(), 1);
        // And they survive the wire: our reply decodes with them intact.
        let bytes = check.encode_to_vec();
        let back = v2::Check::decode(&bytes[..]).unwrap();
        assert_eq!(back.check_hooks, check.check_hooks);
        assert_eq!(back.pipelines, check.pipelines);
    }

    #[test]
    fn fast_protobuf_keepalive_is_the_canonical_encoding() {
        let b = builder(Encoding::Protobuf);
        let mut out = Vec::new();
        b.write_keepalive_frame(&mut out, 1_795_300_844, [7; 16], 3)
            .unwrap();
        let f = split_frame(&out).unwrap();
        assert_eq!(f.kind, "keepalive");
        let canonical = b.keepalive(1_795_300_844, [7; 16], 3).encode_to_vec();
        assert_eq!(f.body, &canonical[..]);
        let ev = decode_event(f.body, Encoding::Protobuf).unwrap();
        validate_event(&ev, true).unwrap();
        let e = ev.entity.unwrap();
        assert_eq!(e.metadata.unwrap().name, "agent-sim-70000");
        assert_eq!(e.last_seen, 1_795_300_844);
        assert_eq!(
            e.system.unwrap().network.unwrap().interfaces[0].addresses,
            ["10.1.17.112/8"]
        );
    }

    #[test]
    fn fast_protobuf_event_is_the_canonical_encoding() {
        let mut b = builder(Encoding::Protobuf);
        assert!(!b.apply_entity_config(v3::EntityConfig {
            metadata: Some(meta("not found", "default")),
            ..Default::default()
        }));
        assert!(b.apply_entity_config(v3::EntityConfig {
            metadata: Some(meta("agent-sim-70000", "default")),
            entity_class: "agent".into(),
            user: "agent".into(),
            subscriptions: vec!["linux".into(), "entity:agent-sim-70000".into()],
            deregister: true,
            ..Default::default()
        }));
        let check = b.agent_event_check(5);
        let mut out = Vec::new();
        b.write_event_frame(&mut out, check.clone(), 5, [1; 16], 1)
            .unwrap();
        let canonical = b.event(check, 5, [1; 16], 1).encode_to_vec();
        assert_eq!(split_frame(&out).unwrap().body, &canonical[..]);
        let ev = decode_event(&canonical, Encoding::Protobuf).unwrap();
        let e = ev.entity.unwrap();
        assert!(e.deregister);
        assert_eq!(e.subscriptions, ["linux", "entity:agent-sim-70000"]);
        assert_eq!(ev.check.unwrap().output.len(), 256);
    }

    #[test]
    fn json_keepalive_round_trips() {
        let b = builder(Encoding::Json);
        let mut out = Vec::new();
        b.write_keepalive_frame(&mut out, 10, [9; 16], 1).unwrap();
        let f = split_frame(&out).unwrap();
        let ev = decode_event(f.body, Encoding::Json).unwrap();
        assert_eq!(ev, b.keepalive(10, [9; 16], 1));
        let text = std::str::from_utf8(f.body).unwrap();
        assert!(text.contains("\"id\":\"09090909-0909-0909-0909-090909090909\""));
        assert!(text.contains("\"entity_class\":\"agent\""));
    }
}
