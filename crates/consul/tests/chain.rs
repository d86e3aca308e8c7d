//! Service chains (`--service-chain`) against the embedded Consul server on
//! paused time: each agent registers its tier's service, the catalog holds
//! every tier at its size, and the agents of each tier but the last watch
//! the next tier of their own chain.

use crate::common::*;
use agent_sim_testkit::bounded::until;

use std::time::Duration;

use agent_sim_consul::ConsulConfig;
use bytes::Bytes;
use http::Method;

async fn get_json(t: &Target, path: &str) -> serde_json::Value {
    let body = t.api().call(Method::GET, path, Bytes::new()).await.unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test(start_paused = true)]
async fn each_tier_registers_its_service_and_watches_the_next() {
    let t = start_target().await;
    let m = metrics();
    // 2, 3 and 4 instances at 2 an agent: 5 agents a chain (tiers of 1, 2
    // and 2 agents), so 20 agents are 4 chains.
    let cfg = ConsulConfig {
        upstreams: vec!["web".into()],
        services_per_agent: 2,
        sidecars: true,
        service_chain: Some("2,3,4".parse().unwrap()),
        session_ttl: None,
        ..config(&t)
    };
    let fleet = tokio::spawn({
        let m = m.clone();
        async move { run_fleet(cfg, fleet_of(20, Some(100.0), Duration::from_secs(30)), &m).await }
    });
    until(
        Duration::from_secs(20),
        "every agent registered",
        async || counter(&m, "registrations") == 20,
    )
    .await;

    for chain in 0..4 {
        for (tier, instances) in [("a", 2), ("b", 3), ("c", 4)] {
            let name = format!("app-{tier}-{chain}");
            let listed = get_json(&t, &format!("/v1/catalog/service/{name}")).await;
            assert_eq!(listed.as_array().unwrap().len(), instances, "{name}");
            // Each instance's sidecar calls the next tier first, then the
            // fleet's own upstreams.
            let proxies = get_json(&t, &format!("/v1/catalog/service/{name}-sidecar-proxy")).await;
            let ups: Vec<&str> = proxies[0]["ServiceProxy"]["Upstreams"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u["DestinationName"].as_str().unwrap())
                .collect();
            let want: Vec<String> = match tier {
                "a" => vec![format!("app-b-{chain}"), "web".into()],
                "b" => vec![format!("app-c-{chain}"), "web".into()],
                _ => vec!["web".into()],
            };
            assert_eq!(ups, want, "{name}");
        }
    }
    let plain = get_json(&t, "/v1/catalog/service/app").await;
    assert_eq!(
        plain,
        serde_json::json!([]),
        "no agent registers the plain name"
    );
    // Every agent watches `web`; the 3 agents of tiers a and b of each
    // chain also watch the next tier.
    until(Duration::from_secs(10), "every stream open", async || {
        t.state.stats().subscriptions_active == 20 + 4 * 3
    })
    .await;
    fleet.await.unwrap();
}
