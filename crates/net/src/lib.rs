//! Transport helpers shared by the protocol crates and the embedded server,
//! apart from the fleet engine (which knows no sockets).
//!
//! - [`accept`]: the accept loop of every listener ([`accept_until`]):
//!   failed accepts counted and spaced by a bounded back-off, shutdown by
//!   a future.
//! - [`dial`]: TCP connect from an optional source address (a pool of source
//!   addresses lets one box exceed ~28k connections per destination), the
//!   plain-or-TLS client socket [`MaybeTlsStream`], and stable error kinds of
//!   failed dials.
//! - [`coalesce`]: a socket whose writes wait for the next flush and go
//!   out in one write ([`Coalesced`]).
//! - [`count`]: a socket whose bytes in and out are counted into the
//!   caller's tally ([`Counted`]).
//! - [`stamp`]: kernel receive timestamps of a TCP socket (`SO_TIMESTAMPNS`).
//! - [`tls`]: rustls client configs (CA file, the platform's trust store or no
//!   verification; optional client certificate) and server configs (for the
//!   embedded backend: certificate, key, optional client verification).
//! - [`speaker`]: whose words an error is (the server's, the OS's or
//!   agent-sim's), told from its source chain ([`speaker_of`]).
//! - [`http`]: the one HTTP/1 client of the project (a connection of one's
//!   own or a shared pool; dial from a source address, TLS, a size limit
//!   on answers, one User-Agent, typed errors).
//!
//! What it is not: no protocol of the agents (no Consul or Sensu words:
//! callers name their error kinds) and no metrics.

pub mod accept;
pub mod coalesce;
pub mod count;
pub mod dial;
pub mod http;
pub mod speaker;
pub mod stamp;
pub mod tls;

pub use accept::accept_until;
pub use coalesce::Coalesced;
pub use count::{Counted, Tally};
pub use dial::{MaybeTls, MaybeTlsStream, dial, dial_error_kind};
pub use speaker::{Speaker, speaker_of};
pub use stamp::{RxStamp, StampedTcp, recv_from_stamped, stamp_instant, stamp_udp};
pub use tls::{ClientTls, TlsError, client_config, server_config};
