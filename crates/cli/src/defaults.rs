//! Every default of a run, in one place: the bottom layer under the config
//! file, the environment and the flags, and what `--help` shows.

use std::time::Duration;

use agent_sim_consul::{ConsulConfig, ProbeKind, ProbeKinds};
use agent_sim_dataplane::DataplaneConfig;
use agent_sim_fleet::FleetConfig;
use agent_sim_sensu::SensuConfig;

use crate::args::{RunArgs, with_run_args_fields};
use crate::values::{Kind, List, Ramp, Secs, Toggle};

/// Agents of a run that does not say.
pub const DEFAULT_AGENTS: u64 = 100;
/// Interval of hlog records and of plain progress lines.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// Time between scrapes of an observed server.
pub const DEFAULT_OBSERVE_EVERY: Duration = Duration::from_secs(5);
/// How long each step of a stepped run is held and judged.
pub const DEFAULT_STEP_HOLD: Duration = Duration::from_secs(60);
/// Time from a step's last start to its window.
pub const DEFAULT_STEP_SETTLE: Duration = Duration::from_secs(10);
/// Check schedule of the embedded Sensu backend.
pub const DEFAULT_EMBEDDED_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// The bottom layer: every default of a run, in one place. Protocol and
/// engine settings come from the crates' own `Default`s ([`SensuConfig`],
/// [`ConsulConfig`], [`FleetConfig`]); the rest are this crate's. Unset
/// fields have no default (`duration`: until Ctrl-C; `threads`: one per
/// core; `http-target`: the first target's host on port 8500).
pub fn defaults() -> RunArgs {
    let fleet = FleetConfig::default();
    let sensu = SensuConfig::default();
    let consul = ConsulConfig::default();
    RunArgs {
        kind: Some(Kind::Sensu),
        agents: Some(DEFAULT_AGENTS),
        step_hold: Some(Secs(DEFAULT_STEP_HOLD)),
        step_settle: Some(Secs(DEFAULT_STEP_SETTLE)),
        steps_past: Some(0),
        ramp: Some(fleet.ramp.map_or(Ramp::All, Ramp::Rate)),
        max_dialing: Some(fleet.max_dialing),
        // The reconnect settings depend on the fleet's kind: see
        // `kind_backoff`, filled in once the kind is known.
        shutdown_grace: Some(Secs(fleet.grace)),
        fail_fast: Some(fleet.fail_fast),
        give_up_after: Some(Secs(fleet.give_up_after)),
        name_prefix: Some(sensu.name_prefix),
        keepalive_interval: Some(Secs(sensu.keepalive_interval)),
        timer_tick: Some(Secs(sensu.timer_tick)),
        keepalive_warning_timeout: Some(sensu.keepalive_warning_timeout),
        keepalive_critical_timeout: Some(sensu.keepalive_critical_timeout),
        namespace: Some(sensu.namespace),
        user: Some(sensu.user),
        password: Some(sensu.password),
        subscriptions: Some(List(sensu.subscriptions)),
        encoding: Some(sensu.encoding),
        deregister: Some(sensu.deregister),
        event_output_size: Some(sensu.event_output_size),
        insecure_skip_tls_verify: Some(sensu.insecure_skip_tls_verify),
        upstreams: Some(List(consul.upstreams)),
        services_per_agent: Some(consul.services_per_agent),
        service_name: Some(consul.service_name),
        sidecars: Some(consul.sidecars),
        leaf_certs: Some(consul.connect.leaf_certs),
        allow_ca_rotation: Some(consul.connect.allow_rotation),
        no_register: Some(!consul.register),
        keep_registrations: Some(consul.keep_registrations),
        session_ttl: Some(
            consul
                .session_ttl
                .map_or(Toggle::Off, |t| Toggle::On(Secs(t))),
        ),
        anti_entropy: Some(
            consul
                .anti_entropy
                .map_or(Toggle::Off, |t| Toggle::On(Secs(t))),
        ),
        // The library's default is no probe; the command line probes the
        // catalog unless told otherwise.
        probe: Some(Toggle::On(ProbeKinds {
            kind: ProbeKind::Catalog,
            also: None,
        })),
        probe_every: Some(Secs(consul.probe.every)),
        watch: Some(consul.watch),
        proxies_per_agent: Some(consul.proxies.per_agent),
        proxy_coalesce: Some(Secs(consul.proxies.coalesce)),
        proxy_update_rate: Some(consul.proxies.update_rate),
        blocking_wait: Some(Secs(consul.blocking_wait)),
        watch_servers: Some(DataplaneConfig::default().watch_servers),
        envoy_version: Some(
            DataplaneConfig::default()
                .envoy_version
                .map_or(Toggle::Off, Toggle::On),
        ),
        embedded_check_interval: Some(Secs(DEFAULT_EMBEDDED_CHECK_INTERVAL)),
        hlog_interval: Some(Secs(DEFAULT_REPORT_INTERVAL)),
        quiet: Some(false),
        progress_every: Some(Secs(DEFAULT_REPORT_INTERVAL)),
        observe_every: Some(Secs(DEFAULT_OBSERVE_EVERY)),
        ..RunArgs::default()
    }
}

/// The reconnect policy and delays of a fleet of `kind` that does not set
/// them: a real agent's own where we know it (Sensu: sensu-agent's retry),
/// the engine's jittered exponential otherwise.
pub fn kind_backoff(kind: Kind) -> agent_sim_fleet::Backoff {
    match kind {
        Kind::Sensu => agent_sim_sensu::real_agent_backoff(),
        Kind::Consul | Kind::ConsulDataplane => FleetConfig::default().backoff,
    }
}

/// `(flag id, default)` of every flag that has a default, for `--help`
/// (secrets are left out).
pub fn shown_defaults() -> Vec<(&'static str, String)> {
    let d = defaults();
    let mut out = Vec::new();
    macro_rules! show {
        (vals: $($f:ident),* ; paths: $($p:ident),* ; vecs: $($v:ident),*) => {
            $(if let Some(v) = &d.$f { out.push((stringify!($f), v.to_string())); })*
            $(if let Some(p) = &d.$p { out.push((stringify!($p), p.display().to_string())); })*
            $(if !d.$v.is_empty() {
                let items: Vec<String> = d.$v.iter().map(|x| x.to_string()).collect();
                out.push((stringify!($v), items.join(",")));
            })*
        };
    }
    with_run_args_fields!(show);
    out.retain(|(id, _)| !matches!(*id, "password" | "token"));
    let (sensu, other) = (kind_backoff(Kind::Sensu), kind_backoff(Kind::Consul));
    let per_kind =
        |s: String, o: String| format!("{s} for sensu (a real sensu-agent's), {o} otherwise");
    out.push((
        "reconnect",
        per_kind(sensu.policy().to_string(), other.policy().to_string()),
    ));
    for (id, s, o) in [
        ("reconnect_min", sensu.min(), other.min()),
        ("reconnect_max", sensu.max(), other.max()),
    ] {
        out.push((id, per_kind(Secs(s).to_string(), Secs(o).to_string())));
    }
    out
}
