//! The report page of real runs against the in-process backends: a Consul
//! run with probes and a Sensu run (`--report-html`), and two Sensu shards
//! merged by `agent-sim report html`. Each page must parse as HTML, carry
//! no external URL and no script, and every chart must draw what its data
//! says: the CDF's last point at the largest arrival, histogram bars adding
//! up to the deliveries, one sessions point per timeline sample. One test
//! renders the page in headless Chromium (skipped, saying so, without one).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use agent_sim::{Kind, Ramp, RunBuilder, Summary};
use agent_sim_testkit::bounded::{CHILD_LIMIT, OutputWithin};
use scraper::{ElementRef, Html, Selector};

use crate::common::{assert_exit, temp_path};

/// A finished run: its summary and its report page.
struct RunPage {
    summary: Summary,
    html: String,
    path: PathBuf,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One Consul run with a probe every second, shared by the tests below.
fn consul_page() -> &'static RunPage {
    static PAGE: OnceLock<RunPage> = OnceLock::new();
    PAGE.get_or_init(|| {
        let dir = temp_path("html-consul");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("consul.html");
        let p = path.clone();
        let outcome = runtime().block_on(async move {
            RunBuilder::new(Kind::Consul)
                .agents(40)
                .ramp(Ramp::per_second(1000.0))
                .duration(Duration::from_secs(4))
                .args(|a| {
                    a.probe_every = Some("1s".parse().unwrap());
                    a.probe_timeout = Some("900ms".parse().unwrap());
                    a.progress_every = Some("1s".parse().unwrap());
                    a.hlog_interval = Some("1s".parse().unwrap());
                    a.report_html = Some(p);
                    a.token = Some("t0ps3cret".into());
                })
                .assert("agents.connected == requested".parse().unwrap())
                .assert("probes.delivered_ratio == 1".parse().unwrap())
                .run()
                .await
                .expect("run")
        });
        assert_exit(&outcome, 0);
        let html = std::fs::read_to_string(&path).unwrap();
        RunPage {
            summary: outcome.summary,
            html,
            path,
        }
    })
}

fn sel(s: &str) -> Selector {
    Selector::parse(s).unwrap()
}

/// Parses a page; it must parse without errors, hold no script and no
/// reference to anything outside itself.
fn parse(html: &str) -> Html {
    let doc = Html::parse_document(html);
    assert!(doc.errors.is_empty(), "HTML parse errors: {:?}", doc.errors);
    assert_eq!(doc.select(&sel("script")).count(), 0, "no script");
    for el in doc.select(&sel("[src], [href], [srcset], [action]")) {
        for attr in ["src", "href", "srcset", "action"] {
            if let Some(v) = el.value().attr(attr) {
                assert!(v.starts_with('#'), "{attr}={v:?} refers outside the page");
            }
        }
    }
    for scheme in ["http://", "https://", "url(", "@import"] {
        assert!(!html.contains(scheme), "{scheme} in the page");
    }
    doc
}

/// A chart's axes as it states them, to map SVG points back to data.
struct Axes {
    plot: [f64; 4],
    x: (String, f64, f64),
    y: (String, f64, f64),
}

impl Axes {
    fn of(svg: ElementRef<'_>) -> Axes {
        let a = |n: &str| {
            svg.value()
                .attr(n)
                .unwrap_or_else(|| panic!("svg without {n}"))
        };
        let f = |n: &str| a(n).parse::<f64>().unwrap();
        let plot: Vec<f64> = a("data-plot")
            .split(' ')
            .map(|v| v.parse().unwrap())
            .collect();
        Axes {
            plot: [plot[0], plot[1], plot[2], plot[3]],
            x: (a("data-x-scale").into(), f("data-x-min"), f("data-x-max")),
            y: (a("data-y-scale").into(), f("data-y-min"), f("data-y-max")),
        }
    }

    fn value((scale, min, max): &(String, f64, f64), frac: f64) -> f64 {
        match scale.as_str() {
            "log" => 10f64.powf(min.log10() + frac * (max.log10() - min.log10())),
            _ => min + frac * (max - min),
        }
    }

    /// The data point an SVG coordinate pair stands for.
    fn data(&self, px: f64, py: f64) -> (f64, f64) {
        let [l, t, w, h] = self.plot;
        (
            Self::value(&self.x, (px - l) / w),
            Self::value(&self.y, 1.0 - (py - t) / h),
        )
    }

    /// How far one SVG unit moves along x near `x` (rounding tolerance).
    fn x_step(&self, x: f64) -> f64 {
        let [_, _, w, _] = self.plot;
        match self.x.0.as_str() {
            "log" => x * ((self.x.2 / self.x.1).log10() / w * std::f64::consts::LN_10),
            _ => (self.x.2 - self.x.1) / w,
        }
    }
}

fn chart<'a>(doc: &'a Html, title: &str) -> ElementRef<'a> {
    doc.select(&sel(&format!("svg.chart[aria-label=\"{title}\"]")))
        .next()
        .unwrap_or_else(|| panic!("no chart {title:?}"))
}

/// The points of a series drawn in `svg`, in SVG coordinates.
fn points(svg: ElementRef<'_>, series: &str) -> (usize, Vec<(f64, f64)>) {
    let g = svg
        .select(&sel(&format!("g.line[data-name=\"{series}\"]")))
        .next()
        .unwrap_or_else(|| panic!("no series {series}"));
    let n = g.value().attr("data-points").unwrap().parse().unwrap();
    let line = g.select(&sel("polyline")).next().unwrap();
    let pts = line
        .value()
        .attr("points")
        .unwrap()
        .split(' ')
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect();
    (n, pts)
}

fn text(doc: &Html, selector: &str) -> String {
    doc.select(&sel(selector))
        .map(|e| e.text().collect::<String>())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The sessions chart has one point per timeline sample, at its level.
fn check_sessions(doc: &Html, s: &Summary) {
    assert!(!s.timeline.is_empty());
    // The line ends at the sessions held when the run ended, not at the
    // zero its own shutdown leaves.
    assert_eq!(
        s.timeline.last().unwrap().connected,
        s.agents.connected,
        "{:?}",
        s.timeline.last()
    );
    let svg = chart(doc, "Sessions held");
    let axes = Axes::of(svg);
    let (n, pts) = points(svg, "connected");
    assert_eq!(n, s.timeline.len());
    assert_eq!(pts.len(), s.timeline.len());
    for (p, t) in pts.iter().zip(&s.timeline) {
        let (x, y) = axes.data(p.0, p.1);
        assert!((x - t.t_s).abs() <= axes.x_step(x), "{x} vs {}", t.t_s);
        assert!((y - t.connected as f64).abs() <= 0.01 * s.agents.requested as f64 + 1.0);
    }
}

/// Every probe: bars add up to its deliveries, the CDF ends at its largest
/// arrival and its delivered share, the max mark sits on the max.
fn check_probes(doc: &Html, s: &Summary) {
    assert!(!s.probes.is_empty());
    for p in &s.probes {
        let hist = chart(doc, &format!("Probe #{}: arrivals by time", p.id));
        let bars: u64 = hist
            .select(&sel("rect.bar"))
            .map(|b| {
                b.value()
                    .attr("data-count")
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum();
        assert_eq!(bars, p.delivered, "probe #{}", p.id);
        assert_eq!(bars, p.latency_us.count);
        let cdf = chart(
            doc,
            &format!("Probe #{}: share of the fleet that has the change", p.id),
        );
        let axes = Axes::of(cdf);
        assert_eq!(axes.x.0, "log", "latency axes are logarithmic");
        let (_, pts) = points(cdf, "arrived");
        let last = *pts.last().unwrap();
        let (x, y) = axes.data(last.0, last.1);
        let max = p.latency_us.max as f64;
        assert!(
            (x - max).abs() <= axes.x_step(max),
            "CDF ends at {x}, max {max}"
        );
        let share = p.delivered as f64 / p.expected as f64;
        assert!(
            (y - share).abs() < 0.01,
            "CDF ends at {y}, delivered {share}"
        );
        for svg in [hist, cdf] {
            let marks: Vec<(String, f64)> = svg
                .select(&sel("g.mark"))
                .map(|m| {
                    (
                        m.value().attr("data-label").unwrap().to_string(),
                        m.value().attr("data-x").unwrap().parse().unwrap(),
                    )
                })
                .collect();
            let l = &p.latency_us;
            for (name, want) in [
                ("p50", l.p50),
                ("p90", l.p90),
                ("p99", l.p99),
                ("max", l.max),
            ] {
                let got = marks
                    .iter()
                    .find(|(label, _)| label.starts_with(&format!("{name} ")))
                    .unwrap_or_else(|| panic!("no {name} mark: {marks:?}"));
                assert_eq!(got.1, want as f64, "{name}");
            }
        }
        let heading = text(doc, &format!("h3.probe[data-probe=\"{}\"]", p.id));
        assert!(
            heading.contains(&format!("delivered {} of {}", p.delivered, p.expected)),
            "{heading}"
        );
    }
}

fn check_headline(doc: &Html, s: &Summary) {
    let cards = text(doc, "#headline .card");
    assert!(
        cards.contains(&format!("agents requested{}", s.agents.requested)),
        "{cards}"
    );
    assert!(
        cards.contains(&format!("connected at end{}", s.agents.connected)),
        "{cards}"
    );
    let banner = text(doc, "#verdict");
    assert!(
        banner.contains(&format!("exit {}", s.outcome.exit_code)),
        "{banner}"
    );
}

#[test]
fn a_consul_run_page_parses_and_its_charts_match_the_data() {
    let run = consul_page();
    let doc = parse(&run.html);
    let s = &run.summary;
    check_headline(&doc, s);
    assert!(text(&doc, "#verdict").contains("2 of 2 assertion(s) held"));
    assert!(text(&doc, "#headline table").contains("probes.delivered_ratio == 1"));
    check_probes(&doc, s);
    check_sessions(&doc, s);
    // Rates of what was rated only, over time.
    let rates = chart(&doc, "Rates");
    assert!(s.rates_per_s.contains_key("events_received"));
    assert!(
        !s.rates_per_s.contains_key("subscriptions"),
        "{:?}",
        s.rates_per_s
    );
    let (n, _) = points(rates, "events_received");
    assert_eq!(n, s.timeline.len());
    // Latency over time from the run's own intervals.
    chart(&doc, "propagation: latency percentiles per interval");
    // Process and config; the token never appears.
    chart(&doc, "CPU");
    chart(&doc, "Resident memory");
    let config = text(&doc, "#config");
    assert!(
        config.contains("probe-every") && config.contains("<redacted>"),
        "{config}"
    );
    assert!(!run.html.contains("t0ps3cret"));
    let sections: Vec<String> = doc
        .select(&sel("main > section"))
        .map(|e| e.value().attr("id").unwrap().to_string())
        .collect();
    assert_eq!(
        sections,
        [
            "headline",
            "probes",
            "sessions",
            "rates",
            "latency",
            "disruptions",
            "errors",
            "process",
            "config"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sensu_run_page_parses_and_its_charts_match_the_data() {
    let dir = temp_path("html-sensu");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sensu.html");
    let outcome = RunBuilder::new(Kind::Sensu)
        .agents(30)
        .ramp(Ramp::All)
        .duration(Duration::from_secs(3))
        .args(|a| {
            a.keepalive_interval = Some("1s".parse().unwrap());
            a.progress_every = Some("1s".parse().unwrap());
            a.report_html = Some(path.clone());
        })
        .run()
        .await
        .expect("run");
    assert_exit(&outcome, 0);
    let html = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let doc = parse(&html);
    let s = &outcome.summary;
    check_headline(&doc, s);
    check_sessions(&doc, s);
    assert!(text(&doc, "#probes").contains("No propagation probe"));
    let (n, _) = points(chart(&doc, "Rates"), "keepalives_sent");
    assert_eq!(n, s.timeline.len());
    assert!(!s.rates_per_s.contains_key("sessions_established"));
    assert!(text(&doc, "#config").contains("keepalive-interval"));
    let password = agent_sim_sensu::SensuConfig::default().password;
    assert!(!html.contains(&password), "the agent password is redacted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_report_shows_the_sum_of_the_shards() {
    let dir = temp_path("html-merged");
    std::fs::create_dir_all(&dir).unwrap();
    let shard = |i: u64| {
        let (summary, hlog) = (
            dir.join(format!("s{i}.json")),
            dir.join(format!("s{i}.hlog")),
        );
        RunBuilder::new(Kind::Sensu)
            .agents(40)
            .ramp(Ramp::All)
            .duration(Duration::from_secs(3))
            .args(move |a| {
                a.shard = Some(format!("{i}/2").parse().unwrap());
                a.keepalive_interval = Some("1s".parse().unwrap());
                a.progress_every = Some("1s".parse().unwrap());
                a.hlog_interval = Some("1s".parse().unwrap());
                a.summary = Some(summary);
                a.hlog = Some(hlog);
            })
            .assert("agents.connected == requested".parse().unwrap())
            .run()
    };
    let (a, b) = tokio::join!(shard(0), shard(1));
    let (a, b) = (a.expect("shard 0"), b.expect("shard 1"));
    let out = dir.join("merged.html");
    let files: Vec<PathBuf> = ["s0.json", "s1.json", "s0.hlog", "s1.hlog"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    let code = tokio::task::spawn_blocking({
        let (files, out) = (files.clone(), out.clone());
        move || agent_sim::report_cmd::html(&files, &out, &[])
    })
    .await
    .unwrap();
    assert_eq!(code, 0);
    let html = std::fs::read_to_string(&out).unwrap();
    let merged = agent_sim::report_cmd::load_and_merge(&files).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let doc = parse(&html);
    let (sa, sb) = (&a.summary, &b.summary);
    assert_eq!(merged.agents.requested, 40);
    assert_eq!(
        merged.agents.connected,
        sa.agents.connected + sb.agents.connected
    );
    check_headline(&doc, &merged);
    assert!(text(&doc, "h1 + p.sub").contains("merged from 4 files"));
    // The shards' own assertion, judged again on the sum.
    assert!(text(&doc, "#verdict").contains("1 of 1 assertion(s) held"));
    assert!(text(&doc, "#headline table").contains("== 40 (requested)"));
    check_sessions(&doc, &merged);
    // Both shards held their 20 sessions at once: the merged line reaches 40.
    let svg = chart(&doc, "Sessions held");
    let axes = Axes::of(svg);
    let top = points(svg, "connected")
        .1
        .iter()
        .map(|p| axes.data(p.0, p.1).1)
        .fold(0.0f64, f64::max);
    assert!((top - 40.0).abs() < 1.0, "merged sessions peak {top}");
    // The keepalives over time add up to both shards' totals.
    let total: u64 = merged
        .timeline
        .iter()
        .map(|t| t.counters.get("keepalives_sent").copied().unwrap_or(0))
        .sum();
    assert_eq!(
        total,
        sa.counters["keepalives_sent"] + sb.counters["keepalives_sent"]
    );
    let rates = text(&doc, "#rates table");
    assert!(
        rates.contains(&merged.counters["keepalives_sent"].to_string()),
        "{rates}"
    );
    // Latency over time from both hlogs, added per interval.
    let connect = chart(&doc, "connect: latency percentiles per interval");
    assert!(points(connect, "p99").0 >= 1);
    let counted: u64 = merged.latency_us["connect"].count;
    assert_eq!(
        counted,
        sa.latency_us["connect"].count + sb.latency_us["connect"].count
    );
}

/// The headless browser to use: `AGENT_SIM_CHROMIUM`, or one on `PATH`.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("AGENT_SIM_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ]
    .iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
    .find(|p| p.is_file())
}

/// Renders `page` headless; returns the screenshot and the console lines
/// the browser logged.
fn render(browser: &Path, page: &Path, shot: &Path) -> Vec<String> {
    let profile = shot.with_extension("profile");
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output_within(CHILD_LIMIT);
    let _ = std::fs::remove_dir_all(&profile);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && shot.is_file(),
        "the browser failed ({}): {stderr}",
        out.status
    );
    // Chromium logs every console message as `...:CONSOLE(line)] "..."`.
    stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_page_renders_in_headless_chromium_with_no_console_error() {
    let Some(browser) = chromium() else {
        eprintln!(
            "SKIPPED the_page_renders_in_headless_chromium: no Chromium found (apt-get install \
             chromium, or set AGENT_SIM_CHROMIUM)"
        );
        return;
    };
    let dir = temp_path("html-chromium");
    std::fs::create_dir_all(&dir).unwrap();
    // The console check catches errors: a page with one is seen.
    let bad = dir.join("bad.html");
    std::fs::write(
        &bad,
        "<!DOCTYPE html><html><body><p>x</p><script>console.error('agent-sim-probe-error')</script></body></html>",
    )
    .unwrap();
    let seen = render(&browser, &bad, &dir.join("bad.png"));
    assert!(
        seen.iter().any(|l| l.contains("agent-sim-probe-error")),
        "console messages are not seen in the browser's log: {seen:?}"
    );
    let run = consul_page();
    let shot = dir.join("consul.png");
    let console = render(&browser, &run.path, &shot);
    assert!(console.is_empty(), "console messages: {console:?}");
    // Not blank: many pixels differ from the page background, in several
    // colours (text, rules, bars, lines).
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let channels = info.color_type.samples();
    assert_eq!((info.width, info.height), (1280, 2000));
    let px: Vec<&[u8]> = buf[..info.buffer_size()].chunks(channels).collect();
    let background = px[0];
    let inked = px.iter().filter(|p| p[..3] != background[..3]).count();
    let colours: std::collections::BTreeSet<&[u8]> = px.iter().map(|p| &p[..3]).collect();
    assert!(
        inked * 50 > px.len(),
        "only {inked} of {} pixels differ from the background",
        px.len()
    );
    assert!(colours.len() > 16, "{} colours", colours.len());
}
