//! Whose words an error is: the server's, the OS's or agent-sim's own, told
//! from the error itself (its source chain) rather than from its kind, so
//! that one kind (`conn_error`, `tls_handshake`, `gossip_join_failed`) whose
//! samples can come from any of them says each time who spoke.

use std::error::Error;
use std::io;

/// Whose words an error sample is, so that a report does not put the OS's
/// `Connection refused` in the server's mouth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Speaker {
    /// The server's own words: an HTTP body or status line, a gRPC status
    /// message, a close reason, a TLS alert it sent.
    #[default]
    Server,
    /// The operating system's words about a local socket: an `io::Error` of
    /// a dial, a bind or a read (`Connection refused`, no port left).
    Os,
    /// agent-sim's own words: a local check or setup step, or its TLS
    /// library refusing what the server presented.
    Local,
}

impl Speaker {
    /// How a report introduces the sample (`server said: ...`).
    pub fn said(self) -> &'static str {
        match self {
            Speaker::Server => "server said",
            Speaker::Os => "the OS said",
            Speaker::Local => "agent-sim said",
        }
    }

    /// Whether these are the server's words (the default, not written to a
    /// summary).
    pub fn is_server(&self) -> bool {
        *self == Speaker::Server
    }
}

/// Who spoke an error, from the first cause in its chain that says: a TLS
/// alert received is the server's; another rustls error is agent-sim's (its
/// TLS library judged what came); an `io::Error` of the socket itself (no
/// error of another kind inside it) is the OS's. `None` when nothing in the
/// chain says (the caller's kind decides then).
pub fn speaker_of(e: &(dyn Error + 'static)) -> Option<Speaker> {
    let mut at: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(err) = at {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(match tls {
                rustls::Error::AlertReceived(_) => Speaker::Server,
                _ => Speaker::Local,
            });
        }
        if let Some(io) = err.downcast_ref::<io::Error>() {
            // An io::Error that wraps another error reports that one's
            // source, not the error itself: look inside it first.
            match io.get_ref() {
                Some(inner) => {
                    at = Some(inner);
                    continue;
                }
                None => return Some(Speaker::Os),
            }
        }
        at = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("dialing: {0}")]
    struct Dialing(#[source] io::Error);

    #[test]
    fn a_refused_dial_is_the_os_even_inside_another_error() {
        let e = Dialing(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(speaker_of(&e), Some(Speaker::Os));
    }

    #[test]
    fn a_tls_alert_is_the_server_and_a_refused_certificate_is_ours() {
        let alert = io::Error::other(rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired,
        ));
        assert_eq!(speaker_of(&alert), Some(Speaker::Server));
        let ours = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(speaker_of(&Dialing(ours)), Some(Speaker::Local));
    }

    #[test]
    fn a_chain_that_says_nothing_leaves_it_to_the_kind() {
        #[derive(Debug, thiserror::Error)]
        #[error("the server sent a GOAWAY")]
        struct GoAway;
        assert_eq!(speaker_of(&GoAway), None);
    }

    #[test]
    fn the_summary_spells_speakers_in_snake_case() {
        assert_eq!(serde_json::to_string(&Speaker::Os).unwrap(), "\"os\"");
        assert!(Speaker::Server.is_server() && !Speaker::Local.is_server());
    }
}
