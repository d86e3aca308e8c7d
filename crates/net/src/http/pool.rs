//! Connections shared by many callers (hyper-util's pool): at most
//! `max_conns` calls, hence connections, at once; each call bounded in
//! time; idle connections dropped after a while. A request written on a
//! pooled connection the server had just closed is sent again on another
//! (hyper-util's rule), so a server's idle close costs no call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt as _, TryFutureExt as _};
use http::{Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Semaphore;

use super::{Answer, Error, MAX_BUF, Peer, identify, read};
use crate::count::{Counted, Tally};
use crate::dial::MaybeTlsStream;

/// How much a [`Pool`] holds and how long it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Most calls (and so connections) at once; more wait for a slot.
    pub max_conns: usize,
    /// How long an idle connection is kept.
    pub idle: Duration,
    /// How long a new connection's TCP connect may take.
    pub dial_timeout: Duration,
    /// How long a call may take once it has a slot (answer read included).
    pub timeout: Duration,
}

/// Dials the peer for hyper-util's pool, counting the bytes of each
/// connection into the tally.
struct Connector<T> {
    peer: Arc<Peer>,
    tally: Option<T>,
    dial_timeout: Duration,
}

impl<T: Clone> Clone for Connector<T> {
    fn clone(&self) -> Self {
        Connector {
            peer: self.peer.clone(),
            tally: self.tally.clone(),
            dial_timeout: self.dial_timeout,
        }
    }
}

/// A pooled connection: plain or TLS, counted.
type PoolIo<T> = Counted<MaybeTlsStream, T>;

impl<T> Connection for PoolIo<T> {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

type ConnectFuture<T> = Pin<Box<dyn Future<Output = Result<TokioIo<PoolIo<T>>, Error>> + Send>>;

impl<T: Clone + Send + Sync + 'static> tower_service::Service<Uri> for Connector<T> {
    type Response = TokioIo<PoolIo<T>>;
    type Error = Error;
    type Future = ConnectFuture<T>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> ConnectFuture<T> {
        let this = self.clone();
        Box::pin(async move {
            let tcp = tokio::time::timeout(this.dial_timeout, this.peer.dial())
                .await
                .map_err(|_| Error::ConnectTimeout)??;
            let io = this.peer.secure(tcp).await?;
            Ok(TokioIo::new(Counted::new(io, this.tally)))
        })
    }
}

/// Connections to one peer shared by many callers (see the module doc).
pub struct Pool<T> {
    client: Client<Connector<T>, Full<Bytes>>,
    gate: Semaphore,
    timeout: Duration,
}

impl<T> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("free", &self.gate.available_permits())
            .finish()
    }
}

impl<T: Tally + Clone + Send + Sync + Unpin + 'static> Pool<T> {
    /// A pool of connections to `peer`, their bytes counted into `tally`.
    pub fn new(peer: Peer, tally: Option<T>, limits: PoolLimits) -> Self {
        let connector = Connector {
            peer: Arc::new(peer),
            tally,
            dial_timeout: limits.dial_timeout,
        };
        let client = Client::builder(TokioExecutor::new())
            .http1_max_buf_size(MAX_BUF)
            .pool_max_idle_per_host(limits.max_conns)
            .pool_idle_timeout(limits.idle)
            .build(connector);
        Pool {
            client,
            gate: Semaphore::new(limits.max_conns),
            timeout: limits.timeout,
        }
    }

    /// Waits for a slot, sends `req` (its URI absolute) and reads the
    /// answer up to `limit` bytes, within the pool's timeout. Each step's
    /// state takes the place of the one before (as [`super::Conn::send`]).
    pub fn send(
        &self,
        mut req: Request<Full<Bytes>>,
        limit: usize,
    ) -> impl Future<Output = Result<Answer, Error>> + '_ {
        identify(&mut req);
        let timeout = self.timeout;
        self.gate
            .acquire()
            .map_err(|_| Error::Closed)
            .and_then(move |slot| {
                let call = self
                    .client
                    .request(req)
                    .map_err(Error::Pool)
                    .and_then(move |resp| read(resp, limit))
                    // The slot is held until the answer is read.
                    .map_ok(move |answer| {
                        drop(slot);
                        answer
                    });
                tokio::time::timeout(timeout, call)
                    .map(move |r| r.unwrap_or(Err(Error::Timeout(timeout))))
            })
    }
}
