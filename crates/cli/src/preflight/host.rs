//! What a host offers, read from a `/proc` tree (a fake one in tests):
//! `RLIMIT_NOFILE` soft/hard, `fs.nr_open`, the ephemeral port range,
//! `net.core.somaxconn`, conntrack count/max, `MemAvailable`, and the TCP
//! connections that already hold ports toward a target.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

/// Ephemeral ports left for the host's other connections.
pub(crate) const PORT_RESERVE: u64 = 256;

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
    pub(super) fn port_budget(&self) -> (u64, u64) {
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
pub(super) fn parse_nofile(limits: &str) -> Option<(u64, u64)> {
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
