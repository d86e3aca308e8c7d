//! When a spec fires: its times (`at:`, `every:`), the window after each
//! (`for:`), and the sessions a `past:N` item waits for ([`Load`]).

use std::time::Duration;

use super::spec::{FaultSpec, Target};

/// What a backend holds that a `past:N` item counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Sensu WebSocket sessions (past their upgrade).
    SensuSessions,
    /// Consul multiplexed RPC connections (a client agent holds one to
    /// its server; its gRPC streams ride another, not counted).
    ConsulRpc,
    /// Delta xDS streams (a dataplane sidecar holds one).
    XdsStreams,
}

impl Target {
    /// The sessions whose count a `past:` item reads.
    pub fn load(self) -> Load {
        match self {
            Target::SensuUpgrade | Target::SensuSession | Target::SensuFrame => Load::SensuSessions,
            Target::ConsulXds => Load::XdsStreams,
            _ => Load::ConsulRpc,
        }
    }
}

impl FaultSpec {
    /// The `k`-th time this fault fires (from serve start), if any.
    pub fn moment(&self, k: u64) -> Option<Duration> {
        match (self.at, self.every) {
            (None, None) => None,
            (Some(a), None) => (k == 0).then_some(a),
            (a, Some(p)) => {
                let first = a.unwrap_or(p);
                let n = u32::try_from(k).ok()?;
                p.checked_mul(n).and_then(|d| d.checked_add(first))
            }
        }
    }

    /// Whether a unit arriving `t` after serve start is within a window.
    pub fn in_window(&self, t: Duration) -> bool {
        let Some(w) = self.window else {
            return false;
        };
        match (self.at, self.every) {
            (Some(a), None) => t >= a && t < a + w,
            (a, Some(p)) => {
                let first = a.unwrap_or(p);
                t >= first && (t - first).as_nanos() % p.as_nanos() < w.as_nanos()
            }
            (None, None) => false,
        }
    }

    /// Whether a rate alone decides (no time given).
    pub fn untimed(&self) -> bool {
        self.at.is_none() && self.every.is_none()
    }
}
