//! Why a pool could not start, a member could not join, or a push-pull
//! with a server failed: one variant per cause, the cause kept
//! (`std::error::Error::source`), the Display text in plain words.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::wire::WireError;

/// Why a push-pull with a server failed (the pool's hello, a member's join,
/// a periodic or a closing exchange).
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The TCP connection could not be opened.
    #[error("connect {to}: {source}")]
    Connect {
        /// The server.
        to: SocketAddr,
        /// What the socket said.
        source: io::Error,
    },
    /// The push-pull could not be written.
    #[error("{to}: sending the push-pull: {source}")]
    Send {
        /// The server.
        to: SocketAddr,
        /// What the socket said.
        source: io::Error,
    },
    /// The server closed the stream before its whole answer came.
    #[error(
        "{to} closed the push-pull without a whole answer (memberlist drops push-pulls past 128 \
         pending: a join storm, or the server is saturated)"
    )]
    Closed {
        /// The server.
        to: SocketAddr,
    },
    /// The answer could not be read (label, key, CRC, compression, size,
    /// a message that does not decode).
    #[error("{to}: {source}")]
    Answer {
        /// The server.
        to: SocketAddr,
        /// What is wrong with its bytes.
        source: WireError,
    },
    /// The server answered with memberlist's error message.
    #[error("{to} said: {said}")]
    Refused {
        /// The server.
        to: SocketAddr,
        /// Its words, as they came on the wire.
        said: String,
    },
    /// The answer is neither a push-pull nor an error.
    #[error("{to}: not a push-pull answer")]
    NotPushPull {
        /// The server.
        to: SocketAddr,
    },
    /// No whole answer within the stream deadline (`Timings::tcp_timeout`).
    #[error("{to}: no answer in {after:?}")]
    Timeout {
        /// The server.
        to: SocketAddr,
        /// The deadline.
        after: Duration,
    },
}

impl ExchangeError {
    /// Whose words the error is: the OS's for a socket's, the server's
    /// for memberlist's error message, agent-sim's where it tells what the
    /// server's bytes or silence were (its reader's verdict, a deadline).
    pub fn said_by(&self) -> agent_sim_metrics::Speaker {
        use agent_sim_metrics::Speaker;
        match self {
            ExchangeError::Connect { .. } | ExchangeError::Send { .. } => Speaker::Os,
            ExchangeError::Refused { .. } => Speaker::Server,
            ExchangeError::Closed { .. }
            | ExchangeError::Answer { .. }
            | ExchangeError::NotPushPull { .. }
            | ExchangeError::Timeout { .. } => Speaker::Local,
        }
    }
}

/// Why a member's join did not happen.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The pool is closing (the end of the run): no join starts.
    #[error("the run is ending")]
    Closing,
    /// The join's push-pull failed, and no member had joined yet: the
    /// port, the key or the label.
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    /// The join's push-pull failed after the servers had taken others:
    /// they are overloaded.
    #[error("{source} (after {joined} members had joined)")]
    Overloaded {
        /// Members whose join the servers took before.
        joined: u64,
        /// How this one failed.
        source: ExchangeError,
    },
}

impl JoinError {
    /// The error kind a failed join is counted as (`None`: not a failure,
    /// the run is ending).
    pub fn kind(&self) -> Option<&'static str> {
        match self {
            JoinError::Closing => None,
            JoinError::Exchange(_) => Some(crate::JOIN_FAILED.kind),
            JoinError::Overloaded { .. } => Some(crate::JOIN_OVERLOADED.kind),
        }
    }

    /// Whose words the error is ([`ExchangeError::said_by`]).
    pub fn said_by(&self) -> agent_sim_metrics::Speaker {
        match self {
            JoinError::Closing => agent_sim_metrics::Speaker::Local,
            JoinError::Exchange(e) | JoinError::Overloaded { source: e, .. } => e.said_by(),
        }
    }

    /// A failed exchange: a server that went silent (no answer in time,
    /// or the stream closed unanswered, as memberlist closes a push-pull
    /// past its bound) after `joined` members had joined is overloaded;
    /// anything else (refused, the server's own words, another key) is
    /// told as it is.
    pub fn failed(source: ExchangeError, joined: u64) -> Self {
        let silent = matches!(
            source,
            ExchangeError::Closed { .. } | ExchangeError::Timeout { .. }
        );
        match joined {
            0 => JoinError::Exchange(source),
            _ if !silent => JoinError::Exchange(source),
            joined => JoinError::Overloaded { joined, source },
        }
    }
}

/// Why a pool cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// An endpoint cannot be bound.
    #[error("gossip: cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the socket said.
        source: io::Error,
    },
    /// No address to listen on was given.
    #[error("gossip: no address to listen on")]
    NoBind,
    /// No server to join was given.
    #[error("gossip: no server to join (--gossip-join)")]
    NoJoin,
    /// The first server's push-pull did not answer (refused, wrong key or
    /// label, not a gossip port).
    #[error("gossip: {0}")]
    Hello(#[source] ExchangeError),
    /// The first server answered, but its member list holds no Consul
    /// server.
    #[error("gossip: {to} answered, but lists no Consul server (role=consul)")]
    NoServer {
        /// The server asked.
        to: SocketAddr,
    },
}

impl PoolError {
    /// Whether the pool could not start because the servers' gossip
    /// security is not this pool's, a cause retrying does not heal: their
    /// answer could not be opened with our key or label, or the first
    /// server took our push-pull and closed it unanswered, as memberlist
    /// closes a stream it cannot open (another key, encryption on one
    /// side only, another label). The kind to count it as.
    pub fn security(&self) -> Option<&'static agent_sim_metrics::ErrorKindSpec> {
        match self {
            PoolError::Hello(ExchangeError::Answer { source, .. }) => match source {
                WireError::Label { .. } => Some(&crate::BAD_LABEL),
                WireError::Crypt(_) | WireError::Key(_) => Some(&crate::BAD_KEY),
                _ => None,
            },
            PoolError::Hello(ExchangeError::Closed { .. }) => Some(&crate::BAD_KEY),
            _ => None,
        }
    }

    /// The error kind a pool that cannot start is counted as, when its
    /// caller counts it (every cause is the run's gossip not joining).
    pub fn kind(&self) -> &'static str {
        match self {
            PoolError::Bind { .. } => crate::JOIN_FAILED.kind,
            PoolError::NoBind => crate::JOIN_FAILED.kind,
            PoolError::NoJoin => crate::JOIN_FAILED.kind,
            PoolError::Hello(_) => crate::JOIN_FAILED.kind,
            PoolError::NoServer { .. } => crate::JOIN_FAILED.kind,
        }
    }

    /// Whose words the error is: the OS's for a bind, the first server's
    /// exchange as [`ExchangeError::said_by`] tells, agent-sim's for a
    /// setting missing or a member list without a server.
    pub fn said_by(&self) -> agent_sim_metrics::Speaker {
        match self {
            PoolError::Bind { .. } => agent_sim_metrics::Speaker::Os,
            PoolError::Hello(e) => e.said_by(),
            PoolError::NoBind | PoolError::NoJoin | PoolError::NoServer { .. } => {
                agent_sim_metrics::Speaker::Local
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use agent_sim_metrics::Speaker;

    use super::*;

    #[test]
    fn a_failed_join_says_who_spoke_by_its_cause() {
        let to: SocketAddr = "127.0.0.1:8301".parse().unwrap();
        let refused = ExchangeError::Connect {
            to,
            source: io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(JoinError::failed(refused, 0).said_by(), Speaker::Os);
        let said = ExchangeError::Refused {
            to,
            said: "Push/Pull: no such label".into(),
        };
        assert_eq!(JoinError::failed(said, 3).said_by(), Speaker::Server);
        let silent = ExchangeError::Timeout {
            to,
            after: Duration::from_secs(10),
        };
        assert_eq!(JoinError::failed(silent, 3).said_by(), Speaker::Local);
        assert_eq!(PoolError::NoJoin.said_by(), Speaker::Local);
    }

    #[test]
    fn each_cause_is_said_in_plain_words_and_kept() {
        let to: SocketAddr = "10.0.0.1:8301".parse().unwrap();
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let e = PoolError::Hello(ExchangeError::Connect {
            to,
            source: refused,
        });
        assert!(
            e.to_string().starts_with("gossip: connect 10.0.0.1:8301: "),
            "{e}"
        );
        let inner = e.source().unwrap();
        assert!(inner.source().unwrap().is::<io::Error>());
        let j = JoinError::from(ExchangeError::Timeout {
            to,
            after: Duration::from_secs(10),
        });
        assert_eq!(j.to_string(), "10.0.0.1:8301: no answer in 10s");
        assert_eq!(j.kind(), Some("gossip_join_failed"));
        assert_eq!(JoinError::Closing.kind(), None);
        // After other members joined, the same failure names the overload.
        let timeout = || ExchangeError::Timeout {
            to,
            after: Duration::from_secs(10),
        };
        assert_eq!(
            JoinError::failed(timeout(), 0).kind(),
            Some("gossip_join_failed")
        );
        let refused = ExchangeError::Connect {
            to,
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        };
        // A server that refuses or speaks is not overloaded, however many
        // joined before.
        assert_eq!(
            JoinError::failed(refused, 9).kind(),
            Some("gossip_join_failed")
        );
        let o = JoinError::failed(timeout(), 4_307);
        assert_eq!(o.kind(), Some("gossip_join_overloaded"));
        assert_eq!(
            o.to_string(),
            "10.0.0.1:8301: no answer in 10s (after 4307 members had joined)"
        );
        assert!(o.source().unwrap().is::<ExchangeError>());
        // Another key or label does not heal; a refused port does.
        let closed = PoolError::Hello(ExchangeError::Closed { to });
        assert_eq!(closed.security().map(|k| k.kind), Some("gossip_encryption"));
        let label = PoolError::Hello(ExchangeError::Answer {
            to,
            source: WireError::Label {
                got: "a".into(),
                want: "b".into(),
            },
        });
        assert_eq!(label.security().map(|k| k.kind), Some("gossip_label"));
        let refused = PoolError::Hello(ExchangeError::Connect {
            to,
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        });
        assert!(refused.security().is_none());
        let said = ExchangeError::Refused {
            to,
            said: "Remote node has a conflicting node ID".into(),
        };
        assert_eq!(
            said.to_string(),
            "10.0.0.1:8301 said: Remote node has a conflicting node ID"
        );
    }
}
