//! TCP dialing from an optional source address.
//!
//! With a source address the socket sets `IP_BIND_ADDRESS_NO_PORT` (Linux) so
//! the kernel picks the source port at connect time: ports are then shared
//! across destinations instead of reserved at bind time, and each
//! (source ip, destination ip:port) pair gets the whole ephemeral range.

use std::io;
use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpSocket, TcpStream};

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
        _ if e.raw_os_error() == Some(24) => "connect_too_many_files",
        _ => "connect_other",
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
