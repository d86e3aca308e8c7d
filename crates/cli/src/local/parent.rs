//! The parent of local processes: starts them (each in a process group of
//! its own, so a Ctrl-C reaches the parent only and is forwarded once as
//! SIGTERM), adds their progress lines up into one, relays what else they
//! say (prefixed with their shard), and when all have ended merges their
//! summaries and interval logs into ONE summary, table, hlog and page
//! through the path `report merge` and `report html` take
//! ([`crate::results`]), with the exit code of the whole.

use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use agent_sim_metrics::assert::evaluate;
use agent_sim_metrics::hlog::{HlogContents, HlogWriter, read_hlog};
use agent_sim_metrics::report::TableOptions;
use agent_sim_metrics::summary::{AgentCounts, KindEntry, Outcome, SCHEMA_V2};
use agent_sim_metrics::{MetricsError, Summary};
use tokio_util::sync::CancellationToken;

use super::child::child_env;
use super::{CAUSE_PROCESS_DIED, CHILD_ENV, LocalPlan};
use crate::exit;
use crate::plan::RunConfig;
use crate::progress::{ChildProgress, PROGRESS_PREFIX, Progress};

/// Lines a child said last (besides progress), kept for its obituary.
const LAST_WORDS: usize = 3;

struct Kid {
    child: Child,
    /// The latest progress it reported.
    progress: Arc<Mutex<ChildProgress>>,
    /// What it said last (not progress).
    // Bound: LAST_WORDS lines.
    last_words: Arc<Mutex<Vec<String>>>,
}

fn spawn(i: u64, lp: &LocalPlan, dir: &Path, argv: &[std::ffi::OsString]) -> std::io::Result<Kid> {
    let exe = std::env::current_exe()?;
    let stdout = std::fs::File::create(dir.join(format!("{i}.out")))?;
    let mut child = Command::new(exe)
        .args(argv)
        .env(
            CHILD_ENV,
            child_env(i, lp.processes, dir, lp.sources.as_deref().unwrap_or("")),
        )
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let progress = Arc::new(Mutex::new(ChildProgress::default()));
    let last_words = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().expect("piped");
    let (p, w, n) = (progress.clone(), last_words.clone(), lp.processes);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(json) = line.strip_prefix(PROGRESS_PREFIX) {
                if let Ok(x) = serde_json::from_str::<ChildProgress>(json) {
                    *p.lock().unwrap_or_else(|e| e.into_inner()) = x;
                }
                continue;
            }
            let said = line
                .strip_prefix("agent-sim: ")
                .unwrap_or(&line)
                .to_string();
            eprintln!("agent-sim [{i}/{n}]: {said}");
            let mut words = w.lock().unwrap_or_else(|e| e.into_inner());
            words.push(said);
            if words.len() > LAST_WORDS {
                words.remove(0);
            }
        }
    });
    Ok(Kid {
        child,
        progress,
        last_words,
    })
}

/// Every child's progress added up, as the progress line's snapshot.
fn added_up(kids: &[Kid]) -> (agent_sim_metrics::Snapshot, u64) {
    let mut snap = agent_sim_metrics::Snapshot::default();
    let mut started = 0;
    let mut counters = std::collections::BTreeMap::<String, u64>::new();
    for k in kids {
        let p = k.progress.lock().unwrap_or_else(|e| e.into_inner());
        snap.connected += p.connected;
        snap.peak_connected += p.connected;
        started += p.started;
        for (c, v) in &p.counters {
            *counters.entry(c.clone()).or_default() += v;
        }
        for (e, v) in &p.errors {
            *snap.errors.entry(e.clone()).or_default() += v;
        }
    }
    snap.counters = crate::progress::COUNTERS_READ
        .iter()
        .map(|n| (*n, counters.get(*n).copied().unwrap_or(0)))
        .collect();
    (snap, started)
}

fn signal(kids: &[Kid], sig: libc::c_int) {
    for k in kids {
        let pid = k.child.id() as libc::pid_t;
        // SAFETY: kill(2) with a pid we spawned and a valid signal number.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// What stands for the summary of a child that left none: its agents
/// missing with cause `process_died`, and what it said last.
fn obituary(
    cfg: &RunConfig,
    i: u64,
    n: u64,
    status: &str,
    words: &[String],
    started: SystemTime,
) -> Summary {
    let share: u64 = cfg
        .fleets
        .iter()
        .map(|f| {
            crate::plan::Shard { index: i, count: n }
                .slice(f.total_agents)
                .1
        })
        .sum();
    let sample = format!(
        "local process {i}/{n} ended ({status}) without a summary{}",
        if words.is_empty() {
            String::new()
        } else {
            format!("; it said last: {}", words.join(" | "))
        }
    );
    Summary {
        schema: SCHEMA_V2.into(),
        kind: cfg.kind().into(),
        started_at: agent_sim_metrics::units::rfc3339(started),
        shard: Some(format!("{i}/{n}")),
        agents: AgentCounts {
            requested: share,
            never_connected: share,
            ..AgentCounts::default()
        },
        errors: [(
            CAUSE_PROCESS_DIED.to_string(),
            KindEntry {
                count: 1,
                first_seen_s: 0.0,
                sample: Some(sample),
                hint: Some(
                    "a local process of this run died (killed, out of memory, a crash): its \
                     agents are counted missing; its own output is beside the run's summary \
                     while it runs"
                        .into(),
                ),
                heals: false,
                said_by: agent_sim_metrics::Speaker::Local,
            },
        )]
        .into(),
        outcome: Outcome {
            exit_code: exit::FAILURE,
            complete: false,
            reason: Some(format!("local process {i}/{n} died")),
            missing: [(CAUSE_PROCESS_DIED.to_string(), share)].into(),
        },
        ..Summary::default()
    }
}

/// The children's interval logs as one, on the earliest start's clock.
fn merge_hlogs(
    path: &Path,
    logs: &[HlogContents],
    started: SystemTime,
) -> Result<(), MetricsError> {
    let zero = logs
        .iter()
        .filter_map(|l| l.base_time.or(l.start_time))
        .fold(f64::INFINITY, f64::min);
    let zero = if zero.is_finite() {
        std::time::UNIX_EPOCH + Duration::from_secs_f64(zero)
    } else {
        started
    };
    let zero_s = zero
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut w = HlogWriter::create(path, zero)?;
    for l in logs {
        for i in &l.intervals {
            let at = Duration::from_secs_f64((i.start - zero_s).max(0.0));
            let tag = i
                .tag
                .as_deref()
                .unwrap_or(agent_sim_metrics::hlog::UNTAGGED);
            w.write_interval(at, Duration::from_secs_f64(i.length), tag, &i.histogram)?;
        }
    }
    w.flush()
}

fn scratch_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "agent-sim-local-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Runs the fleet as `lp.processes` local processes and merges them;
/// returns the exit code.
pub async fn run(cfg: RunConfig, lp: LocalPlan, shutdown: CancellationToken) -> i32 {
    let started_wall = SystemTime::now();
    let started = Instant::now();
    let dir = match scratch_dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("agent-sim: local processes: a scratch folder: {e}");
            return exit::FAILURE;
        }
    };
    eprintln!(
        "agent-sim: {}{}",
        lp.why,
        lp.sources
            .as_ref()
            .map(|s| format!(", dialing from {s}"))
            .unwrap_or_default()
    );
    let Some(mut kids) = spawn_all(&lp, &dir) else {
        return exit::FAILURE;
    };
    let requested: u64 = cfg.fleets.iter().map(|f| f.total_agents).sum();
    let (statuses, all_at) = watch(&cfg, &mut kids, requested, started, &shutdown).await;
    let (parts, logs) = gather(&cfg, &lp, &dir, &kids, &statuses, started_wall);
    let notes: Vec<String> = all_at
        .map(|t| {
            format!(
                "ramp       all {requested} agent(s) connected {:.2}s after the local processes \
                 started",
                t.as_secs_f64()
            )
        })
        .into_iter()
        .collect();
    let code = finish(&cfg, &parts, &logs, started_wall, &notes);
    let _ = std::fs::remove_dir_all(&dir);
    code
}

/// Starts every local process with this process's arguments; `None` (the
/// ones started told to stop) when one cannot start.
fn spawn_all(lp: &LocalPlan, dir: &Path) -> Option<Vec<Kid>> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut kids = Vec::new();
    for i in 0..lp.processes {
        match spawn(i, lp, dir, &argv) {
            Ok(k) => kids.push(k),
            Err(e) => {
                eprintln!("agent-sim: starting local process {i}: {e}");
                signal(&kids, libc::SIGTERM);
                return None;
            }
        }
    }
    Some(kids)
}

/// Shows the processes' progress added up until all have ended, forwarding
/// a shutdown to them once; returns how each ended (its exit status, if
/// known) and when all `requested` agents were first connected.
async fn watch(
    cfg: &RunConfig,
    kids: &mut [Kid],
    requested: u64,
    started: Instant,
    shutdown: &CancellationToken,
) -> (Vec<Option<String>>, Option<Duration>) {
    let mut progress = Progress::new(
        requested,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        cfg.progress_every,
        cfg.kind(),
    );
    let show = !cfg.quiet;
    let mut forwarded = false;
    let mut all_at: Option<Duration> = None;
    loop {
        let done = kids
            .iter_mut()
            .all(|k| k.child.try_wait().ok().flatten().is_some());
        if done {
            if show {
                let (snap, s) = added_up(kids);
                progress.tick(started.elapsed(), &snap, s, true);
            }
            let statuses = kids
                .iter_mut()
                .map(|k| k.child.wait().map(|s| s.to_string()).ok())
                .collect();
            return (statuses, all_at);
        }
        if all_at.is_none() && added_up(kids).0.connected as u64 >= requested {
            all_at = Some(started.elapsed());
        }
        if shutdown.is_cancelled() && !forwarded {
            forwarded = true;
            signal(kids, libc::SIGTERM);
        }
        if show {
            let (snap, s) = added_up(kids);
            progress.tick(started.elapsed(), &snap, s, false);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = shutdown.cancelled(), if !forwarded => {}
        }
    }
}

/// What the processes left: each one's summary (an obituary for one that
/// left none) and the interval logs found.
fn gather(
    cfg: &RunConfig,
    lp: &LocalPlan,
    dir: &Path,
    kids: &[Kid],
    statuses: &[Option<String>],
    started_wall: SystemTime,
) -> (Vec<Summary>, Vec<HlogContents>) {
    let mut parts = Vec::new();
    let mut logs = Vec::new();
    for (i, (k, status)) in kids.iter().zip(statuses).enumerate() {
        let i = i as u64;
        match Summary::read(&dir.join(format!("{i}.json"))) {
            Ok(s) => parts.push(s),
            Err(_) => {
                let words = k
                    .last_words
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                let status = status.clone().unwrap_or_else(|| "status unknown".into());
                eprintln!(
                    "agent-sim: local process {i}/{} died ({status})",
                    lp.processes
                );
                parts.push(obituary(
                    cfg,
                    i,
                    lp.processes,
                    &status,
                    &words,
                    started_wall,
                ));
            }
        }
        if let Ok(l) = read_hlog(&dir.join(format!("{i}.hlog"))) {
            logs.push(l);
        }
    }
    (parts, logs)
}

/// The merged summary, its outputs and the exit code of the whole.
fn finish(
    cfg: &RunConfig,
    parts: &[Summary],
    logs: &[HlogContents],
    started: SystemTime,
    notes: &[String],
) -> i32 {
    // No hlog histograms over the children's summaries: these embed every
    // histogram (the samples after a child's last interval too), and their
    // hlogs lack the observers' propagation that the merge adds up.
    let mut merged = match crate::results::merge(parts, &[]) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("agent-sim: merging the local processes: {e}");
            return exit::FAILURE;
        }
    };
    merged.shard = None;
    let verdicts = evaluate(&cfg.asserts, &merged);
    merged.outcome = crate::run::decide(&merged, None, None, &verdicts);
    let mut errors = Vec::new();
    if let Some(p) = &cfg.summary
        && let Err(e) = merged.write(p)
    {
        errors.push(format!("--summary {}: {e}", p.display()));
    }
    if let Some(p) = &cfg.hlog
        && let Err(e) = merge_hlogs(p, logs, started)
    {
        errors.push(format!("--hlog {}: {e}", p.display()));
    }
    if let Some(p) = &cfg.report_html {
        let page = crate::results::page(&merged, &verdicts, logs, &[]);
        if let Err(e) = crate::results::write_atomically(p, &page) {
            errors.push(format!("--report-html {}: {e}", p.display()));
        }
    }
    if !errors.is_empty() {
        merged.outcome = crate::run::decide(&merged, None, Some(errors.join("; ")), &verdicts);
    }
    print!(
        "{}",
        agent_sim_metrics::report::render_with(
            &merged,
            &TableOptions {
                verdicts: &verdicts,
                notes,
                verbose: cfg.verbose,
            }
        )
    );
    if let Some(r) = &merged.outcome.reason
        && merged.outcome.exit_code != exit::OK
    {
        eprintln!("agent-sim: {r}");
    }
    merged.outcome.exit_code
}
