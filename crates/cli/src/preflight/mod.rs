//! Checks the host can hold the run before any socket is opened, and says
//! what to change when it cannot.
//!
//! Parts, leaves first: `host` ([`Host`]: what the host offers, read from a
//! `/proc` tree, a fake one in tests), `needs` ([`needs`]: what a validated
//! [`RunConfig`] asks of the host, and the memory figures per agent),
//! `findings` ([`assess`]: every check with its verdict and the exact fix;
//! `agent-sim doctor` prints them all). Here: [`check`], the same rules as a
//! run's gate (fds and ports refuse the run, exit 64), [`outputs`] (the
//! result files can be written), [`spread_loopback`], and [`apply`], which
//! raises the soft fd limit to the hard one when the run needs it.

mod findings;
mod host;
mod needs;

use std::net::IpAddr;
use std::path::Path;

use crate::plan::{Protocol, RunConfig, UsageError};
use findings::{held, port_fixes};

pub use findings::{Finding, Verdict, assess, verdict};
pub use host::Host;
pub(crate) use host::PORT_RESERVE;
pub use needs::{
    BASE_BYTES, CONSUL_AGENT_BYTES, CONSUL_SERVER_BYTES, CONSUL_STREAM_BYTES,
    DATAPLANE_AGENT_BYTES, DATAPLANE_SERVER_BYTES, Needs, SENSU_AGENT_BYTES, SENSU_SERVER_BYTES,
    needs,
};
pub(crate) use needs::{count, is_loopback, target_addr};

/// What the checks found (the run's gate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preflight {
    /// File descriptors the run needs.
    pub fds_needed: u64,
    /// The soft limit found.
    pub fd_limit: u64,
    /// Most sessions one source address opens to one destination.
    pub max_per_source_and_destination: u64,
    /// Size of the ephemeral port range.
    pub ephemeral_ports: u64,
}

/// The run's gate: refuses a run whose file descriptors exceed the hard
/// limit or whose sessions per source address exceed the ephemeral ports
/// left (the range, less those this host's connections already hold toward
/// the target), one line each, exit 64. Pure: see [`apply`] for raising
/// the limit.
pub fn check(cfg: &RunConfig, host: &Host) -> Result<Preflight, UsageError> {
    let n = needs(cfg);
    let (soft, hard) = host.nofile;
    if n.fds > hard {
        let embedded = if n.embedded {
            " (the in-process target doubles it: run `agent-sim serve` in another process and pass --target)"
        } else {
            ""
        };
        return Err(UsageError(format!(
            "this run needs about {} file descriptors{embedded} but the hard limit (ulimit -Hn) is {}: \
             run fewer agents per process (--processes N starts them for you; --shard I/N splits by hand) \
             or raise the hard limit (`agent-sim doctor` with the same flags says how)",
            n.fds, hard
        )));
    }
    let (range, budget) = host.port_budget();
    let (held, dest) = held(&n, host);
    let usable = budget.saturating_sub(held);
    if n.worst_pair > usable {
        let (lo, hi) = host.ports;
        let others = match dest {
            Some(d) if held > 0 => format!(
                ", {held} of them already held by this host's connections to {d} (other shards, \
                 other tools)"
            ),
            _ => String::new(),
        };
        return Err(UsageError(format!(
            "{} sessions from one source address to one target need more than the {usable} ephemeral \
             ports left ({range} in {lo}-{hi}{others}): {}",
            n.worst_pair,
            port_fixes(&n, usable).join("; ")
        )));
    }
    Ok(Preflight {
        fds_needed: n.fds,
        fd_limit: soft,
        max_per_source_and_destination: n.worst_pair,
        ephemeral_ports: range,
    })
}

/// Refuses result files the run could not write at its end (`--summary`,
/// `--report-html`, `--hlog`): a path in a missing folder, a folder, or a
/// folder this user may not write in, found before the first agent dials
/// instead of after the whole run (exit 64, one line).
pub fn outputs(cfg: &RunConfig) -> Result<(), UsageError> {
    let files = [
        ("--summary", &cfg.summary),
        ("--report-html", &cfg.report_html),
        ("--hlog", &cfg.hlog),
    ];
    for (flag, path) in files {
        if let Some(p) = path {
            writable(p).map_err(|e| {
                UsageError(format!("{flag} {}: cannot be written: {e}", p.display()))
            })?;
        }
    }
    Ok(())
}

/// Whether a file can be written at `path` the way results are (a file
/// beside it, then renamed over it): tried with a file created beside it
/// and removed at once.
fn writable(path: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        return Err(std::io::Error::other("it is a folder"));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".agent-sim-write-check-{}", std::process::id()));
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

/// For a fleet whose targets are all on this host's loopback (or in this
/// process), with no `--source-addr`: when its sessions to one target need
/// more ports than one source address has left, dial from as many
/// 127.0.0.x addresses as needed (all of 127/8 is local). A shard does so
/// always, from addresses of its own (shard I of addresses k each:
/// 127.0.0.(I·k+1) on): the shards of a fleet on one host share its ports,
/// and none knows how many the others will hold. Returns what was done, in
/// words, for each fleet spread.
pub fn spread_loopback(cfg: &mut RunConfig, host: &Host) -> Vec<String> {
    let mut notes = Vec::new();
    let (_, budget) = host.port_budget();
    let (shard, embedded_servers) = (cfg.shard, cfg.embedded_servers.max(1));
    for plan in &mut cfg.fleets {
        if !plan.fleet.source_addrs.is_empty() {
            continue;
        }
        let targets: Vec<String> = match &plan.protocol {
            Protocol::Sensu(s) => s.targets.clone(),
            Protocol::Consul(c) => c.conn.targets.clone(),
            Protocol::Dataplane(d) => d.conn.targets.clone(),
        };
        if !(plan.embedded || targets.iter().all(|t| is_loopback(t))) {
            continue;
        }
        // An embedded fleet's targets are bound later: `--embedded-servers`.
        let n = if plan.embedded {
            embedded_servers
        } else {
            targets.len()
        };
        let per_target = plan.fleet.agents.div_ceil(n.max(1) as u64);
        let held = targets
            .iter()
            .filter_map(|t| target_addr(t))
            .map(|d| host.held(d, None))
            .max()
            .unwrap_or(0);
        let usable = budget.saturating_sub(held).max(1);
        let k = per_target.div_ceil(usable).clamp(1, 254);
        if k == 1 && shard.is_none() {
            continue;
        }
        let first = shard.map_or(0, |s| s.index * k);
        plan.fleet.source_addrs = (0..k)
            .map(|i| IpAddr::from([127, 0, 0, ((first + i) % 254 + 1) as u8]))
            .collect();
        let from = match (
            plan.fleet.source_addrs.first(),
            plan.fleet.source_addrs.last(),
        ) {
            (Some(a), Some(b)) if a != b => format!("{a}-{b}"),
            (Some(a), _) => a.to_string(),
            _ => String::new(),
        };
        notes.push(match shard {
            Some(s) => format!(
                "shard {s} of a fleet on this host's loopback dials from {from}: the shards on \
                 one host share its ports, so each takes addresses of its own ({} {} sessions \
                 per target, {} ports per address)",
                count(per_target),
                plan.protocol.kind(),
                count(usable)
            ),
            None => format!(
                "{} {} sessions per target exceed the {} ports one source address has left: \
                 dialing from {from} (loopback)",
                count(per_target),
                plan.protocol.kind(),
                count(usable)
            ),
        });
    }
    notes
}

/// Raises the soft fd limit to the hard one when the run needs more than the
/// soft limit; returns the limit in force.
pub fn apply(p: &Preflight, host: &Host) -> Result<u64, UsageError> {
    let (soft, hard) = host.nofile;
    if p.fds_needed <= soft {
        return Ok(soft);
    }
    raise_nofile(hard).map_err(|e| {
        UsageError(format!(
            "this run needs about {} file descriptors; raising the soft limit from {soft} to {hard} failed: {e}",
            p.fds_needed
        ))
    })
}

/// Raises the soft RLIMIT_NOFILE to `hard`; returns the new soft limit.
pub fn raise_nofile(hard: u64) -> std::io::Result<u64> {
    rlimit::setrlimit(rlimit::Resource::NOFILE, hard, hard)?;
    Ok(hard)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::host::parse_nofile;
    use super::*;
    use crate::args::RunArgs;
    use crate::config::resolve;

    fn cfg(agents: u64, targets: Vec<String>, sources: Vec<String>) -> RunConfig {
        let a = RunArgs {
            agents: Some(agents),
            targets,
            source_addrs: sources.iter().map(|s| s.parse().unwrap()).collect(),
            ..Default::default()
        };
        resolve(a, &|_| None).unwrap()
    }

    /// This project's load box: hard limit 20,000, the default port range.
    fn box_host() -> Host {
        Host {
            nofile: (1024, 20_000),
            ..host()
        }
    }

    /// A roomy host, changed per test.
    fn host() -> Host {
        Host {
            nofile: (1024, 1_048_576),
            nr_open: Some(1_048_576),
            ports: (32768, 60999),
            somaxconn: Some(4096),
            conntrack: Some((100, 262_144)),
            mem_available: Some(16 << 30),
            tcp: Vec::new(),
        }
    }

    fn by<'a>(f: &'a [Finding], check: &str) -> &'a Finding {
        f.iter().find(|x| x.check == check).unwrap()
    }

    #[test]
    fn result_files_in_a_missing_folder_or_on_a_folder_are_refused() {
        let dir = std::env::temp_dir().join(format!("agent-sim-outputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = cfg(10, vec![], vec![]);
        c.summary = Some(dir.join("run.json"));
        c.hlog = Some(dir.join("run.hlog"));
        c.report_html = Some(dir.join("run.html"));
        assert!(outputs(&c).is_ok());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "nothing left behind"
        );
        c.report_html = Some(dir.join("missing/run.html"));
        let e = outputs(&c).unwrap_err().0;
        assert!(
            e.starts_with("--report-html ") && e.contains("missing/run.html"),
            "{e}"
        );
        c.report_html = None;
        c.summary = Some(dir.clone());
        let e = outputs(&c).unwrap_err().0;
        assert!(e.starts_with("--summary ") && e.contains("folder"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn in_process_target_counts_twice() {
        let e = check(&cfg(10_000, vec![], vec![]), &box_host())
            .unwrap_err()
            .0;
        assert!(e.contains("hard limit"), "{e}");
        assert!(e.contains("agent-sim serve"), "{e}");
        let p = check(&cfg(9_000, vec![], vec![]), &box_host()).unwrap();
        assert_eq!(p.fds_needed, 18_064);
    }

    #[test]
    fn remote_target_fits_19000_but_not_20000() {
        let t = vec!["10.1.2.3:8081".to_string()];
        assert!(check(&cfg(19_000, t.clone(), vec![]), &box_host()).is_ok());
        assert!(check(&cfg(20_000, t, vec![]), &box_host()).is_err());
    }

    #[test]
    fn ports_per_source_address_are_checked() {
        let big = Host {
            nofile: (1024, 1_000_000),
            ..host()
        };
        let t = vec!["10.1.2.3:8081".to_string()];
        let e = check(&cfg(40_000, t.clone(), vec![]), &big).unwrap_err().0;
        assert!(e.contains("--source-addr"), "{e}");
        let ok = check(&cfg(40_000, t, vec!["127.0.0.2-127.0.0.3".into()]), &big).unwrap();
        assert_eq!(ok.max_per_source_and_destination, 20_000);
    }

    #[test]
    fn a_run_that_fits_is_all_ok() {
        let f = assess(&cfg(2_000, vec!["10.1.2.3:8081".into()], vec![]), &host());
        assert_eq!(verdict(&f), Verdict::Ok, "{f:#?}");
        // Needs 2,064 fds over a soft limit of 1,024: raised by agent-sim.
        assert!(by(&f, "file descriptors").fixes[0].contains("raises the soft limit"));
    }

    #[test]
    fn fds_over_the_hard_limit_say_ulimit_nr_open_and_shards() {
        let h = Host {
            nofile: (1024, 20_000),
            nr_open: Some(30_000),
            ..host()
        };
        let f = assess(
            &cfg(
                40_000,
                vec!["10.1.2.3:8081".into()],
                vec!["10.0.0.1-10.0.0.2".into()],
            ),
            &h,
        );
        let fd = by(&f, "file descriptors");
        assert_eq!(fd.verdict, Verdict::Fail);
        assert!(
            fd.fixes[0].starts_with("sysctl -w fs.nr_open=45056"),
            "{:?}",
            fd.fixes
        );
        assert!(
            fd.fixes[1].starts_with("ulimit -Hn 45056"),
            "{:?}",
            fd.fixes
        );
        // 40,000 agents over 19,936 fds per process: 3 shards.
        assert!(fd.fixes[2].contains("--shard I/3"), "{:?}", fd.fixes);
        assert_eq!(verdict(&f), Verdict::Fail);
    }

    #[test]
    fn ports_name_the_source_addresses_needed() {
        let f = assess(
            &cfg(100_000, vec!["127.0.0.1:8081".into()], vec![]),
            &host(),
        );
        let p = by(&f, "ephemeral ports");
        assert_eq!(p.verdict, Verdict::Fail);
        // 27,976 usable ports: 4 addresses for 100,000 sessions.
        assert!(
            p.fixes[0].contains("--source-addr 127.0.0.2-127.0.0.5"),
            "{:?}",
            p.fixes
        );
        // 100,000 do not fit even the widest range.
        assert!(!p.fixes.iter().any(|x| x.contains("ip_local_port_range")));
        let f = assess(&cfg(40_000, vec!["127.0.0.1:8081".into()], vec![]), &host());
        assert!(by(&f, "ephemeral ports").fixes[1].contains("ip_local_port_range=\"1024 65535\""));
    }

    /// A host holding `n` connections from `from` to `to`.
    fn holding(n: u16, from: &str, to: &str) -> Host {
        let to: SocketAddr = to.parse().unwrap();
        let from: IpAddr = from.parse().unwrap();
        Host {
            nofile: (1024, 1_000_000),
            tcp: (0..n)
                .map(|i| (SocketAddr::new(from, 32768 + i), to))
                .collect(),
            ..host()
        }
    }

    #[test]
    fn connections_already_held_toward_the_target_leave_fewer_ports() {
        let h = holding(25_000, "10.0.0.5", "10.1.2.3:8081");
        let t = vec!["10.1.2.3:8081".to_string()];
        // 27,976 usable less 25,000 held: 2,976 left.
        assert!(check(&cfg(2_900, t.clone(), vec![]), &h).is_ok());
        let e = check(&cfg(5_000, t.clone(), vec![]), &h).unwrap_err().0;
        assert!(
            e.contains("need more than the 2976 ephemeral ports left")
                && e.contains(
                    "25000 of them already held by this host's connections to 10.1.2.3:8081"
                )
                && e.contains("--source-addr"),
            "{e}"
        );
        // Held from another source address: ours are free.
        let ok = check(&cfg(5_000, t.clone(), vec!["10.0.0.6".into()]), &h);
        assert!(ok.is_ok(), "{ok:?}");
        // Elsewhere: nothing held.
        assert!(check(&cfg(5_000, vec!["10.1.2.4:8081".into()], vec![]), &h).is_ok());
        let f = assess(&cfg(5_000, t, vec![]), &h);
        let p = by(&f, "ephemeral ports");
        assert_eq!(p.verdict, Verdict::Fail);
        assert!(p.have.contains("25,000 of them held"), "{}", p.have);
    }

    #[test]
    fn a_loopback_fleet_spreads_over_127_addresses_by_itself() {
        let h = Host {
            nofile: (1024, 1_000_000),
            ..host()
        };
        let mut c = cfg(40_000, vec!["127.0.0.1:8081".into()], vec![]);
        assert!(check(&c, &h).is_err());
        let notes = spread_loopback(&mut c, &h);
        assert_eq!(c.fleets[0].fleet.source_addrs.len(), 2, "{notes:?}");
        assert!(notes[0].contains("127.0.0.1-127.0.0.2"), "{notes:?}");
        assert_eq!(
            check(&c, &h).unwrap().max_per_source_and_destination,
            20_000
        );
        // Connections already held toward the target count too.
        let mut c = cfg(20_000, vec!["127.0.0.1:8081".into()], vec![]);
        let busy = holding(20_000, "127.0.0.1", "127.0.0.1:8081");
        assert_eq!(spread_loopback(&mut c, &busy).len(), 1);
        assert_eq!(c.fleets[0].fleet.source_addrs.len(), 3);
        // A remote target is never spread; given addresses are kept.
        let mut c = cfg(40_000, vec!["10.1.2.3:8081".into()], vec![]);
        assert!(spread_loopback(&mut c, &h).is_empty());
        let mut c = cfg(
            40_000,
            vec!["127.0.0.1:8081".into()],
            vec!["127.0.0.9".into()],
        );
        assert!(spread_loopback(&mut c, &h).is_empty());
    }

    #[test]
    fn shards_on_one_host_dial_from_addresses_of_their_own() {
        let h = Host {
            nofile: (1024, 1_000_000),
            ..host()
        };
        let sharded = |agents: u64, shard: &str| {
            let a = RunArgs {
                agents: Some(agents),
                targets: vec!["127.0.0.1:8081".into()],
                shard: Some(shard.parse().unwrap()),
                ..Default::default()
            };
            resolve(a, &|_| None).unwrap()
        };
        // 30,000 agents as 3 shards: 10,000 each fit one address, but the
        // three together would not (28,000 ports toward the target).
        let mut from = Vec::new();
        for i in 0..3 {
            let mut c = sharded(30_000, &format!("{i}/3"));
            let notes = spread_loopback(&mut c, &h);
            assert_eq!(notes.len(), 1, "{notes:?}");
            assert!(notes[0].starts_with(&format!("shard {i}/3 ")), "{notes:?}");
            from.extend(c.fleets[0].fleet.source_addrs.clone());
        }
        let want: Vec<IpAddr> = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(from, want);
        // A shard that needs two addresses takes the next two after the
        // shards before it.
        let mut c = sharded(120_000, "1/3");
        let notes = spread_loopback(&mut c, &h);
        assert!(notes[0].contains("127.0.0.3-127.0.0.4"), "{notes:?}");
        // Addresses given by hand are kept.
        let mut c = sharded(30_000, "1/3");
        c.fleets[0].fleet.source_addrs = vec!["127.0.0.9".parse().unwrap()];
        assert!(spread_loopback(&mut c, &h).is_empty());
    }

    #[test]
    fn conntrack_and_somaxconn_are_checked_where_readable() {
        let h = Host {
            conntrack: Some((60_000, 65_536)),
            somaxconn: Some(128),
            ..host()
        };
        // In-process target: its backlog is ours.
        let f = assess(&cfg(8_000, vec![], vec![]), &h);
        let c = by(&f, "conntrack");
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(
            c.fixes[0].starts_with("sysctl -w net.netfilter.nf_conntrack_max=86016 "),
            "{:?}",
            c.fixes
        );
        let s = by(&f, "net.core.somaxconn");
        assert_eq!(s.verdict, Verdict::Warn);
        assert!(s.fixes[0].starts_with("sysctl -w net.core.somaxconn=4096"));
        let unreadable = Host {
            conntrack: None,
            somaxconn: None,
            ..host()
        };
        let f = assess(&cfg(8_000, vec![], vec![]), &unreadable);
        assert_eq!(by(&f, "conntrack").verdict, Verdict::Ok);
        assert_eq!(by(&f, "net.core.somaxconn").verdict, Verdict::Warn);
    }

    #[test]
    fn memory_uses_the_measured_figures_and_names_shards() {
        let consul = |agents: u64| {
            let a = RunArgs {
                agents: Some(agents),
                kind: Some(crate::values::Kind::Consul),
                targets: vec!["10.1.2.3:8300".into()],
                ..Default::default()
            };
            resolve(a, &|_| None).unwrap()
        };
        let n = needs(&consul(10_000));
        // web,api + the probe's own subscription: 36.5 + 4 KiB.
        assert!(
            n.memory_terms[1].contains("Consul (3 subscriptions)"),
            "{:?}",
            n.memory_terms
        );
        assert_eq!(
            n.memory,
            BASE_BYTES + 10_000 * (CONSUL_AGENT_BYTES + CONSUL_STREAM_BYTES)
        );
        let small = Host {
            mem_available: Some(1 << 30),
            ..host()
        };
        let f = assess(&consul(100_000), &small);
        let m = by(&f, "memory");
        assert_eq!(m.verdict, Verdict::Fail);
        // ≈4 GiB over 0.8 GiB usable per box: 5 shards.
        assert!(
            m.fixes[0].starts_with("--shard I/5 over 5 boxes"),
            "{:?}",
            m.fixes
        );
    }

    #[test]
    fn a_fake_proc_tree_is_read() {
        let dir = agent_sim_testkit::fake_proc::FakeProc {
            nofile: (1024, 4096),
            nr_open: 1_048_576,
            ports: (20000, 30000),
            somaxconn: 512,
            conntrack: (12, 65_536),
            mem_kib: (2_048_000, 1_024_000),
            tcp: vec![
                (
                    "127.0.0.2:40001".parse().unwrap(),
                    "127.0.0.1:8081".parse().unwrap(),
                ),
                (
                    "[::1]:40002".parse().unwrap(),
                    "[::1]:8081".parse().unwrap(),
                ),
            ],
        }
        .write("preflight");
        let h = Host::read(&dir);
        assert_eq!(
            h,
            Host {
                nofile: (1024, 4096),
                nr_open: Some(1_048_576),
                ports: (20000, 30000),
                somaxconn: Some(512),
                conntrack: Some((12, 65_536)),
                mem_available: Some(1_024_000 * 1024),
                tcp: vec![
                    (
                        "127.0.0.2:40001".parse().unwrap(),
                        "127.0.0.1:8081".parse().unwrap()
                    ),
                    (
                        "[::1]:40002".parse().unwrap(),
                        "[::1]:8081".parse().unwrap()
                    ),
                ],
            }
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            parse_nofile("Max open files  unlimited  unlimited  files"),
            Some((u64::MAX, u64::MAX))
        );
        assert_eq!(count(1_234_567), "1,234,567");
    }
}
