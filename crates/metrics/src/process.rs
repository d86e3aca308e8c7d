//! Resource use of the current process: peak RSS (VmHWM) and CPU time, read
//! from `/proc/self` (Linux), and of any process by pid ([`read_pid`], what
//! `--observe-pid` reads). Other platforms report zeroes.

use crate::summary::ProcessStats;

/// Current resource use of this process.
pub fn stats() -> ProcessStats {
    let peak_rss_bytes = read_status_kib("VmHWM:").unwrap_or(0) * 1024;
    let (cpu_user_s, cpu_sys_s) = cpu_times().unwrap_or((0.0, 0.0));
    ProcessStats {
        peak_rss_bytes,
        cpu_user_s,
        cpu_sys_s,
    }
}

/// Current resident set size in bytes (VmRSS).
pub fn rss_bytes() -> u64 {
    read_status_kib("VmRSS:").unwrap_or(0) * 1024
}

fn read_status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// (user, system) CPU seconds of this process.
pub fn cpu_times() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after `state`.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let hz = clock_ticks_per_second();
    Some((utime / hz, stime / hz))
}

/// What `/proc/PID` says of a process at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcReading {
    /// CPU seconds (user + system) since it started.
    pub cpu_s: f64,
    /// Resident set size (VmRSS).
    pub rss_bytes: u64,
    /// OS threads.
    pub threads: u64,
    /// Open file descriptors (entries of `fd/`; `None` without permission).
    pub open_fds: Option<u64>,
}

/// Reads process `pid` (a number, or `self`) under `proc_root` (`/proc`);
/// `None` when it does not exist (or is not readable).
pub fn read_pid(proc_root: &std::path::Path, pid: &str) -> Option<ProcReading> {
    let dir = proc_root.join(pid);
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After `state` (field 3): utime 14, stime 15, num_threads 20.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let threads: u64 = fields.get(17)?.parse().ok()?;
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let rss_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let open_fds = std::fs::read_dir(dir.join("fd"))
        .ok()
        .map(|d| d.count() as u64);
    Some(ProcReading {
        cpu_s: (utime + stime) / clock_ticks_per_second(),
        rss_bytes: rss_kib * 1024,
        threads,
        open_fds,
    })
}

#[allow(unsafe_code)]
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions and only reads a constant.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 { v as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn reads_nonzero_rss_and_some_cpu() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        let s = super::stats();
        assert!(s.peak_rss_bytes > 1024 * 1024);
        assert!(super::rss_bytes() > 0);
        let r = super::read_pid(std::path::Path::new("/proc"), "self").unwrap();
        assert!(
            r.rss_bytes > 0 && r.threads >= 1 && r.open_fds.unwrap() >= 3,
            "{r:?}"
        );
        let mine = super::read_pid(
            std::path::Path::new("/proc"),
            &std::process::id().to_string(),
        )
        .unwrap();
        assert!(mine.cpu_s >= 0.0 && mine.threads >= 1);
        assert!(super::read_pid(std::path::Path::new("/proc"), "no-such-pid").is_none());
        assert!(s.cpu_user_s + s.cpu_sys_s >= 0.0);
    }
}
