//! Human units: durations (`20s`, `500ms`, `1m30s`, `2h`; parsed by the
//! humantime crate, a bare number is seconds) and rates (`500/s`, `0.2/s`,
//! `30/m`, `100/h`), parsed from flags and config files; [`UnitError`]
//! says what is wrong with one that does not parse.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Why a duration or a rate does not parse (each carries the text as given).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnitError {
    /// A rate without its `/unit`.
    #[error("rate {0:?}: expected N/s, N/m or N/h (e.g. 500/s)")]
    RateForm(String),
    /// A rate whose count is not a number.
    #[error("rate {text:?}: {num:?} is not a number")]
    RateNumber {
        /// The rate as given.
        text: String,
        /// Its count.
        num: String,
    },
    /// A rate per something other than a second, minute or hour.
    #[error("rate {text:?}: unknown unit {unit:?} (use s, m or h)")]
    RateUnit {
        /// The rate as given.
        text: String,
        /// Its unit.
        unit: String,
    },
    /// A rate of zero, below zero or not finite.
    #[error("rate {0:?}: must be greater than zero")]
    RateNotPositive(String),
    /// Nothing where a duration was expected.
    #[error("empty duration")]
    EmptyDuration,
    /// A bare number of seconds below zero or not finite.
    #[error("duration {0:?} must be a non-negative number")]
    NegativeDuration(String),
    /// A duration humantime does not read.
    #[error("duration {text:?}: {source}")]
    Duration {
        /// The duration as given.
        text: String,
        /// What humantime said.
        source: humantime::DurationError,
    },
}

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
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        let s = s.trim();
        let (num, unit) = s
            .split_once('/')
            .ok_or_else(|| UnitError::RateForm(s.into()))?;
        let n: f64 = num.trim().parse().map_err(|_| UnitError::RateNumber {
            text: s.into(),
            num: num.into(),
        })?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            u => {
                return Err(UnitError::RateUnit {
                    text: s.into(),
                    unit: u.into(),
                });
            }
        };
        if !(n.is_finite() && n > 0.0) {
            return Err(UnitError::RateNotPositive(s.into()));
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
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(UnitError::EmptyDuration);
    }
    if let Ok(secs) = t.parse::<f64>() {
        return if secs.is_finite() && secs >= 0.0 {
            Ok(Duration::from_secs_f64(secs))
        } else {
            Err(UnitError::NegativeDuration(s.into()))
        };
    }
    humantime::parse_duration(t).map_err(|source| UnitError::Duration {
        text: s.into(),
        source,
    })
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
