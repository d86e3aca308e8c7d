//! TCP listeners for the embedded targets.

use std::io;
use std::net::SocketAddr;

use tokio::net::TcpListener;

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
