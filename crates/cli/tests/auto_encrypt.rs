//! `--auto-encrypt` end to end: client agents against the in-process
//! reference target ask for their certificate at boot (`AutoEncrypt.Sign`
//! over `0x07` + TLS) faster than the servers' signing rate, back off as a
//! Consul 1.20 agent does, and every one gets its certificate: one
//! `auto_encrypt` latency per agent, the refusals counted in the server's
//! words. Against a TLS backend that wants client certificates on its
//! `0x03` connections, the agents verify its certificate with the run's CA
//! and ask without one, as the server's insecure RPC port takes them.

use std::time::Duration;

use agent_sim::{Kind, RunBuilder};
use agent_sim_server::consul::ConsulTargetConfig;
use agent_sim_testkit::Pki;

use crate::common;
use crate::common::assert_exit;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_gets_its_certificate_past_the_signing_rate() {
    let agents = 60;
    let outcome = RunBuilder::new(Kind::Consul)
        .agents(agents)
        .duration(Duration::from_secs(4))
        .args(|a| {
            a.ramp = Some("all".parse().unwrap());
            a.upstreams = Some("web".parse().unwrap());
            a.probe = Some("off".parse().unwrap());
            a.auto_encrypt = Some(true);
        })
        .assert("agents.connected == requested".parse().unwrap())
        .assert("errors.total == 0".parse().unwrap())
        .run()
        .await
        .expect("run");
    assert_exit(&outcome, 0);
    let s = &outcome.summary;
    assert_eq!(s.latency_us["auto_encrypt"].count, agents);
    // 60 at once against 50/s with a burst of 1 and a 500 ms wait: some are
    // refused, wait 1 s (a round of the one server failed twice) and get it.
    let limited = s.counters["auto_encrypt_rate_limited"];
    assert!(limited > 0, "{:?}", s.counters);
    assert_eq!(s.warnings["auto_encrypt_rate_limited"].count, limited);
    let ca = &outcome
        .embedded_consul
        .as_ref()
        .expect("embedded target stats")
        .connect_ca;
    assert_eq!(ca.agent_certs_signed, agents);
    assert_eq!(ca.sign_rate_limited, limited);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_servers_tls_the_certificate_is_verified_and_none_is_shown() {
    let pki = Pki::new("cli-auto-encrypt");
    let tls = agent_sim_net::server_config(
        &pki.path("server.pem"),
        &pki.path("server-key.pem"),
        Some(&pki.path("ca.pem")),
    )
    .unwrap();
    let b = common::consul_backend(ConsulTargetConfig {
        tls: Some(tls),
        ..ConsulTargetConfig::default()
    })
    .await;
    let agents = 10;
    let outcome = RunBuilder::new(Kind::Consul)
        .agents(agents)
        .duration(Duration::from_secs(3))
        .args(|a| {
            a.targets = vec![b.rpc.to_string()];
            a.http_target = Some(format!("https://{}", b.http));
            a.ca_file = Some(pki.path("ca.pem"));
            a.cert_file = Some(pki.path("client.pem"));
            a.key_file = Some(pki.path("client-key.pem"));
            a.ramp = Some("all".parse().unwrap());
            a.upstreams = Some("web".parse().unwrap());
            a.probe = Some("off".parse().unwrap());
            a.auto_encrypt = Some(true);
        })
        .assert("agents.connected == requested".parse().unwrap())
        .assert("errors.total == 0".parse().unwrap())
        .run()
        .await
        .expect("run");
    b.stop.cancel();
    assert_exit(&outcome, 0);
    assert_eq!(outcome.summary.latency_us["auto_encrypt"].count, agents);
    let seen = b.state.stats();
    assert_eq!(seen.connect_ca.agent_certs_signed, agents);
    assert_eq!(seen.rpc_rejected_tls, 0, "{seen:?}");
}
