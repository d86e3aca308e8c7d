//! Numbers and instants as people and files read them: microseconds,
//! bytes and counts by name with a readable unit (the table, the page, assertion verdicts),
//! and wall-clock instants as RFC 3339 or unix microseconds (the summary,
//! hlogs, probes). A leaf: it imports nothing of this crate.

/// How a figure's values read (what [`fmt_us`] and [`fmt_mib`] are for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Microseconds.
    Micros,
    /// Bytes.
    Bytes,
    /// A count or any plain number.
    Number,
}

/// Formats microseconds with a readable unit (`850µs`, `12.3ms`, `4.20s`).
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else {
        format!("{:.2}s", us as f64 / 1e6)
    }
}

/// Formats a byte count as MiB with one decimal.
pub fn fmt_mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Formats a count with thousands separators (`1,000`, `12,345,678`).
pub fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Counts by name as `name count, ...`, most first (ties by name).
pub fn by_count(m: &std::collections::BTreeMap<String, u64>) -> String {
    let mut v: Vec<_> = m.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Microseconds since the unix epoch (0 before it).
pub fn unix_us(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Formats a time as RFC 3339 UTC with milliseconds, e.g.
/// `2026-11-21T23:39:27.123Z` (humantime's formatter).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_readable() {
        assert_eq!(fmt_us(850), "850µs");
        assert_eq!(fmt_us(12_340), "12.3ms");
        assert_eq!(fmt_us(4_200_000), "4.20s");
        assert_eq!(fmt_mib(3 * 1024 * 1024 / 2), "1.5 MiB");
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(1_000), "1,000");
        assert_eq!(fmt_count(12_345_678), "12,345,678");
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_795_300_844_250);
        assert_eq!(rfc3339(t), "2026-11-21T22:40:44.250Z");
        assert_eq!(rfc3339(std::time::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            unix_us(std::time::UNIX_EPOCH + std::time::Duration::from_micros(7)),
            7
        );
    }
}
