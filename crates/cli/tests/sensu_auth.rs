//! Sensu agents and the two ways into a backend, end to end against the
//! in-process endpoint on 127.0.0.1:0 checking passwords with bcrypt at cost
//! 4: agents with the right password connect (one check each, counted by
//! the backend, `connects` counted by the run); over `wss://` with a client
//! certificate signed by the agent CA they connect with no check at all; a
//! wrong password (401) and a certificate from another CA (refused in the
//! TLS handshake) are errors that do not heal, end the run by themselves and
//! cost the backend a bounded number of attempts, not a storm.

use std::sync::Arc;
use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};
use agent_sim_server::sensu::{SensuTargetConfig, SensuTargetSnapshot, SensuTargetStats, serve};
use agent_sim_testkit::Pki;
use tokio_util::sync::CancellationToken;

/// A backend checking passwords at cost 4, with TLS when `tls` is given.
async fn backend(
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (String, Arc<SensuTargetStats>, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let target = match tls {
        Some(_) => format!("wss://{addr}/"),
        None => addr.to_string(),
    };
    let cfg = SensuTargetConfig {
        password_cost: Some(4),
        tls,
        ..SensuTargetConfig::default()
    };
    let stats = Arc::new(SensuTargetStats::default());
    let stop = CancellationToken::new();
    tokio::spawn(serve(listener, cfg, stats.clone(), stop.clone()));
    (target, stats, stop)
}

/// The backend's TLS: its certificate from `pki`, agents' from `agent_ca`.
fn tls(pki: &Pki, agent_ca: &Pki) -> Arc<rustls::ServerConfig> {
    agent_sim_server::sensu::tls::server_config(
        &pki.path("server.pem"),
        &pki.path("server-key.pem"),
        Some(&agent_ca.path("ca.pem")),
    )
    .unwrap()
}

fn by_auth(s: &SensuTargetSnapshot, way: &str) -> u64 {
    s.upgrades_accepted_by_auth.get(way).copied().unwrap_or(0)
}

/// `agents` agents started at once against `target`, held for `secs`.
fn fleet(target: String, agents: u64, secs: u64) -> RunBuilder {
    RunBuilder::new(Kind::Sensu)
        .agents(agents)
        .ramp(Ramp::All)
        .target(target)
        .duration(Duration::from_secs(secs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_password_connect_is_one_bcrypt_check_and_a_counted_connect() {
    let (target, stats, stop) = backend(None).await;
    let outcome = fleet(target, 20, 2).run().await.expect("run");
    stop.cancel();
    let s = &outcome.summary;
    assert_eq!(s.agents.connected, 20, "{:?}", s.errors);
    assert_eq!(s.counters["connects"], 20);
    assert!(
        s.rates_per_s.contains_key("connects"),
        "{:?}",
        s.rates_per_s
    );
    let b = stats.snapshot();
    assert_eq!(by_auth(&b, "password"), 20);
    assert_eq!(b.bcrypt_checks, 20);
    assert!(b.bcrypt_cpu_us > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_of_the_agent_ca_connects_with_no_password_check() {
    let pki = Pki::new("sensu-cert");
    let (target, stats, stop) = backend(Some(tls(&pki, &pki))).await;
    let outcome = fleet(target, 20, 2)
        .args(|a| {
            // The certificate wins: the password is never looked at.
            a.password = Some("not-the-password".into());
            a.ca_file = Some(pki.path("ca.pem"));
            a.cert_file = Some(pki.path("client.pem"));
            a.key_file = Some(pki.path("client-key.pem"));
        })
        .run()
        .await
        .expect("run");
    stop.cancel();
    let s = &outcome.summary;
    assert_eq!(s.agents.connected, 20, "{:?}", s.errors);
    assert_eq!(s.counters["connects"], 20);
    let b = stats.snapshot();
    assert_eq!(by_auth(&b, "certificate"), 20);
    assert_eq!((by_auth(&b, "password"), b.bcrypt_checks), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_error_that_does_not_heal_and_no_storm() {
    let (target, stats, stop) = backend(None).await;
    let t0 = std::time::Instant::now();
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(20)
        .ramp(Ramp::All)
        .target(target)
        .args(|a| {
            a.password = Some("wrong".into());
            a.give_up_after = Some("2s".parse().unwrap());
        })
        .shutdown(CancellationToken::new())
        .run()
        .await
        .expect("run");
    stop.cancel();
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let s = &outcome.summary;
    assert_eq!(outcome.exit_code, 1, "{:?}", s.outcome);
    let e = &s.errors["upgrade_401"];
    assert!(!e.heals);
    assert!(e.hint.as_deref().unwrap().contains("--password"));
    // Each attempt cost the backend a check; the agents backed off (the
    // real agent's 1 s, doubling, jittered) instead of hammering it.
    let b = stats.snapshot();
    assert_eq!(b.bcrypt_checks, e.count);
    assert!(e.count >= 40 && e.count <= 20 * 5, "{e:?}");
    // Counted apart as denied, never as a success.
    assert_eq!(s.denied["agent websocket"], e.count, "{:?}", s.denied);
    assert_eq!(s.agents.ever_connected, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_refused_in_the_handshake_and_does_not_heal() {
    // The stranger's CA has the same name as the backend's (test PKIs are
    // all named alike), another key: its certificates fail on their
    // signature (alert `decrypt_error`; an unknown issuer's is
    // `unknown_ca`, in the server crate's tests).
    let (pki, stranger) = (Pki::new("sensu-ca"), Pki::new("sensu-stranger"));
    let (target, stats, stop) = backend(Some(tls(&pki, &pki))).await;
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(10)
        .ramp(Ramp::All)
        .target(target)
        .args(|a| {
            a.ca_file = Some(pki.path("ca.pem"));
            a.cert_file = Some(stranger.path("client.pem"));
            a.key_file = Some(stranger.path("client-key.pem"));
            a.give_up_after = Some("2s".parse().unwrap());
        })
        .shutdown(CancellationToken::new())
        .run()
        .await
        .expect("run");
    stop.cancel();
    let s = &outcome.summary;
    assert_eq!(outcome.exit_code, 1, "{:?}", s.outcome);
    let e = &s.errors["tls_client_cert"];
    assert!(!e.heals);
    let hint = e.hint.as_deref().unwrap();
    assert!(
        hint.contains("--cert-file") && hint.contains("--ca-file"),
        "{hint}"
    );
    let b = stats.snapshot();
    assert_eq!(b.rejected_client_cert, e.count);
    assert_eq!(s.denied["agent websocket"], e.count, "{:?}", s.denied);
    assert_eq!((b.upgrades_accepted, b.bcrypt_checks), (0, 0));
    assert!(e.count <= 10 * 5, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_certificate_the_agents_do_not_trust_is_agent_sims_words_not_the_servers() {
    // The agents trust another CA: rustls refuses the backend's
    // certificate on this side, so the sample is agent-sim's verdict, and
    // the report must not say the server said it.
    let (pki, stranger) = (Pki::new("sensu-ca"), Pki::new("sensu-stranger"));
    let (target, _stats, stop) = backend(Some(tls(&pki, &pki))).await;
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(4)
        .ramp(Ramp::All)
        .target(target)
        .args(|a| {
            a.ca_file = Some(stranger.path("ca.pem"));
            a.give_up_after = Some("2s".parse().unwrap());
        })
        .shutdown(CancellationToken::new())
        .run()
        .await
        .expect("run");
    stop.cancel();
    let e = &outcome.summary.errors["tls"];
    assert_eq!(e.said_by, agent_sim_metrics::Speaker::Local, "{e:?}");
    assert!(
        e.sample.as_deref().unwrap().contains("certificate"),
        "{e:?}"
    );
    // The same kind keeps the server's voice where its alert was the
    // cause (the declared default).
    let spec = agent_sim_sensu::metrics_spec();
    let tls = spec.errors.iter().find(|k| k.kind == "tls").unwrap();
    assert_eq!(tls.said_by, agent_sim_metrics::Speaker::Server);
}
