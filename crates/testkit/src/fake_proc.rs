//! A fake `/proc` tree for tests of what agent-sim reads of the host (the
//! preflight, `agent-sim doctor --proc-root`): written by the test into a
//! temp directory, so no root is needed and nothing of the real host is read.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

/// The limits a fake `/proc` states; [`FakeProc::write`] lays them out as
/// the kernel does (`self/limits`, `sys/...`, `meminfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeProc {
    /// Soft and hard `RLIMIT_NOFILE` ("Max open files" of `self/limits`).
    pub nofile: (u64, u64),
    /// `sys/fs/nr_open`.
    pub nr_open: u64,
    /// `sys/net/ipv4/ip_local_port_range`.
    pub ports: (u16, u16),
    /// `sys/net/core/somaxconn`.
    pub somaxconn: u32,
    /// `nf_conntrack_count` and `nf_conntrack_max` of `sys/net/netfilter`.
    pub conntrack: (u64, u64),
    /// `MemTotal` and `MemAvailable` of `meminfo`, in KiB.
    pub mem_kib: (u64, u64),
    /// Connections of `net/tcp` (IPv4) and `net/tcp6` (IPv6): local and
    /// remote address, all ESTABLISHED.
    pub tcp: Vec<(SocketAddr, SocketAddr)>,
}

/// An address as `/proc/net/tcp*` prints it: each 32-bit word of the
/// network-order bytes in host (little-endian) order, then the port.
fn proc_addr(a: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match a.ip() {
        IpAddr::V4(v) => vec![v.octets()],
        IpAddr::V6(v) => v
            .octets()
            .chunks(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect(),
    };
    let hex: String = words
        .iter()
        .map(|w| format!("{:08X}", u32::from_le_bytes(*w)))
        .collect();
    format!("{hex}:{:04X}", a.port())
}

impl FakeProc {
    /// Writes the tree into a fresh directory named after `tag` and this
    /// process (the caller removes it), and returns its path.
    pub fn write(&self, tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("agent-sim-proc-{tag}-{}", std::process::id()));
        self.write_into(&dir);
        dir
    }

    /// Writes the tree under `dir`.
    pub fn write_into(&self, dir: &Path) {
        for d in [
            "self",
            "sys/fs",
            "sys/net/ipv4",
            "sys/net/core",
            "sys/net/netfilter",
            "net",
        ] {
            std::fs::create_dir_all(dir.join(d)).expect("fake /proc directory");
        }
        let w = |p: &str, s: String| std::fs::write(dir.join(p), s).expect("fake /proc file");
        w(
            "self/limits",
            format!(
                "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max open files            {:<20} {:<20} files     \n",
                self.nofile.0, self.nofile.1
            ),
        );
        w("sys/fs/nr_open", format!("{}\n", self.nr_open));
        w(
            "sys/net/ipv4/ip_local_port_range",
            format!("{}\t{}\n", self.ports.0, self.ports.1),
        );
        w("sys/net/core/somaxconn", format!("{}\n", self.somaxconn));
        w(
            "sys/net/netfilter/nf_conntrack_count",
            format!("{}\n", self.conntrack.0),
        );
        w(
            "sys/net/netfilter/nf_conntrack_max",
            format!("{}\n", self.conntrack.1),
        );
        for (file, v6) in [("net/tcp", false), ("net/tcp6", true)] {
            let mut s = String::from(
                "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n",
            );
            for (n, (l, r)) in self
                .tcp
                .iter()
                .filter(|(l, _)| l.is_ipv6() == v6)
                .enumerate()
            {
                s.push_str(&format!(
                    "{n:>4}: {} {} 01 00000000:00000000 00:00000000 00000000     0        0 {} 1\n",
                    proc_addr(*l),
                    proc_addr(*r),
                    1000 + n
                ));
            }
            w(file, s);
        }
        w(
            "meminfo",
            format!(
                "MemTotal:       {} kB\nMemAvailable:    {} kB\n",
                self.mem_kib.0, self.mem_kib.1
            ),
        );
    }
}
