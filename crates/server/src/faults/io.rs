//! Connection-level faults: [`FaultIo`] wraps an accepted TCP stream and
//! can be told, from any task, to drop it (FIN), reset it (RST) or stall it
//! (answer nothing, notice when the client leaves).
//!
//! Each wrapped connection has a [`ConnCtl`] (a kill switch and the waker of
//! whoever polls the stream); live connections of a target are listed in a
//! [`Registry`] so that a fault at a time can reach every one of them.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// What a connection has been told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kill {
    /// Carry on.
    None = 0,
    /// Close without an answer: reads see EOF, writes fail, FIN goes out.
    Drop = 1,
    /// Reset: `SO_LINGER` 0 and fail, so the close sends RST.
    Reset = 2,
    /// Answer nothing: writes are swallowed, reads discarded until the
    /// client leaves.
    Stall = 3,
}

impl Kill {
    fn from_u8(v: u8) -> Kill {
        match v {
            1 => Kill::Drop,
            2 => Kill::Reset,
            3 => Kill::Stall,
            _ => Kill::None,
        }
    }
}

/// The kill switch of one connection.
#[derive(Debug, Default)]
pub(crate) struct ConnCtl {
    kill: AtomicU8,
    waker: AtomicWaker,
}

impl ConnCtl {
    /// Tells the connection to `kill` (the first order wins) and wakes its
    /// owner; false if it already had an order.
    pub(crate) fn kill(&self, kill: Kill) -> bool {
        let set = self
            .kill
            .compare_exchange(0, kill as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        self.waker.wake();
        set
    }

    fn state(&self) -> Kill {
        Kill::from_u8(self.kill.load(Ordering::Acquire))
    }
}

/// Live connections of one target, reachable by a fault at a time.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Arc<ConnCtl>>>,
}

impl Registry {
    fn add(&self, ctl: Arc<ConnCtl>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, ctl);
        id
    }

    fn remove(&self, id: u64) {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// The connections live now.
    pub(crate) fn snapshot(&self) -> Vec<Arc<ConnCtl>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// How many connections are live.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A connection's place in a [`Registry`]; leaves it on drop.
#[derive(Debug)]
struct Listed {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

/// An accepted TCP stream that faults can drop, reset or stall.
#[derive(Debug)]
pub struct FaultIo {
    inner: TcpStream,
    /// `None` on a server without faults: every call passes through.
    ctl: Option<Arc<ConnCtl>>,
    /// Held for its drop, which takes the connection off the list (read
    /// only by `enlist`, which a server without Sensu lacks).
    #[cfg_attr(not(feature = "sensu"), allow(dead_code))]
    listed: Option<Listed>,
}

impl FaultIo {
    /// Wraps `inner` with no kill switch (a server without faults: passes
    /// through at no cost); its owner can still drop, reset or stall it.
    pub fn plain(inner: TcpStream) -> FaultIo {
        FaultIo {
            inner,
            ctl: None,
            listed: None,
        }
    }

    /// Wraps `inner` with a kill switch, unlisted (no fault at a time
    /// reaches it).
    pub(crate) fn armed(inner: TcpStream) -> FaultIo {
        FaultIo {
            inner,
            ctl: Some(Arc::default()),
            listed: None,
        }
    }

    /// Wraps `inner` and lists it in `registry` while it lives.
    pub(crate) fn listed(inner: TcpStream, registry: &Arc<Registry>) -> FaultIo {
        let ctl = Arc::new(ConnCtl::default());
        let id = registry.add(ctl.clone());
        FaultIo {
            inner,
            ctl: Some(ctl),
            listed: Some(Listed {
                registry: registry.clone(),
                id,
            }),
        }
    }

    /// Lists the connection in `registry` (once) while it lives.
    #[cfg(feature = "sensu")]
    pub(crate) fn enlist(&mut self, registry: &Arc<Registry>) {
        if self.listed.is_none() {
            let ctl = self.ctl.get_or_insert_with(Arc::default).clone();
            let id = registry.add(ctl);
            self.listed = Some(Listed {
                registry: registry.clone(),
                id,
            });
        }
    }

    /// The kill switch (for a fault decided later, e.g. inside a request).
    pub(crate) fn ctl(&self) -> Option<Arc<ConnCtl>> {
        self.ctl.clone()
    }

    /// The TCP stream.
    pub fn get_ref(&self) -> &TcpStream {
        &self.inner
    }

    /// Applies a kill order now (from the task that owns the stream).
    pub(crate) fn kill(&self, kill: Kill) {
        if let Some(ctl) = &self.ctl {
            ctl.kill(kill);
        }
        self.apply(kill);
    }

    /// Side effects on the socket itself: FIN at once for a drop, linger 0
    /// for a reset (the close then sends RST).
    fn apply(&self, kill: Kill) {
        let sock = socket2::SockRef::from(&self.inner);
        match kill {
            Kill::Drop => {
                let _ = sock.shutdown(std::net::Shutdown::Write);
            }
            Kill::Reset => {
                let _ = sock.set_linger(Some(Duration::ZERO));
            }
            Kill::Stall | Kill::None => {}
        }
    }

    /// Discards what the client sends until it leaves (EOF or error), the
    /// `limit` passes or `shutdown`: a stalled connection that notices its
    /// client giving up.
    pub(crate) async fn stall(mut self, limit: Duration, shutdown: &CancellationToken) {
        self.kill(Kill::Stall);
        let mut buf = [0u8; 512];
        let drain = async {
            while let Ok(n) = self.inner.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::select! {
            () = drain => {}
            () = tokio::time::sleep(limit) => {}
            () = shutdown.cancelled() => {}
        }
    }

    /// Reads what the client sent first (bounded), so that a drop sends FIN
    /// rather than the RST a close with unread data would send, then drops
    /// or resets the connection.
    pub(crate) async fn refuse(mut self, kill: Kill) {
        let mut buf = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_millis(500), self.inner.read(&mut buf)).await;
        self.kill(kill);
        if kill == Kill::Drop {
            // Let the FIN go out before the socket is closed; late bytes
            // are read away so the close stays a FIN.
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                while let Ok(n) = self.inner.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> Kill {
        let Some(ctl) = &self.ctl else {
            return Kill::None;
        };
        ctl.waker.register(cx.waker());
        let k = ctl.state();
        if k != Kill::None {
            self.apply(k);
        }
        k
    }
}

fn reset_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "connection reset (fault)")
}

impl AsyncRead for FaultIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.check(cx) {
            Kill::None => Pin::new(&mut self.inner).poll_read(cx, buf),
            Kill::Drop => Poll::Ready(Ok(())),
            Kill::Reset => Poll::Ready(Err(reset_error())),
            Kill::Stall => {
                // Discard until the client leaves; hand EOF or the error on.
                let mut scratch = [0u8; 512];
                loop {
                    let mut rb = ReadBuf::new(&mut scratch);
                    match Pin::new(&mut self.inner).poll_read(cx, &mut rb) {
                        Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                            return Poll::Ready(Ok(()));
                        }
                        Poll::Ready(Ok(())) => continue,
                        other => return other,
                    }
                }
            }
        }
    }
}

impl AsyncWrite for FaultIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.check(cx) {
            Kill::None => Pin::new(&mut self.inner).poll_write(cx, buf),
            Kill::Drop => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            Kill::Reset => Poll::Ready(Err(reset_error())),
            Kill::Stall => Poll::Ready(Ok(buf.len())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.check(cx) {
            Kill::None => Pin::new(&mut self.inner).poll_flush(cx),
            Kill::Reset => Poll::Ready(Err(reset_error())),
            Kill::Drop | Kill::Stall => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.check(cx) {
            Kill::None => Pin::new(&mut self.inner).poll_shutdown(cx),
            Kill::Reset => Poll::Ready(Err(reset_error())),
            Kill::Drop | Kill::Stall => Poll::Ready(Ok(())),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.check(cx) {
            Kill::None => Pin::new(&mut self.inner).poll_write_vectored(cx, bufs),
            Kill::Drop => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            Kill::Reset => Poll::Ready(Err(reset_error())),
            Kill::Stall => Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;
    use tokio::net::TcpListener;

    async fn pair(registry: &Arc<Registry>) -> (FaultIo, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        (FaultIo::listed(server, registry), client)
    }

    #[tokio::test]
    async fn a_drop_reaches_the_client_as_eof_and_a_reset_as_rst() {
        let reg = Arc::new(Registry::default());
        let (mut server, mut client) = pair(&reg).await;
        assert_eq!(reg.len(), 1);
        let ctl = server.ctl().unwrap();
        let reader = tokio::spawn(async move {
            let mut b = [0u8; 8];
            let r = server.read(&mut b).await;
            drop(server);
            r
        });
        assert!(ctl.kill(Kill::Drop));
        assert!(!ctl.kill(Kill::Reset), "the first order wins");
        assert_eq!(reader.await.unwrap().unwrap(), 0, "the owner sees EOF");
        let mut b = [0u8; 8];
        assert_eq!(client.read(&mut b).await.unwrap(), 0, "the client sees FIN");
        assert_eq!(reg.len(), 0, "dropped connections leave the registry");

        let (server, mut client) = pair(&reg).await;
        client.write_all(b"hello").await.unwrap();
        server.refuse(Kill::Reset).await;
        let e = client.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    }

    #[tokio::test]
    async fn a_stalled_connection_swallows_writes_and_ends_when_the_client_leaves() {
        let reg = Arc::new(Registry::default());
        let (mut server, client) = pair(&reg).await;
        server.ctl().unwrap().kill(Kill::Stall);
        server.write_all(b"never seen").await.unwrap();
        drop(client);
        let mut b = [0u8; 8];
        assert_eq!(server.read(&mut b).await.unwrap(), 0);
    }
}
