//! How a session's gRPC call ended, as a session counts it: a status in
//! the words the counts keep, and whether a status is the server's answer
//! or the transport's. Shared by the Consul agents and the dataplane
//! sidecars, whose sessions end alike.
//!
//! What it is not: the kinds of a status by code or by Consul's words
//! (`conn::status_kind`, `http::cause_kind`) nor the sessions themselves.

use tonic::{Code, Status};

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
