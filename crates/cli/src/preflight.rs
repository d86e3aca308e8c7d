//! Checks the host can hold the run before any socket is opened, and says
//! what to change when it cannot.
//!
//! - [`needs`]: what a validated [`RunConfig`] asks of the host: file
//!   descriptors, sessions per source address and destination, TCP
//!   connections (conntrack entries), memory from the measured per-agent
//!   figures, handshakes in flight (listen backlog of an in-process target).
//! - [`Host`]: what the host offers, read from a `/proc` tree (a fake one in
//!   tests): `RLIMIT_NOFILE` soft/hard, `fs.nr_open`, the ephemeral port
//!   range, `net.core.somaxconn`, conntrack count/max, `MemAvailable`.
//! - [`assess`]: every check with its verdict and the exact fix
//!   (`agent-sim doctor` prints them all); [`check`]: the same rules as a
//!   run's gate (fds and ports refuse the run, exit 64), and [`apply`]
//!   raises the soft fd limit to the hard one when the run needs it.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;

use crate::plan::{Protocol, RunConfig, UsageError};

/// File descriptors the process keeps for itself (runtime, listeners, files).
const FD_OVERHEAD: u64 = 64;
/// Ephemeral ports left for the host's other connections.
pub(crate) const PORT_RESERVE: u64 = 256;

/// Client memory per Sensu session, all-in (README, BENCHMARKS: 4.54–4.56
/// KiB measured at 19,000 sessions; rounded up).
pub const SENSU_AGENT_BYTES: u64 = 4_710; // 4.6 KiB
/// Client memory per Consul agent with two subscriptions and a TTL session
/// (BENCHMARKS: 35–36.8 KiB, the last from 40.76 KiB with three; the upper
/// figure).
pub const CONSUL_AGENT_BYTES: u64 = 37_684; // 36.8 KiB
/// Each subscription beyond two adds about this much (40 KiB with three).
pub const CONSUL_STREAM_BYTES: u64 = 4 * 1024;
/// Client memory per dataplane sidecar with a WatchServers stream and three
/// EDS clusters (BENCHMARKS: 47.3–47.4 KiB at 5,000 in a release build; the
/// upper figure).
pub const DATAPLANE_AGENT_BYTES: u64 = 48_538; // 47.4 KiB
/// Server side of the in-process gRPC port, per sidecar (a tonic server
/// connection with two streams, as for Consul).
pub const DATAPLANE_SERVER_BYTES: u64 = 32 * 1024;
/// Server side of the in-process Sensu endpoint, per session
/// (PERFORMANCE-NOTES: tuned WebSocket server ≈7 KiB).
pub const SENSU_SERVER_BYTES: u64 = 7 * 1024;
/// Server side of the in-process Consul target, per agent connection
/// (PERFORMANCE-NOTES: ≈32 KiB per connection with two streams).
pub const CONSUL_SERVER_BYTES: u64 = 32 * 1024;
/// The process itself before any agent (runtime, metrics, histograms).
pub const BASE_BYTES: u64 = 48 << 20;

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

/// What a host offers; `None` where the value could not be read (no
/// conntrack module, a container without `/proc/sys`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// `RLIMIT_NOFILE` (soft, hard).
    pub nofile: (u64, u64),
    /// `fs.nr_open`: the most a hard fd limit can be raised to.
    pub nr_open: Option<u64>,
    /// `net.ipv4.ip_local_port_range` (inclusive).
    pub ports: (u64, u64),
    /// `net.core.somaxconn`: the listen backlog cap.
    pub somaxconn: Option<u64>,
    /// `nf_conntrack_count` and `nf_conntrack_max`.
    pub conntrack: Option<(u64, u64)>,
    /// `MemAvailable` in bytes.
    pub mem_available: Option<u64>,
    /// TCP connections of this host (`net/tcp`, `net/tcp6`; listening
    /// sockets left out), local and remote address: each holds an
    /// ephemeral port of its source address toward its destination.
    pub tcp: Vec<(SocketAddr, SocketAddr)>,
}

impl Host {
    /// Reads a `/proc` tree: `self/limits`, `sys/fs/nr_open`,
    /// `sys/net/ipv4/ip_local_port_range`, `sys/net/core/somaxconn`,
    /// `sys/net/netfilter/nf_conntrack_{count,max}`, `meminfo`. Unreadable
    /// fd limits fall back to `getrlimit`, an unreadable port range to
    /// Linux's default 32768–60999.
    pub fn read(root: &Path) -> Host {
        let text = |rel: &str| std::fs::read_to_string(root.join(rel)).ok();
        let num = |rel: &str| text(rel).and_then(|s| s.trim().parse::<u64>().ok());
        let nofile = text("self/limits")
            .and_then(|s| parse_nofile(&s))
            .or_else(|| rlimit::getrlimit(rlimit::Resource::NOFILE).ok())
            .unwrap_or((1024, 1024));
        let ports = text("sys/net/ipv4/ip_local_port_range")
            .and_then(|s| {
                let mut it = s.split_whitespace().map(|x| x.parse::<u64>());
                Some((it.next()?.ok()?, it.next()?.ok()?))
            })
            .unwrap_or((32768, 60999));
        let conntrack = match (
            num("sys/net/netfilter/nf_conntrack_count"),
            num("sys/net/netfilter/nf_conntrack_max"),
        ) {
            (Some(c), Some(m)) => Some((c, m)),
            (None, Some(m)) => Some((0, m)),
            _ => None,
        };
        let mem_available = text("meminfo").and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
        });
        let tcp = ["net/tcp", "net/tcp6"]
            .iter()
            .filter_map(|f| text(f))
            .flat_map(|s| parse_tcp(&s))
            .collect();
        Host {
            nofile,
            nr_open: num("sys/fs/nr_open"),
            ports,
            somaxconn: num("sys/net/core/somaxconn"),
            conntrack,
            mem_available,
            tcp,
        }
    }

    /// This host, read from `/proc` (or the tree `AGENT_SIM_PROC_ROOT`
    /// names: tests give a fake one).
    pub fn of_this_host() -> Host {
        let root = std::env::var_os("AGENT_SIM_PROC_ROOT").unwrap_or_else(|| "/proc".into());
        Host::read(Path::new(&root))
    }

    /// Ports already held toward `remote`: from `source`, or (`None`) from
    /// whichever local address (the OS chooses one).
    pub fn held(&self, remote: SocketAddr, source: Option<IpAddr>) -> u64 {
        self.tcp
            .iter()
            .filter(|(l, r)| *r == remote && source.is_none_or(|s| l.ip() == s))
            .count() as u64
    }

    /// Usable ephemeral ports of one source address toward a destination,
    /// before what others hold.
    fn port_budget(&self) -> (u64, u64) {
        let (lo, hi) = self.ports;
        let range = hi.saturating_sub(lo) + 1;
        (range, range.saturating_sub(PORT_RESERVE))
    }
}

/// The connections of `/proc/net/tcp` or `tcp6` (listening sockets left
/// out): `sl local rem st ...`, addresses as the kernel prints them.
fn parse_tcp(text: &str) -> Vec<(SocketAddr, SocketAddr)> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut it = l.split_whitespace().skip(1);
            let (local, remote, state) = (it.next()?, it.next()?, it.next()?);
            (state != "0A").then_some(())?;
            Some((proc_addr(local)?, proc_addr(remote)?))
        })
        .collect()
}

/// `0100007F:1F90`: the address as the kernel prints it (each 32-bit
/// word of the network-order bytes in host order, here little-endian;
/// IPv6 is four words) and the port.
fn proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::to_le_bytes);
    let ip: IpAddr = match ip.len() {
        8 => std::net::Ipv4Addr::from(word(ip)?).into(),
        32 => {
            let mut bytes = [0u8; 16];
            for k in 0..4 {
                bytes[k * 4..k * 4 + 4].copy_from_slice(&word(&ip[k * 8..k * 8 + 8])?);
            }
            std::net::Ipv6Addr::from(bytes).into()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// `Max open files  <soft>  <hard>  files` of `/proc/<pid>/limits`
/// (`unlimited` as `u64::MAX`).
fn parse_nofile(limits: &str) -> Option<(u64, u64)> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut it = line["Max open files".len()..].split_whitespace().map(|v| {
        if v == "unlimited" {
            Some(u64::MAX)
        } else {
            v.parse().ok()
        }
    });
    Some((it.next()??, it.next()??))
}

/// What a run asks of the host (this process's share when sharded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// Agents this process runs, over every fleet.
    pub agents: u64,
    /// File descriptors (both ends when the target is in-process).
    pub fds: u64,
    /// Most sessions one source address opens to one destination.
    pub worst_pair: u64,
    /// Sessions to the destination of that pair (before source addresses).
    pub worst_destination: u64,
    /// That destination, when it is not in this process (`host:port`).
    pub worst_target: Option<String>,
    /// The source addresses of that pair's fleet (empty: the OS chooses).
    pub worst_sources: Vec<IpAddr>,
    /// Source addresses in use (0: the OS chooses one).
    pub sources: u64,
    /// Whether the destination of that pair is a loopback address.
    pub loopback: bool,
    /// TCP connections the run holds (conntrack entries).
    pub connections: u64,
    /// Memory estimate in bytes, and how it was made.
    pub memory: u64,
    /// The terms of the memory estimate, in words.
    pub memory_terms: Vec<String>,
    /// Whether a target runs in this process.
    pub embedded: bool,
    /// Handshakes in flight at most (the in-process listener's backlog).
    pub max_dialing: u64,
    /// Shards of the run (1 when not sharded).
    pub shards: u64,
}

/// Connections one Consul fleet's HTTP pool may open.
fn consul_http_pool() -> u64 {
    agent_sim_consul::http::MAX_HTTP_CONNS as u64
}

/// What `cfg` asks of the host.
pub fn needs(cfg: &RunConfig) -> Needs {
    let mut n = Needs {
        agents: 0,
        fds: FD_OVERHEAD,
        worst_pair: 0,
        worst_destination: 0,
        worst_target: None,
        worst_sources: Vec::new(),
        sources: 0,
        loopback: false,
        connections: 0,
        memory: BASE_BYTES,
        memory_terms: vec![format!("{} process", bytes(BASE_BYTES))],
        embedded: cfg.embedded(),
        max_dialing: 0,
        shards: cfg.shard.map_or(1, |s| s.count),
    };
    for plan in &cfg.fleets {
        let agents = plan.fleet.agents;
        let target_names: Vec<&str> = match &plan.protocol {
            Protocol::Sensu(s) => s.targets.iter().map(String::as_str).collect(),
            Protocol::Consul(c) => c.conn.targets.iter().map(String::as_str).collect(),
            Protocol::Dataplane(d) => d.conn.targets.iter().map(String::as_str).collect(),
        };
        let (targets, extra, per_agent, server, what) = match &plan.protocol {
            Protocol::Sensu(s) => (
                s.targets.len().max(1) as u64,
                0,
                SENSU_AGENT_BYTES,
                SENSU_SERVER_BYTES,
                "Sensu".to_string(),
            ),
            Protocol::Consul(c) => {
                let streams = c.upstreams.len() as u64 + u64::from(c.probe.kind.is_some());
                let per = (CONSUL_AGENT_BYTES + CONSUL_STREAM_BYTES * streams)
                    .saturating_sub(2 * CONSUL_STREAM_BYTES);
                (
                    c.conn.targets.len().max(1) as u64,
                    consul_http_pool(),
                    per,
                    CONSUL_SERVER_BYTES,
                    format!("Consul ({streams} subscriptions)"),
                )
            }
            Protocol::Dataplane(d) => (
                d.conn.targets.len().max(1) as u64,
                consul_http_pool(),
                DATAPLANE_AGENT_BYTES,
                DATAPLANE_SERVER_BYTES,
                "dataplane sidecar".to_string(),
            ),
        };
        let client = agents + extra;
        n.agents += agents;
        n.connections += client;
        // The in-process target holds the other end of every connection.
        n.fds += if plan.embedded { client * 2 } else { client };
        let per_target = agents.div_ceil(targets);
        let sources = plan.fleet.source_addrs.len() as u64;
        let pair = per_target.div_ceil(sources.max(1));
        if pair > n.worst_pair {
            n.worst_pair = pair;
            n.worst_destination = per_target;
            n.worst_target = (!plan.embedded)
                .then(|| target_names.first().map(|t| t.to_string()))
                .flatten();
            n.worst_sources = plan.fleet.source_addrs.clone();
            n.sources = sources;
            n.loopback = plan.embedded || target_names.iter().all(|t| is_loopback(t));
        }
        n.memory += agents * per_agent;
        n.memory_terms
            .push(format!("{agents} {what} agents × {}", bytes(per_agent)));
        if plan.embedded {
            n.memory += agents * server;
            n.memory_terms
                .push(format!("in-process target {agents} × {}", bytes(server)));
        }
        n.max_dialing = n.max_dialing.max(plan.fleet.max_dialing as u64);
    }
    n
}

/// Whether a target (`host:port`, `ws://host:port/`) names a loopback host.
pub(crate) fn is_loopback(target: &str) -> bool {
    let rest = target.split("://").last().unwrap_or(target);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

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
    let fd_per_agent = if n.embedded { 2 } else { 1 };
    let k = shards_for(n.agents * fd_per_agent, per_process, n.shards);
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

/// The address of a target (`host:port`, `ws://host:port/`), resolved.
pub(crate) fn target_addr(target: &str) -> Option<SocketAddr> {
    let rest = target.split("://").last().unwrap_or(target);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority.to_socket_addrs().ok()?.next()
}

/// Ports already held from this host toward the worst pair's destination:
/// by the busiest of its source addresses, or from any address when the OS
/// chooses (other shards, other tools, an earlier run's TIME_WAIT).
fn held(n: &Needs, host: &Host) -> (u64, Option<SocketAddr>) {
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
fn port_fixes(n: &Needs, usable: u64) -> Vec<String> {
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

/// 20000 → "20,000".
pub(crate) fn count(v: u64) -> String {
    if v == u64::MAX {
        return "unlimited".into();
    }
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in KiB/MiB/GiB, one decimal.
fn bytes(v: u64) -> String {
    const K: f64 = 1024.0;
    let f = v as f64;
    if f >= K * K * K {
        format!("{:.1} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else {
        format!("{:.1} KiB", f / K)
    }
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

/// For a fleet whose targets are all on this host's loopback (or in this
/// process), with no `--source-addr`: when its sessions to one target need
/// more ports than one source address has left, dial from as many
/// 127.0.0.x addresses as needed (all of 127/8 is local). Returns what was
/// done, in words, for each fleet spread.
pub fn spread_loopback(cfg: &mut RunConfig, host: &Host) -> Vec<String> {
    let mut notes = Vec::new();
    let (_, budget) = host.port_budget();
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
        let per_target = plan.fleet.agents.div_ceil(targets.len().max(1) as u64);
        let held = targets
            .iter()
            .filter_map(|t| target_addr(t))
            .map(|d| host.held(d, None))
            .max()
            .unwrap_or(0);
        let usable = budget.saturating_sub(held).max(1);
        if per_target <= usable {
            continue;
        }
        let k = per_target.div_ceil(usable).min(254);
        plan.fleet.source_addrs = (1..=k)
            .map(|i| IpAddr::from([127, 0, 0, i as u8]))
            .collect();
        notes.push(format!(
            "{} {} sessions per target exceed the {} ports one source address has left: dialing \
             from 127.0.0.1-127.0.0.{k} (loopback)",
            count(per_target),
            plan.protocol.kind(),
            count(usable)
        ));
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
