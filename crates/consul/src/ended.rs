//! How a session's gRPC connection or call ended, as a session counts it:
//! the failure of a finished connection driver (its kind and hyper's
//! words), a status in the words the counts keep, and whether a status is
//! the server's answer or the transport's. Shared by the Consul agents and
//! the dataplane sidecars, whose sessions end alike.
//!
//! What it is not: the kinds of a status by code or by Consul's words
//! (`conn::status_kind`, `http::cause_kind`) nor the sessions themselves.

use agent_sim_fleet::Failure;
use tonic::{Code, Status};

use crate::http::error_chain;

/// The failure of a connection driver that finished: closed (`Ok`), a
/// keepalive that went unanswered, or another transport error, with what
/// hyper and h2 said (a reset, a GOAWAY and its reason, an I/O error).
pub fn driver_failure(r: Result<(), hyper::Error>) -> Failure {
    match r {
        Ok(()) => Failure::from("conn_closed"),
        Err(e) if e.is_timeout() => Failure {
            kind: "keepalive_timeout",
            detail: Some(error_chain(&e)),
            said_by: None,
        },
        Err(e) => Failure {
            kind: "conn_error",
            detail: Some(error_chain(&e)),
            said_by: agent_sim_net::speaker_of(&e),
        },
    }
}

/// A status as the counts keep it: `gRPC <Code>: <message>`.
pub fn status_words(s: &Status) -> String {
    format!("gRPC {:?}: {}", s.code(), s.message())
}

/// Whether a status came from the server (an answer) rather than from a
/// broken transport.
pub fn server_said(s: &Status) -> bool {
    !matches!(s.code(), Code::Unavailable | Code::Cancelled) && !s.message().contains("transport")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_driver_is_conn_closed_without_words() {
        assert_eq!(driver_failure(Ok(())), Failure::from("conn_closed"));
    }

    #[test]
    fn answers_are_told_from_transport_failures() {
        assert!(server_said(&Status::new(Code::NotFound, "no such proxy")));
        assert!(!server_said(&Status::new(Code::Unavailable, "try again")));
        assert!(!server_said(&Status::new(Code::Cancelled, "gone")));
        assert!(!server_said(&Status::new(Code::Unknown, "transport error")));
        assert_eq!(
            status_words(&Status::new(Code::Aborted, "reset")),
            "gRPC Aborted: reset"
        );
    }
}
