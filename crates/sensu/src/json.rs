//! JSON form of the Sensu agent messages (the backend's `encoding/json` form of
//! the Go types), used when the session did not ask for protobuf.
//!
//! Serde mirrors of the prost types in `agent_sim_proto::sensu` (only the
//! fields agent-sim carries), with conversions both ways. Keys are snake_case.
//! Go encodes empty slices as `null` or `[]` and every zero field; decoding
//! here accepts `null` and missing fields everywhere. The Event `id` is a UUID
//! string in JSON (16 raw bytes in protobuf).
//!
//! Not here: framing (`codec`), sockets (`session`).

use std::collections::HashMap;

use agent_sim_proto::sensu::{v2, v3};
use serde::{Deserialize, Deserializer, Serialize};

/// Deserializes `null` as the type's default (Go writes nil slices as `null`).
fn nd<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}
fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}
fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}
fn is_false(v: &bool) -> bool {
    !*v
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JObjectMeta {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    namespace: String,
    #[serde(skip_serializing_if = "HashMap::is_empty", deserialize_with = "nd")]
    labels: HashMap<String, String>,
    #[serde(skip_serializing_if = "HashMap::is_empty", deserialize_with = "nd")]
    annotations: HashMap<String, String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    created_by: String,
}

impl From<&v2::ObjectMeta> for JObjectMeta {
    fn from(m: &v2::ObjectMeta) -> Self {
        JObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            labels: m.labels.clone(),
            annotations: m.annotations.clone(),
            created_by: m.created_by.clone(),
        }
    }
}

impl From<JObjectMeta> for v2::ObjectMeta {
    fn from(m: JObjectMeta) -> Self {
        v2::ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            labels: m.labels,
            annotations: m.annotations,
            created_by: m.created_by,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JDeregistration {
    #[serde(skip_serializing_if = "String::is_empty")]
    handler: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JNetworkInterface {
    name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    mac: String,
    #[serde(deserialize_with = "nd")]
    addresses: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JNetwork {
    #[serde(deserialize_with = "nd")]
    interfaces: Vec<JNetworkInterface>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JSystem {
    hostname: String,
    os: String,
    platform: String,
    platform_family: String,
    platform_version: String,
    #[serde(deserialize_with = "nd")]
    network: JNetwork,
    arch: String,
    #[serde(skip_serializing_if = "is_zero_i32")]
    arm_version: i32,
    libc_type: String,
    vm_system: String,
    vm_role: String,
    cloud_provider: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    float_type: String,
}

impl From<&v2::System> for JSystem {
    fn from(s: &v2::System) -> Self {
        JSystem {
            hostname: s.hostname.clone(),
            os: s.os.clone(),
            platform: s.platform.clone(),
            platform_family: s.platform_family.clone(),
            platform_version: s.platform_version.clone(),
            network: JNetwork {
                interfaces: s
                    .network
                    .iter()
                    .flat_map(|n| n.interfaces.iter())
                    .map(|i| JNetworkInterface {
                        name: i.name.clone(),
                        mac: i.mac.clone(),
                        addresses: i.addresses.clone(),
                    })
                    .collect(),
            },
            arch: s.arch.clone(),
            arm_version: s.arm_version,
            libc_type: s.libc_type.clone(),
            vm_system: s.vm_system.clone(),
            vm_role: s.vm_role.clone(),
            cloud_provider: s.cloud_provider.clone(),
            float_type: s.float_type.clone(),
        }
    }
}

impl From<JSystem> for v2::System {
    fn from(s: JSystem) -> Self {
        v2::System {
            hostname: s.hostname,
            os: s.os,
            platform: s.platform,
            platform_family: s.platform_family,
            platform_version: s.platform_version,
            network: Some(v2::Network {
                interfaces: s
                    .network
                    .interfaces
                    .into_iter()
                    .map(|i| v2::NetworkInterface {
                        name: i.name,
                        mac: i.mac,
                        addresses: i.addresses,
                    })
                    .collect(),
            }),
            arch: s.arch,
            arm_version: s.arm_version,
            libc_type: s.libc_type,
            vm_system: s.vm_system,
            vm_role: s.vm_role,
            cloud_provider: s.cloud_provider,
            float_type: s.float_type,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JEntity {
    entity_class: String,
    #[serde(deserialize_with = "nd")]
    system: JSystem,
    #[serde(deserialize_with = "nd")]
    subscriptions: Vec<String>,
    last_seen: i64,
    deregister: bool,
    #[serde(deserialize_with = "nd")]
    deregistration: JDeregistration,
    user: String,
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "nd")]
    redact: Vec<String>,
    #[serde(deserialize_with = "nd")]
    metadata: JObjectMeta,
    sensu_agent_version: String,
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "nd")]
    keepalive_handlers: Vec<String>,
}

impl From<&v2::Entity> for JEntity {
    fn from(e: &v2::Entity) -> Self {
        JEntity {
            entity_class: e.entity_class.clone(),
            system: e.system.as_ref().map(JSystem::from).unwrap_or_default(),
            subscriptions: e.subscriptions.clone(),
            last_seen: e.last_seen,
            deregister: e.deregister,
            deregistration: JDeregistration {
                handler: e
                    .deregistration
                    .as_ref()
                    .map(|d| d.handler.clone())
                    .unwrap_or_default(),
            },
            user: e.user.clone(),
            redact: e.redact.clone(),
            metadata: e
                .metadata
                .as_ref()
                .map(JObjectMeta::from)
                .unwrap_or_default(),
            sensu_agent_version: e.sensu_agent_version.clone(),
            keepalive_handlers: e.keepalive_handlers.clone(),
        }
    }
}

impl From<JEntity> for v2::Entity {
    fn from(e: JEntity) -> Self {
        v2::Entity {
            entity_class: e.entity_class,
            system: Some(e.system.into()),
            subscriptions: e.subscriptions,
            last_seen: e.last_seen,
            deregister: e.deregister,
            deregistration: Some(v2::Deregistration {
                handler: e.deregistration.handler,
            }),
            user: e.user,
            redact: e.redact,
            metadata: Some(e.metadata.into()),
            sensu_agent_version: e.sensu_agent_version,
            keepalive_handlers: e.keepalive_handlers,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JCheckHistory {
    status: u32,
    executed: i64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JCheck {
    command: String,
    #[serde(deserialize_with = "nd")]
    handlers: Vec<String>,
    high_flap_threshold: u32,
    interval: u32,
    low_flap_threshold: u32,
    publish: bool,
    #[serde(deserialize_with = "nd")]
    runtime_assets: Vec<String>,
    #[serde(deserialize_with = "nd")]
    subscriptions: Vec<String>,
    proxy_entity_name: String,
    stdin: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    cron: String,
    ttl: i64,
    timeout: u32,
    round_robin: bool,
    #[serde(skip_serializing_if = "is_zero_f64")]
    duration: f64,
    executed: i64,
    #[serde(deserialize_with = "nd")]
    history: Vec<JCheckHistory>,
    issued: i64,
    output: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    state: String,
    status: u32,
    total_state_change: u32,
    last_ok: i64,
    occurrences: i64,
    occurrences_watermark: i64,
    output_metric_format: String,
    #[serde(deserialize_with = "nd")]
    output_metric_handlers: Vec<String>,
    #[serde(deserialize_with = "nd")]
    env_vars: Vec<String>,
    #[serde(deserialize_with = "nd")]
    metadata: JObjectMeta,
    #[serde(skip_serializing_if = "is_zero_i64")]
    max_output_size: i64,
    #[serde(skip_serializing_if = "is_false")]
    discard_output: bool,
    is_silenced: bool,
    scheduler: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    processed_by: String,
}

impl From<&v2::Check> for JCheck {
    fn from(c: &v2::Check) -> Self {
        JCheck {
            command: c.command.clone(),
            handlers: c.handlers.clone(),
            high_flap_threshold: c.high_flap_threshold,
            interval: c.interval,
            low_flap_threshold: c.low_flap_threshold,
            publish: c.publish,
            runtime_assets: c.runtime_assets.clone(),
            subscriptions: c.subscriptions.clone(),
            proxy_entity_name: c.proxy_entity_name.clone(),
            stdin: c.stdin,
            cron: c.cron.clone(),
            ttl: c.ttl,
            timeout: c.timeout,
            round_robin: c.round_robin,
            duration: c.duration,
            executed: c.executed,
            history: c
                .history
                .iter()
                .map(|h| JCheckHistory {
                    status: h.status,
                    executed: h.executed,
                })
                .collect(),
            issued: c.issued,
            output: c.output.clone(),
            state: c.state.clone(),
            status: c.status,
            total_state_change: c.total_state_change,
            last_ok: c.last_ok,
            occurrences: c.occurrences,
            occurrences_watermark: c.occurrences_watermark,
            output_metric_format: c.output_metric_format.clone(),
            output_metric_handlers: c.output_metric_handlers.clone(),
            env_vars: c.env_vars.clone(),
            metadata: c
                .metadata
                .as_ref()
                .map(JObjectMeta::from)
                .unwrap_or_default(),
            max_output_size: c.max_output_size,
            discard_output: c.discard_output,
            is_silenced: c.is_silenced,
            scheduler: c.scheduler.clone(),
            processed_by: c.processed_by.clone(),
        }
    }
}

impl From<JCheck> for v2::Check {
    fn from(c: JCheck) -> Self {
        v2::Check {
            command: c.command,
            handlers: c.handlers,
            high_flap_threshold: c.high_flap_threshold,
            interval: c.interval,
            low_flap_threshold: c.low_flap_threshold,
            publish: c.publish,
            runtime_assets: c.runtime_assets,
            subscriptions: c.subscriptions,
            proxy_entity_name: c.proxy_entity_name,
            stdin: c.stdin,
            cron: c.cron,
            ttl: c.ttl,
            timeout: c.timeout,
            round_robin: c.round_robin,
            duration: c.duration,
            executed: c.executed,
            history: c
                .history
                .into_iter()
                .map(|h| v2::CheckHistory {
                    status: h.status,
                    executed: h.executed,
                })
                .collect(),
            issued: c.issued,
            output: c.output,
            state: c.state,
            status: c.status,
            total_state_change: c.total_state_change,
            last_ok: c.last_ok,
            occurrences: c.occurrences,
            occurrences_watermark: c.occurrences_watermark,
            output_metric_format: c.output_metric_format,
            output_metric_handlers: c.output_metric_handlers,
            env_vars: c.env_vars,
            metadata: Some(c.metadata.into()),
            max_output_size: c.max_output_size,
            discard_output: c.discard_output,
            is_silenced: c.is_silenced,
            scheduler: c.scheduler,
            processed_by: c.processed_by,
            // Hooks, subdue, proxy requests, secrets, metric tags and pipelines
            // are passed through in protobuf mode only.
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JCheckConfig {
    command: String,
    #[serde(deserialize_with = "nd")]
    handlers: Vec<String>,
    high_flap_threshold: u32,
    interval: u32,
    low_flap_threshold: u32,
    publish: bool,
    #[serde(deserialize_with = "nd")]
    runtime_assets: Vec<String>,
    #[serde(deserialize_with = "nd")]
    subscriptions: Vec<String>,
    proxy_entity_name: String,
    stdin: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    cron: String,
    ttl: i64,
    timeout: u32,
    round_robin: bool,
    output_metric_format: String,
    #[serde(deserialize_with = "nd")]
    output_metric_handlers: Vec<String>,
    #[serde(deserialize_with = "nd")]
    env_vars: Vec<String>,
    #[serde(deserialize_with = "nd")]
    metadata: JObjectMeta,
    #[serde(skip_serializing_if = "is_zero_i64")]
    max_output_size: i64,
    #[serde(skip_serializing_if = "is_false")]
    discard_output: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    scheduler: String,
}

impl From<&v2::CheckConfig> for JCheckConfig {
    fn from(c: &v2::CheckConfig) -> Self {
        JCheckConfig {
            command: c.command.clone(),
            handlers: c.handlers.clone(),
            high_flap_threshold: c.high_flap_threshold,
            interval: c.interval,
            low_flap_threshold: c.low_flap_threshold,
            publish: c.publish,
            runtime_assets: c.runtime_assets.clone(),
            subscriptions: c.subscriptions.clone(),
            proxy_entity_name: c.proxy_entity_name.clone(),
            stdin: c.stdin,
            cron: c.cron.clone(),
            ttl: c.ttl,
            timeout: c.timeout,
            round_robin: c.round_robin,
            output_metric_format: c.output_metric_format.clone(),
            output_metric_handlers: c.output_metric_handlers.clone(),
            env_vars: c.env_vars.clone(),
            metadata: c
                .metadata
                .as_ref()
                .map(JObjectMeta::from)
                .unwrap_or_default(),
            max_output_size: c.max_output_size,
            discard_output: c.discard_output,
            scheduler: c.scheduler.clone(),
        }
    }
}

impl From<JCheckConfig> for v2::CheckConfig {
    fn from(c: JCheckConfig) -> Self {
        v2::CheckConfig {
            command: c.command,
            handlers: c.handlers,
            high_flap_threshold: c.high_flap_threshold,
            interval: c.interval,
            low_flap_threshold: c.low_flap_threshold,
            publish: c.publish,
            runtime_assets: c.runtime_assets,
            subscriptions: c.subscriptions,
            proxy_entity_name: c.proxy_entity_name,
            stdin: c.stdin,
            cron: c.cron,
            ttl: c.ttl,
            timeout: c.timeout,
            round_robin: c.round_robin,
            output_metric_format: c.output_metric_format,
            output_metric_handlers: c.output_metric_handlers,
            env_vars: c.env_vars,
            metadata: Some(c.metadata.into()),
            max_output_size: c.max_output_size,
            discard_output: c.discard_output,
            scheduler: c.scheduler,
            // Hooks, subdue, proxy requests, secrets, metric tags and pipelines
            // are passed through in protobuf mode only.
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JMetricTag {
    name: String,
    value: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JMetricPoint {
    name: String,
    value: f64,
    timestamp: i64,
    #[serde(deserialize_with = "nd")]
    tags: Vec<JMetricTag>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JMetrics {
    #[serde(deserialize_with = "nd")]
    handlers: Vec<String>,
    #[serde(deserialize_with = "nd")]
    points: Vec<JMetricPoint>,
}

impl From<&v2::Metrics> for JMetrics {
    fn from(m: &v2::Metrics) -> Self {
        JMetrics {
            handlers: m.handlers.clone(),
            points: m
                .points
                .iter()
                .map(|p| JMetricPoint {
                    name: p.name.clone(),
                    value: p.value,
                    timestamp: p.timestamp,
                    tags: p
                        .tags
                        .iter()
                        .map(|t| JMetricTag {
                            name: t.name.clone(),
                            value: t.value.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

impl From<JMetrics> for v2::Metrics {
    fn from(m: JMetrics) -> Self {
        v2::Metrics {
            handlers: m.handlers,
            points: m
                .points
                .into_iter()
                .map(|p| v2::MetricPoint {
                    name: p.name,
                    value: p.value,
                    timestamp: p.timestamp,
                    tags: p
                        .tags
                        .into_iter()
                        .map(|t| v2::MetricTag {
                            name: t.name,
                            value: t.value,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JEvent {
    #[serde(skip_serializing_if = "Option::is_none")]
    check: Option<JCheck>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entity: Option<JEntity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<JMetrics>,
    id: String,
    #[serde(deserialize_with = "nd")]
    metadata: JObjectMeta,
    sequence: i64,
    timestamp: i64,
}

/// Errors of the JSON id conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadUuid;

/// Formats 16 bytes as a lowercase hyphenated UUID (other lengths, which a
/// valid event never has, as plain hex).
pub(crate) fn format_uuid(id: &[u8]) -> String {
    match uuid::Uuid::from_slice(id) {
        Ok(u) => u.hyphenated().to_string(),
        Err(_) => id.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// Parses a UUID string (hyphenated or not, as Go's `uuid.Parse` reads it);
/// an empty string is an empty id.
pub(crate) fn parse_uuid(s: &str) -> Result<Vec<u8>, BadUuid> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    uuid::Uuid::parse_str(s)
        .map(|u| u.as_bytes().to_vec())
        .map_err(|_| BadUuid)
}

impl From<&v2::Event> for JEvent {
    fn from(e: &v2::Event) -> Self {
        JEvent {
            check: e.check.as_ref().map(JCheck::from),
            entity: e.entity.as_ref().map(JEntity::from),
            metrics: e.metrics.as_ref().map(JMetrics::from),
            id: format_uuid(&e.id),
            metadata: e
                .metadata
                .as_ref()
                .map(JObjectMeta::from)
                .unwrap_or_default(),
            sequence: e.sequence,
            timestamp: e.timestamp,
        }
    }
}

impl JEvent {
    pub(crate) fn into_proto(self) -> Result<v2::Event, BadUuid> {
        Ok(v2::Event {
            timestamp: self.timestamp,
            entity: self.entity.map(Into::into),
            check: self.check.map(Into::into),
            metrics: self.metrics.map(Into::into),
            metadata: Some(self.metadata.into()),
            id: parse_uuid(&self.id)?,
            sequence: self.sequence,
        })
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JNamed {
    #[serde(deserialize_with = "nd")]
    metadata: JObjectMeta,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JCheckRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<JCheckConfig>,
    #[serde(deserialize_with = "nd")]
    assets: Vec<JNamed>,
    #[serde(deserialize_with = "nd")]
    hooks: Vec<JNamed>,
    issued: i64,
}

impl From<&v2::CheckRequest> for JCheckRequest {
    fn from(r: &v2::CheckRequest) -> Self {
        let named = |m: &Option<v2::ObjectMeta>| JNamed {
            metadata: m.as_ref().map(JObjectMeta::from).unwrap_or_default(),
        };
        JCheckRequest {
            config: r.config.as_ref().map(JCheckConfig::from),
            assets: r.assets.iter().map(|a| named(&a.metadata)).collect(),
            hooks: r.hooks.iter().map(|h| named(&h.metadata)).collect(),
            issued: r.issued,
        }
    }
}

impl From<JCheckRequest> for v2::CheckRequest {
    fn from(r: JCheckRequest) -> Self {
        v2::CheckRequest {
            config: r.config.map(Into::into),
            assets: r
                .assets
                .into_iter()
                .map(|a| v2::AssetRef {
                    metadata: Some(a.metadata.into()),
                })
                .collect(),
            hooks: r
                .hooks
                .into_iter()
                .map(|h| v2::HookRef {
                    metadata: Some(h.metadata.into()),
                })
                .collect(),
            issued: r.issued,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JEntityConfig {
    #[serde(deserialize_with = "nd")]
    metadata: JObjectMeta,
    entity_class: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    user: String,
    #[serde(deserialize_with = "nd")]
    subscriptions: Vec<String>,
    deregister: bool,
    #[serde(deserialize_with = "nd")]
    deregistration: JDeregistration,
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "nd")]
    keepalive_handlers: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "nd")]
    redact: Vec<String>,
}

impl From<&v3::EntityConfig> for JEntityConfig {
    fn from(c: &v3::EntityConfig) -> Self {
        JEntityConfig {
            metadata: c
                .metadata
                .as_ref()
                .map(JObjectMeta::from)
                .unwrap_or_default(),
            entity_class: c.entity_class.clone(),
            user: c.user.clone(),
            subscriptions: c.subscriptions.clone(),
            deregister: c.deregister,
            deregistration: JDeregistration {
                handler: c
                    .deregistration
                    .as_ref()
                    .map(|d| d.handler.clone())
                    .unwrap_or_default(),
            },
            keepalive_handlers: c.keepalive_handlers.clone(),
            redact: c.redact.clone(),
        }
    }
}

impl From<JEntityConfig> for v3::EntityConfig {
    fn from(c: JEntityConfig) -> Self {
        v3::EntityConfig {
            metadata: Some(c.metadata.into()),
            entity_class: c.entity_class,
            user: c.user,
            subscriptions: c.subscriptions,
            deregister: c.deregister,
            deregistration: Some(v2::Deregistration {
                handler: c.deregistration.handler,
            }),
            keepalive_handlers: c.keepalive_handlers,
            redact: c.redact,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_round_trip() {
        let id: Vec<u8> = (0u8..16).collect();
        let s = format_uuid(&id);
        assert_eq!(s, "00010203-0405-0607-0809-0a0b0c0d0e0f");
        assert_eq!(parse_uuid(&s).unwrap(), id);
        assert_eq!(parse_uuid("").unwrap(), Vec::<u8>::new());
        assert!(parse_uuid("zz").is_err());
        assert!(parse_uuid("abc").is_err());
    }

    #[test]
    fn nulls_and_missing_fields_decode_as_defaults() {
        let c: JCheckRequest = serde_json::from_str(
            r#"{"config":{"handlers":null,"metadata":null,"subscriptions":null},"assets":null}"#,
        )
        .unwrap();
        let r = v2::CheckRequest::from(c);
        let cfg = r.config.unwrap();
        assert!(cfg.handlers.is_empty() && cfg.subscriptions.is_empty());
        assert!(r.assets.is_empty() && r.hooks.is_empty());
        let e: JEvent = serde_json::from_str(r#"{"entity":null,"metadata":null}"#).unwrap();
        let e = e.into_proto().unwrap();
        assert!(e.entity.is_none() && e.check.is_none());
    }
}
