//! What every port of the server does with its connections: accept them
//! ([`accept_loop`], counted in `accept_errors`), a bounded TLS handshake
//! ([`tls_accept`]), hyper's HTTP/2 server sized for many idle gRPC
//! connections ([`h2_builder`]), and a graceful, bounded end on shutdown
//! ([`drive_connection`]). What each port speaks lives in `rpc`, `grpc`
//! and `http`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ConsulState;
use crate::listen;

/// How long open connections get to finish after shutdown.
const CONNECTION_GRACE: Duration = Duration::from_millis(1500);
/// How long streams get to end with their own words after shutdown, before
/// their connection's graceful end begins.
const LAST_WORDS: Duration = Duration::from_millis(200);
/// How long a `serve_*` call waits for its connection tasks after shutdown.
const SERVE_GRACE: Duration = Duration::from_secs(2);
/// How long a client gets for its TLS handshake (Consul's
/// `limits.rpc_handshake_timeout` default), on every port.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Streams one HTTP/2 connection may hold at once (an agent opens one
/// Subscribe per upstream; a sidecar its ADS stream and `WatchServers`).
const MAX_STREAMS_PER_CONN: u32 = 1024;
/// Largest HTTP/2 header block accepted from a client (hyper's default,
/// stated): gRPC request headers are a few hundred bytes.
const MAX_HEADER_LIST: u32 = 16 * 1024;

/// Accepts until `shutdown`, one tracked task per connection, failed
/// accepts counted in `accept_errors`; then closes the listener and waits
/// (bounded) for the tasks.
pub(super) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    state: &ConsulState,
    shutdown: CancellationToken,
    handle: F,
) -> io::Result<()>
where
    F: FnMut(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let errors = &state.inner.counters.accept_errors;
    listen::serve_tracked(
        listener,
        TaskTracker::new(),
        &shutdown,
        errors,
        SERVE_GRACE,
        handle,
    )
    .await;
    Ok(())
}

/// hyper's HTTP/2 server for a gRPC port. It never pings clients: a real
/// server doesn't, and pings cost wakeups over 10,000 idle connections.
/// Bound: [`MAX_STREAMS_PER_CONN`] streams per connection, and what one
/// header block may hold ([`MAX_HEADER_LIST`]).
pub(super) fn h2_builder() -> Arc<http2::Builder<TokioExecutor>> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(None)
        .max_concurrent_streams(MAX_STREAMS_PER_CONN)
        .max_header_list_size(MAX_HEADER_LIST);
    Arc::new(builder)
}

/// The server side of a TLS handshake on `stream`, within
/// [`TLS_HANDSHAKE_TIMEOUT`]: `None` at shutdown, else how it went (an
/// error too when it took too long).
pub(super) async fn tls_accept<S>(
    stream: S,
    tls: Arc<rustls::ServerConfig>,
    shutdown: &CancellationToken,
) -> Option<io::Result<TlsStream<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let r = listen::tls_accept(stream, tls, TLS_HANDSHAKE_TIMEOUT, shutdown).await?;
    Some(r.map_err(|(e, _)| e))
}

/// Drives one accepted connection until it ends; on `shutdown` starts its
/// graceful shutdown (hyper's inherent `graceful_shutdown`, passed in as
/// `graceful`) and waits at most [`CONNECTION_GRACE`] for it.
pub(super) async fn drive_connection<C>(
    conn: C,
    shutdown: &CancellationToken,
    graceful: impl FnOnce(Pin<&mut C>),
) where
    C: Future,
{
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = shutdown.cancelled() => {
            // Streams say their last words (the server is shutting down)
            // before the connection's GOAWAY, as Consul stops its
            // subscriptions before its gRPC server: with the GOAWAY first,
            // a stream's status could lose the race to the close.
            if tokio::time::timeout(LAST_WORDS, conn.as_mut()).await.is_ok() {
                return;
            }
            graceful(conn.as_mut());
            let _ = tokio::time::timeout(CONNECTION_GRACE, conn).await;
        }
    }
}
