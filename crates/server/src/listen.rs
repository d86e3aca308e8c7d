//! TCP listeners of the embedded targets: [`bind`] (with `SO_REUSEPORT`)
//! and `serve_tracked`, the accept side every server shares
//! ([`agent_sim_net::accept_until`], one tracked task per connection, a
//! bounded wait for them at shutdown), and `tls_accept`, a bounded server
//! TLS handshake that hands the stream back when it fails.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use agent_sim_net::accept_until;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Binds `addr` with a large backlog; with `reuse_port`, sets `SO_REUSEPORT`
/// so that several processes (or listeners) share the port and the kernel
/// spreads connections over them.
pub fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    #[cfg(not(unix))]
    let _ = reuse_port;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    TcpListener::from_std(socket.into())
}

/// Accepts on `listener` until `shutdown`, each connection a task of
/// `tracker` (which may hold the server's other tasks), failed accepts
/// counted in `accept_errors`; then closes the listener and waits at most
/// `grace` for every task of `tracker`.
pub(crate) async fn serve_tracked<F, Fut>(
    listener: TcpListener,
    tracker: TaskTracker,
    shutdown: &CancellationToken,
    accept_errors: &AtomicU64,
    grace: Duration,
    mut handle: F,
) where
    F: FnMut(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    accept_until(
        listener,
        shutdown.cancelled(),
        accept_errors,
        |stream, _| {
            tracker.spawn(handle(stream));
        },
    )
    .await;
    tracker.close();
    let _ = tokio::time::timeout(grace, tracker.wait()).await;
}

/// The server side of a TLS handshake on `stream` within `limit`: `None`
/// at shutdown; on failure the error and, unless it ran out of time, the
/// stream back (to close it politely, so that the alert reaches the
/// client).
pub(crate) async fn tls_accept<S>(
    stream: S,
    tls: std::sync::Arc<rustls::ServerConfig>,
    limit: Duration,
    shutdown: &CancellationToken,
) -> Option<Result<TlsStream<S>, (io::Error, Option<S>)>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = tokio_rustls::TlsAcceptor::from(tls)
        .accept(stream)
        .into_fallible();
    tokio::select! {
        () = shutdown.cancelled() => None,
        r = tokio::time::timeout(limit, handshake) => Some(match r {
            Ok(Ok(tls)) => Ok(tls),
            Ok(Err((e, stream))) => Err((e, Some(stream))),
            Err(_) => Err((io::ErrorKind::TimedOut.into(), None)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn two_listeners_share_a_port_with_reuse_port() {
        let a = bind("127.0.0.1:0".parse().unwrap(), true).unwrap();
        let port = a.local_addr().unwrap().port();
        let b = bind(SocketAddr::from(([127, 0, 0, 1], port)), true).unwrap();
        assert_eq!(b.local_addr().unwrap().port(), port);
    }

    #[tokio::test]
    async fn without_reuse_port_the_second_bind_fails() {
        let a = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let port = a.local_addr().unwrap().port();
        assert!(bind(SocketAddr::from(([127, 0, 0, 1], port)), false).is_err());
    }
}
