//! Byte counting on a socket: [`Counted`] wraps any async socket and tells
//! a [`Tally`] how many bytes each read and each write moved.
//!
//! What it is not: no metrics; the caller's tally decides where the numbers
//! go (an atomic add per read and per write, nothing without a tally).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where a connection's byte counts go.
pub trait Tally {
    /// `n` bytes were read.
    fn read(&self, n: u64);
    /// `n` bytes were written.
    fn wrote(&self, n: u64);
}

/// A socket whose bytes in and out are counted into an optional tally.
#[derive(Debug)]
pub struct Counted<S, T> {
    io: S,
    tally: Option<T>,
}

impl<S, T> Counted<S, T> {
    /// Counts `io`'s bytes into `tally` (none: not counted).
    pub fn new(io: S, tally: Option<T>) -> Self {
        Counted { io, tally }
    }
}

impl<S: AsyncRead + Unpin, T: Tally + Unpin> AsyncRead for Counted<S, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(t)) = (&r, &self.tally) {
            t.read((buf.filled().len() - before) as u64);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin, T: Tally + Unpin> AsyncWrite for Counted<S, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(t)) = (&r, &self.tally) {
            t.wrote(*n as u64);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Bytes read and written, summed.
    #[derive(Clone, Default)]
    pub(crate) struct Sums(Arc<(AtomicU64, AtomicU64)>);

    impl Sums {
        pub(crate) fn totals(&self) -> (u64, u64) {
            (
                self.0.0.load(Ordering::Relaxed),
                self.0.1.load(Ordering::Relaxed),
            )
        }
    }

    impl Tally for Sums {
        fn read(&self, n: u64) {
            self.0.0.fetch_add(n, Ordering::Relaxed);
        }
        fn wrote(&self, n: u64) {
            self.0.1.fetch_add(n, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn reads_and_writes_are_counted() {
        let (a, mut b) = tokio::io::duplex(64);
        let sums = Sums::default();
        let mut a = Counted::new(a, Some(sums.clone()));
        a.write_all(b"hello").await.unwrap();
        b.write_all(b"hi").await.unwrap();
        let mut got = [0u8; 2];
        a.read_exact(&mut got).await.unwrap();
        assert_eq!(sums.totals(), (2, 5));
    }
}
