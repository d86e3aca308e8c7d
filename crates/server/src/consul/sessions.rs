//! TTL sessions: create / renew / destroy, expiry after 2 × TTL without a
//! renewal, swept by ONE task (not a timer per session); plus Go
//! `time.Duration` parsing and printing, because Consul's messages print
//! durations the Go way (`10s`, `24h0m0s`).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// `structs.SessionTTLMax`.
pub(crate) const SESSION_TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// Consul's default `LockDelay`.
pub(crate) const DEFAULT_LOCK_DELAY: Duration = Duration::from_secs(15);

/// One session as `/v1/session/*` prints it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Session {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Node")]
    pub node: String,
    /// Nanoseconds.
    #[serde(rename = "LockDelay")]
    pub lock_delay: u64,
    #[serde(rename = "Behavior")]
    pub behavior: String,
    #[serde(rename = "TTL")]
    pub ttl: String,
    #[serde(rename = "NodeChecks")]
    pub node_checks: Option<Vec<String>>,
    #[serde(rename = "ServiceChecks")]
    pub service_checks: Option<serde_json::Value>,
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
    #[serde(skip)]
    pub ttl_duration: Option<Duration>,
    #[serde(skip)]
    pub deadline: Option<Instant>,
}

impl Session {
    /// Pushes the expiry to now + 2 × TTL (no TTL: never expires).
    pub(crate) fn touch(&mut self, now: Instant) {
        self.deadline = self.ttl_duration.map(|ttl| now + ttl * 2);
    }

    fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }
}

/// What [`Sessions::renew`] found.
pub(crate) enum Renewal {
    Renewed(Box<Session>),
    /// Its deadline had passed; it is gone now (its keys are the caller's
    /// to release).
    Expired(Box<Session>),
    NotFound,
}

/// Most sessions held: one per agent is what agents create, and a session
/// without a TTL never expires, so creates beyond this are refused (HTTP
/// 500) rather than kept forever.
pub(crate) const MAX_SESSIONS: usize = 1 << 20;

#[derive(Default)]
pub(crate) struct Sessions {
    // Bound: MAX_SESSIONS (checked by the create handler).
    map: HashMap<String, Session>,
}

impl Sessions {
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn insert(&mut self, s: Session) {
        self.map.insert(s.id.clone(), s);
    }

    pub(crate) fn renew(&mut self, id: &str, now: Instant) -> Renewal {
        match self.map.get_mut(id) {
            None => Renewal::NotFound,
            Some(s) if s.expired(now) => match self.map.remove(id) {
                Some(s) => Renewal::Expired(Box::new(s)),
                None => Renewal::NotFound,
            },
            Some(s) => {
                s.touch(now);
                Renewal::Renewed(Box::new(s.clone()))
            }
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Session> {
        self.map.values()
    }

    pub(crate) fn get(&self, id: &str) -> Option<&Session> {
        self.map.get(id)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Session> {
        self.map.remove(id)
    }

    /// Drops every session bound to `node`; returns them.
    pub(crate) fn remove_node(&mut self, node: &str) -> Vec<Session> {
        self.take_where(|s| s.node == node)
    }

    fn take_where(&mut self, gone: impl Fn(&Session) -> bool) -> Vec<Session> {
        let ids: Vec<String> = self
            .map
            .values()
            .filter(|s| gone(s))
            .map(|s| s.id.clone())
            .collect();
        ids.iter().filter_map(|id| self.map.remove(id)).collect()
    }

    /// Restarts every session's TTL timer at `now` (a new leader does).
    pub(crate) fn touch_all(&mut self, now: Instant) {
        for s in self.map.values_mut() {
            s.touch(now);
        }
    }

    /// Drops expired sessions; returns them.
    pub(crate) fn sweep(&mut self, now: Instant) -> Vec<Session> {
        self.take_where(|s| s.expired(now))
    }
}

/// A random (v4) UUID, the form of Consul session IDs.
pub(crate) fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Why a Go duration string did not parse, in Go's `time.ParseDuration`
/// words (Consul answers them as they are).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DurationError {
    /// Not a duration (a sign, no number, too large).
    #[error("time: invalid duration \"{0}\"")]
    Invalid(String),
    /// A number without a unit.
    #[error("time: missing unit in duration \"{0}\"")]
    MissingUnit(String),
    /// A unit Go does not know.
    #[error("time: unknown unit \"{unit}\" in duration \"{text}\"")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole duration string.
        text: String,
    },
}

/// Parses a Go duration string (`"15s"`, `"1m30s"`, `"1.5h"`, `"100ms"`, `"0"`).
pub(crate) fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(s.to_owned());
    let body = s.strip_prefix('+').unwrap_or(s);
    if body.starts_with('-') {
        return Err(invalid());
    }
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err(invalid());
    }
    let mut rest = body;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::MissingUnit(s.to_owned()))?;
        if num_end == 0 {
            return Err(invalid());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| invalid())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            unit => {
                return Err(DurationError::UnknownUnit {
                    unit: unit.to_owned(),
                    text: s.to_owned(),
                });
            }
        };
        total += value * nanos_per;
        rest = &rest[unit_end..];
    }
    if total > u64::MAX as f64 {
        return Err(invalid());
    }
    Ok(Duration::from_nanos(total.round() as u64))
}

/// Prints a duration like Go's `time.Duration.String()`.
pub(crate) fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    fn frac(value: u128, unit: u128) -> String {
        let whole = value / unit;
        let rem = value % unit;
        if rem == 0 {
            return whole.to_string();
        }
        let width = unit.ilog10() as usize;
        let digits = format!("{rem:0width$}");
        format!("{whole}.{}", digits.trim_end_matches('0'))
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", frac(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", frac(nanos, 1_000_000));
    }
    let secs_nanos = nanos % 60_000_000_000;
    let mins = nanos / 60_000_000_000;
    let s = format!("{}s", frac(secs_nanos, 1_000_000_000));
    if mins == 0 {
        return s;
    }
    let (h, m) = (mins / 60, mins % 60);
    if h == 0 {
        format!("{m}m{s}")
    } else {
        format!("{h}h{m}m{s}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_round_trip() {
        for (text, d) in [
            ("15s", Duration::from_secs(15)),
            ("5s", Duration::from_secs(5)),
            ("1m30s", Duration::from_secs(90)),
            ("100ms", Duration::from_millis(100)),
            ("1.5s", Duration::from_millis(1500)),
            ("24h", SESSION_TTL_MAX),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(parse_go_duration(text), Ok(d), "{text}");
        }
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("x").is_err());
        assert!(parse_go_duration("-5s").is_err());
        assert_eq!(format_go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_go_duration(SESSION_TTL_MAX), "24h0m0s");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_go_duration(Duration::from_millis(100)), "100ms");
        assert_eq!(format_go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_go_duration(Duration::from_micros(2)), "2µs");
    }

    #[test]
    fn uuids_look_like_uuids() {
        let id = uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(id.as_bytes()[14], b'4');
        assert_ne!(uuid(), id);
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_after_twice_the_ttl() {
        let mut sessions = Sessions::default();
        let now = Instant::now();
        let mut s = Session {
            id: "a".into(),
            name: String::new(),
            node: "n".into(),
            lock_delay: 0,
            behavior: "release".into(),
            ttl: "10s".into(),
            node_checks: Some(vec![]),
            service_checks: None,
            create_index: 1,
            modify_index: 1,
            ttl_duration: Some(Duration::from_secs(10)),
            deadline: None,
        };
        s.touch(now);
        sessions.insert(s);
        assert!(sessions.sweep(now + Duration::from_secs(19)).is_empty());
        assert!(matches!(
            sessions.renew("a", now + Duration::from_secs(19)),
            Renewal::Renewed(_)
        ));
        assert!(sessions.sweep(now + Duration::from_secs(38)).is_empty());
        assert_eq!(sessions.sweep(now + Duration::from_secs(39)).len(), 1);
        assert!(matches!(sessions.renew("a", now), Renewal::NotFound));
    }
}
