//! `agent-sim serve`: the embedded reference backend as its own process, so
//! a benchmark measures the simulator apart from its target (and several
//! `serve --reuse-port` processes can share one port), optionally injecting
//! faults (`--faults`, see [`agent_sim_server::faults::HELP`]) and restarting itself.

use std::sync::Arc;
use std::time::Duration;

use agent_sim_server::backend::{Backend, BackendConfig, ConsulAddrs};
use agent_sim_server::consul::{ConsulTargetConfig, SerfConfig};
use agent_sim_server::faults::{FaultSpec, Protocol, Target};
use agent_sim_server::sensu::{CheckSpec, SensuTargetConfig};
use tokio_util::sync::CancellationToken;

use crate::args::ServeArgs;
use crate::plan::{UsageError, password_cost};

/// Validated `serve` settings.
#[derive(Debug, Clone)]
pub struct ServePlan {
    args_check_interval: Duration,
    stats_every: Duration,
    /// TLS of the Consul listeners.
    consul_tls: Option<Arc<rustls::ServerConfig>>,
    /// TLS of the Sensu agent port (with the agent CA, if given).
    sensu_tls: Option<Arc<rustls::ServerConfig>>,
    /// Faults to inject.
    faults: Vec<FaultSpec>,
    /// Their dice.
    faults_seed: u64,
    /// The serf LAN port, when served.
    consul_serf: Option<SerfConfig>,
}

/// Validates `serve` flags (exit 64 on error).
pub fn plan(a: &ServeArgs) -> Result<ServePlan, UsageError> {
    follower_flags(a)?;
    if a.sensu.is_none() && a.consul_rpc.is_none() && a.consul_http.is_none() {
        return Err(UsageError(
            "serve needs at least one of --sensu ADDR, --consul-rpc ADDR, --consul-http ADDR"
                .into(),
        ));
    }
    if a.consul_grpc.is_some() && a.consul_http.is_none() {
        return Err(UsageError(
            "serve: --consul-grpc needs --consul-rpc and --consul-http (sidecars register \
             through the HTTP API)"
                .into(),
        ));
    }
    if a.xds_coalesce.0 > Duration::from_secs(60) {
        return Err(UsageError("--xds-coalesce must be at most 60s".into()));
    }
    if a.consul_leader.is_none() && a.consul_rpc.is_some() != a.consul_http.is_some() {
        return Err(UsageError(
            "serve: --consul-rpc and --consul-http go together (agents use both)".into(),
        ));
    }
    let check = a.check_interval.0;
    if check < Duration::from_millis(100) {
        return Err(UsageError("--check-interval must be at least 100ms".into()));
    }
    let stats_every = a.stats_every.0;
    let consul_tls = match (&a.tls_cert_file, &a.tls_key_file) {
        (None, None) if a.tls_client_ca_file.is_none() => None,
        (Some(cert), Some(key)) => Some(
            agent_sim_net::server_config(cert, key, a.tls_client_ca_file.as_deref())
                .map_err(|e| UsageError(format!("serve --tls-cert-file/--tls-key-file: {e}")))?,
        ),
        _ => {
            return Err(UsageError(
                "serve: --tls-cert-file and --tls-key-file go together (and \
                 --tls-client-ca-file needs them)"
                    .into(),
            ));
        }
    };
    let faults = fault_specs(a)?;
    let consul_serf = serf_config(a)?;
    let sensu_tls = sensu_auth(a)?;
    Ok(ServePlan {
        args_check_interval: check,
        stats_every,
        consul_tls,
        sensu_tls,
        faults,
        faults_seed: a.faults_seed.unwrap_or_else(|| fastrand::u64(..)),
        consul_serf,
    })
}

/// `--consul-leader` relays one port: it needs `--consul-rpc`, and what
/// the leader serves (or a relay cannot carry) is refused beside it.
fn follower_flags(a: &ServeArgs) -> Result<(), UsageError> {
    if a.consul_leader.is_none() {
        return Ok(());
    }
    if a.consul_rpc.is_none() {
        return Err(UsageError(
            "serve: --consul-leader needs --consul-rpc (the port agents dial)".into(),
        ));
    }
    let others = [
        (a.sensu.is_some(), "--sensu"),
        (a.consul_http.is_some(), "--consul-http"),
        (a.consul_grpc.is_some(), "--consul-grpc"),
        (a.consul_serf.is_some(), "--consul-serf"),
        (a.tls_cert_file.is_some(), "--tls-cert-file"),
        (!a.acl_tokens.is_empty(), "--acl-token"),
        (a.rpc_max_conns_per_client > 0, "--rpc-max-conns-per-client"),
        (!a.faults.is_empty(), "--faults"),
    ];
    let given: Vec<&str> = others
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| *f)
        .collect();
    if given.is_empty() {
        return Ok(());
    }
    Err(UsageError(format!(
        "serve: --consul-leader relays --consul-rpc only; {} belong to the leader's serve \
         (agents join its serf port, the probe writes to its HTTP API)",
        given.join(", ")
    )))
}

/// The Sensu port's TLS from `--sensu-tls-*` and `--sensu-agent-ca-file`,
/// after checking `--sensu-password-cost` and that all of them have a Sensu
/// port to apply to.
fn sensu_auth(a: &ServeArgs) -> Result<Option<Arc<rustls::ServerConfig>>, UsageError> {
    let any = a.sensu_password_cost.is_some()
        || a.sensu_tls_cert_file.is_some()
        || a.sensu_tls_key_file.is_some()
        || a.sensu_agent_ca_file.is_some();
    if any && a.sensu.is_none() {
        return Err(UsageError(
            "serve: --sensu-password-cost, --sensu-tls-* and --sensu-agent-ca-file need --sensu"
                .into(),
        ));
    }
    password_cost("--sensu-password-cost", a.sensu_password_cost)?;
    match (&a.sensu_tls_cert_file, &a.sensu_tls_key_file) {
        (None, None) if a.sensu_agent_ca_file.is_none() => Ok(None),
        (Some(cert), Some(key)) => {
            agent_sim_server::sensu::tls::server_config(cert, key, a.sensu_agent_ca_file.as_deref())
                .map(Some)
                .map_err(|e| {
                    UsageError(format!(
                        "serve --sensu-tls-cert-file/--sensu-tls-key-file: {e}"
                    ))
                })
        }
        _ => Err(UsageError(
            "serve: --sensu-tls-cert-file and --sensu-tls-key-file go together (and \
             --sensu-agent-ca-file needs them)"
                .into(),
        )),
    }
}

/// The serf LAN port's settings from `--consul-serf*`.
fn serf_config(a: &ServeArgs) -> Result<Option<SerfConfig>, UsageError> {
    let Some(bind) = a.consul_serf else {
        if !a.consul_serf_keys.is_empty() || a.consul_serf_label.is_some() {
            return Err(UsageError(
                "serve: --consul-serf-key and --consul-serf-label need --consul-serf".into(),
            ));
        }
        return Ok(None);
    };
    if a.consul_rpc.is_none() {
        return Err(UsageError(
            "serve: --consul-serf needs --consul-rpc and --consul-http (its tags name the RPC \
             port, its catalog is the HTTP API's)"
                .into(),
        ));
    }
    let label = a.consul_serf_label.clone().unwrap_or_default();
    let cfg = SerfConfig::secured(bind, &a.consul_serf_keys, label)
        .map_err(|e| UsageError(format!("serve --consul-serf: {e}")))?;
    Ok(Some(cfg))
}

/// Parses every `--faults` spec and checks that its protocol is served.
fn fault_specs(a: &ServeArgs) -> Result<Vec<FaultSpec>, UsageError> {
    a.faults
        .iter()
        .map(|text| {
            let spec: FaultSpec = text
                .parse()
                .map_err(|e| UsageError(format!("serve --faults {e}")))?;
            let missing = match spec.target.protocol() {
                Some(Protocol::Sensu) if a.sensu.is_none() => Some("--sensu"),
                _ if spec.target == Target::ConsulXds && a.consul_grpc.is_none() => {
                    Some("--consul-grpc")
                }
                Some(Protocol::Consul) if a.consul_rpc.is_none() => {
                    Some("--consul-rpc and --consul-http")
                }
                _ => None,
            };
            match missing {
                Some(flags) => Err(UsageError(format!(
                    "serve --faults {:?}: {} is not served (add {flags})",
                    spec.text, spec.target
                ))),
                None => Ok(spec),
            }
        })
        .collect()
}

/// The backend `serve` runs: what the flags ask for.
fn backend_config(a: &ServeArgs, p: &ServePlan) -> BackendConfig {
    BackendConfig {
        sensu: a.sensu.map(|addr| {
            let cfg = SensuTargetConfig {
                user: a.user.clone(),
                password: a.password.clone(),
                password_cost: a.sensu_password_cost,
                tls: p.sensu_tls.clone(),
                checks: vec![CheckSpec {
                    name: "agent-sim-check".into(),
                    command: "!sensu_test_check!".into(),
                    interval: p.args_check_interval,
                    subscriptions: a.check_subscriptions.0.clone(),
                }],
                namespaces_ready_after: a.namespace_ready_after.0,
                ..SensuTargetConfig::default()
            };
            (addr, cfg)
        }),
        consul: a
            .consul_rpc
            .zip(a.consul_http)
            .map(|(rpc, http)| ConsulAddrs {
                rpc,
                http,
                grpc: a.consul_grpc,
                cfg: ConsulTargetConfig {
                    tls: p.consul_tls.clone(),
                    rpc_max_conns_per_client: a.rpc_max_conns_per_client,
                    acl_tokens: (!a.acl_tokens.is_empty()).then(|| a.acl_tokens.clone()),
                    xds_coalesce: a.xds_coalesce.0,
                    xds_update_rate: a
                        .xds_update_rate
                        .into_option()
                        .map_or(0.0, |r| r.as_per_second()),
                    xds_max_streams: a.xds_max_streams,
                    serf: p.consul_serf.clone(),
                    ..ConsulTargetConfig::default()
                },
                state: None,
            }),
        reuse_port: a.reuse_port,
        faults: p.faults.clone(),
        faults_seed: p.faults_seed,
        log: Some(Arc::new(|line| eprintln!("agent-sim serve: {line}"))),
    }
}

/// Counters of the backend's stats that are levels, not totals.
fn is_gauge(field: &str) -> bool {
    field.ends_with("_active")
        || field.ends_with("_open")
        || field == "raft_index"
        || field.starts_with("serf_members_")
}

/// The backend's stats (a serialized snapshot) as Prometheus families
/// `agent_sim_serve_<protocol>_<field>`: counters `_total`, levels gauges.
fn stats_families(out: &mut String, protocol: &str, snapshot: serde_json::Value) {
    let Some(fields) = snapshot.as_object() else {
        return;
    };
    for (field, v) in fields {
        // A map of counts (Consul's RPC calls by method): one family, a
        // label per key.
        if let Some(by) = v.as_object() {
            labelled_family(out, protocol, field, by);
            continue;
        }
        let Some(v) = v.as_f64() else { continue };
        let (name, kind) = if is_gauge(field) {
            (format!("agent_sim_serve_{protocol}_{field}"), "gauge")
        } else {
            (
                format!("agent_sim_serve_{protocol}_{field}_total"),
                "counter",
            )
        };
        let help = format!("agent-sim serve: {protocol} {}.", field.replace('_', " "));
        agent_sim_metrics::prometheus::scalar(out, &name, kind, &help, v);
    }
}

/// `agent_sim_serve_<protocol>_<field>_total{<key>="..."}` for a map of
/// counts (`rpc_calls` by `method`).
fn labelled_family(
    out: &mut String,
    protocol: &str,
    field: &str,
    by: &serde_json::Map<String, serde_json::Value>,
) {
    use std::fmt::Write as _;
    let name = format!("agent_sim_serve_{protocol}_{field}_total");
    // `<what>_by_<label>` (`serf_received_by_type`, `rejected_by_reason`).
    let label = match field {
        "rpc_calls" => "method",
        f => f.rsplit_once("_by_").map_or("key", |(_, l)| l),
    };
    let _ = writeln!(
        out,
        "# HELP {name} agent-sim serve: {protocol} {} by {label}.\n# TYPE {name} counter",
        field.replace('_', " ")
    );
    for (k, v) in by {
        if let Some(v) = v.as_f64() {
            let k = k.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(out, "{name}{{{label}=\"{k}\"}} {v}");
        }
    }
}

/// What `serve --metrics-addr` shows: the process and the backend's stats.
fn exposition(backend: &Backend) -> String {
    let mut out = String::with_capacity(8 * 1024);
    agent_sim_metrics::prometheus::process_families(&mut out);
    if let Some(s) = backend.sensu_stats() {
        stats_families(
            &mut out,
            "sensu",
            serde_json::to_value(s).unwrap_or_default(),
        );
    }
    if let Some(s) = backend.consul_stats() {
        stats_families(
            &mut out,
            "consul",
            serde_json::to_value(s).unwrap_or_default(),
        );
    }
    out
}

/// Serves `--metrics-addr` until `shutdown`.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    page: Arc<dyn Fn() -> String + Send + Sync>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics-addr {addr}: {e}"))?;
    eprintln!(
        "agent-sim serve: metrics on http://{}/metrics",
        listener.local_addr()?
    );
    tokio::spawn(async move {
        let _ = agent_sim_metrics::prometheus::serve_text(listener, page, async move {
            shutdown.cancelled().await
        })
        .await;
    });
    Ok(())
}

/// Calls `print` every `every` (never if zero) until `shutdown`; the
/// caller prints once more after its servers stopped.
async fn print_stats<F: Fn()>(every: Duration, shutdown: &CancellationToken, print: F) {
    if every > Duration::ZERO {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => print(),
                _ = shutdown.cancelled() => break,
            }
        }
    } else {
        shutdown.cancelled().await;
    }
}

/// A follower (`--consul-leader`): the RPC port relayed to the leader
/// until `shutdown`.
async fn serve_follower(
    a: &ServeArgs,
    rpc: std::net::SocketAddr,
    leader: std::net::SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    use agent_sim_server::consul::{RelayConfig, RelayCounters, serve_relay};
    let listener = agent_sim_server::listen::bind(rpc, a.reuse_port)
        .map_err(|e| anyhow::anyhow!("--consul-rpc {rpc}: {e}"))?;
    let counters = Arc::new(RelayCounters::default());
    if let Some(addr) = a.metrics_addr {
        let c = counters.clone();
        serve_metrics(
            addr,
            Arc::new(move || relay_exposition(&c)),
            shutdown.clone(),
        )
        .await?;
    }
    eprintln!(
        "agent-sim serve: consul rpc on {}, a follower relaying to the leader at {leader}",
        listener.local_addr()?
    );
    let relay = tokio::spawn(serve_relay(
        listener,
        RelayConfig::new(leader),
        counters.clone(),
        shutdown.clone(),
    ));
    let print = || {
        eprintln!(
            "agent-sim serve: relay {}",
            serde_json::to_string(&counters.snapshot()).unwrap_or_default()
        );
    };
    print_stats(a.stats_every.0, &shutdown, print).await;
    let _ = relay.await;
    print();
    Ok(())
}

/// What a follower's `--metrics-addr` shows: the process and its relay.
fn relay_exposition(counters: &agent_sim_server::consul::RelayCounters) -> String {
    let mut out = String::with_capacity(4 * 1024);
    agent_sim_metrics::prometheus::process_families(&mut out);
    stats_families(
        &mut out,
        "consul_relay",
        serde_json::to_value(counters.snapshot()).unwrap_or_default(),
    );
    out
}

/// Runs the requested servers until `shutdown`.
pub async fn serve(a: ServeArgs, p: ServePlan, shutdown: CancellationToken) -> anyhow::Result<()> {
    if let (Some(rpc), Some(leader)) = (a.consul_rpc, a.consul_leader) {
        return serve_follower(&a, rpc, leader, shutdown).await;
    }
    let backend = Arc::new(Backend::start(backend_config(&a, &p)).await?);
    if let Some(addr) = a.metrics_addr {
        let b = backend.clone();
        serve_metrics(addr, Arc::new(move || exposition(&b)), shutdown.clone()).await?;
    }
    if let Some(addr) = backend.sensu_addr() {
        let scheme = if p.sensu_tls.is_some() { "wss" } else { "ws" };
        let certs = if a.sensu_agent_ca_file.is_some() {
            " (client certificates of the agent CA, else the password)"
        } else {
            ""
        };
        let cost = match a.sensu_password_cost {
            Some(c) => format!(", password checked with bcrypt cost {c}"),
            None => String::new(),
        };
        eprintln!("agent-sim serve: sensu agent endpoint on {scheme}://{addr}/{certs}{cost}");
    }
    if let Some((rpc, http)) = backend.consul_addrs() {
        let tls = if p.consul_tls.is_some() {
            " (TLS: rpc 0x03 + TLS, https)"
        } else {
            ""
        };
        eprintln!("agent-sim serve: consul rpc on {rpc}, http on {http}{tls}");
        if let Some(serf) = backend.consul_serf_addr() {
            eprintln!("agent-sim serve: consul serf LAN on {serf} (udp and tcp)");
        }
        if let Some(grpc) = backend.consul_grpc_addr() {
            eprintln!(
                "agent-sim serve: consul grpc (dataplane, delta xDS; coalescing {:?}, updates at \
                 most {}) on {grpc}",
                a.xds_coalesce.0, a.xds_update_rate
            );
        }
    }
    for f in &p.faults {
        eprintln!("agent-sim serve: fault {f}");
    }
    if !p.faults.is_empty() {
        eprintln!("agent-sim serve: faults seed {}", p.faults_seed);
    }
    let print = || {
        if let Some(s) = backend.sensu_stats() {
            eprintln!(
                "agent-sim serve: sensu {}",
                serde_json::to_string(&s).unwrap_or_default()
            );
        }
        if let Some(s) = backend.consul_stats() {
            eprintln!(
                "agent-sim serve: consul {}",
                serde_json::to_string(&s).unwrap_or_default()
            );
        }
        if !p.faults.is_empty() {
            eprintln!(
                "agent-sim serve: faults {}",
                serde_json::to_string(&backend.fault_stats()).unwrap_or_default()
            );
        }
    };
    print_stats(p.stats_every, &shutdown, &print).await;
    backend.stop().await;
    print();
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn counts_by_method_are_one_labelled_family() {
        let mut out = String::new();
        stats_families(
            &mut out,
            "consul",
            serde_json::json!({"rpc_calls": {"Coordinate.Update": 12, "Status.Ping": 3}, "rpc_errors": 1}),
        );
        assert!(
            out.contains("agent_sim_serve_consul_rpc_calls_total{method=\"Coordinate.Update\"} 12"),
            "{out}"
        );
        assert!(out.contains("# TYPE agent_sim_serve_consul_rpc_calls_total counter"));
        assert!(
            out.contains("agent_sim_serve_consul_rpc_errors_total 1"),
            "{out}"
        );
    }
    use crate::args::{Cli, Command};

    fn consul_cfg(extra: &[&str]) -> ConsulTargetConfig {
        let mut argv = vec![
            "agent-sim",
            "serve",
            "--consul-rpc",
            "127.0.0.1:0",
            "--consul-http",
            "127.0.0.1:0",
            "--consul-grpc",
            "127.0.0.1:0",
        ];
        argv.extend_from_slice(extra);
        let Some(Command::Serve(a)) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("serve");
        };
        let p = plan(&a).unwrap();
        backend_config(&a, &p).consul.unwrap().cfg
    }

    fn serve_plan(argv: &[&str]) -> Result<ServePlan, UsageError> {
        let argv = [&["agent-sim", "serve"][..], argv].concat();
        let Some(Command::Serve(a)) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("serve");
        };
        plan(&a)
    }

    #[test]
    fn the_serf_port_takes_its_key_and_label_and_needs_the_consul_ports() {
        let key = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";
        let cfg = consul_cfg(&[
            "--consul-serf",
            "127.0.0.1:0",
            "--consul-serf-key",
            key,
            "--consul-serf-label",
            "prod",
        ])
        .serf
        .unwrap();
        assert_eq!(cfg.security.label, "prod");
        assert!(cfg.security.keyring.is_some());
        assert!(consul_cfg(&[]).serf.is_none());
        let e = serve_plan(&["--consul-serf", "127.0.0.1:0"]).unwrap_err().0;
        assert!(e.contains("--consul-rpc"), "{e}");
        let e = serve_plan(&[
            "--consul-http",
            "127.0.0.1:0",
            "--consul-rpc",
            "127.0.0.1:0",
            "--consul-serf-key",
            key,
        ])
        .unwrap_err()
        .0;
        assert!(e.contains("need --consul-serf"), "{e}");
        let e = serve_plan(&[
            "--consul-http",
            "127.0.0.1:0",
            "--consul-rpc",
            "127.0.0.1:0",
            "--consul-serf",
            "127.0.0.1:0",
            "--consul-serf-key",
            "not base64!",
        ])
        .unwrap_err()
        .0;
        assert!(e.contains("not base64"), "{e}");
    }

    #[test]
    fn a_follower_takes_its_rpc_port_only_and_its_relay_counts_are_exposed() {
        let leader = ["--consul-leader", "127.0.0.1:8300"];
        assert!(serve_plan(&[&leader[..], &["--consul-rpc", "127.0.0.1:0"]].concat()).is_ok());
        let e = serve_plan(&leader).unwrap_err().0;
        assert!(e.contains("needs --consul-rpc"), "{e}");
        let e = serve_plan(
            &[
                &leader[..],
                &[
                    "--consul-rpc",
                    "127.0.0.1:0",
                    "--consul-http",
                    "127.0.0.1:0",
                ],
                &["--consul-serf", "127.0.0.1:0"],
            ]
            .concat(),
        )
        .unwrap_err()
        .0;
        assert!(
            e.contains("--consul-http, --consul-serf belong to the leader's serve"),
            "{e}"
        );
        let out = relay_exposition(&agent_sim_server::consul::RelayCounters::default());
        assert!(
            out.contains("# TYPE agent_sim_serve_consul_relay_links_open gauge"),
            "{out}"
        );
        assert!(out.contains("agent_sim_serve_consul_relay_grpc_requests_total 0"));
    }

    #[test]
    fn serf_counts_by_type_and_cause_are_labelled_and_members_are_gauges() {
        let mut out = String::new();
        stats_families(
            &mut out,
            "consul",
            serde_json::json!({"serf_received_by_type": {"ping": 4}, "serf_bad_by_cause": {"label": 1}, "serf_members_alive": 3}),
        );
        assert!(
            out.contains("agent_sim_serve_consul_serf_received_by_type_total{type=\"ping\"} 4"),
            "{out}"
        );
        assert!(out.contains("agent_sim_serve_consul_serf_bad_by_cause_total{cause=\"label\"} 1"));
        assert!(
            out.contains("# TYPE agent_sim_serve_consul_serf_members_alive gauge"),
            "{out}"
        );
    }

    /// The Sensu endpoint's settings from `serve` flags (after `--sensu`).
    fn sensu_cfg(extra: &[&str]) -> Result<SensuTargetConfig, UsageError> {
        let argv = [&["agent-sim", "serve", "--sensu", "127.0.0.1:0"][..], extra].concat();
        let Some(Command::Serve(a)) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("serve");
        };
        let p = plan(&a)?;
        Ok(backend_config(&a, &p).sensu.unwrap().1)
    }

    #[test]
    fn sensu_password_cost_and_tls_flags_reach_the_endpoint_and_are_checked() {
        let plain = sensu_cfg(&[]).unwrap();
        assert_eq!(plain.password_cost, None);
        assert!(plain.tls.is_none());
        assert_eq!(
            sensu_cfg(&["--sensu-password-cost", "4"])
                .unwrap()
                .password_cost,
            Some(4)
        );
        let e = sensu_cfg(&["--sensu-password-cost", "3"]).unwrap_err().0;
        assert!(e.contains("4 to 14"), "{e}");
        let pki = agent_sim_testkit::Pki::new("serve-sensu-tls");
        let (cert, key, ca) = (
            pki.path("server.pem"),
            pki.path("server-key.pem"),
            pki.path("ca.pem"),
        );
        let (cert, key, ca) = (
            cert.to_str().unwrap(),
            key.to_str().unwrap(),
            ca.to_str().unwrap(),
        );
        let tls = sensu_cfg(&[
            "--sensu-tls-cert-file",
            cert,
            "--sensu-tls-key-file",
            key,
            "--sensu-agent-ca-file",
            ca,
        ])
        .unwrap();
        assert!(tls.tls.is_some());
        let e = sensu_cfg(&["--sensu-agent-ca-file", ca]).unwrap_err().0;
        assert!(e.contains("go together"), "{e}");
        let e = sensu_cfg(&[
            "--sensu-tls-cert-file",
            cert,
            "--sensu-tls-key-file",
            "/nope",
        ])
        .unwrap_err()
        .0;
        assert!(e.contains("/nope"), "{e}");
        let e = serve_plan(&[
            "--consul-rpc",
            "127.0.0.1:0",
            "--consul-http",
            "127.0.0.1:0",
            "--sensu-password-cost",
            "10",
        ])
        .unwrap_err()
        .0;
        assert!(e.contains("need --sensu"), "{e}");
    }

    #[test]
    fn the_xds_update_rate_is_consuls_by_default_and_off_is_no_limit() {
        assert_eq!(consul_cfg(&[]).xds_update_rate, 250.0);
        assert_eq!(
            consul_cfg(&["--xds-update-rate", "50/s"]).xds_update_rate,
            50.0
        );
        assert_eq!(
            consul_cfg(&["--xds-update-rate", "off"]).xds_update_rate,
            0.0
        );
    }
}
