//! `--observe`, `--observe-pid`, `--observe-every`, `--observe-metric` and
//! `--observe-shard` onto the run's [`ObserveConfig`]: the shorthands
//! `consul` and `sensu` expand to every server of the run's own fleets,
//! with the run's token and TLS; only one shard observes. When Consul
//! fleets gossip, their name prefixes go along, so that the first Consul
//! server observed is also asked for its view of the run's members.

use std::time::Duration;

use agent_sim_net::ClientTls;
use agent_sim_observe::target::{SENSU_API_PORT, check_pid, host_of};
use agent_sim_observe::{Endpoint, GossipWatch, ObserveConfig, ObserveSpec, Target};

use crate::args::RunArgs;
use crate::plan::{FleetPlan, Protocol, Shard, UsageError, usage};

/// The TLS of a Consul connection as a client of its HTTP API.
fn consul_tls(c: &agent_sim_consul::Connection) -> Option<ClientTls> {
    c.tls.as_ref().map(|t| t.client())
}

/// The Consul connections of the run's fleets (agents and sidecars).
fn consul_conns(fleets: &[FleetPlan]) -> Vec<&agent_sim_consul::Connection> {
    fleets
        .iter()
        .filter_map(|f| match &f.protocol {
            Protocol::Consul(c) => Some(&c.conn),
            Protocol::Dataplane(d) => Some(&d.conn),
            Protocol::Sensu(_) => None,
        })
        .collect()
}

/// The members of the run's gossiping Consul fleets: their name prefixes,
/// and whether they leave at the end (not when registrations are kept).
fn gossip_watch(fleets: &[FleetPlan]) -> Option<GossipWatch> {
    let gossiping: Vec<&agent_sim_consul::ConsulConfig> = fleets
        .iter()
        .filter_map(|f| match &f.protocol {
            Protocol::Consul(c) if c.gossip.is_some() => Some(&**c),
            _ => None,
        })
        .collect();
    let mut prefixes: Vec<String> = gossiping
        .iter()
        .map(|c| c.conn.name_prefix.clone())
        .collect();
    prefixes.sort();
    prefixes.dedup();
    (!prefixes.is_empty()).then(|| GossipWatch {
        prefixes,
        expect_left: gossiping.iter().all(|c| !c.keep_registrations),
    })
}

/// Each Consul server of a fleet: its HTTP API on every target's host
/// (the scheme and port of the run's HTTP target).
fn consul_servers(c: &agent_sim_consul::Connection) -> Vec<String> {
    let http = c.http_target();
    let (https, hostport) = agent_sim_consul::config::http_parts(&http);
    let port = hostport.rsplit_once(':').map_or("8500", |(_, p)| p);
    let scheme = if https { "https" } else { "http" };
    let mut hosts: Vec<String> = c
        .targets
        .iter()
        .map(|t| format!("{scheme}://{}:{port}", host_of(t)))
        .collect();
    hosts.dedup();
    hosts
}

/// Expands one `--observe` value into endpoints.
fn expand(
    spec: &ObserveSpec,
    a: &RunArgs,
    fleets: &[FleetPlan],
) -> Result<Vec<Endpoint>, UsageError> {
    let embedded = fleets.iter().all(|f| f.embedded);
    let run_tls = || {
        (a.ca_file.is_some() || a.insecure_skip_tls_verify == Some(true)).then(|| ClientTls {
            ca_file: a.ca_file.clone(),
            insecure_skip_verify: a.insecure_skip_tls_verify.unwrap_or(false),
            cert_file: a.cert_file.clone(),
            key_file: a.key_file.clone(),
        })
    };
    let in_process = |what: &str| {
        usage(format!(
            "--observe {what}: the run has no {what} target; the embedded backend runs in this \
             process (its CPU is agent-sim's own): run `agent-sim serve --metrics-addr ADDR` and \
             --observe http://ADDR/metrics, or name the server: --observe {what}=HOST:PORT"
        ))
    };
    let conns = consul_conns(fleets);
    let token = conns.iter().find_map(|c| c.token.clone());
    Ok(match spec {
        ObserveSpec::Url(u) => {
            let mut e = Endpoint::url(u.clone());
            if u.starts_with("https://") {
                e.tls = run_tls();
            }
            if u.contains(agent_sim_observe::target::CONSUL_JSON_PATH) {
                // A Consul server named by URL: the run's token, and the
                // JSON format when it keeps no Prometheus metrics.
                let base = u.split("/v1/").next().unwrap_or(u);
                let c = Endpoint::consul(base, token.as_deref(), e.tls.clone());
                e.headers = c.headers;
                if u.contains("format=prometheus") {
                    e.json_fallback = c.json_fallback;
                }
                e.kind = c.kind;
            }
            vec![e]
        }
        ObserveSpec::Consul(Some(addr)) => {
            let tls = conns.iter().find_map(|c| consul_tls(c)).or_else(run_tls);
            vec![Endpoint::consul(addr, token.as_deref(), tls)]
        }
        ObserveSpec::Consul(None) => {
            if conns.is_empty() {
                return usage(
                    "--observe consul: this run has no Consul fleet; name the server: \
                     --observe consul=HOST:8500",
                );
            }
            if embedded {
                return in_process("consul");
            }
            conns
                .iter()
                .flat_map(|c| {
                    consul_servers(c)
                        .into_iter()
                        .map(|base| Endpoint::consul(&base, c.token.as_deref(), consul_tls(c)))
                })
                .collect()
        }
        ObserveSpec::Sensu(Some(addr)) => vec![Endpoint::sensu(addr, run_tls())],
        ObserveSpec::Sensu(None) => {
            let targets: Vec<&String> = fleets
                .iter()
                .filter_map(|f| match &f.protocol {
                    Protocol::Sensu(s) if !f.embedded => Some(&s.targets),
                    _ => None,
                })
                .flatten()
                .collect();
            if targets.is_empty() {
                return if fleets
                    .iter()
                    .any(|f| matches!(f.protocol, Protocol::Sensu(_)))
                {
                    in_process("sensu")
                } else {
                    usage(
                        "--observe sensu: this run has no Sensu fleet; name the backend's API: \
                         --observe sensu=HOST:8080",
                    )
                };
            }
            targets
                .into_iter()
                .map(|t| {
                    let tls = t
                        .starts_with("wss://")
                        .then(|| run_tls().unwrap_or_default());
                    Endpoint::sensu(&format!("{}:{SENSU_API_PORT}", host_of(t)), tls)
                })
                .collect()
        }
    })
}

/// The observer's settings, when this process observes; refusals name
/// the flag.
pub fn plan(
    a: &RunArgs,
    fleets: &[FleetPlan],
    shard: Option<Shard>,
) -> Result<Option<ObserveConfig>, UsageError> {
    let every = a.observe_every.map_or(Duration::from_secs(5), |d| d.0);
    let wanted = !a.observe.is_empty() || !a.observe_pid.is_empty();
    if !wanted {
        if !a.observe_metric.is_empty() || a.observe_shard.is_some() {
            return usage(
                "--observe-metric/--observe-shard: nothing is observed (add --observe or --observe-pid)",
            );
        }
        return Ok(None);
    }
    if every < Duration::from_millis(500) {
        return usage("--observe-every must be at least 500ms");
    }
    let observer = a.observe_shard.unwrap_or(0);
    if let Some(s) = shard
        && observer >= s.count
    {
        return usage(format!(
            "--observe-shard {observer}: the run has {} shards",
            s.count
        ));
    }
    let mut targets: Vec<Target> = Vec::new();
    for spec in &a.observe {
        for e in expand(spec, a, fleets)? {
            if !targets.iter().any(|t| t.name() == e.url) {
                targets.push(Target::Http(e));
            }
        }
    }
    for pid in &a.observe_pid {
        check_pid(*pid).map_err(|e| UsageError(e.to_string()))?;
        targets.push(Target::Pid(*pid));
    }
    // Only one shard observes: a merged report counts a server once.
    if shard.is_some_and(|s| s.index != observer) {
        return Ok(None);
    }
    Ok(Some(ObserveConfig {
        targets,
        every,
        extra: a.observe_metric.clone(),
        gossip: gossip_watch(fleets),
    }))
}
