//! Resolves flags, environment and the `--config` file into one validated
//! [`RunConfig`], before any socket is opened.
//!
//! Precedence: built-in defaults < `--config FILE.toml` < `AGENT_SIM_*`
//! environment < flags (clap applies env < flags; this module puts the file
//! underneath). A config file may declare several fleets in `[[fleet]]`
//! sections (e.g. 20,000 Sensu + 5,000 Consul agents in one process); each
//! section takes the same keys as the top level, which it overrides.
//! Every problem is a [`UsageError`]: one line, exit code 64.

use std::net::IpAddr;
use std::time::Duration;

use agent_sim_consul::{Connection, ConsulConfig, ConsulTls};
use agent_sim_dataplane::{Adopt, DataplaneConfig};
use agent_sim_fleet::{Backoff, FleetConfig};
use agent_sim_sensu::SensuConfig;

use crate::args::{RunArgs, with_run_args_fields};
use crate::defaults::{DEFAULT_AGENTS, defaults};
use crate::plan::{FleetPlan, Protocol, RunConfig, Shard, UsageError};
use crate::plan::{password_cost, usage};
use crate::scenario::ScenarioSection;
use crate::settings::effective_settings;
use crate::values::{AddrRange, Kind, Secs};

/// Merges two layers: `hi` wins where it has a value.
fn overlay(hi: RunArgs, lo: RunArgs) -> RunArgs {
    macro_rules! pick {
        (vals: $($f:ident),* ; paths: $($p:ident),* ; vecs: $($v:ident),*) => {
            RunArgs {
                $($f: hi.$f.or(lo.$f),)*
                $($p: hi.$p.or(lo.$p),)*
                $($v: if hi.$v.is_empty() { lo.$v } else { hi.$v },)*
            }
        };
    }
    with_run_args_fields!(pick)
}

/// What a `--config` file holds: the top-level layer, its `[[fleet]]`
/// sections and its `[[scenario]]` sections.
pub(crate) type FileLayers = (RunArgs, Vec<RunArgs>, Vec<ScenarioSection>);

/// Reads the `--config` file: the top-level layer and its sections.
fn read_file(path: &std::path::Path) -> Result<FileLayers, UsageError> {
    let origin = format!("--config {}", path.display());
    let text = std::fs::read_to_string(path).or_else(|e| usage(format!("{origin}: {e}")))?;
    let table: toml::Table =
        toml::from_str(&text).or_else(|e| usage(format!("{origin}: {}", one_line(e))))?;
    if table.contains_key("study") {
        return usage(format!(
            "{origin}: a study's file: run it with `agent-sim study NAME` (agent-sim study --list)"
        ));
    }
    layers_of(table, &origin)
}

/// toml's message spans several lines; a usage error is one.
pub(crate) fn one_line(e: toml::de::Error) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A config table's top-level layer and its sections; `origin` begins
/// every refusal (`--config FILE`, `study NAME`).
pub(crate) fn layers_of(mut table: toml::Table, origin: &str) -> Result<FileLayers, UsageError> {
    let fleets = match table.remove("fleet") {
        None => Vec::new(),
        Some(toml::Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                v.try_into::<RunArgs>()
                    .or_else(|e| usage(format!("{origin}: [[fleet]] #{}: {}", i + 1, one_line(e))))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return usage(format!("{origin}: `fleet` must be [[fleet]] sections")),
    };
    let scenarios = match table.remove("scenario") {
        None => Vec::new(),
        Some(v) => crate::scenario::sections(v, origin.trim_start_matches("--config "))?,
    };
    let top = toml::Value::Table(table)
        .try_into::<RunArgs>()
        .or_else(|e| usage(format!("{origin}: {}", one_line(e))))?;
    Ok((top, fleets, scenarios))
}

/// The flag that sets a protocol or engine config field, for messages.
fn flag_of(field: &str) -> String {
    let name = match field {
        "targets" | "rpc_targets" => "target",
        "tls" => "ca-file",
        f => f.strip_prefix("tls.").unwrap_or(f),
    };
    format!("--{}", name.replace(['_', '.'], "-"))
}

/// A protocol or engine refusal as a usage error naming the flag.
fn refused(field: &str, reason: &str) -> UsageError {
    UsageError(format!("{}: {reason}", flag_of(field)))
}

fn sensu_refused(e: agent_sim_sensu::SensuError) -> UsageError {
    match e {
        agent_sim_sensu::SensuError::Invalid { field, reason } => refused(field, &reason),
        e => UsageError(e.to_string()),
    }
}

fn consul_refused(e: agent_sim_consul::ConsulError) -> UsageError {
    match e {
        agent_sim_consul::ConsulError::Invalid(e) => refused(e.field(), &e.to_string()),
        e => UsageError(e.to_string()),
    }
}

fn dataplane_refused(e: agent_sim_dataplane::DataplaneError) -> UsageError {
    match e {
        agent_sim_dataplane::DataplaneError::Invalid(e) => refused(e.field(), &e.to_string()),
        e => UsageError(e.to_string()),
    }
}

/// Resolves the CLI layer (flags+env) and the optional config file into a [`RunConfig`].
pub fn resolve(
    cli: RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<RunConfig, UsageError> {
    let file = match &cli.config {
        Some(p) => read_file(p)?,
        None => (RunArgs::default(), Vec::new(), Vec::new()),
    };
    resolve_with(cli, env, file)
}

/// [`resolve`] with the file's layers given (a study's, [`crate::study`]).
pub(crate) fn resolve_with(
    mut cli: RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
    file: FileLayers,
) -> Result<RunConfig, UsageError> {
    let local_child =
        crate::local::apply_child(&mut cli, env).map_err(|e| UsageError(e.to_string()))?;
    let (file_top, file_fleets, scenarios) = file;
    let given = crate::settings::given_fields(&[&cli, &file_top]);
    // A fleet section's own reconnect or dial settings count as given too.
    let in_fleets = crate::settings::given_fields(&file_fleets.iter().collect::<Vec<_>>());
    let dial_given = given
        .iter()
        .chain(&in_fleets)
        .any(|f| matches!(*f, "reconnect" | "max_dialing"));
    let (mut top, mut layers) = stack(cli, file_top, file_fleets)?;
    if let Some(n) = crate::steps::fleet_agents(&top, given.contains(&"agents"))? {
        top.agents = Some(n);
        layers.iter_mut().for_each(|l| l.agents = Some(n));
    }
    let (shard, shard_from) = match crate::shard::resolve(top.shard, env)? {
        Some((s, from)) => (Some(s), from),
        None => (None, None),
    };
    let (duration, hlog_interval) = run_times(&top)?;
    let mut fleets = plan_fleets(&layers, shard, &scenarios, duration)?;
    // Laid out on the whole fleet's ramp, before a local process takes its share.
    let steps = crate::steps::plan(&top, &mut fleets)?;
    if local_child && let Some(s) = shard {
        share_rates(&mut fleets, s);
    }
    let embedded_servers = top.embedded_servers.unwrap_or(1);
    failover_flags(&top, embedded_servers, fleets.iter().any(|f| f.embedded))?;
    let observe = crate::observing::plan(&top, &fleets, shard)?;
    let effective = effective_settings(&top, &layers, &fleets);
    let mut notes = crate::settings::unread(&given, &fleets);
    if dial_given {
        notes.extend(fleets.iter().filter_map(crate::scenario::capped_burst));
    }
    let secs = |v: Option<Secs>| v.map(|s| s.0).unwrap_or_default();
    Ok(RunConfig {
        fleets,
        duration,
        grace: secs(top.shutdown_grace),
        summary: top.summary.clone(),
        hlog: top.hlog.clone(),
        hlog_interval,
        metrics_addr: top.metrics_addr,
        asserts: top.asserts.clone(),
        shard,
        shard_from,
        seed: top.seed,
        quiet: top.quiet.unwrap_or(false),
        progress_every: secs(top.progress_every),
        threads: top.threads,
        embedded_check_interval: secs(top.embedded_check_interval),
        embedded_password_cost: password_cost(
            "--embedded-password-cost",
            top.embedded_password_cost,
        )?,
        embedded_servers,
        server_downs: top.server_downs.clone(),
        report_html: top.report_html.clone(),
        verbose: top.verbose.unwrap_or(false),
        observe,
        processes: top.processes,
        local_child,
        effective,
        study: None,
        notes,
        steps,
    })
}

/// The layers stacked: the run's top layer (flags and env over the file's
/// top level over the defaults), and one layer per fleet (flags and env
/// over its `[[fleet]]` section over the file's top level; the top layer
/// alone without sections), each with its Consul wire filled in.
fn stack(
    cli: RunArgs,
    file_top: RunArgs,
    file_fleets: Vec<RunArgs>,
) -> Result<(RunArgs, Vec<RunArgs>), UsageError> {
    if !file_fleets.is_empty()
        && (cli.kind.is_some() || cli.agents.is_some() || !cli.targets.is_empty())
    {
        return usage(
            "--kind/--agents/--target cannot be combined with [[fleet]] sections in --config; set them per section",
        );
    }
    boot_or_ramp(&overlay(cli.clone(), file_top.clone()))?;
    for section in &file_fleets {
        boot_or_ramp(&overlay(
            cli.clone(),
            overlay(section.clone(), file_top.clone()),
        ))?;
    }
    let file_top = overlay(file_top, defaults());
    let mut top = overlay(cli.clone(), file_top.clone());
    fill_kind(&mut top);
    // Sections beat the file's top level; flags and env beat both.
    let mut layers: Vec<RunArgs> = if file_fleets.is_empty() {
        vec![top.clone()]
    } else {
        file_fleets
            .into_iter()
            .map(|section| overlay(cli.clone(), overlay(section, file_top.clone())))
            .collect()
    };
    layers.iter_mut().for_each(fill_kind);
    Ok((top, layers))
}

/// The run's duration and hlog interval, checked (and its thread count).
fn run_times(top: &RunArgs) -> Result<(Option<Duration>, Duration), UsageError> {
    let duration = top.duration.map(|d| d.0);
    if duration == Some(Duration::ZERO) {
        return usage("--duration must be greater than zero");
    }
    let hlog_interval = top.hlog_interval.map(|s| s.0).unwrap_or_default();
    if hlog_interval < Duration::from_secs(1) {
        return usage("--hlog-interval must be at least 1s");
    }
    if top.threads == Some(0) {
        return usage("--threads must be at least 1");
    }
    Ok((duration, hlog_interval))
}

/// One plan per fleet layer, its scenario applied; with several fleets a
/// refusal names its `[[fleet]]` section.
fn plan_fleets(
    layers: &[RunArgs],
    shard: Option<Shard>,
    scenarios: &[ScenarioSection],
    duration: Option<Duration>,
) -> Result<Vec<FleetPlan>, UsageError> {
    let mut fleets = Vec::new();
    for (n, layer) in layers.iter().enumerate() {
        let plan = resolve_fleet(layer, shard)
            .and_then(|mut plan| {
                crate::scenario::apply(&mut plan, layer, scenarios, duration)?;
                Ok(plan)
            })
            .map_err(|e| {
                if layers.len() > 1 {
                    UsageError(format!("[[fleet]] #{}: {}", n + 1, e.0))
                } else {
                    e
                }
            })?;
        fleets.push(plan);
    }
    Ok(fleets)
}

/// A local process runs a slice of one run: the whole run ramps and dials
/// at the rates asked for, so each process at its share.
fn share_rates(fleets: &mut [FleetPlan], s: Shard) {
    for plan in fleets {
        let f = &mut plan.fleet;
        f.ramp = f
            .ramp
            .map(|r| agent_sim_fleet::Rate::per_second(r.as_per_second() / s.count as f64));
        f.max_dialing = f.max_dialing.div_ceil(s.count as usize).max(1);
    }
}

/// A layer (before the defaults) that sets both a boot window and a ramp.
fn boot_or_ramp(a: &RunArgs) -> Result<(), UsageError> {
    if a.boot_window.is_some() && a.ramp.is_some() {
        return usage(
            "--boot-window and --ramp both set: choose one (--boot-window starts each agent at a \
             random moment of the window, --ramp paces them)",
        );
    }
    Ok(())
}

/// What depends on the fleet's kind, filled in once the layers are stacked:
/// the Consul wire and the reconnect settings.
fn fill_kind(a: &mut RunArgs) {
    fill_wire(a);
    let b = crate::defaults::kind_backoff(a.kind.unwrap_or_default());
    a.reconnect.get_or_insert(b.policy());
    // A cap set below the kind's smallest delay lowers that too.
    let min = a.reconnect_max.map_or(b.min(), |max| b.min().min(max.0));
    a.reconnect_min.get_or_insert(Secs(min));
    a.reconnect_max.get_or_insert(Secs(b.max()));
}

/// The Consul wire follows the watch mode unless set; filled in before the
/// settings are read, so that the summary names the wire the run used.
fn fill_wire(a: &mut RunArgs) {
    if a.consul_agent.is_none() {
        let watch = a.watch.unwrap_or_default();
        a.consul_agent = Some(agent_sim_consul::modes::AgentWire::for_watch(watch));
    }
    if a.consul_agent != Some(agent_sim_consul::modes::AgentWire::Client) {
        // Only a client agent gossips.
        a.gossip = Some(false);
    } else if a.gossip.is_none() {
        a.gossip = Some(true);
    }
}

/// `--embedded-servers` and `--server-down` act on the embedded backend:
/// refused with a target (against real servers, the user stops one), and a
/// server down must be one of the run's.
fn failover_flags(top: &RunArgs, servers: usize, embedded: bool) -> Result<(), UsageError> {
    if top.embedded_servers.is_some() && !embedded {
        return usage(
            "--embedded-servers: the run has --target (against real servers, name them all in \
             --target)",
        );
    }
    if servers == 0 || servers > 16 {
        return usage("--embedded-servers: 1 to 16");
    }
    for d in &top.server_downs {
        if !embedded {
            return usage(
                "--server-down stops an embedded server: with --target, stop the real server \
                 yourself (the run measures the failover the same way)",
            );
        }
        if d.server >= servers {
            return usage(format!(
                "--server-down server={}: the run has {servers} embedded server(s), numbered from 0 \
                 (--embedded-servers)",
                d.server
            ));
        }
    }
    Ok(())
}

/// One fleet from its fully layered arguments (defaults included).
/// Flags one kind reads given to another: refused, not ignored.
fn only_for_kind(a: &RunArgs) -> Result<(), UsageError> {
    if !matches!(a.kind.unwrap_or_default(), Kind::ConsulDataplane)
        && let Some(flag) = [
            (a.adopt.is_some(), "--adopt"),
            (a.adopt_node.is_some(), "--adopt-node"),
            (a.watch_servers == Some(true), "--watch-servers"),
        ]
        .into_iter()
        .find_map(|(set, flag)| set.then_some(flag))
    {
        return usage(format!("{flag}: only --kind consul-dataplane reads it"));
    }
    if !matches!(a.kind.unwrap_or_default(), Kind::Consul) {
        if a.vault_nodes.is_some_and(|n| n > 0) {
            return usage(
                "--vault-nodes: only --kind consul reads it (Vault stores in a Consul cluster)",
            );
        }
        if a.auto_encrypt == Some(true) {
            return usage("--auto-encrypt: only --kind consul reads it (client agents ask for it)");
        }
        if a.proxies_per_agent.is_some_and(|n| n > 0) {
            return usage(
                "--proxies-per-agent: only --kind consul reads it (a dataplane sidecar is the proxy)",
            );
        }
    }
    Ok(())
}

fn resolve_fleet(a: &RunArgs, shard: Option<Shard>) -> Result<FleetPlan, UsageError> {
    let total = a.agents.unwrap_or(DEFAULT_AGENTS);
    if total == 0 {
        return usage("--agents must be at least 1");
    }
    let (first_index, agents) = match shard {
        Some(s) => s.slice(total),
        None => (0, total),
    };
    if agents == 0 {
        return usage(format!(
            "--agents {total} leaves shard {} without agents",
            shard.map(|s| s.to_string()).unwrap_or_default()
        ));
    }
    let mut sources: Vec<IpAddr> = a.source_addrs.iter().flat_map(AddrRange::addrs).collect();
    if let Some(s) = shard
        && sources.len() as u64 >= s.count
    {
        let (start, len) = s.slice(sources.len() as u64);
        sources = sources[start as usize..(start + len) as usize].to_vec();
    }
    let mut fleet = FleetConfig {
        agents,
        first_index,
        source_addrs: sources,
        ..FleetConfig::default()
    };
    if let Some(r) = a.ramp {
        fleet.ramp = r.rate();
    }
    if let Some(w) = a.boot_window {
        fleet.ramp = None;
        fleet.boot_window = Some(w.0);
    }
    if let Some(n) = a.max_dialing {
        fleet.max_dialing = n;
    }
    if let Some(f) = a.fail_fast {
        fleet.fail_fast = f;
    }
    if let Some(d) = a.give_up_after {
        fleet.give_up_after = d.0;
    }
    fleet.backoff = Backoff::new(
        a.reconnect_min.map_or(fleet.backoff.min(), |d| d.0),
        a.reconnect_max.map_or(fleet.backoff.max(), |d| d.0),
    );
    fleet.validate().map_err(|e| refused(e.field, &e.reason))?;
    let embedded = a.targets.is_empty();
    let protocol = match a.kind.unwrap_or_default() {
        Kind::Sensu => {
            let c = sensu_config(a);
            c.validate().map_err(sensu_refused)?;
            Protocol::Sensu(c)
        }
        Kind::Consul => {
            let mut c = consul_config(a, shard);
            c.cluster_size = total;
            c.validate().map_err(consul_refused)?;
            if let Err(reason) = c.connect.check_rotation(embedded, c.agent, c.sidecars) {
                return usage(reason.to_string());
            }
            if let Err(reason) = c.connect.check_auto_encrypt(c.agent) {
                return usage(reason.to_string());
            }
            Protocol::Consul(Box::new(c))
        }
        Kind::ConsulDataplane => {
            let c = dataplane_config(a, shard);
            c.validate().map_err(dataplane_refused)?;
            Protocol::Dataplane(c)
        }
    };
    only_for_kind(a)?;
    Ok(FleetPlan {
        protocol,
        fleet,
        total_agents: total,
        embedded,
    })
}

/// Sets `$dst` from an `Option` of the layered arguments when it is set.
macro_rules! set {
    ($dst:expr, $src:expr) => {
        if let Some(v) = $src.clone() {
            $dst = v.into();
        }
    };
}

/// Maps the flags onto [`SensuConfig`] (its `validate` holds the rules).
fn sensu_config(a: &RunArgs) -> SensuConfig {
    let mut c = SensuConfig::default();
    if !a.targets.is_empty() {
        c.targets = a.targets.clone();
    }
    set!(c.namespace, a.namespace);
    set!(c.user, a.user);
    set!(c.password, a.password);
    if let Some(l) = &a.subscriptions {
        c.subscriptions = l.0.clone();
    }
    set!(c.encoding, a.encoding);
    if let Some(d) = a.keepalive_interval {
        c.keepalive_interval = d.0;
    }
    if let Some(d) = a.timer_tick {
        c.timer_tick = d.0;
    }
    set!(c.keepalive_warning_timeout, a.keepalive_warning_timeout);
    set!(c.keepalive_critical_timeout, a.keepalive_critical_timeout);
    set!(c.name_prefix, a.name_prefix);
    set!(c.deregister, a.deregister);
    c.event_rate = a.event_rate;
    set!(c.event_output_size, a.event_output_size);
    c.ca_file = a.ca_file.clone();
    set!(c.insecure_skip_tls_verify, a.insecure_skip_tls_verify);
    c.cert_file = a.cert_file.clone();
    c.key_file = a.key_file.clone();
    c
}

/// Maps the flags onto [`DataplaneConfig`] (its `validate` holds the rules):
/// the Consul flags it shares (targets are the gRPC ports), and its own.
fn dataplane_config(a: &RunArgs, shard: Option<Shard>) -> DataplaneConfig {
    let c = consul_config(a, shard);
    let defaults = DataplaneConfig::default();
    let mut d = DataplaneConfig {
        // The same connection, but the gRPC ports when none are given.
        conn: Connection {
            targets: if a.targets.is_empty() {
                defaults.conn.targets.clone()
            } else {
                c.conn.targets
            },
            ..c.conn
        },
        service_name: c.service_name,
        keep_registrations: c.keep_registrations,
        probe: c.probe,
        ..defaults
    };
    if let Some(l) = &a.upstreams {
        d.upstreams = l.0.clone();
    }
    if a.adopt.is_some() || a.adopt_node.is_some() {
        d.adopt = Some(Adopt {
            proxy_id: a.adopt.clone().unwrap_or_default(),
            node: a.adopt_node.clone().unwrap_or_default(),
        });
    }
    set!(d.watch_servers, a.watch_servers);
    if let Some(v) = &a.envoy_version {
        d.envoy_version = v.clone().into_option();
    }
    d
}

/// The Vault servers of the flags, when `--vault-nodes` is above 0.
fn vault_config(a: &RunArgs) -> Option<agent_sim_consul::vault::VaultConfig> {
    let nodes = a.vault_nodes.filter(|n| *n > 0)?;
    let mut v = agent_sim_consul::vault::VaultConfig {
        nodes,
        bursts: a.vault_bursts.clone(),
        ..Default::default()
    };
    if let Some(r) = a.vault_tokens {
        v.tokens_per_s = r.as_per_second();
    }
    if let Some(d) = a.vault_token_ttl {
        v.token_ttl = d.0;
    }
    if let Some(r) = a.vault_renew {
        v.renew = r;
    }
    set!(v.path, a.vault_path);
    v.stop_active_at = a.vault_stop_active_at.map(|d| d.0);
    v.kill_active_at = a.vault_kill_active_at.map(|d| d.0);
    Some(v)
}

/// The proxies behind the Consul agents (`--proxies-per-agent`): the flags
/// over the library's defaults.
fn proxy_config(a: &RunArgs) -> agent_sim_consul::proxy::ProxyConfig {
    let mut p = agent_sim_consul::proxy::ProxyConfig::default();
    set!(p.per_agent, a.proxies_per_agent);
    if let Some(d) = a.proxy_coalesce {
        p.coalesce = d.0;
    }
    set!(p.update_rate, a.proxy_update_rate);
    p
}

/// The client agents' gossip (`--gossip-*`; the join derived from the
/// `targets` unless given).
fn gossip_config(a: &RunArgs, targets: &[String]) -> agent_sim_consul::gossip::GossipConfig {
    agent_sim_consul::gossip::GossipConfig {
        join: if a.gossip_join.is_empty() {
            agent_sim_consul::gossip::derived_join(targets)
        } else {
            a.gossip_join.clone()
        },
        join_given: !a.gossip_join.is_empty(),
        bind: a.gossip_bind.clone(),
        keys: a
            .gossip_key
            .iter()
            .flat_map(|k| k.split(','))
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect(),
        label: a.gossip_label.clone().unwrap_or_default(),
        timings: agent_sim_gossip::Timings::default(),
    }
}

/// Maps the flags onto [`ConsulConfig`] (its `validate` holds the rules).
fn consul_config(a: &RunArgs, shard: Option<Shard>) -> ConsulConfig {
    let mut c = ConsulConfig::default();
    if !a.targets.is_empty() {
        c.conn.targets = a.targets.iter().map(|t| t.trim().to_string()).collect();
        // Derived from the first target unless given.
        c.conn.http_target = String::new();
    }
    set!(c.conn.http_target, a.http_target);
    c.conn.token = a.token.clone().filter(|t| !t.is_empty());
    c.acl_tokens = a.acl_tokens.clone().map(Box::new);
    if let Some(r) = a.acl_token_rate {
        c.acl_token_rate = r.as_per_second();
    }
    if let Some(l) = &a.upstreams {
        c.upstreams = l.0.clone();
    }
    set!(c.conn.name_prefix, a.name_prefix);
    if let Some(no) = a.no_register {
        c.register = !no;
    }
    set!(c.service_name, a.service_name);
    set!(c.services_per_agent, a.services_per_agent);
    c.service_chain = a.service_chain.clone();
    set!(c.sidecars, a.sidecars);
    set!(c.connect.leaf_certs, a.leaf_certs);
    c.connect.rotate_at = a.rotate_ca_at.map(|d| d.0);
    set!(c.connect.allow_rotation, a.allow_ca_rotation);
    set!(c.connect.auto_encrypt, a.auto_encrypt);
    set!(c.keep_registrations, a.keep_registrations);
    if let Some(t) = a.session_ttl {
        c.session_ttl = t.into_option().map(|d| d.0);
    }
    if let Some(t) = a.anti_entropy {
        c.anti_entropy = t.into_option().map(|d| d.0);
    }
    c.flap_rate = a.flap_rate;
    if let Some(p) = a.probe {
        c.probe.set_kinds(p.into_option());
    }
    if let Some(d) = a.probe_every {
        c.probe.every = d.0;
    }
    c.probe.timeout = a.probe_timeout.map(|d| d.0);
    c.probe.service = a.probe_service.clone();
    // Shard 0 makes the changes every shard's agents see; a shard on
    // embedded servers (no --target: a local process of a demo run) has a
    // cluster of its own, which no other shard changes, so it makes its own.
    c.probe.own_cluster = shard.is_some() && a.targets.is_empty();
    c.probe.controller = shard.is_none_or(|s| s.index == 0) || c.probe.own_cluster;
    set!(c.watch, a.watch);
    if let Some(d) = a.rebalance_min {
        c.rebalance_min = d.0;
    }
    c.agent = a
        .consul_agent
        .unwrap_or(agent_sim_consul::modes::AgentWire::for_watch(c.watch));
    if a.gossip.unwrap_or(true) && c.agent == agent_sim_consul::modes::AgentWire::Client {
        c.gossip = Some(gossip_config(a, &c.conn.targets));
    }
    c.seed = a.seed_service.clone().map(Box::new);
    if let Some(d) = a.change_every {
        c.probe.every = d.0;
        c.probe.meta = true;
    }
    if let Some(d) = a.blocking_wait {
        c.blocking_wait = d.0;
    }
    c.watch_kv = a.watch_kv.clone();
    c.proxies = Box::new(proxy_config(a));
    c.vault = vault_config(a).map(Box::new);
    // TLS when any TLS setting is given, or the HTTP API is https://.
    let insecure = a.insecure_skip_tls_verify.unwrap_or(false);
    let wants_tls = a.ca_file.is_some()
        || insecure
        || a.cert_file.is_some()
        || a.key_file.is_some()
        || a.tls_server_name.is_some()
        || c.conn.http_target.starts_with("https://");
    if wants_tls {
        c.conn.tls = Some(ConsulTls {
            ca_file: a.ca_file.clone(),
            insecure_skip_verify: insecure,
            cert_file: a.cert_file.clone(),
            key_file: a.key_file.clone(),
            server_name: a.tls_server_name.clone(),
        });
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults::shown_defaults;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// `text` as the config file `name` in a fresh folder of this test
    /// (`tag`): the folder (to remove) and the file.
    fn toml_file(tag: &str, name: &str, text: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("agent-sim-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    fn args(f: impl FnOnce(&mut RunArgs)) -> RunArgs {
        let mut a = RunArgs::default();
        f(&mut a);
        a
    }

    #[test]
    fn defaults_make_an_embedded_sensu_run() {
        let c = resolve(RunArgs::default(), &no_env).unwrap();
        assert_eq!(c.kind(), "sensu");
        assert!(c.embedded());
        assert_eq!(c.fleets[0].fleet.agents, 100);
        let Protocol::Sensu(s) = &c.fleets[0].protocol else {
            panic!()
        };
        assert_eq!(s.keepalive_interval, Duration::from_secs(20));
    }

    #[test]
    fn bad_values_are_one_line_usage_errors() {
        for (a, needle) in [
            (args(|a| a.agents = Some(0)), "--agents"),
            (args(|a| a.targets = vec!["http://x:1".into()]), "--target"),
            (args(|a| a.targets = vec!["nohost".into()]), "--target"),
            (
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.session_ttl = Some("500ms".parse().unwrap())
                }),
                "--session-ttl",
            ),
            (
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.probe_every = Some("5s".parse().unwrap());
                    a.probe_timeout = Some("6s".parse().unwrap())
                }),
                "--probe-timeout",
            ),
            (
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.targets = vec!["10.0.0.1:8300".into()];
                    a.sidecars = Some(true);
                    a.rotate_ca_at = Some("30s".parse().unwrap())
                }),
                "without --allow-ca-rotation",
            ),
            (
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.rotate_ca_at = Some("30s".parse().unwrap())
                }),
                "it needs --sidecars",
            ),
            (
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.consul_agent = Some(agent_sim_consul::modes::AgentWire::Api);
                    a.auto_encrypt = Some(true)
                }),
                "--auto-encrypt is a client agent's boot step",
            ),
        ] {
            let e = resolve(a, &no_env).unwrap_err().0;
            assert!(e.contains(needle), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn shards_slice_agents_and_take_the_index_from_the_environment() {
        let env = |k: &str| (k == "JOB_COMPLETION_INDEX").then(|| "2".to_string());
        let c = resolve(
            args(|a| {
                a.agents = Some(10);
                a.shard = Some("4".parse().unwrap())
            }),
            &env,
        )
        .unwrap();
        assert_eq!(c.shard, Some(Shard { index: 2, count: 4 }));
        let from = c.shard_from.as_ref().map(ToString::to_string);
        assert_eq!(
            from.as_deref(),
            Some("JOB_COMPLETION_INDEX=2 (Kubernetes Indexed Job)")
        );
        assert_eq!(
            (c.fleets[0].fleet.first_index, c.fleets[0].fleet.agents),
            (5, 2)
        );
        let total: u64 = (0..3)
            .map(|i| Shard { index: i, count: 3 }.slice(10).1)
            .sum();
        assert_eq!(total, 10);
    }

    #[test]
    fn config_file_is_under_flags_and_can_declare_fleets() {
        let (dir, p) = toml_file(
            "cfg",
            "run.toml",
            "duration = \"30s\"\nramp = \"100/s\"\n[[fleet]]\nkind = \"sensu\"\nagents = 20\nkeepalive-interval = \"5s\"\n[[fleet]]\nkind = \"consul\"\nagents = 5\nupstreams = \"web\"\n",
        );
        let c = resolve(
            args(|a| {
                a.config = Some(p.clone());
                a.duration = Some("2s".parse().unwrap())
            }),
            &no_env,
        )
        .unwrap();
        assert_eq!(c.duration, Some(Duration::from_secs(2)));
        assert_eq!(c.kind(), "mixed");
        assert_eq!(c.fleets.len(), 2);
        assert_eq!(c.fleets[0].fleet.agents, 20);
        assert_eq!(c.fleets[1].fleet.agents, 5);
        assert_eq!(
            c.fleets[0].fleet.ramp,
            Some(agent_sim_fleet::Rate::per_second(100.0))
        );

        std::fs::write(&p, "agentz = 3\n").unwrap();
        let e = resolve(args(|a| a.config = Some(p.clone())), &no_env)
            .unwrap_err()
            .0;
        assert!(e.contains("agentz"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn kv_watches_come_from_flags_or_toml_and_a_probe_outside_them_is_refused() {
        let (dir, p) = toml_file(
            "kv",
            "kv.toml",
            "kind = \"consul\"\nprobe = \"kv\"\nwatch-kv = [\"agent-sim/\", \"app/{i%4}/\"]\n",
        );
        let c = resolve(args(|a| a.config = Some(p.clone())), &no_env).unwrap();
        let Protocol::Consul(cc) = &c.fleets[0].protocol else {
            panic!()
        };
        assert_eq!(cc.watch_kv, ["agent-sim/", "app/{i%4}/"]);
        assert_eq!(cc.probe.kind, Some(agent_sim_consul::ProbeKind::Kv));
        let e = resolve(
            args(|a| {
                a.config = Some(p.clone());
                a.watch_kv = vec!["config/".into()];
            }),
            &no_env,
        )
        .unwrap_err()
        .0;
        assert!(
            e.starts_with("--watch-kv: --probe kv changes agent-sim/probe/kv"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn two_probe_kinds_come_from_the_flag_or_toml_and_a_bad_pair_is_refused() {
        let (dir, p) = toml_file(
            "probes",
            "probes.toml",
            "kind = \"consul\"\nprobe = \"catalog,intentions\"\nprobe-every = \"20s\"\n",
        );
        let c = resolve(args(|a| a.config = Some(p.clone())), &no_env).unwrap();
        let Protocol::Consul(cc) = &c.fleets[0].protocol else {
            panic!()
        };
        use agent_sim_consul::ProbeKind;
        assert_eq!(cc.probe.kind, Some(ProbeKind::Catalog));
        assert_eq!(cc.probe.also, Some(ProbeKind::Intentions));
        assert_eq!(cc.probe.timeout(), Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&dir);
        // The flag says the same; a pair other than these two is refused.
        let flag = |kinds: &str| {
            resolve(
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.probe = Some(kinds.parse().unwrap());
                }),
                &no_env,
            )
        };
        let Protocol::Consul(cc) = &flag("intentions,catalog").unwrap().fleets[0].protocol else {
            panic!()
        };
        assert_eq!(cc.probe.also, Some(ProbeKind::Intentions));
        assert!(
            "kv,catalog"
                .parse::<crate::values::Toggle<agent_sim_consul::ProbeKinds>>()
                .is_err()
        );
    }

    #[test]
    fn a_setting_no_fleet_reads_is_named_in_a_note() {
        let run = |kind: Kind| {
            resolve(
                args(|a| {
                    a.kind = Some(kind);
                    a.service_chain = Some("10,83,85".parse().unwrap());
                    a.keepalive_interval = Some("20s".parse().unwrap());
                }),
                &no_env,
            )
            .unwrap()
            .notes
        };
        assert_eq!(
            run(Kind::Sensu),
            [
                "--service-chain (config key service-chain) is a setting of Consul \
              (docs/consul.md) fleets; this run has sensu only: ignored"
            ]
        );
        let consul = run(Kind::Consul);
        assert_eq!(consul.len(), 1, "{consul:?}");
        assert!(consul[0].starts_with("--keepalive-interval (config key keepalive-interval)"));
        // The defaults are no one's doing: nothing given, nothing named.
        let quiet = resolve(args(|a| a.kind = Some(Kind::Sensu)), &no_env).unwrap();
        assert!(quiet.notes.is_empty(), "{:?}", quiet.notes);
        // Nor do the reconnect and dial defaults warn of each other (a
        // Sensu fleet past --max-dialing comes back in one burst): only a
        // run that set either hears of it.
        let big = |f: fn(&mut RunArgs)| {
            resolve(
                args(|a| {
                    a.agents = Some(2000);
                    f(a)
                }),
                &no_env,
            )
            .unwrap()
            .notes
        };
        assert!(big(|_| ()).is_empty(), "{:?}", big(|_| ()));
        let set = big(|a| a.max_dialing = Some(100));
        assert_eq!(set.len(), 1, "{set:?}");
        assert!(set[0].contains("--max-dialing 100 lets only that many of its 2000"));
    }

    #[test]
    fn a_short_probe_interval_shortens_the_default_timeout() {
        let c = resolve(
            args(|a| {
                a.kind = Some(Kind::Consul);
                a.probe_every = Some("5s".parse().unwrap())
            }),
            &no_env,
        )
        .unwrap();
        let Protocol::Consul(cc) = &c.fleets[0].protocol else {
            panic!()
        };
        assert_eq!(cc.probe.timeout(), Duration::from_secs(5));
    }

    #[test]
    fn the_streaming_vs_blocking_config_seeds_and_changes_metadata() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../configs/streaming-vs-blocking.toml"
        );
        let c = resolve(
            args(|a| {
                a.config = Some(path.into());
                a.watch = Some("blocking".parse().unwrap());
            }),
            &no_env,
        )
        .unwrap();
        let Protocol::Consul(cc) = &c.fleets[0].protocol else {
            panic!()
        };
        assert_eq!(cc.watch, agent_sim_consul::watch::WatchMode::Blocking);
        assert_eq!(
            cc.seed.as_ref().map(|s| s.to_string()).as_deref(),
            Some("big=5000")
        );
        assert!(cc.probe.meta);
        assert_eq!(cc.probe.every, Duration::from_secs(1));
        assert_eq!(cc.probe.timeout(), Duration::from_secs(1));
        assert_eq!(cc.probe.service.as_deref(), Some("big"));
        assert_eq!(c.effective["watch"], "blocking");
        assert_eq!(c.effective["seed-service"], "big=5000");
        // --change-every is the catalog probe's: with the probe off it is refused.
        let refused = resolve(
            args(|a| {
                a.kind = Some(Kind::Consul);
                a.change_every = Some("1s".parse().unwrap());
                a.probe = Some("off".parse().unwrap());
            }),
            &no_env,
        );
        assert!(refused.is_err());
    }

    #[test]
    fn the_wire_follows_the_watch_mode_unless_set_and_is_named() {
        use agent_sim_consul::modes::AgentWire;
        let wire = |watch: &str, set: Option<&str>| {
            let c = resolve(
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.watch = Some(watch.parse().unwrap());
                    a.consul_agent = set.map(|w| w.parse().unwrap());
                }),
                &no_env,
            )
            .unwrap();
            let Protocol::Consul(cc) = &c.fleets[0].protocol else {
                panic!()
            };
            (cc.agent, c.effective["consul-agent"].clone())
        };
        assert_eq!(
            wire("streaming", None),
            (AgentWire::Client, "client".into())
        );
        assert_eq!(wire("blocking", None), (AgentWire::Client, "client".into()));
        assert_eq!(wire("http", None), (AgentWire::Api, "api".into()));
        assert_eq!(
            wire("http", Some("client")),
            (AgentWire::Client, "client".into())
        );
        assert_eq!(
            wire("streaming", Some("api")),
            (AgentWire::Api, "api".into())
        );
    }

    #[test]
    fn source_address_ranges_expand_and_split_over_shards() {
        let c = resolve(
            args(|a| {
                a.source_addrs = vec![
                    "127.0.0.2-127.0.0.4".parse().unwrap(),
                    "127.0.0.9".parse().unwrap(),
                ];
                a.shard = Some("1/2".parse().unwrap());
            }),
            &no_env,
        )
        .unwrap();
        assert_eq!(
            c.fleets[0].fleet.source_addrs,
            vec![
                "127.0.0.4".parse::<IpAddr>().unwrap(),
                "127.0.0.9".parse().unwrap()
            ]
        );
    }

    #[test]
    fn a_shard_on_embedded_servers_makes_its_own_probe_changes() {
        let controller = |targets: Vec<String>| {
            let c = resolve(
                args(|a| {
                    a.kind = Some(Kind::ConsulDataplane);
                    a.targets = targets;
                    a.shard = Some("1/3".parse().unwrap());
                }),
                &no_env,
            )
            .unwrap();
            let Protocol::Dataplane(d) = &c.fleets[0].protocol else {
                panic!()
            };
            (d.probe.controller, d.probe.own_cluster)
        };
        // Shard 1 of a cluster others share watches shard 0's changes; on
        // servers of its own (a local process of a demo run) nobody else
        // changes its catalog, and its change ids are its cluster's alone.
        assert_eq!(controller(vec!["10.0.0.1:8502".into()]), (false, false));
        assert_eq!(controller(Vec::new()), (true, true));
    }

    #[test]
    fn rules_come_from_the_protocol_crates_and_name_the_flag() {
        for (a, needle) in [
            (
                args(|a| a.keepalive_critical_timeout = Some(10)),
                "--keepalive-critical-timeout",
            ),
            (
                args(|a| a.subscriptions = Some("a b".parse().unwrap())),
                "--subscriptions",
            ),
            (
                args(|a| a.name_prefix = Some("a b".into())),
                "--name-prefix",
            ),
            (
                args(|a| a.keepalive_interval = Some("500ms".parse().unwrap())),
                "--keepalive-interval",
            ),
            (
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.anti_entropy = Some("500ms".parse().unwrap());
                }),
                "--anti-entropy",
            ),
            (
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.probe_service = Some("svc-{i}".into());
                }),
                "--probe-service",
            ),
            (
                args(|a| {
                    a.kind = Some(Kind::Consul);
                    a.targets = vec!["nohost".into()];
                }),
                "--target",
            ),
            (
                args(|a| {
                    a.reconnect_min = Some("10s".parse().unwrap());
                    a.reconnect_max = Some("1s".parse().unwrap());
                }),
                "--reconnect-max",
            ),
            (args(|a| a.max_dialing = Some(0)), "--max-dialing"),
        ] {
            let e = resolve(a, &no_env).unwrap_err().0;
            assert!(e.starts_with(needle), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_later_layer_turns_a_flag_off_again() {
        let (dir, p) = toml_file(
            "off",
            "run.toml",
            "deregister = true\nquiet = true\nsession-ttl = \"off\"\n",
        );
        let sensu = |c: &RunConfig| match &c.fleets[0].protocol {
            Protocol::Sensu(s) => s.clone(),
            _ => panic!(),
        };
        let c = resolve(args(|a| a.config = Some(p.clone())), &no_env).unwrap();
        assert!(sensu(&c).deregister && c.quiet);
        let c = resolve(
            args(|a| {
                a.config = Some(p.clone());
                a.deregister = Some(false);
                a.quiet = Some(false);
            }),
            &no_env,
        )
        .unwrap();
        assert!(!sensu(&c).deregister && !c.quiet);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_effective_settings_name_every_layer_and_redact_secrets() {
        let c = resolve(
            args(|a| {
                a.kind = Some(Kind::Consul);
                a.agents = Some(7);
                a.token = Some("s3cr3t-token".into());
                a.password = Some("P@ss".into());
                a.targets = vec!["127.0.0.1:8300".into()];
                a.asserts = vec!["errors.total == 0".parse().unwrap()];
            }),
            &no_env,
        )
        .unwrap();
        let e = &c.effective;
        assert_eq!(e["agents"], 7);
        assert_eq!(e["kind"], "consul");
        assert_eq!(e["token"], "<redacted>");
        assert_eq!(e["target"], serde_json::json!(["127.0.0.1:8300"]));
        assert_eq!(e["assert"], serde_json::json!(["errors.total == 0"]));
        assert_eq!(e["session-ttl"], "30s");
        assert_eq!(e["quiet"], false);
        // The wire is named though not set: it follows the watch mode.
        assert_eq!(e["consul-agent"], "client");
        assert!(
            !e.contains_key("keepalive-interval"),
            "a Sensu setting: {e:?}"
        );
        assert!(!e.contains_key("password"), "a Sensu setting");
        assert!(!e.contains_key("embedded-check-interval"), "not a demo run");
        let text = serde_json::to_string(e).unwrap();
        assert!(!text.contains("s3cr3t") && !text.contains("P@ss"), "{text}");
    }

    #[test]
    fn a_dataplane_run_lists_the_consul_settings_it_reads_and_its_own() {
        let c = resolve(
            args(|a| {
                a.kind = Some(Kind::ConsulDataplane);
                a.token = Some("s3cr3t-token".into());
                a.targets = vec!["127.0.0.1:8502".into()];
            }),
            &no_env,
        )
        .unwrap();
        let e = &c.effective;
        assert_eq!(e["kind"], "consul-dataplane");
        assert_eq!(e["token"], "<redacted>");
        assert!(e.contains_key("watch-servers"), "its own flag: {e:?}");
        assert!(
            e.contains_key("probe-every"),
            "a Consul flag it reads: {e:?}"
        );
        assert!(
            !e.contains_key("session-ttl") && !e.contains_key("keepalive-interval"),
            "flags it does not read: {e:?}"
        );
    }

    #[test]
    fn several_fleets_list_their_own_settings() {
        let (dir, p) = toml_file(
            "eff",
            "mixed.toml",
            "duration = \"30s\"\n[[fleet]]\nkind = \"sensu\"\nagents = 20\nkeepalive-interval = \"5s\"\n[[fleet]]\nkind = \"consul\"\nagents = 5\nramp = \"all\"\n",
        );
        let c = resolve(args(|a| a.config = Some(p.clone())), &no_env).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let e = &c.effective;
        assert_eq!(e["duration"], "30s");
        assert_eq!(e["embedded-check-interval"], "10s", "a demo run");
        assert!(!e.contains_key("kind") && !e.contains_key("keepalive-interval"));
        let f = e["fleet"].as_array().unwrap();
        assert_eq!(
            (f[0]["kind"].clone(), f[0]["agents"].clone()),
            ("sensu".into(), 20.into())
        );
        assert_eq!(f[0]["keepalive-interval"], "5s");
        assert_eq!(f[0]["password"], "<redacted>");
        assert!(f[0].get("upstreams").is_none() && f[0].get("ramp").is_none());
        assert_eq!(f[1]["ramp"], "all");
        assert!(f[1].get("upstreams").is_some() && f[1].get("duration").is_none());
    }

    #[test]
    fn help_shows_the_crates_defaults_and_no_secrets() {
        let shown: std::collections::BTreeMap<_, _> = shown_defaults().into_iter().collect();
        assert_eq!(shown["keepalive_interval"], "20s");
        assert_eq!(shown["ramp"], "500/s");
        assert_eq!(shown["session_ttl"], "30s");
        assert_eq!(shown["agents"], "100");
        assert!(!shown.contains_key("password"));
        let help = crate::help::command().render_long_help().to_string();
        assert!(help.contains("[default: 20s]"), "{help}");
        assert_eq!(
            shown["reconnect_max"],
            "2m for sensu (a real sensu-agent's), 30s otherwise"
        );
        assert!(help.contains("[default: sensu-agent for sensu"), "{help}");
    }

    #[test]
    fn reconnect_defaults_follow_the_kind_and_give_way_to_flags() {
        let backoff = |f: fn(&mut RunArgs)| {
            resolve(args(f), &no_env).unwrap().fleets[0]
                .fleet
                .backoff
                .clone()
        };
        let b = backoff(|_| {});
        assert_eq!(b.policy(), agent_sim_fleet::ReconnectPolicy::SensuAgent);
        assert_eq!(
            (b.min(), b.max()),
            (Duration::from_secs(1), Duration::from_secs(120))
        );
        let b = backoff(|a| a.kind = Some(Kind::Consul));
        assert_eq!(b.policy(), agent_sim_fleet::ReconnectPolicy::Exponential);
        assert_eq!(
            (b.min(), b.max()),
            (Duration::from_millis(500), Duration::from_secs(30))
        );
        let b = backoff(|a| {
            a.reconnect = Some(agent_sim_fleet::ReconnectPolicy::FullJitter);
            a.reconnect_max = Some("5s".parse().unwrap())
        });
        assert_eq!(b.policy(), agent_sim_fleet::ReconnectPolicy::FullJitter);
        assert_eq!(
            (b.min(), b.max()),
            (Duration::from_secs(1), Duration::from_secs(5))
        );
        // The summary's settings name what the run used.
        let c = resolve(RunArgs::default(), &no_env).unwrap();
        assert_eq!(c.effective["reconnect"], "sensu-agent");
        assert_eq!(c.effective["reconnect-min"], "1s");
    }

    #[test]
    fn a_boot_window_replaces_the_ramp_and_is_refused_beside_one() {
        let c = resolve(
            args(|a| a.boot_window = Some("10m".parse().unwrap())),
            &no_env,
        )
        .unwrap();
        let f = &c.fleets[0].fleet;
        assert_eq!(f.ramp, None);
        assert_eq!(f.boot_window, Some(Duration::from_secs(600)));
        let e = resolve(
            args(|a| {
                a.boot_window = Some("10m".parse().unwrap());
                a.ramp = Some("100/s".parse().unwrap())
            }),
            &no_env,
        )
        .unwrap_err()
        .0;
        assert!(e.contains("--boot-window and --ramp"), "{e}");
        // A [[fleet]] section's ramp under a boot window of the file's top.
        let (dir, p) = toml_file(
            "boot",
            "boot.toml",
            "boot-window = \"1m\"\n[[fleet]]\nkind = \"sensu\"\nagents = 5\nramp = \"10/s\"\n",
        );
        let e = resolve(args(|a| a.config = Some(p.clone())), &no_env)
            .unwrap_err()
            .0;
        assert!(e.contains("--boot-window and --ramp"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
