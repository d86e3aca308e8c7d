//! A regression gate for lab pipelines (`agent-sim report compare A B
//! --threshold EXPR`): how far run B may move from run A on one figure
//! before the comparison fails (exit 3).
//!
//! ```text
//! threshold := path change
//! change    := ("+" | "-") (number "%" | value)
//! ```
//!
//! `path` is any path of the `--assert` grammar ([`crate::assert`]), the
//! stepped run's `capacity.agents` included. `+` bounds how far B may rise
//! above A (latencies, errors, the server's cost); `-` how far it may fall
//! below A (the capacity, rates, the delivered ratio). The bound is a share
//! of A (`+10%`) or an amount in the path's unit (`+50ms`, `-500`, `+2MiB`).
//! Examples:
//!
//! ```text
//! propagation.p99 +10%     capacity.agents -0%     server.cores_per_1000_agents +15%
//! errors.total +0          keepalive_lateness.p99 +50ms
//! ```
//!
//! A figure either run lacks fails the threshold with a note.

use std::fmt::Write as _;
use std::str::FromStr;

use crate::assert::{AssertError, Assertion, Measure};
use crate::summary::Summary;

/// Why a threshold does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ThresholdError {
    /// Not `PATH CHANGE`.
    #[error("--threshold {0:?}: expected PATH +N% or PATH -VALUE (e.g. 'propagation.p99 +10%')")]
    Shape(String),
    /// The path is not one of the assertion grammar.
    #[error("--threshold {text:?}: {source}")]
    Path {
        /// The threshold as written.
        text: String,
        /// What the grammar said.
        source: AssertError,
    },
    /// The amount does not read in the path's unit.
    #[error("--threshold {text:?}: {source}")]
    Value {
        /// The threshold as written.
        text: String,
        /// What the grammar said.
        source: AssertError,
    },
    /// A share that is not a number of at least 0.
    #[error("--threshold {0:?}: the share must be a number of at least 0 (+10%)")]
    Share(String),
}

/// How far B may move.
#[derive(Debug, Clone, PartialEq)]
enum Bound {
    /// A share of A (0.10 for 10 %).
    Share(f64),
    /// An amount in the path's base unit.
    By(f64),
}

/// One parsed threshold.
#[derive(Debug, Clone)]
pub struct Threshold {
    text: String,
    measure: Measure,
    /// `+`: B may rise this far above A; `-`: fall this far below.
    up: bool,
    bound: Bound,
}

impl FromStr for Threshold {
    type Err = ThresholdError;

    fn from_str(s: &str) -> Result<Self, ThresholdError> {
        let text = s.split_whitespace().collect::<Vec<_>>().join(" ");
        let shape = || ThresholdError::Shape(text.clone());
        let (path, change) = text.split_once(' ').ok_or_else(shape)?;
        let up = match change.chars().next() {
            Some('+') => true,
            Some('-') => false,
            _ => return Err(shape()),
        };
        let amount = change[1..].trim();
        let measure: Measure = path.parse().map_err(|source| ThresholdError::Path {
            text: text.clone(),
            source,
        })?;
        let bound = match amount.strip_suffix('%') {
            Some(n) => {
                let share: f64 = n
                    .trim()
                    .parse()
                    .map_err(|_| ThresholdError::Share(text.clone()))?;
                if !(share.is_finite() && share >= 0.0) {
                    return Err(ThresholdError::Share(text.clone()));
                }
                Bound::Share(share / 100.0)
            }
            // The amount read as the assertion grammar reads the path's values.
            None => {
                let a: Assertion = format!("{path} < {amount}").parse().map_err(|source| {
                    ThresholdError::Value {
                        text: text.clone(),
                        source,
                    }
                })?;
                Bound::By(a.threshold(0))
            }
        };
        Ok(Threshold {
            text,
            measure,
            up,
            bound,
        })
    }
}

impl std::fmt::Display for Threshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// One threshold over two runs.
#[derive(Debug, Clone, PartialEq)]
pub struct GateVerdict {
    /// The threshold as written.
    pub threshold: String,
    /// A's and B's values, readable (`-` when absent).
    pub a: String,
    /// B's value, readable.
    pub b: String,
    /// How B moved from A (`+16.7%`, `-2`), when both are there.
    pub change: Option<String>,
    /// Whether B stayed within the bound.
    pub passed: bool,
    /// Why it could not be judged.
    pub note: Option<String>,
}

/// Each threshold judged on runs `a` (before) and `b` (after).
pub fn judge(thresholds: &[Threshold], a: &Summary, b: &Summary) -> Vec<GateVerdict> {
    thresholds.iter().map(|t| one(t, a, b)).collect()
}

fn one(t: &Threshold, a: &Summary, b: &Summary) -> GateVerdict {
    let (va, vb) = (t.measure.read(a), t.measure.read(b));
    let shown = |v: &Result<f64, _>| v.as_ref().map_or("-".into(), |x| t.measure.show(*x));
    let mut out = GateVerdict {
        threshold: t.text.clone(),
        a: shown(&va),
        b: shown(&vb),
        change: None,
        passed: false,
        note: None,
    };
    let (x, y) = match (va, vb) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) => {
            out.note = Some(format!("A: {e}"));
            return out;
        }
        (_, Err(e)) => {
            out.note = Some(format!("B: {e}"));
            return out;
        }
    };
    let room = match t.bound {
        Bound::Share(p) => x.abs() * p,
        Bound::By(d) => d,
    };
    out.passed = if t.up { y <= x + room } else { y >= x - room };
    out.change = Some(match (x != 0.0, &t.bound) {
        (true, Bound::Share(_)) => format!("{:+.1}%", (y - x) / x.abs() * 100.0),
        _ if y >= x => format!("+{}", t.measure.show(y - x)),
        _ => format!("-{}", t.measure.show(x - y)),
    });
    out
}

/// The verdicts as lines for the terminal, then how many held.
pub fn render(v: &[GateVerdict]) -> String {
    let mut out = String::new();
    if v.is_empty() {
        return out;
    }
    let _ = writeln!(out, "thresholds (B against A)");
    for g in v {
        let _ = writeln!(
            out,
            "  {:<4} {:<40} {:>12} {:>12} {:>9}  {}",
            if g.passed { "pass" } else { "FAIL" },
            g.threshold,
            g.a,
            g.b,
            g.change.as_deref().unwrap_or(""),
            g.note.as_deref().unwrap_or("")
        );
    }
    let held = v.iter().filter(|g| g.passed).count();
    let _ = writeln!(out, "  {held} of {} thresholds held", v.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::LatencySummary;

    fn run(p99_ms: u64, errors: u64) -> Summary {
        let mut s = Summary::default();
        s.latency_us.insert(
            "propagation".into(),
            LatencySummary {
                count: 10,
                p99: p99_ms * 1000,
                ..LatencySummary::default()
            },
        );
        s.counters.insert("events".into(), errors);
        s
    }

    fn gate(t: &str, a: &Summary, b: &Summary) -> GateVerdict {
        judge(&[t.parse().unwrap()], a, b).remove(0)
    }

    #[test]
    fn a_share_or_an_amount_bounds_how_far_b_moves() {
        let (a, b) = (run(100, 0), run(115, 3));
        let g = gate("propagation.p99 +10%", &a, &b);
        assert!(!g.passed);
        assert_eq!(g.change.as_deref(), Some("+15.0%"));
        assert!(gate("propagation.p99 +20%", &a, &b).passed);
        assert!(gate("propagation.p99 +15ms", &a, &b).passed);
        assert!(!gate("propagation.p99 +14ms", &a, &b).passed);
        // `-`: a fall is bounded; a rise always holds.
        assert!(gate("propagation.p99 -0%", &a, &b).passed);
        assert!(!gate("propagation.p99 -5%", &b, &a).passed);
        assert!(gate("events +3", &a, &b).passed);
        assert!(!gate("events +2", &a, &b).passed);
    }

    #[test]
    fn a_figure_either_run_lacks_fails_with_a_note() {
        let g = gate("capacity.agents -0%", &run(1, 0), &run(1, 0));
        assert!(!g.passed);
        assert!(g.note.unwrap().contains("no --steps"));
        let text = render(&[gate("propagation.p99 +10%", &run(100, 0), &run(100, 0))]);
        assert!(
            text.contains("pass") && text.contains("1 of 1 thresholds held"),
            "{text}"
        );
    }

    #[test]
    fn thresholds_that_do_not_parse_say_why() {
        let err = |s: &str| s.parse::<Threshold>().unwrap_err().to_string();
        assert!(err("propagation.p99 10%").contains("expected PATH +N%"));
        assert!(err("propagation.p99").contains("expected PATH +N%"));
        assert!(err("propagation.p99 +ten%").contains("at least 0"));
        assert!(err("nonsense..path +1%").contains("--threshold"));
        assert!(err("propagation.p99 +fast").contains("--threshold"));
    }
}
