//! Human units: durations (`20s`, `500ms`, `1m30s`, `2h`; parsed by the
//! humantime crate, a bare number is seconds) and rates (`500/s`, `0.2/s`,
//! `30/m`, `100/h`), parsed from flags and config files.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A rate of events per unit of time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_second: f64,
}

impl Rate {
    /// A rate of `n` per second (must be positive and finite).
    pub fn per_second(n: f64) -> Self {
        Rate { per_second: n }
    }

    /// Events per second.
    pub fn as_per_second(&self) -> f64 {
        self.per_second
    }

    /// Mean time between two events.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.per_second)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.per_second)
    }
}

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (num, unit) = s
            .split_once('/')
            .ok_or_else(|| format!("rate {s:?}: expected N/s, N/m or N/h (e.g. 500/s)"))?;
        let n: f64 = num
            .trim()
            .parse()
            .map_err(|_| format!("rate {s:?}: {num:?} is not a number"))?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            u => return Err(format!("rate {s:?}: unknown unit {u:?} (use s, m or h)")),
        };
        if !(n.is_finite() && n > 0.0) {
            return Err(format!("rate {s:?}: must be greater than zero"));
        }
        Ok(Rate::per_second(n / per))
    }
}

impl<'de> serde::Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Parses `20s`, `500ms`, `1m30s`, `2h`, `1.5s`, `250us` (humantime's
/// units); a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<f64>() {
        return if secs.is_finite() && secs >= 0.0 {
            Ok(Duration::from_secs_f64(secs))
        } else {
            Err(format!("duration {s:?} must be a non-negative number"))
        };
    }
    humantime::parse_duration(t).map_err(|e| format!("duration {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("15").unwrap(), Duration::from_secs(15));
        assert!(parse_duration("20x").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!("500/s".parse::<Rate>().unwrap().as_per_second(), 500.0);
        assert!(("0.2/s".parse::<Rate>().unwrap().as_per_second() - 0.2).abs() < 1e-12);
        assert_eq!("120/m".parse::<Rate>().unwrap().as_per_second(), 2.0);
        assert_eq!(
            "500/s".parse::<Rate>().unwrap().interval(),
            Duration::from_millis(2)
        );
        assert!("500".parse::<Rate>().is_err());
        assert!("0/s".parse::<Rate>().is_err());
        assert!("5/fortnight".parse::<Rate>().is_err());
    }
}
