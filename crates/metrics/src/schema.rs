//! The JSON Schema (draft 2020-12) of the run summary, version 2
//! (`crates/metrics/schema/summary-v2.schema.json`), and version 1, which
//! older files follow (read and upgraded by [`crate::Summary::from_json`]).
//!
//! The schema is what other tools may rely on; the tests below keep it and
//! [`crate::Summary`] in step (a populated summary validates, a broken one does
//! not), with the validator of the dev-only `agent-sim-testkit` crate, so the
//! binary carries no validator. The schema has no remote references.

/// The schema text of what agent-sim writes (v2).
pub const SUMMARY_SCHEMA: &str = include_str!("../schema/summary-v2.schema.json");
/// The schema text of version 1 (older files).
pub const SUMMARY_SCHEMA_V1: &str = include_str!("../schema/summary-v1.schema.json");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{LatencySummary, ProbeSummary, SCHEMA_V2, Summary};
    use crate::units::rfc3339;
    use crate::{Metrics, MetricsSpec, new_latency_histogram};

    fn populated() -> Summary {
        let m = Metrics::new(
            &MetricsSpec {
                counters: vec!["keepalives_sent", "events_sent"],
                latencies: vec!["connect", "session_ready"],
                errors: Vec::new(),
            },
            2,
        );
        m.add(m.counter("keepalives_sent"), 7);
        m.error("connect_refused");
        m.record_us(m.latency("connect"), 0, 1_234);
        m.collect();
        let snap = m.snapshot();
        let mut h = new_latency_histogram();
        h.record(250_000).unwrap();
        Summary {
            schema: SCHEMA_V2.into(),
            kind: "sensu".into(),
            targets: vec!["ws://127.0.0.1:8081/".into()],
            started_at: rfc3339(std::time::SystemTime::now()),
            duration_s: 12.5,
            agents: crate::summary::AgentCounts {
                requested: 10,
                connected: 9,
                peak_connected: 10,
                ever_connected: 9,
                never_connected: 1,
                lost_not_back: 0,
                left: 1,
            },
            outcome: crate::summary::Outcome {
                exit_code: 2,
                complete: false,
                reason: Some("incomplete fleet".into()),
                missing: [("connect_refused".to_string(), 1)].into(),
            },
            counters: snap
                .counters
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            errors: snap
                .errors
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        crate::summary::KindEntry {
                            count: *v,
                            first_seen_s: 0.25,
                            sample: Some("connection refused".into()),
                            hint: Some("is the server up?".into()),
                            heals: true,
                            said_by: crate::Speaker::Os,
                        },
                    )
                })
                .collect(),
            warnings: [(
                "entity_config_timeout".to_string(),
                crate::summary::KindEntry {
                    count: 1,
                    ..Default::default()
                },
            )]
            .into(),
            sessions_lost: [("pong_timeout".to_string(), 2)].into(),
            latency_us: m
                .cumulative()
                .iter()
                .map(|(k, h)| (k.to_string(), LatencySummary::from_histogram(h)))
                .collect(),
            rates_per_s: [("keepalives".to_string(), 0.5)].into(),
            process: crate::process::stats(),
            probes: vec![
                ProbeSummary {
                    id: 1,
                    kind: "deregister".into(),
                    t0: rfc3339(std::time::SystemTime::now()),
                    delivered: 1,
                    expected: 1,
                    time_to_99pct_us: Some(250_000),
                    latency_us: LatencySummary::from_histogram(&h),
                    ..Default::default()
                },
                ProbeSummary {
                    id: 2,
                    kind: "register".into(),
                    t0: rfc3339(std::time::SystemTime::now()),
                    delivered: 0,
                    expected: 1,
                    time_to_99pct_us: None,
                    latency_us: LatencySummary::from_histogram(&new_latency_histogram()),
                    change_id: Some(42),
                    role: Some(crate::summary::ROLE_CONTROLLER.into()),
                    t0_unix_us: Some(1_795_300_860_000_000),
                    ..Default::default()
                },
                ProbeSummary {
                    id: 0,
                    kind: "register".into(),
                    t0: String::new(),
                    delivered: 1,
                    expected: 1,
                    time_to_99pct_us: Some(250_000),
                    latency_us: LatencySummary::from_histogram(&h),
                    change_id: Some(42),
                    role: Some(crate::summary::ROLE_OBSERVER.into()),
                    first_arrival_unix_us: Some(1_795_300_860_010_000),
                    note: Some("a merge note".into()),
                    ..Default::default()
                },
            ],
            shard: Some("0/2".into()),
            shard_from: Some("AGENT_SIM_SHARD_SLOT=1 (Docker Swarm task slot)".into()),
            disruptions: disruptions(),
            ..Default::default()
        }
    }

    /// A storm and a detected restart, one agent still missing.
    fn disruptions() -> Vec<crate::disruption::DisruptionSummary> {
        let log = crate::disruption::DisruptionLog::default();
        let s = std::time::Duration::from_secs(1);
        let storm = log.open("storm", "sensu", 20 * s, None).unwrap();
        log.lost(storm);
        log.lost(storm);
        log.back(storm, s / 2, 20 * s + s / 2, 1);
        log.missing(storm, "connect_refused", 3);
        log.resync(storm, crate::disruption::Resync::Snapshot);
        let restart = log
            .open(
                crate::disruption::CAUSE_BACKEND,
                "consul",
                40 * s,
                Some("n".into()),
            )
            .unwrap();
        log.lost(restart);
        log.summaries()
    }

    fn validate_summary_json(v: &serde_json::Value) -> Result<(), Vec<String>> {
        agent_sim_testkit::validate_json(SUMMARY_SCHEMA, v)
    }

    #[test]
    fn a_populated_summary_validates() {
        let v = serde_json::to_value(populated()).unwrap();
        validate_summary_json(&v).unwrap();
        // The minimal form (no probes, shard or rates) too.
        let mut s = populated();
        s.probes.clear();
        s.shard = None;
        s.shard_from = None;
        let mut v = serde_json::to_value(s).unwrap();
        v.as_object_mut().unwrap().remove("rates_per_s");
        validate_summary_json(&v).unwrap();
    }

    #[test]
    fn a_stepped_runs_capacity_validates() {
        use crate::capacity::{CapacitySummary, SloFigure, StepServer, StepSummary, StepVerdict};
        let step = |agents, verdict| StepSummary {
            agents,
            started_s: 1.0,
            window_s: (3.0, 8.0),
            connected: agents,
            verdict,
            slos: vec![SloFigure {
                slo: "propagation.p99 < 1s".into(),
                actual: "1.51s".into(),
                value: Some(1_510_000.0),
                passed: verdict == StepVerdict::Held,
                over: Some(1.51),
                note: None,
            }],
            errors: 2,
            top_error: Some("upgrade_5xx".into()),
            load_box: vec!["agent-sim's own CPU at 99 % of its 2 cores".into()],
            server: vec![StepServer {
                target: "http://127.0.0.1:8500/v1/agent/metrics".into(),
                cpu_cores: Some(0.4),
                rss_bytes: Some(9e7),
                cores_per_1000_agents: Some(0.1),
                rss_per_agent_kib: Some(12.0),
            }],
        };
        let mut c = CapacitySummary {
            slos: vec!["propagation.p99 < 1s".into()],
            hold_s: 5.0,
            settle_s: 1.0,
            steps: vec![step(4, StepVerdict::Held), step(8, StepVerdict::Failed)],
            ..CapacitySummary::default()
        };
        c.conclude(false);
        let s = Summary {
            capacity: Some(c),
            step_windows: vec![populated(), populated()],
            ..populated()
        };
        validate_summary_json(&serde_json::to_value(&s).unwrap()).unwrap();
        let back: Summary = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn disruptions_timeline_and_config_validate() {
        let mut h = new_latency_histogram();
        h.record(900_000).unwrap();
        let s = Summary {
            disruptions: vec![crate::disruption::DisruptionSummary {
                id: 1,
                cause: "storm".into(),
                fleet: "sensu".into(),
                began_s: 60.02,
                sessions_lost: 2,
                back: 1,
                back_after_s: crate::disruption::BackAfter {
                    p50: Some(0.9),
                    ..Default::default()
                },
                reconnect_us: LatencySummary::from_histogram(&h),
                attempts: 3,
                missing_at_end: [("connect_refused".to_string(), 1)].into(),
                ..Default::default()
            }],
            timeline: vec![crate::summary::TimelineSample {
                t_s: 10.0,
                connected: 9,
                rss_bytes: 1 << 20,
                cpu_s: 0.5,
                counters: [("keepalives_sent".to_string(), 4)].into(),
                errors: [("connect_refused".to_string(), 1)].into(),
                ..Default::default()
            }],
            config: Some(
                serde_json::json!({"agents": 10, "password": "<redacted>"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
            study: Some(crate::study::StudySummary {
                name: "demo".into(),
                title: "A published run".into(),
                source: "https://example.com/run".into(),
                doc: "docs/studies/demo.md".into(),
                scale: 0.5,
                scaled: vec!["agents: 5 of 10".into()],
                differences: vec!["one server".into()],
                figures: vec![crate::study::StudyFigure {
                    label: "connect p99".into(),
                    published: "1 s".into(),
                    ours: Some("connect.p99".into()),
                    note: None,
                }],
            }),
            ..populated()
        };
        let v = serde_json::to_value(&s).unwrap();
        validate_summary_json(&v).unwrap();
        assert!(v["disruptions"][0]["back_after_s"]["p99"].is_null());
        let mut bad = v.clone();
        bad["study"]["scale"] = serde_json::json!(0);
        assert!(validate_summary_json(&bad).is_err());
        assert_eq!(crate::Summary::from_json(&v.to_string()).unwrap(), s);
        let mut bad = v.clone();
        bad["timeline"][0]["connected"] = serde_json::json!(-1);
        assert!(validate_summary_json(&bad).is_err());
        let mut bad = v;
        bad["disruptions"][0]["back_after_s"]["p50"] = serde_json::json!("soon");
        assert!(validate_summary_json(&bad).is_err());
    }

    #[test]
    fn an_observed_server_validates() {
        use crate::server::{LatencyUnderLoad, Level, Quantiles, ServerSample, ServerSizing};
        let sample = |t_s: f64, cpu: f64| ServerSample {
            t_s,
            agents: 100,
            steady: t_s > 0.0,
            cpu_cores: Some(cpu),
            rss_bytes: Some(64 << 20),
            values: [("consul_rpc_request_per_s".to_string(), 12.5)].into(),
            latencies: [(
                "consul_raft_commit_time".to_string(),
                Quantiles {
                    p50: Some(23.0),
                    p99: Some(41.5),
                    count: 3.0,
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        let s = Summary {
            server: vec![crate::server::ServerSummary {
                target: "http://127.0.0.1:8500/v1/agent/metrics?format=prometheus".into(),
                kind: "consul".into(),
                source: "prometheus".into(),
                scrapes: 3,
                failed: 1,
                baseline: sample(-1.0, 0.01),
                samples: vec![sample(5.0, 0.4), sample(10.0, 0.5)],
                sizing: ServerSizing {
                    steady_s: Some((5.0, 10.0)),
                    agents: 100.0,
                    cpu_cores: Level {
                        baseline: Some(0.01),
                        mean: Some(0.45),
                        max: Some(0.5),
                    },
                    cores_per_1000_agents: Some(4.4),
                    ..Default::default()
                },
                latencies: [(
                    "consul_raft_commit_time".to_string(),
                    LatencyUnderLoad {
                        p99: Some(41.5),
                        unit: "ms".into(),
                        ..Default::default()
                    },
                )]
                .into(),
                notes: vec!["a note".into()],
                gossip: Some(crate::server::GossipSummary {
                    prefixes: vec!["agent-sim".into()],
                    polls: 3,
                    stale: 2,
                    samples: vec![crate::server::GossipSample {
                        t_s: 5.0,
                        alive: 98,
                        failed: 2,
                        critical: 2,
                        ..Default::default()
                    }],
                    failed_ever: 2,
                    failed_turns: 3,
                    first_failed_s: Some(4.5),
                    last_failed_s: Some(5.0),
                    critical_ever: 2,
                    first_critical_s: Some(5.0),
                    ..Default::default()
                }),
                storm: Some(storm()),
            }],
            ..populated()
        };
        let v = serde_json::to_value(&s).unwrap();
        validate_summary_json(&v).unwrap();
        assert_eq!(crate::Summary::from_json(&v.to_string()).unwrap(), s);
        let mut bad = v.clone();
        bad["server"][0]["source"] = serde_json::json!("guessed");
        assert!(validate_summary_json(&bad).is_err());
        let mut bad = v.clone();
        bad["server"][0]["gossip"]["samples"][0]["suspect"] = serde_json::json!(1);
        assert!(validate_summary_json(&bad).is_err());
        // A summary written before the storm part reads, without one.
        let mut old = v.clone();
        old["server"][0].as_object_mut().unwrap().remove("storm");
        validate_summary_json(&old).unwrap();
        let read = crate::Summary::from_json(&old.to_string()).unwrap();
        assert_eq!(read.server[0].storm, None);
        let mut bad = v.clone();
        bad["server"][0]["storm"]["total"]["pings"] = serde_json::json!(1);
        assert!(validate_summary_json(&bad).is_err());
        let mut bad = v.clone();
        bad["server"][0]["storm"]["queue_max"]["intent"] = serde_json::json!(3);
        assert!(validate_summary_json(&bad).is_err());
        let mut bad = v;
        bad["server"][0]["gossip"]
            .as_object_mut()
            .unwrap()
            .remove("failed_ever");
        assert!(validate_summary_json(&bad).is_err());
    }

    /// A server's storm part with a figure of each shape.
    fn storm() -> crate::storm::StormSummary {
        use crate::storm::{Count, Depth, Peak, Queue, StormSample, StormSummary};
        StormSummary {
            samples: vec![StormSample {
                t_s: 5.0,
                per_s: [(Count::AliveMsgs, 24.0), (Count::AeReads, 2.5)].into(),
                queues: [(
                    Queue::Intent,
                    Depth {
                        p50: Some(3.0),
                        p99: Some(40.0),
                        mean: Some(5.0),
                        ..Depth::default()
                    },
                )]
                .into(),
            }],
            total: [(Count::AliveMsgs, 120.0), (Count::AeReads, 12.5)].into(),
            peak_per_s: [(
                Count::AliveMsgs,
                Peak {
                    value: 24.0,
                    at_s: 5.0,
                },
            )]
            .into(),
            queue_max: [(
                Queue::Intent,
                Peak {
                    value: 40.0,
                    at_s: 5.0,
                },
            )]
            .into(),
        }
    }

    #[test]
    fn merged_summaries_validate() {
        let m = crate::merge::merge_summaries(&[populated(), populated()]).unwrap();
        validate_summary_json(&serde_json::to_value(m).unwrap()).unwrap();
    }

    #[test]
    fn broken_summaries_fail_with_reasons() {
        let good = serde_json::to_value(populated()).unwrap();

        let mut v = good.clone();
        v.as_object_mut().unwrap().remove("agents");
        let e = validate_summary_json(&v).unwrap_err();
        assert!(e.iter().any(|x| x.contains("agents")), "{e:?}");

        let mut v = good.clone();
        v["latency_us"]["connect"]
            .as_object_mut()
            .unwrap()
            .remove("p99");
        v["counters"]["keepalives_sent"] = serde_json::json!(-1);
        v["schema"] = serde_json::json!("agent-sim.summary.v3");
        let e = validate_summary_json(&v).unwrap_err();
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(
            e.iter().any(|x| x.starts_with("/latency_us/connect")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|x| x.starts_with("/counters/keepalives_sent")),
            "{e:?}"
        );

        let mut v = good.clone();
        v["surprise"] = serde_json::json!(1);
        assert!(validate_summary_json(&v).is_err());

        let mut v = good.clone();
        v["probes"][2]["role"] = serde_json::json!("bystander");
        assert!(validate_summary_json(&v).is_err());
        let mut v = good.clone();
        v["probes"][1]["change_id"] = serde_json::json!(-1);
        assert!(validate_summary_json(&v).is_err());

        let mut v = good.clone();
        v["disruptions"][0]["cause"] = serde_json::json!("ramp_down");
        assert!(validate_summary_json(&v).is_err());
        let mut v = good;
        v["disruptions"][1]["back_after_s"]["p50"] = serde_json::json!("soon");
        assert!(validate_summary_json(&v).is_err());
    }

    #[test]
    fn a_v1_file_validates_against_v1_and_upgrades_to_a_valid_v2() {
        let v1 = serde_json::json!({
            "schema": "agent-sim.summary.v1", "kind": "consul", "targets": ["127.0.0.1:8300"],
            "started_at": "2026-11-21T22:40:44.250Z", "duration_s": 3.0,
            "agents": {"requested": 2, "connected": 2, "peak_connected": 2, "failed": 0},
            "counters": {"subscriptions": 4, "errors": {"http_429": 1}},
            "latency_us": {}, "process": {"peak_rss_bytes": 1, "cpu_user_s": 0.1, "cpu_sys_s": 0.1}
        });
        agent_sim_testkit::validate_json(SUMMARY_SCHEMA_V1, &v1).unwrap();
        let s = crate::Summary::from_json(&v1.to_string()).unwrap();
        validate_summary_json(&serde_json::to_value(&s).unwrap()).unwrap();
    }

    #[test]
    fn the_schema_is_valid_draft_2020_12() {
        assert!(agent_sim_testkit::is_valid_schema(SUMMARY_SCHEMA_V1));
        assert!(agent_sim_testkit::is_valid_schema(SUMMARY_SCHEMA));
        let schema: serde_json::Value = serde_json::from_str(SUMMARY_SCHEMA).unwrap();
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
    }
}
