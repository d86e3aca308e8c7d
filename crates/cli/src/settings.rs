//! The effective settings of a run as the summary's `config`: the keys of
//! the config file with the value each had after every layer, secrets
//! redacted, and only the settings each fleet's protocol reads.

use crate::args::{RunArgs, heading, with_run_args_fields};
use crate::plan::FleetPlan;

/// Settings whose value never leaves the process.
const SECRET_SETTINGS: &[&str] = &["password", "token"];

/// The config file key of a [`RunArgs`] field.
fn config_key(field: &str) -> String {
    match field {
        "targets" => "target".into(),
        "source_addrs" => "source-addr".into(),
        "asserts" => "assert".into(),
        f => f.replace('_', "-"),
    }
}

/// A setting as JSON: booleans and whole numbers as such, everything else
/// as the text its flag takes (`20s`, `500/s`).
fn config_value(text: String) -> serde_json::Value {
    match text.as_str() {
        "true" => true.into(),
        "false" => false.into(),
        t => match t.parse::<u64>() {
            Ok(n) if n.to_string() == t => n.into(),
            _ => text.into(),
        },
    }
}

/// Every setting of a layer that has a value, by field name; secrets as
/// `<redacted>`.
fn settings_of(a: &RunArgs) -> Vec<(&'static str, serde_json::Value)> {
    let mut out: Vec<(&'static str, serde_json::Value)> = Vec::new();
    macro_rules! dump {
        (vals: $($f:ident),* ; paths: $($p:ident),* ; vecs: $($v:ident),*) => {
            $(if let Some(v) = &a.$f { out.push((stringify!($f), config_value(v.to_string()))); })*
            $(if let Some(p) = &a.$p { out.push((stringify!($p), p.display().to_string().into())); })*
            $(if !a.$v.is_empty() {
                let items = a.$v.iter().map(|x| config_value(x.to_string())).collect();
                out.push((stringify!($v), serde_json::Value::Array(items)));
            })*
        };
    }
    with_run_args_fields!(dump);
    for (field, v) in out.iter_mut() {
        if SECRET_SETTINGS.contains(field) && v.as_str() != Some("") {
            *v = "<redacted>".into();
        }
    }
    out
}

/// The Consul flags a dataplane fleet reads (see `dataplane_config`).
const DATAPLANE_READS_CONSUL: &[&str] = &[
    "http_target",
    "token",
    "upstreams",
    "service_name",
    "keep_registrations",
    "probe",
    "probe_every",
    "probe_timeout",
    "probe_service",
];

/// The `--help` heading of a fleet kind's own flags.
fn own_heading(kind: &str) -> &'static str {
    match kind {
        "sensu" => heading::SENSU,
        agent_sim_dataplane::KIND => heading::DATAPLANE,
        _ => heading::CONSUL,
    }
}

/// Whether a fleet of `kind` reads `field`, whose `--help` heading is
/// `heading`: `None` for a setting of no protocol (the run's own).
fn protocol_reads(field: &str, heading: Option<&str>, kind: &str) -> Option<bool> {
    match heading? {
        heading::SENSU => Some(kind == "sensu"),
        heading::CONSUL => Some(
            kind == "consul"
                || (kind == agent_sim_dataplane::KIND && DATAPLANE_READS_CONSUL.contains(&field)),
        ),
        heading::DATAPLANE => Some(kind == agent_sim_dataplane::KIND),
        _ => None,
    }
}

/// The fields the layers `given` (the command line and environment, a
/// config file's top level) set, each once.
pub fn given_fields(given: &[&RunArgs]) -> Vec<&'static str> {
    let mut fields: Vec<&'static str> = given
        .iter()
        .flat_map(|a| settings_of(a).into_iter().map(|(f, _)| f))
        .collect();
    fields.sort_unstable();
    fields.dedup();
    fields
}

/// Of the `fields` given, those of a protocol no fleet of the run speaks
/// (`--service-chain` in a Sensu run): the words of a note each, naming
/// the flag, its config key and the fleets the run has. They are not
/// refused, since one config file may serve runs of several kinds.
pub fn unread(fields: &[&'static str], fleets: &[FleetPlan]) -> Vec<String> {
    let cmd = crate::help::command();
    let kinds: Vec<&str> = fleets.iter().map(|f| f.protocol.kind()).collect();
    let mut out = Vec::new();
    for &field in fields {
        let Some(arg) = cmd.get_arguments().find(|a| a.get_id() == field) else {
            continue;
        };
        let heading = arg.get_help_heading();
        let read = kinds
            .iter()
            .map(|k| protocol_reads(field, heading, k))
            .collect::<Option<Vec<bool>>>();
        if let Some(read) = read
            && !read.contains(&true)
        {
            let flag = arg.get_long().unwrap_or(field);
            out.push(format!(
                "--{flag} (config key {}) is a setting of {} fleets; this run has {} only: ignored",
                config_key(field),
                heading.unwrap_or("other"),
                kinds.join(" and ")
            ));
        }
    }
    out
}

/// The effective settings of a run as the summary's `config`: the keys of
/// the config file (kebab-case) with the value each had after defaults <
/// `--config` < environment < flags, secrets as `<redacted>`. Settings of
/// the other protocol are left out (a Consul run shows no Sensu keepalive
/// interval), and the embedded backend's check schedule only for demo runs.
/// A run of several fleets lists its own settings at the top and each
/// fleet's in `fleet`: its kind, agents and targets, its protocol's
/// settings, and whatever it sets apart from the top.
pub fn effective_settings(
    top: &RunArgs,
    layers: &[RunArgs],
    fleets: &[FleetPlan],
) -> serde_json::Map<String, serde_json::Value> {
    let cmd = crate::help::command();
    let heading = |field: &str| {
        cmd.get_arguments()
            .find(|a| a.get_id() == field)
            .and_then(|a| a.get_help_heading().map(str::to_string))
    };
    let embedded = fleets.iter().any(|f| f.embedded);
    let observing = !top.observe.is_empty() || !top.observe_pid.is_empty();
    // Whether a field belongs in a fleet of `kind` (None: no fleet's own).
    let belongs = |field: &str, kind: Option<&str>| {
        if field == "embedded_check_interval" || field == "embedded_password_cost" {
            return embedded;
        }
        let h = heading(field);
        if h.as_deref() == Some(heading::OBSERVE) {
            return observing;
        }
        match kind {
            Some(k) => protocol_reads(field, h.as_deref(), k).unwrap_or(true),
            None => protocol_reads(field, h.as_deref(), "").is_none(),
        }
    };
    let keyed = |items: Vec<(&'static str, serde_json::Value)>| {
        items
            .into_iter()
            .map(|(f, v)| (config_key(f), v))
            .collect::<serde_json::Map<_, _>>()
    };
    let top_settings = settings_of(top);
    if let ([_], [plan]) = (layers, fleets) {
        let kind = plan.protocol.kind();
        return keyed(
            top_settings
                .into_iter()
                .filter(|(f, _)| belongs(f, Some(kind)))
                .collect(),
        );
    }
    const PER_FLEET: &[&str] = &["kind", "agents", "targets"];
    let mut out = keyed(
        top_settings
            .iter()
            .filter(|(f, _)| !PER_FLEET.contains(f) && belongs(f, None))
            .cloned()
            .collect(),
    );
    let sections = layers
        .iter()
        .zip(fleets)
        .map(|(layer, plan)| {
            let kind = plan.protocol.kind();
            serde_json::Value::Object(keyed(
                settings_of(layer)
                    .into_iter()
                    .filter(|(f, v)| {
                        PER_FLEET.contains(f)
                            || (belongs(f, Some(kind))
                                && (heading(f).as_deref() == Some(own_heading(kind))
                                    || top_settings.iter().all(|(g, w)| g != f || w != v)))
                    })
                    .collect(),
            ))
        })
        .collect();
    out.insert("fleet".into(), serde_json::Value::Array(sections));
    out
}
