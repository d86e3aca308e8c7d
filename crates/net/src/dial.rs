//! TCP dialing from an optional source address.
//!
//! With a source address the socket sets `IP_BIND_ADDRESS_NO_PORT` (Linux) so
//! the kernel picks the source port at connect time: ports are then shared
//! across destinations instead of reserved at bind time, and each
//! (source ip, destination ip:port) pair gets the whole ephemeral range.
//!
//! [`MaybeTlsStream`] is the dialed socket after an optional TLS handshake
//! (the client config comes from [`crate::tls`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;

/// Connects to `addr`, from `bind` if given, with `TCP_NODELAY` set.
pub async fn dial(addr: SocketAddr, bind: Option<IpAddr>) -> io::Result<TcpStream> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(ip) = bind {
        #[cfg(target_os = "linux")]
        set_bind_address_no_port(&socket);
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_bind_address_no_port(socket: &TcpSocket) {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: a valid open socket fd, a pointer to a live c_int and its size.
    // Failure only means the kernel reserves the port at bind time.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// A short, stable error-kind name for a dial failure (for error counters).
pub fn dial_error_kind(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connect_refused",
        io::ErrorKind::TimedOut => "connect_timeout",
        io::ErrorKind::AddrNotAvailable => "connect_addr_unavailable",
        io::ErrorKind::AddrInUse => "connect_addr_in_use",
        io::ErrorKind::ConnectionReset => "connect_reset",
        _ if e.raw_os_error() == Some(libc::EMFILE) => "connect_too_many_files",
        _ if matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ENOMEM)) => "connect_no_buffers",
        _ => "connect_other",
    }
}

/// A plaintext or TLS socket: `P` the plain one, `T` the TLS stream over it
/// (the client's or the server's side of rustls).
pub enum MaybeTls<P, T> {
    /// Plain TCP.
    Plain(P),
    /// TLS over TCP (boxed: the rustls state is large and plain sessions
    /// should not pay for it).
    Tls(Box<T>),
}

/// A plaintext or TLS client socket over `S` (TCP, or a TCP socket with
/// kernel receive timestamps, [`crate::StampedTcp`]).
pub type MaybeTlsStream<S = TcpStream> = MaybeTls<S, TlsStream<S>>;

impl<P, T> std::fmt::Debug for MaybeTls<P, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MaybeTls::Plain(_) => "MaybeTls::Plain",
            MaybeTls::Tls(_) => "MaybeTls::Tls",
        })
    }
}

impl<P, T> AsyncRead for MaybeTls<P, T>
where
    P: AsyncRead + Unpin,
    T: AsyncRead + Unpin,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<P, T> AsyncWrite for MaybeTls<P, T>
where
    P: AsyncWrite + Unpin,
    T: AsyncWrite + Unpin,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dials_from_a_chosen_loopback_source() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move { listener.accept().await.unwrap().1 });
        let s = dial(addr, Some("127.0.0.2".parse().unwrap()))
            .await
            .unwrap();
        assert_eq!(s.local_addr().unwrap().ip().to_string(), "127.0.0.2");
        assert_eq!(accept.await.unwrap().ip().to_string(), "127.0.0.2");
    }

    #[tokio::test]
    async fn refused_dial_has_a_kind() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let e = dial(addr, None).await.unwrap_err();
        assert_eq!(dial_error_kind(&e), "connect_refused");
    }
}
