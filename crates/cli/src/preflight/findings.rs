//! Every check of a run against a host with its verdict and the exact
//! fix, best first: file descriptors, ephemeral ports per source address,
//! the listen backlog, conntrack and memory (`agent-sim doctor` prints them
//! all; the run's gate refuses on the first two).

use std::fmt;
use std::net::SocketAddr;

use super::host::{Host, PORT_RESERVE};
use super::needs::{FD_OVERHEAD, Needs, bytes, count, needs, target_addr};
use crate::plan::RunConfig;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Fits.
    Ok,
    /// Fits, close to a limit or not checkable here.
    Warn,
    /// Does not fit.
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        })
    }
}

/// One check of [`assess`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What was checked, e.g. `file descriptors`.
    pub check: &'static str,
    /// What the run needs, in words.
    pub need: String,
    /// What the host has, in words.
    pub have: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Exact changes that make it fit (commands, flags), best first; or a
    /// note for an `ok` that needs no change.
    pub fixes: Vec<String>,
}

/// Every check of `cfg` against `host`.
pub fn assess(cfg: &RunConfig, host: &Host) -> Vec<Finding> {
    let n = needs(cfg);
    vec![
        fds(&n, host),
        ports(&n, host),
        backlog(&n, host),
        conntrack(&n, host),
        memory(&n, host),
    ]
}

/// The worst verdict of `findings`.
pub fn verdict(findings: &[Finding]) -> Verdict {
    findings
        .iter()
        .map(|f| f.verdict)
        .max()
        .unwrap_or(Verdict::Ok)
}

/// Shards (processes, on as many boxes) needed so that each holds `need`
/// / shards within `have` per process, for a run already split `current`
/// ways.
fn shards_for(need: u64, have: u64, current: u64) -> u64 {
    if have == 0 {
        return current.max(1) * 2;
    }
    (need.div_ceil(have) * current.max(1)).max(2)
}

fn fds(n: &Needs, host: &Host) -> Finding {
    let (soft, hard) = host.nofile;
    let have = format!("soft {} / hard {}", count(soft), count(hard));
    let need = format!(
        "{} ({} agents{})",
        count(n.fds),
        count(n.agents),
        if n.embedded {
            ", both ends in-process"
        } else {
            ""
        }
    );
    if n.fds <= soft {
        return finding("file descriptors", need, have, Verdict::Ok, vec![]);
    }
    if n.fds <= hard {
        return finding(
            "file descriptors",
            need,
            have,
            Verdict::Ok,
            vec![format!(
                "agent-sim raises the soft limit to the hard one itself (ulimit -n {hard})"
            )],
        );
    }
    let mut fixes = Vec::new();
    let target = round_up(n.fds + n.fds / 10, 1024);
    if host.nr_open.is_some_and(|m| target > m) {
        fixes.push(format!(
            "sysctl -w fs.nr_open={target}   (the hard limit cannot exceed fs.nr_open = {})",
            count(host.nr_open.unwrap_or(0))
        ));
    }
    fixes.push(format!(
        "ulimit -Hn {target} && ulimit -n {target}   (as root; for a service: LimitNOFILE={target}, \
         or `* hard nofile {target}` in /etc/security/limits.conf)"
    ));
    let per_process = hard.saturating_sub(FD_OVERHEAD);
    // Every connection the agents hold (two per client agent), and the
    // in-process target's ends.
    let k = shards_for(n.fds.saturating_sub(FD_OVERHEAD), per_process, n.shards);
    fixes.push(format!(
        "or split the run: --shard I/{k} (I = 0..{}), one process per shard, each ≈{} agents",
        k - 1,
        count((n.agents * n.shards).div_ceil(k))
    ));
    if n.embedded {
        fixes.push(
            "or run the target in another process (agent-sim serve) and pass --target: \
             the in-process target doubles the fds"
                .into(),
        );
    }
    finding("file descriptors", need, have, Verdict::Fail, fixes)
}

/// Ports already held from this host toward the worst pair's destination:
/// by the busiest of its source addresses, or from any address when the OS
/// chooses (other shards, other tools, an earlier run's TIME_WAIT).
pub(super) fn held(n: &Needs, host: &Host) -> (u64, Option<SocketAddr>) {
    let Some(dest) = n.worst_target.as_deref().and_then(target_addr) else {
        return (0, None);
    };
    let held = if n.worst_sources.is_empty() {
        host.held(dest, None)
    } else {
        n.worst_sources
            .iter()
            .map(|s| host.held(dest, Some(*s)))
            .max()
            .unwrap_or(0)
    };
    (held, Some(dest))
}

fn ports(n: &Needs, host: &Host) -> Finding {
    let (lo, hi) = host.ports;
    let (range, budget) = host.port_budget();
    let (held, dest) = held(n, host);
    let usable = budget.saturating_sub(held);
    let need = format!(
        "{} sessions per source address per target",
        count(n.worst_pair)
    );
    let have = match dest {
        Some(d) if held > 0 => format!(
            "{} ephemeral ports ({lo}-{hi}), {} of them held by this host's connections to {d}",
            count(range),
            count(held)
        ),
        _ => format!("{} ephemeral ports ({lo}-{hi})", count(range)),
    };
    if n.worst_pair <= usable {
        let v = if n.worst_pair * 10 > usable * 9 {
            Verdict::Warn
        } else {
            Verdict::Ok
        };
        return finding("ephemeral ports", need, have, v, vec![]);
    }
    finding(
        "ephemeral ports",
        need,
        have,
        Verdict::Fail,
        port_fixes(n, usable),
    )
}

/// What makes the worst pair fit in `usable` ports.
pub(super) fn port_fixes(n: &Needs, usable: u64) -> Vec<String> {
    let mut fixes = Vec::new();
    let addrs = n.worst_destination.div_ceil(usable.max(1));
    fixes.push(if n.loopback {
        format!(
            "--source-addr 127.0.0.2-127.0.0.{} ({addrs} loopback source addresses)",
            1 + addrs.min(254)
        )
    } else {
        format!(
            "--source-addr with {addrs} addresses of this box (configure them on its NIC first), \
             e.g. --source-addr 10.0.0.10-10.0.0.{}",
            9 + addrs.min(245)
        )
    });
    let widest = 65535 - 1024 + 1 - PORT_RESERVE;
    if n.worst_pair <= widest {
        fixes.push("or sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\"".into());
    }
    fixes.push(format!(
        "or spread agents over more targets (--target a,b,…: {} sessions per target now)",
        count(n.worst_destination)
    ));
    fixes
}

fn backlog(n: &Needs, host: &Host) -> Finding {
    let need = format!(
        "listen backlog ≥ {} (handshakes in flight, --max-dialing)",
        count(n.max_dialing)
    );
    let Some(cap) = host.somaxconn else {
        return finding(
            "net.core.somaxconn",
            need,
            "not readable".into(),
            Verdict::Warn,
            vec![],
        );
    };
    let have = count(cap);
    if !n.embedded {
        return finding(
            "net.core.somaxconn",
            need,
            have,
            Verdict::Ok,
            vec!["the target's listener is on the target host: check somaxconn there".into()],
        );
    }
    if cap >= n.max_dialing {
        return finding("net.core.somaxconn", need, have, Verdict::Ok, vec![]);
    }
    let want = n.max_dialing.next_power_of_two().max(4096);
    finding(
        "net.core.somaxconn",
        need,
        have,
        Verdict::Warn,
        vec![format!(
            "sysctl -w net.core.somaxconn={want}   (or a lower --max-dialing): the in-process \
             target's accept queue overflows and handshakes are retried"
        )],
    )
}

fn conntrack(n: &Needs, host: &Host) -> Finding {
    let need = format!(
        "{} connections ({} entries with those already tracked)",
        count(n.connections),
        count(n.connections + host.conntrack.map_or(0, |c| c.0))
    );
    let Some((now, max)) = host.conntrack else {
        return finding(
            "conntrack",
            need,
            "not loaded (no nf_conntrack)".into(),
            Verdict::Ok,
            vec![],
        );
    };
    let have = format!("max {} ({} in use)", count(max), count(now));
    let total = now + n.connections;
    if total * 10 <= max * 8 {
        return finding("conntrack", need, have, Verdict::Ok, vec![]);
    }
    let want = round_up(total + total / 4, 1024);
    let fix = vec![format!(
        "sysctl -w net.netfilter.nf_conntrack_max={want}   (a full table drops new connections: \
         connect timeouts)"
    )];
    let v = if total > max {
        Verdict::Fail
    } else {
        Verdict::Warn
    };
    finding("conntrack", need, have, v, fix)
}

fn memory(n: &Needs, host: &Host) -> Finding {
    let need = format!("≈{} ({})", bytes(n.memory), n.memory_terms.join(" + "));
    let Some(avail) = host.mem_available else {
        return finding(
            "memory",
            need,
            "MemAvailable not readable".into(),
            Verdict::Warn,
            vec![],
        );
    };
    let have = format!("{} available", bytes(avail));
    if n.memory * 10 <= avail * 8 {
        return finding("memory", need, have, Verdict::Ok, vec![]);
    }
    let k = shards_for(n.memory, avail * 8 / 10, n.shards);
    let mut fixes = vec![format!(
        "--shard I/{k} over {k} boxes (I = 0..{}), each ≈{} agents",
        k - 1,
        count((n.agents * n.shards).div_ceil(k))
    )];
    if n.embedded {
        fixes.push(
            "or run the target elsewhere (agent-sim serve on another box) and pass --target".into(),
        );
    }
    let v = if n.memory > avail {
        Verdict::Fail
    } else {
        Verdict::Warn
    };
    finding("memory", need, have, v, fixes)
}

fn finding(
    check: &'static str,
    need: String,
    have: String,
    verdict: Verdict,
    fixes: Vec<String>,
) -> Finding {
    Finding {
        check,
        need,
        have,
        verdict,
        fixes,
    }
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}
