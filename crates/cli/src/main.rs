//! The `agent-sim` binary: parse, validate and preflight before any socket,
//! build an explicit tokio runtime, run, and exit with a documented code
//! (0 complete, 1 nothing could run, 2 incomplete fleet, 3 SLO failed, 64 bad usage).

use std::process::ExitCode;

use agent_sim::args::{
    CleanupArgs, Command, DoctorArgs, ReportCommand, RunArgs, ServeArgs, StudyArgs,
};
use agent_sim::run::{Output, exit};
use agent_sim::{config, preflight, report_cmd, run, serve};
use tokio_util::sync::CancellationToken;

/// jemalloc with `--features jemalloc` (needs `make` and a C compiler to
/// build): a churning run's RSS stays flat where glibc's malloc keeps what
/// closed sessions freed (BENCHMARKS.md, churn soak).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn code(c: i32) -> ExitCode {
    ExitCode::from(c as u8)
}

fn runtime(threads: Option<usize>, seed: Option<u64>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all().thread_name("agent-sim");
    if let Some(n) = threads {
        b.worker_threads(n);
    }
    if let Some(seed) = seed {
        let next = std::sync::atomic::AtomicU64::new(seed);
        b.on_thread_start(move || {
            fastrand::seed(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        });
        fastrand::seed(seed);
    }
    b.build()
}

/// Builds the runtime and runs `job` on it with a shutdown token that
/// SIGINT/SIGTERM cancel; a runtime that cannot start is a runtime failure.
fn run_with_signals<F, Fut>(threads: Option<usize>, seed: Option<u64>, job: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    let rt = match runtime(threads, seed) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agent-sim: runtime: {e}");
            return code(exit::FAILURE);
        }
    };
    rt.block_on(async move {
        let token = CancellationToken::new();
        on_signals(token.clone());
        job(token).await
    })
}

/// Cancels `token` on SIGINT or SIGTERM (a second signal exits at once).
fn on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        wait_signal().await;
        eprintln!(
            "\nagent-sim: shutting down (closing sessions, then writing the report; Ctrl-C again to abort)"
        );
        token.cancel();
        wait_signal().await;
        eprintln!("agent-sim: aborted");
        std::process::exit(130);
    });
}

async fn wait_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Clap's error as one line: its first paragraph, naming the flag and the
/// reason (`invalid value 'x' for '--storm <...>': at=x: ...`).
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty())
        .collect();
    let line = first.join(" ");
    line.strip_prefix("error: ").unwrap_or(&line).to_string()
}

fn main() -> ExitCode {
    let cli = match agent_sim::help::parse() {
        Ok(c) => c,
        Err(e) if e.use_stderr() => {
            eprintln!("agent-sim: {}", one_line(&e));
            return code(exit::USAGE);
        }
        Err(e) => {
            // --help, --version.
            let _ = e.print();
            return code(exit::OK);
        }
    };
    match cli.command {
        Some(Command::Report(r)) => report(r),
        Some(Command::Cleanup(args)) => cleanup(*args),
        Some(Command::Doctor(args)) => doctor(&args),
        Some(Command::Serve(args)) => serve_backend(*args),
        Some(Command::Study(args)) => study(*args),
        None => run_fleet(cli.run),
    }
}

/// A refusal of bad usage: its reason in one line, exit 64.
fn refuse(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("agent-sim: {e}");
    code(exit::USAGE)
}

/// `agent-sim report ...`.
fn report(cmd: ReportCommand) -> ExitCode {
    code(match cmd {
        ReportCommand::Show { file, verbose } => report_cmd::show(&file, verbose),
        ReportCommand::Html {
            files,
            out,
            asserts,
        } => report_cmd::html(&files, &out, &asserts),
        ReportCommand::Compare {
            a,
            b,
            out,
            thresholds,
        } => report_cmd::compare(&a, &b, out.as_deref(), &thresholds),
        ReportCommand::Merge {
            files,
            summary,
            asserts,
        } => report_cmd::merge(&files, summary.as_deref(), &asserts),
    })
}

/// `agent-sim cleanup ...`.
fn cleanup(args: CleanupArgs) -> ExitCode {
    let cfg = match agent_sim::cleanup_cmd::plan(&args) {
        Ok(c) => c,
        Err(e) => return refuse(e),
    };
    run_with_signals(Some(1), None, |_token| async move {
        code(agent_sim::cleanup_cmd::run(cfg, args.dry_run).await)
    })
}

/// `agent-sim doctor ...`.
fn doctor(args: &DoctorArgs) -> ExitCode {
    match agent_sim::doctor_cmd::plan(args) {
        Ok(cfg) => {
            let (report, c) = agent_sim::doctor_cmd::run(&cfg, &args.proc_root);
            print!("{report}");
            code(c)
        }
        Err(e) => refuse(e),
    }
}

/// `agent-sim serve ...`.
fn serve_backend(args: ServeArgs) -> ExitCode {
    let plan = match serve::plan(&args) {
        Ok(p) => p,
        Err(e) => return refuse(e),
    };
    let host = preflight::Host::of_this_host();
    let _ = preflight::raise_nofile(host.nofile.1);
    run_with_signals(args.threads, None, |token| async move {
        match serve::serve(args, plan, token).await {
            Ok(()) => code(exit::OK),
            Err(e) => {
                eprintln!("agent-sim: {e:#}");
                code(exit::FAILURE)
            }
        }
    })
}

/// `agent-sim study ...`: the study's run, or the list of studies.
fn study(args: StudyArgs) -> ExitCode {
    if args.list {
        return match agent_sim::study::list() {
            Ok(text) => {
                print!("{text}");
                code(exit::OK)
            }
            Err(e) => refuse(e),
        };
    }
    match agent_sim::study::resolve(args, &|k| std::env::var(k).ok()) {
        Ok(cfg) => run_resolved(cfg),
        Err(e) => refuse(e),
    }
}

/// A fleet run (no subcommand).
fn run_fleet(args: RunArgs) -> ExitCode {
    match config::resolve(args, &|k| std::env::var(k).ok()) {
        Ok(cfg) => run_resolved(cfg),
        Err(e) => refuse(e),
    }
}

/// A resolved run, checked before any socket, run as local processes or
/// in this one.
fn run_resolved(mut cfg: agent_sim::plan::RunConfig) -> ExitCode {
    // Results are written at the end: a path they cannot take is
    // refused now, before a long run would lose them.
    if let Err(e) = preflight::outputs(&cfg) {
        return refuse(e);
    }
    if !cfg.local_child {
        for note in &cfg.notes {
            eprintln!("agent-sim: note: {note}");
        }
    }
    let host = preflight::Host::of_this_host();
    match agent_sim::local::plan(&cfg, &host) {
        Ok(Some(lp)) => {
            return run_with_signals(Some(1), None, |token| async move {
                code(agent_sim::local::run(cfg, lp, token).await)
            });
        }
        Ok(None) => {}
        Err(e) => return refuse(e),
    }
    for note in preflight::spread_loopback(&mut cfg, &host) {
        eprintln!("agent-sim: note: {note}");
    }
    let pre = preflight::check(&cfg, &host).and_then(|p| preflight::apply(&p, &host));
    if let Err(e) = pre {
        return refuse(e);
    }
    let (threads, seed) = (cfg.threads, cfg.seed);
    run_with_signals(threads, seed, |token| async move {
        match run::execute(cfg, token, Output::Terminal).await {
            Ok(outcome) => {
                if let Some(p) = &outcome.problem {
                    eprintln!("agent-sim: {p}");
                }
                code(outcome.exit_code)
            }
            Err(e) if e.is_usage() => refuse(e),
            Err(e) => {
                eprintln!("agent-sim: {e}");
                code(exit::FAILURE)
            }
        }
    })
}
