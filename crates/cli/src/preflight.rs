//! Checks the host can hold the run before any socket is opened: file
//! descriptors against `RLIMIT_NOFILE` (the soft limit is raised to the hard
//! one) and sessions per source address against the ephemeral port range.
//! A run that cannot fit is refused with an actionable message instead of
//! failing halfway through the ramp.

use crate::config::{Protocol, RunConfig, UsageError};

/// File descriptors the process keeps for itself (runtime, listeners, files).
const FD_OVERHEAD: u64 = 64;
/// Connections the Consul HTTP pool may open.
const CONSUL_HTTP_POOL: u64 = 64;

/// What the checks found.
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

/// Host limits, injectable for tests.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Soft RLIMIT_NOFILE.
    pub soft: u64,
    /// Hard RLIMIT_NOFILE.
    pub hard: u64,
    /// Ephemeral port range (inclusive).
    pub ports: (u64, u64),
}

impl Limits {
    /// Reads this host's limits.
    pub fn of_this_host() -> Limits {
        let (soft, hard) = nofile().unwrap_or((1024, 1024));
        Limits {
            soft,
            hard,
            ports: ephemeral_range().unwrap_or((32768, 60999)),
        }
    }
}

/// Runs the checks (pure: see [`apply`] for raising the limit).
pub fn check(cfg: &RunConfig, limits: Limits) -> Result<Preflight, UsageError> {
    let mut fds = FD_OVERHEAD;
    let mut worst_pair = 0u64;
    for plan in &cfg.fleets {
        let agents = plan.fleet.agents;
        let (per_agent, targets, extra) = match &plan.protocol {
            Protocol::Sensu(s) => (1, s.targets.len().max(1) as u64, 0),
            Protocol::Consul(c) => (1, c.rpc_targets.len().max(1) as u64, CONSUL_HTTP_POOL),
            Protocol::Dataplane(c) => (1, c.targets.len().max(1) as u64, CONSUL_HTTP_POOL),
        };
        let client = agents * per_agent + extra;
        // The in-process target holds the other end of every connection.
        fds += if plan.embedded { client * 2 } else { client };
        let per_target = agents.div_ceil(targets);
        let sources = plan.fleet.source_addrs.len().max(1) as u64;
        worst_pair = worst_pair.max(per_target.div_ceil(sources));
    }
    if fds > limits.hard {
        let embedded = if cfg.embedded() {
            " (the in-process target doubles it: run `agent-sim serve` in another process and pass --target)"
        } else {
            ""
        };
        return Err(UsageError(format!(
            "this run needs about {fds} file descriptors{embedded} but the hard limit (ulimit -Hn) is {}: \
             run fewer agents per process (split with --shard I/N over several processes) or raise the hard limit",
            limits.hard
        )));
    }
    let ports = limits.ports.1.saturating_sub(limits.ports.0) + 1;
    // Leave a little room for other connections of the host.
    if worst_pair > ports.saturating_sub(256) {
        return Err(UsageError(format!(
            "{worst_pair} sessions from one source address to one target exceed the {ports} ephemeral ports \
             ({}-{}): add source addresses (--source-addr 127.0.0.2-127.0.0.9; real NICs need aliases), \
             more targets, or shards",
            limits.ports.0, limits.ports.1
        )));
    }
    Ok(Preflight {
        fds_needed: fds,
        fd_limit: limits.soft,
        max_per_source_and_destination: worst_pair,
        ephemeral_ports: ports,
    })
}

/// Raises the soft fd limit to the hard one when the run needs more than the
/// soft limit; returns the limit in force.
pub fn apply(p: &Preflight, limits: Limits) -> Result<u64, UsageError> {
    if p.fds_needed <= limits.soft {
        return Ok(limits.soft);
    }
    raise_nofile(limits.hard).map_err(|e| {
        UsageError(format!(
            "this run needs about {} file descriptors; raising the soft limit from {} to {} failed: {e}",
            p.fds_needed, limits.soft, limits.hard
        ))
    })
}

fn ephemeral_range() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>());
    Some((it.next()?.ok()?, it.next()?.ok()?))
}

fn nofile() -> Option<(u64, u64)> {
    rlimit::getrlimit(rlimit::Resource::NOFILE).ok()
}

/// Raises the soft RLIMIT_NOFILE to `hard`; returns the new soft limit.
pub fn raise_nofile(hard: u64) -> std::io::Result<u64> {
    rlimit::setrlimit(rlimit::Resource::NOFILE, hard, hard)?;
    Ok(hard)
}

#[cfg(test)]
mod tests {
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

    const HOST: Limits = Limits {
        soft: 1024,
        hard: 20_000,
        ports: (32768, 60999),
    };

    #[test]
    fn in_process_target_counts_twice() {
        let e = check(&cfg(10_000, vec![], vec![]), HOST).unwrap_err().0;
        assert!(e.contains("hard limit"), "{e}");
        assert!(e.contains("agent-sim serve"), "{e}");
        let p = check(&cfg(9_000, vec![], vec![]), HOST).unwrap();
        assert_eq!(p.fds_needed, 18_064);
    }

    #[test]
    fn remote_target_fits_19000_but_not_20000() {
        let t = vec!["10.1.2.3:8081".to_string()];
        assert!(check(&cfg(19_000, t.clone(), vec![]), HOST).is_ok());
        assert!(check(&cfg(20_000, t, vec![]), HOST).is_err());
    }

    #[test]
    fn ports_per_source_address_are_checked() {
        let big = Limits {
            hard: 1_000_000,
            ..HOST
        };
        let t = vec!["10.1.2.3:8081".to_string()];
        let e = check(&cfg(40_000, t.clone(), vec![]), big).unwrap_err().0;
        assert!(e.contains("--source-addr"), "{e}");
        let ok = check(&cfg(40_000, t, vec!["127.0.0.2-127.0.0.3".into()]), big).unwrap();
        assert_eq!(ok.max_per_source_and_destination, 20_000);
    }
}
