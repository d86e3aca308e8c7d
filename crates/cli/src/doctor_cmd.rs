//! `agent-sim doctor`: the run's preflight ([`crate::preflight::assess`])
//! as its own command. It resolves the run's flags exactly as a run would,
//! reads the host's limits from a `/proc` tree, and prints every check with
//! its verdict and the exact fixes; nothing is changed and no socket is
//! opened.

use std::path::Path;

use crate::args::DoctorArgs;
use crate::config;
use crate::plan::{RunConfig, UsageError};
use crate::preflight::{self, Finding, Host, Verdict};

/// Exit code of a run that does not fit the host.
pub const DOES_NOT_FIT: i32 = 2;

/// Resolves the flags into the run they describe (same rules as a run).
pub fn plan(args: &DoctorArgs) -> Result<RunConfig, UsageError> {
    config::resolve(args.run.clone(), &|k| std::env::var(k).ok())
}

/// Checks `cfg` against the host whose `/proc` is `proc_root`; returns the
/// report and the exit code (0 fits, [`DOES_NOT_FIT`]).
pub fn run(cfg: &RunConfig, proc_root: &Path) -> (String, i32) {
    let host = Host::read(proc_root);
    let mut cfg = cfg.clone();
    let local = crate::local::plan(&cfg, &host);
    let spread = match &local {
        Ok(None) => preflight::spread_loopback(&mut cfg, &host),
        _ => Vec::new(),
    };
    let mut findings = preflight::assess(&cfg, &host);
    match local {
        Ok(None) => {}
        Ok(Some(lp)) => {
            // The fds and ports are each local process's, planned together.
            findings.retain(|f| f.check != "file descriptors" && f.check != "ephemeral ports");
            let n = preflight::needs(&cfg);
            findings.insert(
                0,
                Finding {
                    check: "local processes",
                    need: format!("{} file descriptors in all", preflight::count(n.fds)),
                    have: format!("hard limit {} per process", preflight::count(host.nofile.1)),
                    verdict: Verdict::Ok,
                    fixes: vec![format!(
                        "agent-sim runs this as {} local processes by itself, one merged report \
                         ({}{})",
                        lp.processes,
                        lp.why,
                        lp.sources
                            .as_ref()
                            .map(|s| format!("; dialing from {s}"))
                            .unwrap_or_default()
                    )],
                },
            );
        }
        Err(e) => findings.insert(
            0,
            Finding {
                check: "local processes",
                need: "the fleet over several processes of this host".into(),
                have: "not enough ports for all of them".into(),
                verdict: Verdict::Fail,
                fixes: vec![e.0],
            },
        ),
    }
    if let Some(f) = findings.iter_mut().find(|f| f.check == "ephemeral ports") {
        f.fixes.extend(spread);
    }
    let code = match preflight::verdict(&findings) {
        Verdict::Fail => DOES_NOT_FIT,
        Verdict::Ok | Verdict::Warn => 0,
    };
    (render(&cfg, &findings), code)
}

/// The report: what the run is, one block per check, the verdict.
pub fn render(cfg: &RunConfig, findings: &[Finding]) -> String {
    let mut out = String::new();
    let fleets: Vec<String> = cfg
        .fleets
        .iter()
        .map(|f| {
            let target = if f.embedded {
                "the in-process target".to_string()
            } else {
                match &f.protocol {
                    crate::plan::Protocol::Sensu(s) => s.targets.join(","),
                    crate::plan::Protocol::Consul(c) => c.conn.targets.join(","),
                    crate::plan::Protocol::Dataplane(d) => d.conn.targets.join(","),
                }
            };
            format!(
                "{} {} agents → {target}",
                preflight::count(f.fleet.agents),
                f.protocol.kind()
            )
        })
        .collect();
    let shard = cfg
        .shard
        .map(|s| format!(" (shard {s})"))
        .unwrap_or_default();
    out.push_str(&format!(
        "agent-sim doctor: {}{shard}\n\n",
        fleets.join("; ")
    ));
    for f in findings {
        out.push_str(&format!(
            "[{:>4}] {}: need {}; have {}\n",
            f.verdict.to_string(),
            f.check,
            f.need,
            f.have
        ));
        for fix in &f.fixes {
            out.push_str(&format!("       → {fix}\n"));
        }
    }
    let verdict = preflight::verdict(findings);
    out.push('\n');
    out.push_str(match verdict {
        Verdict::Ok => "This run fits this host (exit 0).\n",
        Verdict::Warn => "This run fits this host, with warnings above (exit 0).\n",
        Verdict::Fail => {
            "This run does not fit this host (exit 2): apply one fix (→) of each FAIL.\n"
        }
    });
    out
}
