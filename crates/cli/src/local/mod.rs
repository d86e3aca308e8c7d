//! Local processes: when one process cannot hold the fleet (the open-files
//! hard limit, or `--processes N`), agent-sim starts N copies of itself as
//! local shards and is their parent: one progress line for all, Ctrl-C and
//! SIGTERM forwarded, ONE summary, table, hlog and page merged exactly as
//! `report merge` does, and the exit code of the whole. A child that dies is
//! reported as such: its agents missing with cause `process_died`.
//!
//! Parts: [`plan`] (whether to, how many, and the source addresses the
//! children dial from, planned together), `child` (what a child changes of
//! its own settings, and the progress lines it writes for its parent),
//! `parent` (spawning, progress, signals, the merge).
//!
//! Across boxes the Kubernetes and Nomad configs stay the way; each pod may
//! itself use local processes.

mod child;
mod parent;

use crate::plan::{FleetPlan, Protocol, RunConfig, UsageError, usage};
use crate::preflight::{self, Host};
use crate::values::{AddrRange, ValueError};

pub use child::{CHILD_ENV, apply_child};
pub use parent::run;

/// Cause of the agents of a local process that died.
pub const CAUSE_PROCESS_DIED: &str = "process_died";

/// File descriptors a local process keeps for itself besides its agents'.
const FD_SLACK: u64 = 256;

/// Most local processes a run starts by itself: two per core (at least 4),
/// twice that for a run on the embedded backend, whose every process holds
/// both ends of its sessions: the same box running the backend as `serve`
/// processes beside the fleet's would run as many (40,000 Sensu agents: 3
/// fleet and 3 `serve` processes).
fn max_processes(embedded: bool) -> u64 {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    (2 * cores).max(4) * if embedded { 2 } else { 1 }
}

/// How a run is split over local processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPlan {
    /// Processes to start.
    pub processes: u64,
    /// The source addresses the children dial from (each takes its slice),
    /// when planned here.
    pub sources: Option<String>,
    /// Why, in one line (printed at start).
    pub why: String,
}

fn targets(plan: &FleetPlan) -> Vec<String> {
    match &plan.protocol {
        Protocol::Sensu(s) => s.targets.clone(),
        Protocol::Consul(c) => c.conn.targets.clone(),
        Protocol::Dataplane(d) => d.conn.targets.clone(),
    }
}

/// Whether this run is split over local processes, and how. `None`: one
/// process (it fits, it is a child, or the user shards by hand).
pub fn plan(cfg: &RunConfig, host: &Host) -> Result<Option<LocalPlan>, UsageError> {
    if cfg.local_child {
        return Ok(None);
    }
    let asked = cfg.processes;
    if cfg.shard.is_some() {
        if asked.is_some_and(|n| n > 1) {
            return usage("--processes and --shard: use one (--shard splits by hand)");
        }
        return Ok(None);
    }
    let n = preflight::needs(cfg);
    let hard = host.nofile.1;
    let per_process = hard.saturating_sub(FD_SLACK).max(1);
    let fds = n.fds.saturating_sub(64);
    let (processes, why) = match asked {
        Some(p) => (p, format!("--processes {p}")),
        None if n.fds > hard => {
            let p = fds.div_ceil(per_process);
            (
                p,
                format!(
                    "this run needs about {} file descriptors and one process may hold {} (ulimit \
                     -Hn): {p} local processes",
                    preflight::count(n.fds),
                    preflight::count(hard)
                ),
            )
        }
        None => return Ok(None),
    };
    if processes <= 1 {
        return Ok(None);
    }
    let cap = max_processes(n.embedded);
    if asked.is_none() && processes > cap {
        return usage(format!(
            "this run needs about {} file descriptors: {processes} local processes of at most {} \
             each, more than this box should run (at most {cap}: {}): split it over boxes with \
             --shard I/N, or raise the hard limit (ulimit -Hn)",
            preflight::count(n.fds),
            preflight::count(hard),
            if n.embedded {
                "4 per core with the embedded backend, holding both ends of each session"
            } else {
                "2 per core"
            }
        ));
    }
    if fds.div_ceil(processes) + FD_SLACK > hard {
        return usage(format!(
            "--processes {processes}: each would need about {} file descriptors, over the hard \
             limit {} (ulimit -Hn): give more processes",
            preflight::count(fds.div_ceil(processes) + FD_SLACK),
            preflight::count(hard)
        ));
    }
    if cfg.metrics_addr.is_some() {
        return usage(
            "--metrics-addr with local processes: each would serve its own; run --shard I/N \
             processes by hand with one address each, or --processes 1",
        );
    }
    let sources = plan_sources(cfg, host, processes)?;
    Ok(Some(LocalPlan {
        processes,
        sources,
        why,
    }))
}

/// The source addresses of the children, planned together: the ports one
/// source address has left toward a target (less what this host's
/// connections already hold) against the sessions every child opens from
/// it. A loopback fleet gets its own 127.0.0.x addresses (at least one per
/// child); another is refused with the numbers when it cannot fit.
fn plan_sources(
    cfg: &RunConfig,
    host: &Host,
    processes: u64,
) -> Result<Option<String>, UsageError> {
    let (lo, hi) = host.ports;
    let range = hi.saturating_sub(lo) + 1;
    let mut planned: Option<String> = None;
    for plan in &cfg.fleets {
        let names = targets(plan);
        let per_target = plan.total_agents.div_ceil(names.len().max(1) as u64);
        let held = names
            .iter()
            .filter_map(|t| preflight::target_addr(t))
            .map(|d| host.held(d, None))
            .max()
            .unwrap_or(0);
        let usable = range
            .saturating_sub(preflight::PORT_RESERVE)
            .saturating_sub(held)
            .max(1);
        let loopback = plan.embedded || names.iter().all(|t| preflight::is_loopback(t));
        let given = plan.fleet.source_addrs.len() as u64;
        if plan.embedded {
            // Each child runs its own in-process target: nothing shared.
            continue;
        }
        if given == 0 && loopback {
            let k = per_target.div_ceil(usable).max(processes).min(254);
            let range = format!("127.0.0.1-127.0.0.{k}");
            planned = Some(match planned {
                Some(p) if p != range => {
                    return usage(
                        "several loopback fleets in local processes: give their --source-addr \
                         per [[fleet]]",
                    );
                }
                _ => range,
            });
            continue;
        }
        // Every child dials from the same addresses (or from its slice of
        // them): the busiest address carries this many sessions.
        let per_source = per_target.div_ceil(given.max(1));
        if per_source > usable {
            let need = per_target.div_ceil(usable);
            return usage(format!(
                "the {processes} local processes together open {} sessions to one target from \
                 {}; {usable} ephemeral ports are left per source address ({range} in {lo}-{hi}{}): \
                 add source addresses (--source-addr with {need} addresses of this box), more \
                 targets, or widen net.ipv4.ip_local_port_range",
                preflight::count(per_target),
                if given == 0 {
                    "the OS-chosen source address".to_string()
                } else {
                    format!("{given} source address(es)")
                },
                if held > 0 {
                    format!(", {held} held by this host's connections to it")
                } else {
                    String::new()
                }
            ));
        }
    }
    Ok(planned)
}

/// The `--source-addr` value a child is given (parsed back by the child).
pub(crate) fn parse_sources(s: &str) -> Result<Vec<AddrRange>, ValueError> {
    s.split(',').map(|x| x.trim().parse()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::RunArgs;
    use crate::config::resolve;

    fn cfg(agents: u64, target: &str, extra: impl FnOnce(&mut RunArgs)) -> RunConfig {
        let mut a = RunArgs {
            agents: Some(agents),
            targets: if target.is_empty() {
                vec![]
            } else {
                vec![target.into()]
            },
            ..Default::default()
        };
        extra(&mut a);
        resolve(a, &|_| None).unwrap()
    }

    fn host(hard: u64) -> Host {
        let mut h = Host::read(std::path::Path::new("/nonexistent"));
        h.nofile = (1024, hard);
        h.ports = (32768, 60999);
        h.tcp.clear();
        h
    }

    #[test]
    fn the_headline_run_takes_three_processes_and_three_loopback_addresses() {
        let p = plan(&cfg(40_000, "127.0.0.1:8081", |_| {}), &host(20_000))
            .unwrap()
            .unwrap();
        assert_eq!(p.processes, 3);
        assert_eq!(p.sources.as_deref(), Some("127.0.0.1-127.0.0.3"));
        assert!(p.why.contains("3 local processes"), "{}", p.why);
        // Fits one process: none.
        assert!(
            plan(&cfg(10_000, "127.0.0.1:8081", |_| {}), &host(20_000))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn processes_can_be_asked_for_and_are_checked() {
        let p = plan(
            &cfg(1_000, "10.1.2.3:8081", |a| a.processes = Some(2)),
            &host(20_000),
        )
        .unwrap()
        .unwrap();
        assert_eq!((p.processes, p.sources), (2, None));
        let e = plan(
            &cfg(40_000, "10.1.2.3:8081", |a| a.processes = Some(2)),
            &host(20_000),
        )
        .unwrap_err()
        .0;
        assert!(e.contains("each would need about"), "{e}");
        let e = plan(
            &cfg(1_000, "10.1.2.3:8081", |a| {
                a.processes = Some(2);
                a.shard = Some("0/2".parse().unwrap());
            }),
            &host(20_000),
        )
        .unwrap_err()
        .0;
        assert!(e.contains("use one"), "{e}");
    }

    #[test]
    fn a_child_ramps_and_dials_at_its_share_of_the_run() {
        let a = RunArgs {
            agents: Some(3_000),
            ramp: Some("600/s".parse().unwrap()),
            max_dialing: Some(256),
            ..Default::default()
        };
        let v = child::child_env(1, 3, std::path::Path::new("/tmp"), "");
        let c = resolve(a, &|k| (k == CHILD_ENV).then(|| v.clone())).unwrap();
        assert!(c.local_child);
        let f = &c.fleets[0].fleet;
        assert_eq!((f.agents, f.first_index), (1_000, 1_000));
        assert_eq!(f.ramp.unwrap().as_per_second(), 200.0);
        assert_eq!(f.max_dialing, 86);
    }

    #[test]
    fn an_embedded_run_holds_both_ends_and_may_take_twice_the_processes() {
        // 40,000 sidecars and their server: 2 descriptors a sidecar, five
        // processes of 8,000 (more than 2 per core on a 2-core box).
        let p = plan(
            &cfg(40_000, "", |a| {
                a.kind = Some(crate::values::Kind::ConsulDataplane)
            }),
            &host(20_000),
        )
        .unwrap()
        .unwrap();
        assert_eq!((p.processes, p.sources), (5, None));
    }

    #[test]
    fn a_fleet_no_box_should_hold_is_refused_not_forked() {
        let e = plan(&cfg(5_000_000, "", |_| {}), &host(20_000))
            .unwrap_err()
            .0;
        assert!(
            e.contains("more than this box should run") && e.contains("--shard"),
            "{e}"
        );
    }

    #[test]
    fn a_remote_target_is_planned_for_every_child_together() {
        // 40,000 over 3 processes from one OS-chosen address: refused.
        let e = plan(&cfg(40_000, "10.1.2.3:8081", |_| {}), &host(20_000))
            .unwrap_err()
            .0;
        assert!(
            e.contains("the 3 local processes together open 40,000 sessions to one target")
                && e.contains("27976 ephemeral ports are left")
                && e.contains("--source-addr with 2 addresses"),
            "{e}"
        );
        let ok = plan(
            &cfg(40_000, "10.1.2.3:8081", |a| {
                a.source_addrs = vec!["10.0.0.10-10.0.0.12".parse().unwrap()]
            }),
            &host(20_000),
        )
        .unwrap()
        .unwrap();
        assert_eq!((ok.processes, ok.sources), (3, None));
    }
}
