//! `/metrics` for Prometheus (`--metrics-addr 127.0.0.1:9090`): the live
//! [`Metrics`] of a run in the text exposition format 0.0.4, and a minimal
//! hyper server for it.
//!
//! Families:
//! - `agent_sim_sessions` (gauge): sessions established now;
//!   `agent_sim_sessions_peak` (gauge): most at once.
//! - `agent_sim_<counter>_total` (counter): one per declared counter.
//! - `agent_sim_errors_total{kind="..."}` (counter): failed operations by kind.
//! - `agent_sim_latency_seconds{name="..."}` (histogram): every declared latency,
//!   over a fixed ladder of [`BUCKETS_US`] (100 µs .. 60 s, 19 buckets + `+Inf`).
//! - `agent_sim_latency_clamped_total` (counter): samples above 1 h, clamped.
//! - `agent_sim_disruptions_total{cause,fleet}` (counter): disruptions begun
//!   (storms, churn, pauses, detected backend restarts);
//!   `agent_sim_disruption_sessions_lost_total{cause,fleet}` and
//!   `agent_sim_disruption_sessions_back_total{cause,fleet}` (counters): their
//!   lost sessions and those back in steady state;
//!   `agent_sim_reconvergence_seconds` (histogram): per lost session, loss →
//!   steady state again, over every disruption.
//! - any `extra_gauges` the caller passes (e.g. `agent_sim_agents_requested`).
//! - `agent_sim_metrics_accept_errors_total` (counter): failed accepts of the
//!   `/metrics` listener itself (in [`serve`] and [`serve_text`] answers).
//!
//! Cost: rendering reads the *cumulative* histograms ([`Metrics::cumulative`])
//! and the atomic counters, so it is independent of the number of agents (a
//! few tens of µs per latency). It never calls [`Metrics::collect`]: the
//! reporter loop does, every second, so a scrape sees samples up to the last
//! collect. Bucket counts come from HDR buckets (a sample counts under `le` when
//! the lowest value of its HDR bucket is ≤ `le`, i.e. within the histogram's
//! 0.1 % precision); `_sum` is `mean × count` of the HDR histogram, likewise
//! approximate.
//!
//! This is not a general Prometheus client: no registry, no other metric types.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agent_sim_net::accept_until;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::Metrics;

/// Content type of the text exposition format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (`le`) of the latency histogram buckets, in microseconds,
/// with their rendering in seconds.
pub const BUCKETS_US: &[(u64, &str)] = &[
    (100, "0.0001"),
    (250, "0.00025"),
    (500, "0.0005"),
    (1_000, "0.001"),
    (2_500, "0.0025"),
    (5_000, "0.005"),
    (10_000, "0.01"),
    (25_000, "0.025"),
    (50_000, "0.05"),
    (100_000, "0.1"),
    (250_000, "0.25"),
    (500_000, "0.5"),
    (1_000_000, "1"),
    (2_500_000, "2.5"),
    (5_000_000, "5"),
    (10_000_000, "10"),
    (20_000_000, "20"),
    (30_000_000, "30"),
    (60_000_000, "60"),
];

/// A metric name made of `[a-zA-Z0-9_:]` (other characters become `_`).
fn metric_name(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

/// A label value escaped for the text format.
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A HELP text escaped for the text format.
fn help_text(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value in Go's float syntax.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {}", help_text(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Renders the metrics in the Prometheus text format 0.0.4.
/// `extra_gauges` are `(name, help, value)`, rendered as gauges as given
/// (names sanitized).
pub fn render(metrics: &Metrics, extra_gauges: &[(&str, &str, f64)]) -> String {
    let snap = metrics.snapshot();
    let mut out = String::with_capacity(4096);

    family(
        &mut out,
        "agent_sim_sessions",
        "gauge",
        "Agent sessions established now.",
    );
    let _ = writeln!(out, "agent_sim_sessions {}", snap.connected);
    family(
        &mut out,
        "agent_sim_sessions_peak",
        "gauge",
        "Most agent sessions established at once.",
    );
    let _ = writeln!(out, "agent_sim_sessions_peak {}", snap.peak_connected);

    for (name, v) in &snap.counters {
        let full = format!("agent_sim_{}_total", metric_name(name));
        family(&mut out, &full, "counter", &format!("Counter {name}."));
        let _ = writeln!(out, "{full} {v}");
    }

    family(
        &mut out,
        "agent_sim_errors_total",
        "counter",
        "Failed agent operations by kind.",
    );
    for (kind, v) in &snap.errors {
        let _ = writeln!(
            out,
            "agent_sim_errors_total{{kind=\"{}\"}} {v}",
            label_value(kind)
        );
    }

    family(
        &mut out,
        "agent_sim_latency_clamped_total",
        "counter",
        "Latency samples above one hour, recorded as one hour.",
    );
    let _ = writeln!(out, "agent_sim_latency_clamped_total {}", metrics.clamped());

    family(
        &mut out,
        "agent_sim_latency_seconds",
        "histogram",
        "Latencies by name since the start of the run (HDR histograms, updated every collect).",
    );
    for (name, h) in metrics.cumulative() {
        let labels = format!("name=\"{}\"", label_value(name));
        histogram(&mut out, "agent_sim_latency_seconds", &labels, &h);
    }

    disruptions(&mut out, metrics);

    for (name, help, v) in extra_gauges {
        let name = metric_name(name);
        family(&mut out, &name, "gauge", help);
        let _ = writeln!(out, "{name} {}", value(*v));
    }
    out
}

/// The `_bucket`, `_sum` and `_count` lines of one histogram (µs samples)
/// over [`BUCKETS_US`], with `labels` (`k="v",...`, may be empty).
fn histogram(out: &mut String, family: &str, labels: &str, h: &hdrhistogram::Histogram<u64>) {
    let mut per_bucket = vec![0u64; BUCKETS_US.len()];
    for v in h.iter_recorded() {
        let low = h.lowest_equivalent(v.value_iterated_to());
        let idx = BUCKETS_US.partition_point(|(le, _)| *le < low);
        if let Some(c) = per_bucket.get_mut(idx) {
            *c += v.count_at_value();
        }
    }
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0u64;
    for ((_, le), c) in BUCKETS_US.iter().zip(&per_bucket) {
        cumulative += c;
        let _ = writeln!(
            out,
            "{family}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
        );
    }
    let count = h.len();
    let sum_s = if count == 0 {
        0.0
    } else {
        h.mean() * count as f64 / 1e6
    };
    let _ = writeln!(out, "{family}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
    let braces = |l: &str| {
        if l.is_empty() {
            String::new()
        } else {
            format!("{{{l}}}")
        }
    };
    let _ = writeln!(out, "{family}_sum{} {}", braces(labels), value(sum_s));
    let _ = writeln!(out, "{family}_count{} {count}", braces(labels));
}

/// The disruption families (see the module doc).
fn disruptions(out: &mut String, metrics: &Metrics) {
    let log = metrics.disruptions();
    let mut by: std::collections::BTreeMap<(&str, &str), (u64, u64, u64)> = Default::default();
    for d in log.live() {
        let e = by.entry((d.cause, d.fleet)).or_default();
        e.0 += 1;
        e.1 += d.lost;
        e.2 += d.back;
    }
    for (name, help, pick) in [
        (
            "agent_sim_disruptions_total",
            "Disruptions begun, by cause (storm, churn, pause, max_session_length; backend: a restart or failover detected).",
            0,
        ),
        (
            "agent_sim_disruption_sessions_lost_total",
            "Sessions lost in disruptions, by cause.",
            1,
        ),
        (
            "agent_sim_disruption_sessions_back_total",
            "Sessions lost in disruptions that were in steady state again, by cause.",
            2,
        ),
    ] {
        family(out, name, "counter", help);
        for ((cause, fleet), v) in &by {
            let n = [v.0, v.1, v.2][pick];
            let _ = writeln!(
                out,
                "{name}{{cause=\"{}\",fleet=\"{}\"}} {n}",
                label_value(cause),
                label_value(fleet)
            );
        }
    }
    family(
        out,
        "agent_sim_reconvergence_seconds",
        "histogram",
        "Per session lost in a disruption: loss to steady state again.",
    );
    histogram(
        out,
        "agent_sim_reconvergence_seconds",
        "",
        &log.reconnect_histogram(),
    );
}

/// The process families a Prometheus client exposes, read from
/// `/proc/self`: `process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds` and `process_threads` (what `agent-sim serve
/// --metrics-addr` shows besides its own counters).
pub fn process_families(out: &mut String) {
    let Some(p) = crate::process::read_pid(std::path::Path::new("/proc"), "self") else {
        return;
    };
    scalar(
        out,
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time spent, in seconds.",
        p.cpu_s,
    );
    scalar(
        out,
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size, in bytes.",
        p.rss_bytes as f64,
    );
    if let Some(f) = p.open_fds {
        scalar(
            out,
            "process_open_fds",
            "gauge",
            "Open file descriptors.",
            f as f64,
        );
    }
    scalar(
        out,
        "process_threads",
        "gauge",
        "OS threads.",
        p.threads as f64,
    );
}

/// A gauge or counter family of one unlabelled sample.
pub fn scalar(out: &mut String, name: &str, kind: &str, help: &str, v: f64) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

fn respond(
    req: &Request<Incoming>,
    render: &(dyn Fn() -> String + Send + Sync),
) -> Response<Full<Bytes>> {
    let status = |code: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = code;
        r
    };
    if req.uri().path() != "/metrics" {
        return status(StatusCode::NOT_FOUND, "not found: try /metrics\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return status(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    let mut r = Response::new(Full::new(Bytes::from(render())));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
    r
}

/// Serves `GET /metrics` on `listener` (HTTP/1.1, keep-alive) until
/// `shutdown` completes; other paths get 404. On shutdown it stops accepting
/// and drops open scrape connections. Failed accepts (e.g. out of file
/// descriptors while 40k agents hold theirs) are counted
/// ([`ACCEPT_ERRORS`], in every scrape) and retried after a pause that
/// doubles from 5 ms to 1 s ([`agent_sim_net::accept`]) rather than ending
/// the server.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let text = move || render(&metrics, &[]);
    serve_text(listener, std::sync::Arc::new(text), shutdown).await
}

/// The family of the `/metrics` listener's own failed accepts.
pub const ACCEPT_ERRORS: &str = "agent_sim_metrics_accept_errors_total";

/// Serves `GET /metrics` with whatever `text` renders at each request,
/// followed by [`ACCEPT_ERRORS`] (the same server as [`serve`], for
/// `agent-sim serve --metrics-addr`).
pub async fn serve_text(
    listener: TcpListener,
    text: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let accept_errors = Arc::new(AtomicU64::new(0));
    let errors = accept_errors.clone();
    let page: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(move || {
        let mut out = text();
        let help = "Failed accepts on this /metrics listener (each retried after a pause).";
        let n = errors.load(Ordering::Relaxed) as f64;
        scalar(&mut out, ACCEPT_ERRORS, "counter", help, n);
        out
    });
    let mut conns = JoinSet::new();
    accept_until(listener, shutdown, &accept_errors, |stream, _| {
        // Finished scrape connections are reaped as the next one comes.
        while conns.try_join_next().is_some() {}
        let page = page.clone();
        conns.spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let r = respond(&req, page.as_ref());
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    })
    .await;
    conns.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::BufRead as _;

    use prometheus_parse::{Scrape, Value};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::MetricsSpec;

    fn metrics() -> Metrics {
        let m = Metrics::new(
            &MetricsSpec {
                counters: vec!["keepalives_sent", "events_sent"],
                latencies: vec!["connect", "session_ready"],
                errors: Vec::new(),
            },
            4,
        );
        m.add(m.counter("keepalives_sent"), 42);
        for _ in 0..3 {
            m.session_up();
        }
        m.session_down();
        m.error("connect_refused");
        m.error("connect_refused");
        m.error("weird \"kind\"");
        let c = m.latency("connect");
        // 50 µs, 700 µs, 3 ms, 40 ms, 2 s, 90 s: far from bucket edges.
        for (i, us) in [50u64, 700, 3_000, 40_000, 2_000_000, 90_000_000]
            .into_iter()
            .enumerate()
        {
            m.record_us(c, i, us);
        }
        m
    }

    fn parse(text: &str) -> Scrape {
        // Every line is a comment or a sample the parser understands.
        for line in text.lines() {
            assert!(
                !matches!(
                    prometheus_parse::LineInfo::parse(line),
                    prometheus_parse::LineInfo::Ignored
                ),
                "unparsed line {line:?}"
            );
        }
        Scrape::parse(text.as_bytes().lines()).unwrap()
    }

    fn sample<'a>(s: &'a Scrape, metric: &str, label: Option<(&str, &str)>) -> &'a Value {
        &s.samples
            .iter()
            .find(|x| x.metric == metric && label.is_none_or(|(k, v)| x.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no {metric} {label:?}"))
            .value
    }

    #[test]
    fn disruptions_are_counted_by_cause_with_a_reconvergence_histogram() {
        let m = metrics();
        let log = m.disruptions();
        let sec = Duration::from_secs(1);
        let id = log.open("storm", "sensu", 10 * sec, None).unwrap();
        for ms in [300u64, 700, 1_500] {
            log.lost(id);
            log.back(id, Duration::from_millis(ms), 11 * sec, 1);
        }
        log.lost(id);
        let text = render(&m, &[]);
        let s = parse(&text);
        let l = Some(("cause", "storm"));
        assert_eq!(
            sample(&s, "agent_sim_disruptions_total", l),
            &Value::Counter(1.0)
        );
        assert_eq!(
            sample(&s, "agent_sim_disruption_sessions_lost_total", l),
            &Value::Counter(4.0)
        );
        assert_eq!(
            sample(&s, "agent_sim_disruption_sessions_back_total", l),
            &Value::Counter(3.0)
        );
        let Value::Histogram(b) = sample(&s, "agent_sim_reconvergence_seconds", None) else {
            panic!("not a histogram");
        };
        let at = |le: f64| b.iter().find(|x| x.less_than == le).unwrap().count;
        assert_eq!((at(0.5), at(1.0), at(2.5)), (1.0, 2.0, 3.0));
        assert!(
            text.contains("agent_sim_reconvergence_seconds_count 3"),
            "{text}"
        );
    }

    #[test]
    fn render_parses_and_values_match() {
        let m = metrics();
        // Nothing collected yet: render must not drain the shards itself.
        let before = parse(&render(&m, &[]));
        match sample(
            &before,
            "agent_sim_latency_seconds",
            Some(("name", "connect")),
        ) {
            Value::Histogram(b) => assert_eq!(b.last().unwrap().count, 0.0),
            other => panic!("{other:?}"),
        }
        m.collect();
        let text = render(
            &m,
            &[("agent_sim_agents_requested", "Agents asked for.", 100.0)],
        );
        let s = parse(&text);
        assert_eq!(sample(&s, "agent_sim_sessions", None), &Value::Gauge(2.0));
        assert_eq!(
            sample(&s, "agent_sim_sessions_peak", None),
            &Value::Gauge(3.0)
        );
        assert_eq!(
            sample(&s, "agent_sim_keepalives_sent_total", None),
            &Value::Counter(42.0)
        );
        assert_eq!(
            sample(&s, "agent_sim_events_sent_total", None),
            &Value::Counter(0.0)
        );
        assert_eq!(
            sample(
                &s,
                "agent_sim_errors_total",
                Some(("kind", "connect_refused"))
            ),
            &Value::Counter(2.0)
        );
        assert!(text.contains(r#"agent_sim_errors_total{kind="weird \"kind\""} 1"#));
        assert_eq!(
            sample(&s, "agent_sim_agents_requested", None),
            &Value::Gauge(100.0)
        );
        let Value::Histogram(buckets) =
            sample(&s, "agent_sim_latency_seconds", Some(("name", "connect")))
        else {
            panic!("connect is not a histogram");
        };
        assert_eq!(buckets.len(), BUCKETS_US.len() + 1);
        let at = |le: f64| {
            buckets
                .iter()
                .find(|b| b.less_than == le)
                .unwrap_or_else(|| panic!("no bucket {le}"))
                .count
        };
        assert_eq!(at(0.0001), 1.0);
        assert_eq!(at(0.0005), 1.0);
        assert_eq!(at(0.001), 2.0);
        assert_eq!(at(0.005), 3.0);
        assert_eq!(at(0.05), 4.0);
        assert_eq!(at(1.0), 4.0);
        assert_eq!(at(2.5), 5.0);
        assert_eq!(at(60.0), 5.0);
        assert_eq!(at(f64::INFINITY), 6.0);
        assert_eq!(
            sample(
                &s,
                "agent_sim_latency_seconds_count",
                Some(("name", "connect"))
            ),
            &Value::Untyped(6.0)
        );
        let Value::Untyped(sum) = sample(
            &s,
            "agent_sim_latency_seconds_sum",
            Some(("name", "connect")),
        ) else {
            panic!("sum");
        };
        let exact = (50 + 700 + 3_000 + 40_000 + 2_000_000 + 90_000_000) as f64 / 1e6;
        assert!((sum - exact).abs() / exact < 0.001, "{sum} vs {exact}");
        // An empty histogram still has its full ladder.
        match sample(
            &s,
            "agent_sim_latency_seconds",
            Some(("name", "session_ready")),
        ) {
            Value::Histogram(b) => assert!(b.iter().all(|x| x.count == 0.0)),
            other => panic!("{other:?}"),
        }
        assert!(text.contains("# TYPE agent_sim_latency_seconds histogram"));
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn scrape_over_tcp() {
        let m = metrics();
        m.collect();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, m, async {
            let _ = stop_rx.await;
        }));

        let resp = get(addr, "/metrics").await;
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        let s = parse(body);
        assert_eq!(
            sample(&s, "agent_sim_keepalives_sent_total", None),
            &Value::Counter(42.0)
        );

        assert_eq!(sample(&s, ACCEPT_ERRORS, None), &Value::Counter(0.0));

        let resp = get(addr, "/").await;
        assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");

        stop_tx.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
