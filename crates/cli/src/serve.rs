//! `agent-sim serve`: the embedded reference backend as its own process, so
//! a benchmark measures the simulator apart from its target (and several
//! `serve --reuse-port` processes can share one port).

use std::sync::Arc;
use std::time::Duration;

use agent_sim_server::consul::{ConsulState, ConsulTargetConfig};
use agent_sim_server::sensu::{CheckSpec, SensuTargetConfig, SensuTargetStats};
use tokio_util::sync::CancellationToken;

use crate::args::ServeArgs;
use crate::config::UsageError;

/// Validated `serve` settings.
#[derive(Debug, Clone)]
pub struct ServePlan {
    args_check_interval: Duration,
    stats_every: Duration,
    /// TLS of the Consul listeners.
    consul_tls: Option<Arc<rustls::ServerConfig>>,
}

/// Validates `serve` flags (exit 64 on error).
pub fn plan(a: &ServeArgs) -> Result<ServePlan, UsageError> {
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
    if a.consul_rpc.is_some() != a.consul_http.is_some() {
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
    Ok(ServePlan {
        args_check_interval: check,
        stats_every,
        consul_tls,
    })
}

/// Runs the requested servers until `shutdown`.
pub async fn serve(a: ServeArgs, p: ServePlan, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    let mut sensu_stats = None;
    let mut consul_state = None;
    if let Some(addr) = a.sensu {
        let listener = agent_sim_server::listen::bind(addr, a.reuse_port)
            .map_err(|e| anyhow::anyhow!("--sensu {addr}: {e}"))?;
        let cfg = SensuTargetConfig {
            user: a.user.clone(),
            password: a.password.clone(),
            checks: vec![CheckSpec {
                name: "agent-sim-check".into(),
                command: "!sensu_test_check!".into(),
                interval: p.args_check_interval,
                subscriptions: a.check_subscriptions.0.clone(),
            }],
            namespaces_ready_after: a.namespace_ready_after.0,
            ..SensuTargetConfig::default()
        };
        let stats = Arc::new(SensuTargetStats::default());
        sensu_stats = Some(stats.clone());
        eprintln!(
            "agent-sim serve: sensu agent endpoint on ws://{}/",
            listener.local_addr()?
        );
        let t = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            agent_sim_server::sensu::serve(listener, cfg, stats, t).await
        }));
    }
    if let (Some(rpc), Some(http)) = (a.consul_rpc, a.consul_http) {
        let state = ConsulState::new(ConsulTargetConfig {
            tls: p.consul_tls.clone(),
            rpc_max_conns_per_client: a.rpc_max_conns_per_client,
            acl_tokens: (!a.acl_tokens.is_empty()).then(|| a.acl_tokens.clone()),
            xds_coalesce: a.xds_coalesce.0,
            xds_max_streams: a.xds_max_streams,
            ..ConsulTargetConfig::default()
        });
        consul_state = Some(state.clone());
        let rl = agent_sim_server::listen::bind(rpc, a.reuse_port)
            .map_err(|e| anyhow::anyhow!("--consul-rpc {rpc}: {e}"))?;
        let hl = agent_sim_server::listen::bind(http, a.reuse_port)
            .map_err(|e| anyhow::anyhow!("--consul-http {http}: {e}"))?;
        let tls = if p.consul_tls.is_some() {
            " (TLS: rpc 0x03 + TLS, https)"
        } else {
            ""
        };
        eprintln!(
            "agent-sim serve: consul rpc on {}, http on {}{tls}",
            rl.local_addr()?,
            hl.local_addr()?
        );
        let (t1, t2, s2) = (shutdown.clone(), shutdown.clone(), state.clone());
        let s1 = state.clone();
        tasks.push(tokio::spawn(async move {
            agent_sim_server::consul::serve_rpc(rl, s1, t1).await
        }));
        if let Some(grpc) = a.consul_grpc {
            let gl = agent_sim_server::listen::bind(grpc, a.reuse_port)
                .map_err(|e| anyhow::anyhow!("--consul-grpc {grpc}: {e}"))?;
            eprintln!(
                "agent-sim serve: consul grpc (dataplane, delta xDS; coalescing {:?}) on {}",
                a.xds_coalesce.0,
                gl.local_addr()?
            );
            let (t3, s3) = (shutdown.clone(), state.clone());
            tasks.push(tokio::spawn(async move {
                agent_sim_server::consul::serve_grpc(gl, s3, t3).await
            }));
        }
        tasks.push(tokio::spawn(async move {
            agent_sim_server::consul::serve_http(hl, s2, t2).await
        }));
    }
    let print = || {
        if let Some(s) = &sensu_stats {
            eprintln!(
                "agent-sim serve: sensu {}",
                serde_json::to_string(&s.snapshot()).unwrap_or_default()
            );
        }
        if let Some(s) = &consul_state {
            eprintln!(
                "agent-sim serve: consul {}",
                serde_json::to_string(&s.stats()).unwrap_or_default()
            );
        }
    };
    if p.stats_every > Duration::ZERO {
        let mut tick = tokio::time::interval(p.stats_every);
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
    for t in tasks {
        if let Ok(Ok(Err(e))) = tokio::time::timeout(Duration::from_secs(5), t).await {
            eprintln!("agent-sim serve: {e}")
        }
    }
    print();
    Ok(())
}
