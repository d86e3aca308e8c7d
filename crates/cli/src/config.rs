//! Resolves flags, environment and the `--config` file into one validated
//! [`RunConfig`], before any socket is opened.
//!
//! Precedence: built-in defaults < `--config FILE.toml` < `AGENT_SIM_*`
//! environment < flags (clap applies env < flags; this module puts the file
//! underneath). A config file may declare several fleets in `[[fleet]]`
//! sections (e.g. 20,000 Sensu + 5,000 Consul agents in one process); each
//! section takes the same keys as the top level, which it overrides.
//! Every problem is a [`UsageError`]: one line, exit code 64.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use agent_sim_consul::{ConsulConfig, ProbeConfig, ProbeKind};
use agent_sim_fleet::{Backoff, FleetConfig, Rate, parse_duration};
use agent_sim_metrics::assert::Assertion;
use agent_sim_sensu::SensuConfig;
use agent_sim_sensu::codec::Encoding;

use crate::args::RunArgs;

/// A usage problem: printed as one line, exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Which slice of a multi-process run this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This process's index, `0..count`.
    pub index: u64,
    /// Number of processes.
    pub count: u64,
}

impl Shard {
    /// The half-open range of global agent indexes this shard runs out of `total`.
    pub fn slice(&self, total: u64) -> (u64, u64) {
        let start = total * self.index / self.count;
        let end = total * (self.index + 1) / self.count;
        (start, end - start)
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The protocol of one fleet with its settings.
#[derive(Debug, Clone)]
pub enum Protocol {
    /// Sensu Go agents.
    Sensu(SensuConfig),
    /// Consul client agents.
    Consul(ConsulConfig),
}

impl Protocol {
    /// `sensu` or `consul`.
    pub fn kind(&self) -> &'static str {
        match self {
            Protocol::Sensu(_) => "sensu",
            Protocol::Consul(_) => "consul",
        }
    }
}

/// One fleet of a run.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// Protocol settings.
    pub protocol: Protocol,
    /// Engine settings (agent count and first index already sharded).
    pub fleet: FleetConfig,
    /// Agents of the whole fleet across shards.
    pub total_agents: u64,
    /// Whether this fleet runs against the embedded in-process backend.
    pub embedded: bool,
}

/// Everything a run needs, validated.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The fleets (one, or several from `[[fleet]]` sections).
    pub fleets: Vec<FleetPlan>,
    /// Run length (None: until Ctrl-C).
    pub duration: Option<Duration>,
    /// Shutdown grace period.
    pub grace: Duration,
    /// Summary JSON path.
    pub summary: Option<PathBuf>,
    /// HdrHistogram interval log path.
    pub hlog: Option<PathBuf>,
    /// Interval of hlog records.
    pub hlog_interval: Duration,
    /// Prometheus listen address.
    pub metrics_addr: Option<SocketAddr>,
    /// SLO assertions.
    pub asserts: Vec<Assertion>,
    /// Shard of a multi-process run.
    pub shard: Option<Shard>,
    /// Seed for stable randomness.
    pub seed: Option<u64>,
    /// No live progress.
    pub quiet: bool,
    /// Interval of plain progress lines (non-TTY).
    pub progress_every: Duration,
    /// Tokio worker threads.
    pub threads: Option<usize>,
    /// Check schedule of the embedded Sensu target (demo and tests).
    pub embedded_check_interval: Duration,
}

impl RunConfig {
    /// `sensu`, `consul` or `mixed`.
    pub fn kind(&self) -> &'static str {
        let first = self.fleets[0].protocol.kind();
        if self.fleets.iter().all(|f| f.protocol.kind() == first) {
            first
        } else {
            "mixed"
        }
    }

    /// Whether any fleet needs the in-process backend.
    pub fn embedded(&self) -> bool {
        self.fleets.iter().any(|f| f.embedded)
    }
}

/// Merges two layers: `hi` wins where it has a value.
fn overlay(hi: RunArgs, lo: RunArgs) -> RunArgs {
    macro_rules! pick {
        ($($f:ident),* ; vecs: $($v:ident),* ; flags: $($b:ident),*) => {
            RunArgs {
                $($f: hi.$f.or(lo.$f),)*
                $($v: if hi.$v.is_empty() { lo.$v } else { hi.$v },)*
                $($b: hi.$b || lo.$b,)*
            }
        };
    }
    pick!(
        config, kind, agents, duration, ramp, max_dialing, reconnect_min, reconnect_max,
        shutdown_grace, name_prefix, threads, keepalive_interval, keepalive_warning_timeout,
        keepalive_critical_timeout, namespace, user, password, subscriptions, encoding,
        event_rate, event_output_size, ca_file, http_target, token, upstreams,
        services_per_agent, service_name, session_ttl, flap_rate, probe, probe_every,
        probe_timeout, probe_service, embedded_check_interval, summary, hlog, hlog_interval, metrics_addr, shard, seed,
        progress_every;
        vecs: targets, source_addrs, asserts;
        flags: deregister, insecure_skip_tls_verify, sidecars, no_register, keep_registrations,
        quiet
    )
}

/// Reads the `--config` file: the top-level layer and its `[[fleet]]` sections.
fn read_file(path: &std::path::Path) -> Result<(RunArgs, Vec<RunArgs>), UsageError> {
    let text = std::fs::read_to_string(path)
        .or_else(|e| usage(format!("--config {}: {e}", path.display())))?;
    let mut table: toml::Table =
        toml::from_str(&text).or_else(|e| usage(format!("--config {}: {e}", path.display())))?;
    let fleets = match table.remove("fleet") {
        None => Vec::new(),
        Some(toml::Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                v.try_into::<RunArgs>().or_else(|e| {
                    usage(format!(
                        "--config {}: [[fleet]] #{}: {e}",
                        path.display(),
                        i + 1
                    ))
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return usage(format!(
                "--config {}: `fleet` must be [[fleet]] sections",
                path.display()
            ));
        }
    };
    let top = toml::Value::Table(table)
        .try_into::<RunArgs>()
        .or_else(|e| usage(format!("--config {}: {e}", path.display())))?;
    Ok((top, fleets))
}

fn dur(name: &str, v: &Option<String>, default: Duration) -> Result<Duration, UsageError> {
    match v {
        None => Ok(default),
        Some(s) => parse_duration(s).or_else(|e| usage(format!("--{name}: {e}"))),
    }
}

fn rate(name: &str, v: &Option<String>) -> Result<Option<Rate>, UsageError> {
    match v.as_deref() {
        None => Ok(None),
        Some(s) => s
            .parse::<Rate>()
            .map(Some)
            .or_else(|e| usage(format!("--{name}: {e}"))),
    }
}

fn list(v: &Option<String>, default: &[&str]) -> Vec<String> {
    match v {
        None => default.iter().map(|s| s.to_string()).collect(),
        Some(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    }
}

/// Parses `--shard I/N`, or `--shard N` with the index taken from
/// `JOB_COMPLETION_INDEX` (Kubernetes Indexed Job) or `NOMAD_ALLOC_INDEX`.
pub fn parse_shard(
    v: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Shard>, UsageError> {
    let env_index = || {
        env("JOB_COMPLETION_INDEX")
            .or_else(|| env("NOMAD_ALLOC_INDEX"))
            .map(|s| {
                s.trim().parse::<u64>().or_else(|_| {
                    usage(format!(
                        "shard index from environment {s:?} is not a number"
                    ))
                })
            })
    };
    let Some(v) = v else { return Ok(None) };
    let (index, count) = match v.split_once('/') {
        Some((i, n)) => {
            let n: u64 = n
                .trim()
                .parse()
                .or_else(|_| usage(format!("--shard {v:?}: expected I/N, e.g. 0/4")))?;
            let i: u64 = if i.trim().is_empty() || i.trim() == "auto" {
                match env_index() {
                    Some(r) => r?,
                    None => {
                        return usage(format!(
                            "--shard {v:?}: no index given and neither JOB_COMPLETION_INDEX nor NOMAD_ALLOC_INDEX is set"
                        ));
                    }
                }
            } else {
                i.trim()
                    .parse()
                    .or_else(|_| usage(format!("--shard {v:?}: expected I/N, e.g. 0/4")))?
            };
            (i, n)
        }
        None => {
            let n: u64 = v
                .trim()
                .parse()
                .or_else(|_| usage(format!("--shard {v:?}: expected I/N, e.g. 0/4")))?;
            match env_index() {
                Some(r) => (r?, n),
                None => {
                    return usage(format!(
                        "--shard {v}: no index: use I/N, or set JOB_COMPLETION_INDEX or NOMAD_ALLOC_INDEX"
                    ));
                }
            }
        }
    };
    if count == 0 || index >= count {
        return usage(format!("--shard {index}/{count}: need 0 <= I < N"));
    }
    Ok(Some(Shard { index, count }))
}

/// Expands `127.0.0.2`, `127.0.0.2-127.0.0.9` into addresses.
fn source_addrs(items: &[String]) -> Result<Vec<IpAddr>, UsageError> {
    let mut out = Vec::new();
    for item in items {
        if let Some((a, b)) = item.split_once('-') {
            let (a, b): (std::net::Ipv4Addr, std::net::Ipv4Addr) = (
                a.trim()
                    .parse()
                    .or_else(|_| usage(format!("--source-addr {item:?}: bad IPv4 range")))?,
                b.trim()
                    .parse()
                    .or_else(|_| usage(format!("--source-addr {item:?}: bad IPv4 range")))?,
            );
            let (a, b) = (u32::from(a), u32::from(b));
            if b < a || b - a > 65_535 {
                return usage(format!("--source-addr {item:?}: empty or too large range"));
            }
            out.extend((a..=b).map(|x| IpAddr::V4(x.into())));
        } else {
            out.push(
                item.trim()
                    .parse()
                    .or_else(|_| usage(format!("--source-addr {item:?}: not an IP address")))?,
            );
        }
    }
    Ok(out)
}

/// Turns a Sensu target (`host:port`, `ws://host:port/`, `wss://...`) into a URL.
fn sensu_url(t: &str) -> Result<String, UsageError> {
    let t = t.trim();
    let url = if t.starts_with("ws://") || t.starts_with("wss://") {
        t.to_string()
    } else if t.contains("://") {
        return usage(format!(
            "--target {t:?}: Sensu targets are host:port, ws:// or wss:// URLs"
        ));
    } else {
        format!("ws://{t}/")
    };
    let rest = url.split_once("://").map(|x| x.1).unwrap_or_default();
    let hostport = rest.split('/').next().unwrap_or_default();
    if hostport
        .rsplit_once(':')
        .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
    {
        return usage(format!(
            "--target {t:?}: expected host:port (the agent port is usually 8081)"
        ));
    }
    Ok(url)
}

fn host_port(flag: &str, t: &str) -> Result<String, UsageError> {
    let t = t.trim();
    match t.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(t.to_string()),
        _ => usage(format!("--{flag} {t:?}: expected host:port")),
    }
}

/// Resolves the CLI layer (flags+env) and the optional config file into a [`RunConfig`].
pub fn resolve(
    cli: RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<RunConfig, UsageError> {
    let (file_top, file_fleets) = match &cli.config {
        Some(p) => read_file(p)?,
        None => (RunArgs::default(), Vec::new()),
    };
    if !file_fleets.is_empty()
        && (cli.kind.is_some() || cli.agents.is_some() || !cli.targets.is_empty())
    {
        return usage(
            "--kind/--agents/--target cannot be combined with [[fleet]] sections in --config; set them per section",
        );
    }
    let top = overlay(cli.clone(), file_top.clone());
    // Sections beat the file's top level; flags and env beat both.
    let layers: Vec<RunArgs> = if file_fleets.is_empty() {
        vec![top.clone()]
    } else {
        file_fleets
            .into_iter()
            .map(|section| overlay(cli.clone(), overlay(section, file_top.clone())))
            .collect()
    };
    let shard = parse_shard(top.shard.as_deref(), env)?;
    let duration = match &top.duration {
        None => None,
        Some(s) => Some(parse_duration(s).or_else(|e| usage(format!("--duration: {e}")))?),
    };
    if duration == Some(Duration::ZERO) {
        return usage("--duration must be greater than zero");
    }
    let grace = dur(
        "shutdown-grace",
        &top.shutdown_grace,
        Duration::from_secs(5),
    )?;
    let hlog_interval = dur("hlog-interval", &top.hlog_interval, Duration::from_secs(10))?;
    if hlog_interval < Duration::from_secs(1) {
        return usage("--hlog-interval must be at least 1s");
    }
    let progress_every = dur(
        "progress-every",
        &top.progress_every,
        Duration::from_secs(10),
    )?;
    let asserts = top
        .asserts
        .iter()
        .map(|a| {
            a.parse::<Assertion>()
                .or_else(|e| usage(format!("--assert {a:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if top.threads == Some(0) {
        return usage("--threads must be at least 1");
    }

    let mut fleets = Vec::new();
    for (n, layer) in layers.iter().enumerate() {
        let plan = resolve_fleet(layer, shard).map_err(|e| {
            if layers.len() > 1 {
                UsageError(format!("[[fleet]] #{}: {}", n + 1, e.0))
            } else {
                e
            }
        })?;
        fleets.push(plan);
    }
    Ok(RunConfig {
        fleets,
        duration,
        grace,
        summary: top.summary.clone(),
        hlog: top.hlog.clone(),
        hlog_interval,
        metrics_addr: top.metrics_addr,
        asserts,
        shard,
        seed: top.seed,
        quiet: top.quiet,
        progress_every,
        threads: top.threads,
        embedded_check_interval: dur(
            "embedded-check-interval",
            &top.embedded_check_interval,
            Duration::from_secs(10),
        )?,
    })
}

fn resolve_fleet(a: &RunArgs, shard: Option<Shard>) -> Result<FleetPlan, UsageError> {
    let kind = a.kind.as_deref().unwrap_or("sensu");
    let total = a.agents.unwrap_or(100);
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
    let ramp = match a.ramp.as_deref() {
        None => Some(Rate::per_second(500.0)),
        Some("all") | Some("none") | Some("0") => None,
        Some(s) => Some(
            s.parse::<Rate>()
                .or_else(|e| usage(format!("--ramp: {e}")))?,
        ),
    };
    let reconnect_min = dur(
        "reconnect-min",
        &a.reconnect_min,
        Duration::from_millis(500),
    )?;
    let reconnect_max = dur("reconnect-max", &a.reconnect_max, Duration::from_secs(30))?;
    if reconnect_max < reconnect_min {
        return usage("--reconnect-max must be at least --reconnect-min");
    }
    let max_dialing = a.max_dialing.unwrap_or(256);
    if max_dialing == 0 {
        return usage("--max-dialing must be at least 1");
    }
    let mut sources = source_addrs(&a.source_addrs)?;
    if let Some(s) = shard
        && sources.len() as u64 >= s.count
    {
        let (start, len) = s.slice(sources.len() as u64);
        sources = sources[start as usize..(start + len) as usize].to_vec();
    }
    let name_prefix = a.name_prefix.clone().unwrap_or_else(|| "agent-sim".into());
    if name_prefix.is_empty()
        || !name_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':'))
    {
        return usage(format!(
            "--name-prefix {name_prefix:?}: use letters, digits, '_', '.', '-', ':' (Sensu entity name rules)"
        ));
    }
    let fleet = FleetConfig {
        agents,
        first_index,
        ramp,
        max_dialing,
        backoff: Backoff::new(reconnect_min, reconnect_max),
        duration: None,
        grace: Duration::from_secs(5),
        source_addrs: sources,
    };
    let embedded = a.targets.is_empty();
    let protocol = match kind {
        "sensu" => Protocol::Sensu(sensu_config(a, &name_prefix)?),
        "consul" => Protocol::Consul(consul_config(a, &name_prefix, shard)?),
        other => return usage(format!("--kind {other:?}: expected sensu or consul")),
    };
    Ok(FleetPlan {
        protocol,
        fleet,
        total_agents: total,
        embedded,
    })
}

fn sensu_config(a: &RunArgs, name_prefix: &str) -> Result<SensuConfig, UsageError> {
    let d = SensuConfig::default();
    let keepalive_interval = dur(
        "keepalive-interval",
        &a.keepalive_interval,
        d.keepalive_interval,
    )?;
    if keepalive_interval < Duration::from_secs(1) {
        return usage("--keepalive-interval must be at least 1s");
    }
    let encoding = match a.encoding.as_deref() {
        None => d.encoding,
        Some(s) => s
            .parse::<Encoding>()
            .or_else(|_| usage(format!("--encoding {s:?}: expected protobuf or json")))?,
    };
    let subscriptions = list(&a.subscriptions, &["linux"]);
    for s in &subscriptions {
        if !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':'))
        {
            return usage(format!(
                "--subscriptions: {s:?} is not a valid subscription name"
            ));
        }
    }
    let warning = a
        .keepalive_warning_timeout
        .unwrap_or(d.keepalive_warning_timeout);
    let critical = a
        .keepalive_critical_timeout
        .unwrap_or(d.keepalive_critical_timeout);
    let interval_s = keepalive_interval.as_secs() as u32;
    if critical != 0 && (critical <= interval_s || critical < 5) {
        return usage(
            "--keepalive-critical-timeout must be 0 or greater than the interval and at least 5 (backend rule)",
        );
    }
    if let Some(p) = &a.ca_file
        && !p.is_file()
    {
        return usage(format!("--ca-file {}: no such file", p.display()));
    }
    Ok(SensuConfig {
        targets: a
            .targets
            .iter()
            .map(|t| sensu_url(t))
            .collect::<Result<_, _>>()?,
        namespace: a.namespace.clone().unwrap_or(d.namespace),
        user: a.user.clone().unwrap_or(d.user),
        password: a.password.clone().unwrap_or(d.password),
        subscriptions,
        encoding,
        keepalive_interval,
        keepalive_warning_timeout: warning,
        keepalive_critical_timeout: critical,
        name_prefix: name_prefix.to_string(),
        deregister: a.deregister,
        event_rate: rate("event-rate", &a.event_rate)?,
        event_output_size: a.event_output_size.unwrap_or(d.event_output_size),
        ca_file: a.ca_file.clone(),
        insecure_skip_tls_verify: a.insecure_skip_tls_verify,
        ..d
    })
}

fn consul_config(
    a: &RunArgs,
    name_prefix: &str,
    shard: Option<Shard>,
) -> Result<ConsulConfig, UsageError> {
    let d = ConsulConfig::default();
    let rpc_targets = a
        .targets
        .iter()
        .map(|t| host_port("target", t))
        .collect::<Result<Vec<_>, _>>()?;
    let http_target = match &a.http_target {
        Some(h) => host_port("http-target", h)?,
        None => match rpc_targets.first() {
            Some(t) => format!("{}:8500", t.rsplit_once(':').map(|x| x.0).unwrap_or(t)),
            None => String::new(),
        },
    };
    let session_ttl = match a.session_ttl.as_deref() {
        Some("off") | Some("none") | Some("0") => None,
        None => d.session_ttl,
        Some(s) => {
            let ttl = parse_duration(s).or_else(|e| usage(format!("--session-ttl: {e}")))?;
            if ttl < Duration::from_secs(10) || ttl > Duration::from_secs(86_400) {
                return usage(format!("--session-ttl {s}: Consul accepts 10s to 24h"));
            }
            Some(ttl)
        }
    };
    let upstreams = list(&a.upstreams, &["web", "api"]);
    if upstreams.is_empty() {
        return usage("--upstreams needs at least one service");
    }
    let probe_kind = match a.probe.as_deref() {
        None | Some("catalog") | Some("deregister") => Some(ProbeKind::Catalog),
        Some("intentions") => Some(ProbeKind::Intentions),
        Some("off") | Some("none") => None,
        Some(s) => {
            return usage(format!(
                "--probe {s:?}: expected catalog, intentions or off"
            ));
        }
    };
    let every = dur("probe-every", &a.probe_every, d.probe.every)?;
    let probe = ProbeConfig {
        kind: probe_kind,
        every,
        service: a.probe_service.clone(),
        // A probe must end before the next one starts.
        timeout: dur(
            "probe-timeout",
            &a.probe_timeout,
            d.probe.timeout.min(every),
        )?,
        controller: shard.is_none_or(|s| s.index == 0),
    };
    if probe.kind.is_some() && probe.every < Duration::from_secs(1) {
        return usage("--probe-every must be at least 1s");
    }
    if probe.kind.is_some() && probe.timeout > probe.every {
        return usage("--probe-timeout must not exceed --probe-every (one probe at a time)");
    }
    if let Some(svc) = &probe.service {
        if svc.contains('{') {
            return usage("--probe-service must be one shared service, not a per-agent pattern");
        }
    } else if probe.kind.is_some() && upstreams.iter().all(|u| u.contains('{')) {
        return usage(
            "--probe needs a shared upstream: add one without {i} to --upstreams or set --probe-service",
        );
    }
    Ok(ConsulConfig {
        rpc_targets,
        http_target,
        token: a.token.clone().filter(|t| !t.is_empty()),
        upstreams,
        name_prefix: name_prefix.to_string(),
        register: !a.no_register,
        service_name: a.service_name.clone().unwrap_or(d.service_name.clone()),
        services_per_agent: a.services_per_agent.unwrap_or(d.services_per_agent),
        sidecars: a.sidecars,
        keep_registrations: a.keep_registrations,
        session_ttl,
        flap_rate: rate("flap-rate", &a.flap_rate)?,
        probe,
        ..d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
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
            (args(|a| a.ramp = Some("fast".into())), "--ramp"),
            (args(|a| a.kind = Some("nomad".into())), "--kind"),
            (args(|a| a.encoding = Some("xml".into())), "--encoding"),
            (
                args(|a| a.duration = Some("10 parsecs".into())),
                "--duration",
            ),
            (args(|a| a.targets = vec!["http://x:1".into()]), "--target"),
            (args(|a| a.targets = vec!["nohost".into()]), "--target"),
            (args(|a| a.shard = Some("4/4".into())), "--shard"),
            (args(|a| a.asserts = vec!["p99 <<< 3".into()]), "--assert"),
            (
                args(|a| {
                    a.kind = Some("consul".into());
                    a.session_ttl = Some("5s".into())
                }),
                "--session-ttl",
            ),
            (
                args(|a| {
                    a.kind = Some("consul".into());
                    a.probe_every = Some("5s".into());
                    a.probe_timeout = Some("6s".into())
                }),
                "--probe-timeout",
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
                a.shard = Some("4".into())
            }),
            &env,
        )
        .unwrap();
        assert_eq!(c.shard, Some(Shard { index: 2, count: 4 }));
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
        let dir = std::env::temp_dir().join(format!("agent-sim-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("run.toml");
        std::fs::write(
            &p,
            "duration = \"30s\"\nramp = \"100/s\"\n[[fleet]]\nkind = \"sensu\"\nagents = 20\nkeepalive-interval = \"5s\"\n[[fleet]]\nkind = \"consul\"\nagents = 5\nupstreams = \"web\"\n",
        )
        .unwrap();
        let c = resolve(
            args(|a| {
                a.config = Some(p.clone());
                a.duration = Some("2s".into())
            }),
            &no_env,
        )
        .unwrap();
        assert_eq!(c.duration, Some(Duration::from_secs(2)));
        assert_eq!(c.kind(), "mixed");
        assert_eq!(c.fleets.len(), 2);
        assert_eq!(c.fleets[0].fleet.agents, 20);
        assert_eq!(c.fleets[1].fleet.agents, 5);
        assert_eq!(c.fleets[0].fleet.ramp, Some(Rate::per_second(100.0)));

        std::fs::write(&p, "agentz = 3\n").unwrap();
        let e = resolve(args(|a| a.config = Some(p.clone())), &no_env)
            .unwrap_err()
            .0;
        assert!(e.contains("agentz"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_short_probe_interval_shortens_the_default_timeout() {
        let c = resolve(
            args(|a| {
                a.kind = Some("consul".into());
                a.probe_every = Some("5s".into())
            }),
            &no_env,
        )
        .unwrap();
        let Protocol::Consul(cc) = &c.fleets[0].protocol else {
            panic!()
        };
        assert_eq!(cc.probe.timeout, Duration::from_secs(5));
    }

    #[test]
    fn source_address_ranges_expand() {
        let v = source_addrs(&["127.0.0.2-127.0.0.4".into(), "127.0.0.9".into()]).unwrap();
        assert_eq!(v.len(), 4);
        assert!(source_addrs(&["127.0.0.9-127.0.0.2".into()]).is_err());
    }
}
