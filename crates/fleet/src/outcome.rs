//! What a session ends with and what the engine counts: the [`Failure`]
//! (a stable kind and the server's words), the [`SessionEnd`] a protocol
//! returns, why a fleet [`Stopped`] early, and the counter and error-kind
//! names the engine records. A leaf of this crate: the ledger, the
//! sessions' context and the engine all read it.

use agent_sim_metrics::MetricsSpec;

/// Counter of session attempts after an agent's first (every retry).
pub const COUNTER_RECONNECT_ATTEMPTS: &str = "reconnect_attempts";
/// Counter of agents that held a session, lost it and got one again (once
/// per comeback).
pub const COUNTER_AGENTS_RECONNECTED: &str = "agents_reconnected";
/// Counter of sessions that reached [`crate::SessionCx::established`].
pub const COUNTER_SESSIONS: &str = "sessions_established";
/// Cause of an agent missing at the end that never got an answer at all
/// (still dialing or in its first handshake).
pub const CAUSE_NO_ANSWER_YET: &str = "no_answer_yet";

/// Names the engine records; merge them into the run's [`MetricsSpec`].
pub fn metrics_spec() -> MetricsSpec {
    MetricsSpec {
        counters: vec![
            COUNTER_RECONNECT_ATTEMPTS,
            COUNTER_AGENTS_RECONNECTED,
            COUNTER_SESSIONS,
        ],
        latencies: vec![],
        errors: dial_error_kinds()
            .iter()
            .copied()
            .chain(ceiling_kinds())
            .collect(),
    }
}

/// What to check for each kind [`agent_sim_net::dial_error_kind`] gives
/// (every protocol dials through it).
pub fn dial_error_kinds() -> &'static [agent_sim_metrics::ErrorKindSpec] {
    use agent_sim_metrics::ErrorKindSpec as K;
    &[
        K {
            kind: "connect_refused",
            hint: "nothing listens on that host:port: is the server up, and is --target the right port?",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        K {
            kind: "connect_timeout",
            hint: "no answer to the TCP connect: a firewall, a wrong address, or a server that is not accepting",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        K {
            kind: "connect_addr_unavailable",
            hint: "the load box ran out of ephemeral ports for this source address: add --source-addr addresses or use --shard",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        K {
            kind: "connect_no_buffers",
            hint: "the kernel had no memory left for another socket (ENOBUFS)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        K {
            kind: "connect_too_many_files",
            hint: "out of file descriptors: raise ulimit -n, or use --shard over several processes",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        K {
            kind: "connect_reset",
            hint: "the server reset the connection while it was being made",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
    ]
}

/// Why a session failed: a stable kind for the counters, and the server's
/// own words when it said anything (HTTP body or status line, gRPC status
/// message, close reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Error kind, e.g. `upgrade_401`, `connect_refused`.
    pub kind: &'static str,
    /// What the server said, if anything.
    pub detail: Option<String>,
    /// Whose words `detail` is when the error itself tells (a refused dial
    /// is the OS's, a TLS alert the server's); `None`: as the kind declares.
    pub said_by: Option<agent_sim_metrics::Speaker>,
}

impl Failure {
    /// A failure of `kind` with its words, whose they are told from the
    /// error they came from ([`agent_sim_net::speaker_of`]).
    pub fn of(kind: &'static str, e: &(dyn std::error::Error + 'static)) -> Self {
        Failure {
            kind,
            detail: Some(e.to_string()),
            said_by: agent_sim_net::speaker_of(e),
        }
    }
}

impl From<&'static str> for Failure {
    fn from(kind: &'static str) -> Self {
        Failure {
            kind,
            detail: None,
            said_by: None,
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// Shutdown was requested and the session closed; do not reconnect.
    Shutdown,
    /// The session failed (handshake refused, reset, timed out, ...) or was
    /// lost; counted as an error of this kind, then the agent reconnects
    /// after a backoff, as a real agent does, whatever the cause.
    Lost(Failure),
    /// The session cannot even be attempted (a local problem such as a TLS
    /// target without TLS settings); counted, and the agent stops.
    Fatal(Failure),
    /// The agent moves to another server of the run (a Consul agent's
    /// router rebalanced): not a loss, no error; the next session at once.
    Moved,
}

impl SessionEnd {
    /// [`SessionEnd::Lost`] without the server's words.
    pub fn lost(kind: &'static str) -> Self {
        SessionEnd::Lost(kind.into())
    }

    /// [`SessionEnd::Lost`] with what the server said.
    pub fn lost_with(kind: &'static str, detail: impl Into<String>) -> Self {
        SessionEnd::Lost(Failure {
            kind,
            detail: Some(detail.into()),
            said_by: None,
        })
    }

    /// [`SessionEnd::Lost`] with an error's words, whose they are told from
    /// the error ([`Failure::of`]).
    pub fn lost_of(kind: &'static str, e: &(dyn std::error::Error + 'static)) -> Self {
        SessionEnd::Lost(Failure::of(kind, e))
    }

    /// [`SessionEnd::Fatal`] of a kind.
    pub fn fatal(kind: &'static str) -> Self {
        SessionEnd::Fatal(kind.into())
    }

    /// The failure, unless this is a shutdown.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            SessionEnd::Shutdown | SessionEnd::Moved => None,
            SessionEnd::Lost(f) | SessionEnd::Fatal(f) => Some(f),
        }
    }
}

/// Why a fleet stopped before the end of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    /// `true`: `fail_fast` and this failure; `false`: no agent ever held a
    /// session and every agent failed twice with a cause that cannot heal.
    pub fail_fast: bool,
    /// The failure that decided it.
    pub failure: Failure,
}

/// A local ceiling (see `crate::ceiling`): ports of a source address (to a destination) all taken.
pub const CAUSE_PORTS: &str = "local_ports_exhausted";
/// The process is out of file descriptors.
pub const CAUSE_FDS: &str = "local_fds_exhausted";
/// The kernel is out of memory for sockets.
pub const CAUSE_BUFFERS: &str = "local_buffers_exhausted";

/// What to check for each local ceiling (see `crate::ceiling`).
pub fn ceiling_kinds() -> [agent_sim_metrics::ErrorKindSpec; 3] {
    [
        agent_sim_metrics::ErrorKindSpec {
            kind: CAUSE_PORTS,
            hint: "the load box ran out of ephemeral ports for one source address and target: \
                   those agents waited for a connection to close instead of retrying; add \
                   --source-addr addresses, more targets, or widen \
                   net.ipv4.ip_local_port_range (agent-sim doctor says how many)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        agent_sim_metrics::ErrorKindSpec {
            kind: CAUSE_FDS,
            hint: "this process ran out of file descriptors: those agents waited for a \
                   connection to close; raise ulimit -n or run more processes (--processes N)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
        agent_sim_metrics::ErrorKindSpec {
            kind: CAUSE_BUFFERS,
            hint: "the kernel ran out of memory for sockets (ENOBUFS): those agents waited for \
                   a connection to close; fewer agents per box, or more memory \
                   (net.ipv4.tcp_mem)",
            heals: true,
            said_by: agent_sim_metrics::Speaker::Os,
        },
    ]
}
