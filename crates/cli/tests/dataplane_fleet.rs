//! End to end: dataplane sidecars against the in-process reference target
//! (HTTP API and public gRPC port on 127.0.0.1:0), alone and beside Consul
//! client agents in one run, through the same path as the binary; and the
//! flags' usage errors.

use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder};

use crate::common::{assert_exit, temp_path};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_time_the_probe_at_their_eds_updates_and_leave_the_catalog() {
    let summary_path = temp_path("dataplane-50.json");
    let outcome = RunBuilder::new(Kind::ConsulDataplane)
        .agents(50)
        .ramp(Ramp::per_second(1000.0))
        .duration(Duration::from_secs(5))
        .args(|a| {
            a.probe_every = Some("1500ms".parse().unwrap());
            a.probe_timeout = Some("1s".parse().unwrap());
            a.watch_servers = Some(true);
            a.summary = Some(summary_path.clone());
        })
        .assert("agents.connected == requested".parse().unwrap())
        .assert("probes.delivered_ratio == 1".parse().unwrap())
        .assert("errors.total == 0".parse().unwrap())
        .assert("propagation_xds.count >= 100".parse().unwrap())
        .run()
        .await
        .expect("run");
    let s = &outcome.summary;
    assert_exit(&outcome, 0);
    assert_eq!(s.kind, "consul-dataplane");
    assert_eq!(s.counters["xds_streams"], 50);
    assert_eq!(s.counters["server_lists"], 50);
    assert_eq!(s.counters["xds_nacks"], 0);
    assert!(s.probes.len() >= 2, "{:?}", s.probes);
    for p in &s.probes {
        assert_eq!((p.delivered, p.expected), (50, 50), "{p:?}");
        assert_eq!(p.fleet.as_deref(), Some("consul-dataplane"));
    }
    let target = outcome.embedded_consul.expect("embedded target");
    assert_eq!(target.xds_streams, 50);
    assert_eq!(target.xds_nacks, 0);
    // The summary file carries the probes' `fleet`.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary_path).unwrap()).unwrap();
    assert_eq!(json["probes"][0]["fleet"], "consul-dataplane");
    let _ = std::fs::remove_file(&summary_path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_run_times_one_change_at_both_fleets() {
    let dir = temp_path("mixed-dp");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("run.toml");
    std::fs::write(
        &cfg,
        "duration = \"5s\"\nramp = \"1000/s\"\nprobe-every = \"1500ms\"\nprobe-timeout = \"1s\"\n\
         session-ttl = \"off\"\n\
         [[fleet]]\nkind = \"consul\"\nagents = 30\n\
         [[fleet]]\nkind = \"consul-dataplane\"\nagents = 30\n",
    )
    .unwrap();
    let outcome = RunBuilder::new(Kind::Sensu)
        .args(|a| {
            a.kind = None;
            a.config = Some(cfg.clone());
        })
        .run()
        .await
        .expect("run");
    let s = &outcome.summary;
    assert_exit(&outcome, 0);
    assert_eq!(s.kind, "mixed");
    assert_eq!(s.agents.connected, 60);
    let subscribe: Vec<_> = s.probes.iter().filter(|p| p.fleet.is_none()).collect();
    let xds: Vec<_> = s.probes.iter().filter(|p| p.fleet.is_some()).collect();
    assert!(
        !subscribe.is_empty() && subscribe.len() == xds.len(),
        "{:?}",
        s.probes
    );
    for (a, b) in subscribe.iter().zip(&xds) {
        assert_eq!((a.id, &a.t0), (b.id, &b.t0), "one change, two entries");
        assert_eq!((a.delivered, a.expected), (30, 30), "{a:?}");
        assert_eq!((b.delivered, b.expected), (30, 30), "{b:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dataplane_flags_are_checked_before_any_socket() {
    use agent_sim::args::RunArgs;
    use agent_sim::config::resolve;
    let no_env = |_: &str| None;
    let args = |f: &dyn Fn(&mut RunArgs)| {
        let mut a = RunArgs::default();
        f(&mut a);
        a
    };
    for (a, needle) in [
        (
            args(&|a| {
                a.kind = Some(Kind::ConsulDataplane);
                a.adopt = Some("web-sidecar-proxy-{i}".into());
            }),
            "--adopt-node",
        ),
        (
            args(&|a| {
                a.kind = Some(Kind::ConsulDataplane);
                a.envoy_version = Some("1.29".parse().unwrap());
            }),
            "--envoy-version",
        ),
        (
            args(&|a| {
                a.kind = Some(Kind::ConsulDataplane);
                a.probe = Some("intentions".parse().unwrap());
            }),
            "--probe",
        ),
        (
            args(&|a| {
                a.kind = Some(Kind::Consul);
                a.adopt = Some("x-{i}".into());
            }),
            "--adopt",
        ),
    ] {
        let e = resolve(a, &no_env).unwrap_err().0;
        assert!(e.starts_with(needle), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
