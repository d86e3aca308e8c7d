//! `--observe`: a run reads the server under load on its own time axis.
//! Against `agent-sim serve --metrics-addr` in another process, the
//! summary, the table and the page carry the server's CPU and RSS series,
//! its baseline and what each agent cost it, and an assertion on a server
//! figure fails the run (exit 3). A stalled endpoint is a warning and
//! leaves the sessions' timing within budget.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder, Secs};
use agent_sim_observe::ObserveSpec;
use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin, wait_within};

fn agent_sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agent-sim"))
}

/// `agent-sim serve --sensu … --metrics-addr …` and its two addresses.
struct Serve {
    child: Child,
    sensu: String,
    metrics: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = wait_within(&mut self.child, CHILD_LIMIT);
    }
}

fn serve() -> Serve {
    let mut child = agent_sim()
        .args([
            "serve",
            "--sensu",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--stats-every",
            "0",
            "--check-interval",
            "1s",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let (mut sensu, mut metrics) = (None, None);
    while sensu.is_none() || metrics.is_none() {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("serve says where it listens");
        if let Some(a) = line.strip_prefix("agent-sim serve: sensu agent endpoint on ws://") {
            sensu = Some(a.trim_end_matches('/').to_string());
        }
        if let Some(a) = line.strip_prefix("agent-sim serve: metrics on ") {
            metrics = Some(a.to_string());
        }
    }
    Serve {
        child,
        sensu: sensu.unwrap(),
        metrics: metrics.unwrap(),
    }
}

#[test]
fn a_run_observes_serve_and_reports_what_each_agent_cost_it() {
    let s = serve();
    let dir = std::env::temp_dir().join(format!("agent-sim-observe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (summary, page) = (dir.join("run.json"), dir.join("run.html"));
    let out = agent_sim()
        .args(["--agents", "300", "--target", &s.sensu, "--duration", "8s"])
        .args(["--ramp", "all", "--keepalive-interval", "1s", "-q"])
        .args(["--observe", &s.metrics, "--observe-every", "1s"])
        .args(["--assert", "server.cpu_cores.max < 0.000001"])
        .args(["--assert", "server.rss_per_agent_kib < 100000"])
        .arg("--summary")
        .arg(&summary)
        .arg("--report-html")
        .arg(&page)
        .output_within(CHILD_LIMIT);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "a server figure fails the run\n{table}"
    );
    assert!(
        table.contains("FAIL   server.cpu_cores.max < 0.000001")
            && table.contains("pass   server.rss_per_agent_kib < 100000"),
        "{table}"
    );
    assert!(table.contains("server     agent-sim http://"), "{table}");
    assert!(
        table.contains("KiB per agent") && table.contains("cores per 1,000 agents"),
        "{table}"
    );

    let run = agent_sim::Summary::read(&summary).unwrap();
    assert_eq!(run.agents.connected, 300);
    assert_eq!(run.server.len(), 1, "{:?}", run.server);
    let srv = &run.server[0];
    assert_eq!(
        (srv.kind.as_str(), srv.source.as_str()),
        ("agent-sim", "prometheus")
    );
    assert_eq!(srv.failed, 0);
    assert!(
        srv.scrapes >= 7,
        "baseline 2 + one a second + the last: {}",
        srv.scrapes
    );
    // The baseline: before any agent dialed.
    assert_eq!(srv.baseline.agents, 0);
    assert!(
        srv.baseline.rss_bytes.unwrap() > 1 << 20,
        "{:?}",
        srv.baseline
    );
    assert!(srv.baseline.cpu_cores.is_some());
    // The series: CPU and RSS at every scrape, the sessions the server held.
    assert!(
        srv.samples
            .iter()
            .all(|x| x.cpu_cores.is_some() && x.rss_bytes.is_some())
    );
    assert!(
        srv.samples
            .iter()
            .any(|x| x.values.get("agent_sim_serve_sensu_sessions_active") == Some(&300.0)),
        "{:?}",
        srv.samples.iter().map(|x| &x.values).collect::<Vec<_>>()
    );
    assert!(srv.samples.iter().any(|x| x.steady && x.agents == 300));
    let z = &srv.sizing;
    assert_eq!(z.agents, 300.0);
    assert!(
        z.cores_per_1000_agents.is_some() && z.rss_per_agent_kib.is_some(),
        "{z:?}"
    );
    assert!(z.rss_bytes.max.unwrap() >= z.rss_bytes.baseline.unwrap());
    // Same time axis as the run's timeline.
    let last = run.timeline.last().unwrap().t_s;
    assert!(srv.samples.last().unwrap().t_s >= last - 1.5, "{last}");

    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<section id=\"server\">"),
        "the page has a Server part"
    );
    assert!(html.contains("Server CPU") && html.contains("Server resident memory"));

    // The run against itself: every ratio 1, server figures included.
    let cmp = dir.join("cmp.html");
    let out = agent_sim()
        .args(["report", "compare"])
        .arg(&summary)
        .arg(&summary)
        .arg("-o")
        .arg(&cmp)
        .output_within(CHILD_LIMIT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("server #1 agent-sim") && text.contains("KiB per agent"),
        "{text}"
    );
    assert!(
        text.lines()
            .filter(|l| l.ends_with('x'))
            .all(|l| l.ends_with("1.00x")),
        "{text}"
    );
    assert!(
        std::fs::read_to_string(&cmp)
            .unwrap()
            .contains("Two runs compared")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_endpoint_is_a_warning_and_leaves_the_sessions_alone() {
    // Accepts and never answers: every scrape runs into its timeout.
    let stall = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", stall.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = stall.accept().await {
            conns.push(c);
        }
    });
    let spec: ObserveSpec = url.parse().unwrap();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        RunBuilder::new(Kind::Sensu)
            .agents(200)
            .ramp(Ramp::All)
            .duration(Duration::from_secs(6))
            .args(move |a| {
                a.keepalive_interval = Some(Secs(Duration::from_secs(1)));
                a.observe = vec![spec];
                a.observe_every = Some(Secs(Duration::from_secs(1)));
            })
            .run(),
    )
    .await
    .expect("the run ends on time")
    .unwrap();
    held.abort();
    let s = &outcome.summary;
    assert_eq!(s.agents.connected, 200);
    let w = &s.warnings["observe_failed"];
    assert!(w.count >= 4, "{w:?}");
    let words = w.sample.as_deref().unwrap();
    assert!(words.contains("no answer within 800ms"), "{words}");
    assert!(w.hint.is_some());
    assert_eq!((s.server[0].scrapes, s.server[0].failed >= 4), (0, true));
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    // Keepalives stayed on schedule while every scrape hung (a budget).
    let lateness = &s.latency_us["keepalive_lateness"];
    assert!(lateness.count >= 200 * 4, "{lateness:?}");
    assert!(
        lateness.p99 < 100_000,
        "keepalive lateness p99 {} µs",
        lateness.p99
    );
}

#[test]
fn bad_observe_values_are_usage_errors() {
    for (args, says) in [
        (vec!["--observe", "nomad"], "expected a URL"),
        (vec!["--observe", "consul"], "no Consul fleet"),
        (
            vec!["--observe", "sensu"],
            "the embedded backend runs in this process",
        ),
        (vec!["--observe-metric", "x"], "nothing is observed"),
        (
            vec![
                "--observe",
                "http://127.0.0.1:9/metrics",
                "--observe-every",
                "100ms",
            ],
            "at least 500ms",
        ),
        (vec!["--observe-pid", "4294967294"], "no such process"),
        (
            vec![
                "--observe",
                "http://127.0.0.1:9/m",
                "--shard",
                "0/2",
                "--observe-shard",
                "2",
            ],
            "the run has 2 shards",
        ),
    ] {
        let out = agent_sim()
            .args(["--agents", "10", "--duration", "1s"])
            .args(&args)
            .output_within(CHILD_LIMIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
