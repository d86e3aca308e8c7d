//! Syscalls gathered: [`Coalesced`] wraps a socket and sends what was
//! written since the last flush in one write, so a protocol that writes a
//! frame's header and its body apart (the `yamux` crate does) costs one
//! syscall and one TCP segment per flush, not one per piece, as
//! hashicorp's yamux (behind a `bufio.Writer`) sends them; and a read
//! smaller than [`READ_CHUNK`] (a frame's 12-byte header) takes up to that
//! much from the socket, so the body that came with it is read from
//! memory, not by another syscall.
//!
//! Each buffer is allocated while it holds bytes and given back once
//! emptied, so an idle connection keeps none.
//!
//! What it is not: no timer. Bytes wait only for the writer's own flush
//! (which every caller must make, as with any buffered writer), and a
//! write of at least [`DIRECT`] bytes into an empty buffer goes straight
//! through.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A write this large into an empty buffer is not copied.
pub const DIRECT: usize = 16 * 1024;
/// A smaller read takes this much from the socket at most.
pub const READ_CHUNK: usize = 4096;

/// A socket whose writes wait for the next flush.
#[derive(Debug)]
pub struct Coalesced<S> {
    io: S,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    sent: usize,
    /// Bytes read from the socket and not yet taken.
    rbuf: Vec<u8>,
    /// Bytes of `rbuf` already taken.
    taken: usize,
}

impl<S> Coalesced<S> {
    /// Gathers `io`'s writes until each flush.
    pub fn new(io: S) -> Self {
        Coalesced {
            io,
            buf: Vec::new(),
            sent: 0,
            rbuf: Vec::new(),
            taken: 0,
        }
    }

    /// Bytes waiting for a flush.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.sent
    }
}

impl<S: AsyncWrite + Unpin> Coalesced<S> {
    /// Writes out what waits; `Ready(Ok)` once nothing does.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.sent = 0;
        // Given back: an idle connection keeps no buffer (one allocation
        // a flush costs less than the syscall it saves).
        self.buf = Vec::new();
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesced<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.rbuf.is_empty() {
            if buf.remaining() >= READ_CHUNK {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            let mut chunk = vec![0; READ_CHUNK];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            chunk.truncate(n);
            this.rbuf = chunk;
            this.taken = 0;
        }
        let left = &this.rbuf[this.taken..];
        let n = left.len().min(buf.remaining());
        buf.put_slice(&left[..n]);
        this.taken += n;
        if this.taken == this.rbuf.len() {
            this.rbuf = Vec::new();
            this.taken = 0;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesced<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.pending() + data.len() > DIRECT {
            ready!(this.poll_drain(cx))?;
        }
        if this.buf.is_empty() && data.len() >= DIRECT {
            return Pin::new(&mut this.io).poll_write(cx, data);
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A socket that counts its writes and can refuse to take more.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        /// Bytes a write takes at most (0: any).
        take: usize,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = if self.take == 0 {
                data.len()
            } else {
                data.len().min(self.take)
            };
            self.writes.push(data[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_header_and_its_body_go_out_in_one_write_at_the_flush() {
        let mut c = Coalesced::new(Recorder::default());
        c.write_all(&[0; 12]).await.unwrap();
        c.write_all(&[1; 221]).await.unwrap();
        assert!(c.io.writes.is_empty(), "nothing before the flush");
        assert_eq!(c.pending(), 233);
        c.flush().await.unwrap();
        assert_eq!(c.io.writes.len(), 1);
        assert_eq!(c.io.writes[0].len(), 233);
        assert_eq!(&c.io.writes[0][..12], &[0; 12]);
        assert_eq!(c.pending(), 0);
    }

    #[tokio::test]
    async fn short_writes_resume_and_large_ones_pass_through() {
        let mut c = Coalesced::new(Recorder {
            take: 100,
            ..Recorder::default()
        });
        c.write_all(&[7; 250]).await.unwrap();
        c.flush().await.unwrap();
        let lens: Vec<usize> = c.io.writes.iter().map(Vec::len).collect();
        assert_eq!(lens, [100, 100, 50], "the socket's short writes resumed");
        let mut c = Coalesced::new(Recorder::default());
        c.write_all(&[1; 10]).await.unwrap();
        c.write_all(&vec![2; DIRECT]).await.unwrap();
        // The small one went out first, then the large one uncopied.
        let lens: Vec<usize> = c.io.writes.iter().map(Vec::len).collect();
        assert_eq!(lens, [10, DIRECT]);
        assert_eq!(c.buf.capacity(), 0, "an idle connection keeps no buffer");
        c.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn a_header_read_takes_its_body_along_and_keeps_nothing_after() {
        let (a, mut b) = tokio::io::duplex(8192);
        let mut c = Coalesced::new(a);
        let frame: Vec<u8> = (0..233u32).map(|i| i as u8).collect();
        b.write_all(&frame).await.unwrap();
        let mut header = [0; 12];
        c.read_exact(&mut header).await.unwrap();
        assert_eq!(&header[..], &frame[..12]);
        assert_eq!(c.rbuf.len() - c.taken, 221, "the body came with it");
        let mut body = vec![0; 221];
        c.read_exact(&mut body).await.unwrap();
        assert_eq!(&body[..], &frame[12..]);
        assert_eq!(c.rbuf.capacity(), 0, "nothing kept once taken");
        // The end of the stream reads as the end.
        drop(b);
        assert_eq!(c.read(&mut header).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn reads_pass_through() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut c = Coalesced::new(a);
        b.write_all(b"hello").await.unwrap();
        let mut got = [0; 5];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        c.write_all(b"back").await.unwrap();
        c.flush().await.unwrap();
        let mut back = [0; 4];
        b.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"back");
    }
}
