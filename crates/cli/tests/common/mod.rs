//! Helpers shared by the integration tests.

/// A per-process path in the temp directory (tests run in parallel processes).
#[allow(dead_code)]
pub fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("agent-sim-test-{}-{name}", std::process::id()))
}

/// Asserts that a run ended with exit code `code`; otherwise shows why it
/// did not (the problem and every assertion's verdict).
/// Every error and warning kind the run counted has its hint: a kind
/// counted without one fails here (each kind is declared once, with what
/// to check, by the crate that counts it).
#[allow(dead_code)]
pub fn assert_exit(o: &agent_sim::run::RunOutcome, code: i32) {
    assert_eq!(
        o.exit_code, code,
        "{:?} {:?} {:?}",
        o.problem, o.verdicts, o.summary.outcome
    );
    assert_hinted(&o.summary);
}

/// Fails on an error or warning kind counted without a hint.
#[allow(dead_code)]
pub fn assert_hinted(s: &agent_sim_metrics::Summary) {
    let bare: Vec<&String> = s
        .errors
        .iter()
        .chain(&s.warnings)
        .filter(|(_, e)| e.hint.is_none())
        .map(|(k, _)| k)
        .collect();
    assert!(bare.is_empty(), "kinds counted without a hint: {bare:?}");
}

/// An embedded Consul backend serving on 127.0.0.1:0.
#[allow(dead_code)]
pub struct ConsulBackend {
    /// Its catalog and counters.
    pub state: agent_sim_server::consul::ConsulState,
    /// The RPC port's address.
    pub rpc: std::net::SocketAddr,
    /// The HTTP API's address.
    pub http: std::net::SocketAddr,
    /// Cancel to stop it.
    pub stop: tokio_util::sync::CancellationToken,
}

/// Starts an embedded Consul backend with `cfg` (RPC and HTTP on
/// 127.0.0.1:0).
#[allow(dead_code)]
pub async fn consul_backend(cfg: agent_sim_server::consul::ConsulTargetConfig) -> ConsulBackend {
    use agent_sim_server::consul::{ConsulState, serve_http, serve_rpc};
    let state = ConsulState::new(cfg);
    let rpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = ConsulBackend {
        state: state.clone(),
        rpc: rpc.local_addr().unwrap(),
        http: http.local_addr().unwrap(),
        stop: tokio_util::sync::CancellationToken::new(),
    };
    tokio::spawn(serve_rpc(rpc, state.clone(), b.stop.clone()));
    tokio::spawn(serve_http(http, state, b.stop.clone()));
    b
}
