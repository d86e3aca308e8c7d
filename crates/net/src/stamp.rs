//! Kernel receive timestamps: a TCP client socket ([`StampedTcp`]) whose
//! reads go through `recvmsg` with `SO_TIMESTAMPNS` (Linux), so the time
//! the kernel received the bytes of the latest read is known ([`RxStamp`]);
//! and a UDP socket's datagrams read with the time each arrived
//! ([`stamp_udp`], [`recv_from_stamped`]).
//!
//! A protocol reader that decodes a message reads the stamp then: it is the
//! kernel time of the last bytes read before the decode, so never later
//! than the decode itself, and the gap between the two is the simulator's
//! own delay (runtime queueing, decode). Where the kernel gives no stamp
//! (not Linux, or the option refused) [`RxStamp::get`] stays `None` and the
//! caller falls back to user-space time.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UdpSocket};

/// The kernel receive time of the latest bytes read from a [`StampedTcp`]
/// (shared with whoever decodes them; cheap to clone).
#[derive(Clone, Debug, Default)]
pub struct RxStamp(Arc<AtomicU64>);

impl RxStamp {
    /// Wall-clock time of the latest stamped read, if the kernel stamps.
    pub fn get(&self) -> Option<SystemTime> {
        stamp_time(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::Relaxed);
    }

    /// The latest stamp as a tokio instant: `now` minus how long ago the
    /// kernel received the bytes (never after `now`). `None` without one.
    pub fn instant(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        Some(stamp_instant(self.get()?, now))
    }
}

/// A stamp as `recvmsg` gave it, in nanoseconds since the epoch (0: none).
fn stamp_time(ns: u64) -> Option<SystemTime> {
    (ns > 0).then(|| UNIX_EPOCH + Duration::from_nanos(ns))
}

/// Kernel stamp `at` as a tokio instant: `now` minus how long ago the
/// kernel took it (never after `now`, also when the wall clock has since
/// stepped back past it).
pub fn stamp_instant(at: SystemTime, now: tokio::time::Instant) -> tokio::time::Instant {
    let ago = SystemTime::now().duration_since(at).unwrap_or_default();
    now.checked_sub(ago).unwrap_or(now)
}

/// A TCP stream whose reads record kernel receive timestamps in an
/// [`RxStamp`]; writes go straight to the socket.
#[derive(Debug)]
pub struct StampedTcp {
    inner: TcpStream,
    stamp: RxStamp,
    /// The kernel accepted `SO_TIMESTAMPNS`.
    enabled: bool,
}

impl StampedTcp {
    /// Turns on receive timestamps for `tcp` (when the kernel allows).
    pub fn new(tcp: TcpStream) -> Self {
        let enabled = enable(&tcp);
        StampedTcp {
            inner: tcp,
            stamp: RxStamp::default(),
            enabled,
        }
    }

    /// The stamp handle of this socket.
    pub fn stamp(&self) -> RxStamp {
        self.stamp.clone()
    }

    /// Whether reads are stamped by the kernel.
    pub fn enabled(&self) -> bool {
        self.enabled
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn enable(sock: &impl std::os::fd::AsRawFd) -> bool {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket descriptor, an int option of the right size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn enable<S>(_sock: &S) -> bool {
    false
}

/// Turns on kernel receive timestamps for a UDP socket's datagrams (where
/// the kernel allows; `false` otherwise: [`recv_from_stamped`] then gives
/// none).
pub fn stamp_udp(sock: &UdpSocket) -> bool {
    enable(sock)
}

/// One datagram into `buf`: its length, its sender, and the time the kernel
/// received it (`None` where the kernel does not stamp).
#[cfg(target_os = "linux")]
pub async fn recv_from_stamped(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, std::net::SocketAddr, Option<SystemTime>)> {
    sock.async_io(tokio::io::Interest::READABLE, || {
        let mut from = Sender::default();
        // SAFETY (of the call): `buf` is initialized bytes, writable whole.
        let (n, ns) = recvmsg_stamped(sock, buf.as_mut_ptr(), buf.len(), Some(&mut from))?;
        let from = from.addr().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "datagram from an unknown address family",
            )
        })?;
        Ok((n, from, stamp_time(ns)))
    })
    .await
}

/// One datagram into `buf` (no stamps off Linux).
#[cfg(not(target_os = "linux"))]
pub async fn recv_from_stamped(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, std::net::SocketAddr, Option<SystemTime>)> {
    let (n, from) = sock.recv_from(buf).await?;
    Ok((n, from, None))
}

/// A datagram's sender as `recvmsg` writes it.
#[cfg(target_os = "linux")]
struct Sender {
    addr: libc::sockaddr_storage,
    len: libc::socklen_t,
}

#[cfg(target_os = "linux")]
impl Default for Sender {
    #[allow(unsafe_code)]
    fn default() -> Self {
        Sender {
            // SAFETY: sockaddr_storage is plain data; all-zero is valid.
            addr: unsafe { std::mem::zeroed() },
            len: std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
        }
    }
}

#[cfg(target_os = "linux")]
impl Sender {
    /// The address, for IPv4 and IPv6 senders.
    #[allow(unsafe_code)]
    fn addr(&self) -> Option<std::net::SocketAddr> {
        use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
        let fits = |n: usize| self.len as usize >= n;
        match i32::from(self.addr.ss_family) {
            libc::AF_INET if fits(std::mem::size_of::<libc::sockaddr_in>()) => {
                // SAFETY: the family says sockaddr_in, and the kernel wrote
                // at least its size.
                let a: libc::sockaddr_in = unsafe {
                    std::ptr::read_unaligned((&self.addr as *const libc::sockaddr_storage).cast())
                };
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                Some(SocketAddrV4::new(ip, u16::from_be(a.sin_port)).into())
            }
            libc::AF_INET6 if fits(std::mem::size_of::<libc::sockaddr_in6>()) => {
                // SAFETY: as above, for sockaddr_in6.
                let a: libc::sockaddr_in6 = unsafe {
                    std::ptr::read_unaligned((&self.addr as *const libc::sockaddr_storage).cast())
                };
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                let port = u16::from_be(a.sin6_port);
                Some(SocketAddrV6::new(ip, port, a.sin6_flowinfo, a.sin6_scope_id).into())
            }
            _ => None,
        }
    }
}

/// One `recvmsg` into `buf`; stores the `SCM_TIMESTAMPNS` stamp if any.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn recv_stamped(tcp: &TcpStream, buf: &mut ReadBuf<'_>, stamp: &RxStamp) -> io::Result<usize> {
    // Not zeroed first (as tokio's own reads): the kernel writes the bytes,
    // and zeroing would touch every page of a large, mostly idle buffer.
    // SAFETY: only the first `n` bytes the kernel wrote are marked filled
    // (by the caller).
    let unfilled = unsafe { buf.unfilled_mut() };
    let (n, found) = recvmsg_stamped(tcp, unfilled.as_mut_ptr().cast(), unfilled.len(), None)?;
    // A read without a stamp (bytes queued before stamping was on) clears
    // it: a stale stamp would date these bytes too early.
    if n > 0 {
        stamp.set(found);
    }
    Ok(n)
}

/// One non-blocking `recvmsg` of at most `len` bytes to `ptr` (and the
/// sender into `from`, for a datagram): the bytes read and the
/// `SCM_TIMESTAMPNS` stamp in nanoseconds (0: none).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn recvmsg_stamped(
    sock: &impl std::os::fd::AsRawFd,
    ptr: *mut u8,
    len: usize,
    from: Option<&mut Sender>,
) -> io::Result<(usize, u64)> {
    let mut iov = libc::iovec {
        iov_base: ptr.cast(),
        iov_len: len,
    };
    // Room for one timespec control message, 8-byte aligned.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let mut from = from;
    if let Some(f) = from.as_deref_mut() {
        msg.msg_name = (&mut f.addr as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = f.len;
    }
    // SAFETY: the descriptor is a socket; iov points at `len` writable
    // bytes (the caller's), the control buffer at `control` and the name at
    // the sender's storage, all alive for the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(f) = from {
        f.len = msg.msg_namelen;
    }
    // SAFETY: walking the control messages the kernel wrote into `control`
    // with the libc macros, within `msg_controllen`.
    let mut found = 0;
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                let ns = (ts.tv_sec as u64)
                    .saturating_mul(1_000_000_000)
                    .saturating_add(ts.tv_nsec as u64);
                found = ns;
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, found))
}

impl AsyncRead for StampedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        #[cfg(target_os = "linux")]
        if this.enabled {
            loop {
                std::task::ready!(this.inner.poll_read_ready(cx))?;
                let asked = buf.remaining();
                // A read of less than asked has drained the socket (as
                // tokio's own reads take it): the closure then says
                // WouldBlock so that `try_io` clears the readiness it saw
                // *before* the read, and the next read waits for the next
                // readiness instead of costing a recvmsg that returns
                // EAGAIN. Cleared with that earlier tick, readiness that
                // came with bytes arriving after the read stays set; a
                // clear taken after the read would lose that wakeup and
                // leave those bytes unread until some later arrival.
                let mut drained = None;
                let r = this.inner.try_io(tokio::io::Interest::READABLE, || {
                    let n = recv_stamped(&this.inner, buf, &this.stamp)?;
                    if n > 0 && n < asked {
                        drained = Some(n);
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    Ok(n)
                });
                let r = match drained {
                    Some(n) => Ok(n),
                    None => r,
                };
                match r {
                    Ok(n) => {
                        // SAFETY: recvmsg wrote these `n` bytes.
                        #[allow(unsafe_code)]
                        unsafe {
                            buf.assume_init(n);
                        }
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StampedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// On loopback reads are stamped (once the kernel has switched
    /// timestamping on, which it does lazily for the first socket of a
    /// host: reads before that carry none and clear the stamp), and a stamp
    /// is never later than the moment its read returned.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn loopback_reads_carry_kernel_stamps_before_user_time() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            // Send once the client has stamping on (it speaks first).
            let mut hello = [0u8; 1];
            s.read_exact(&mut hello).await.unwrap();
            for i in 0..50u8 {
                s.write_all(&[i; 100]).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        });
        let mut c = StampedTcp::new(TcpStream::connect(addr).await.unwrap());
        assert!(c.enabled());
        c.write_all(&[8]).await.unwrap();
        let stamp = c.stamp();
        assert!(stamp.get().is_none());
        let (mut got, mut stamped, mut last_stamped) = (0, 0, false);
        let mut buf = [0u8; 4096];
        while got < 5000 {
            let n = c.read(&mut buf).await.unwrap();
            assert!(n > 0);
            let user = SystemTime::now();
            last_stamped = match stamp.get() {
                Some(kernel) => {
                    assert!(kernel <= user, "kernel {kernel:?} after user {user:?}");
                    stamped += 1;
                    true
                }
                None => false,
            };
            got += n;
        }
        assert!(stamped > 0 && last_stamped, "{stamped} stamped reads");
        server.await.unwrap();
    }

    /// Bytes that arrive while a read is returning are not left unread:
    /// a read of less than asked clears the socket's readiness only as it
    /// was before the read. Senders on one worker write small pieces while
    /// readers on the other drain them; then the senders stop, the
    /// connections stay open, and every reader must still get every byte
    /// (a lost wakeup would leave the last pieces in the socket).
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pieces_arriving_during_a_read_are_not_left_unread() {
        const CONNS: usize = 64;
        const PIECES: usize = 1000;
        const PIECE: usize = 40;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (done_tx, _) = tokio::sync::broadcast::channel::<()>(1);
        let senders = {
            let done_tx = done_tx.clone();
            tokio::spawn(async move {
                let mut held = Vec::new();
                for _ in 0..CONNS {
                    let (mut s, _) = l.accept().await.unwrap();
                    let mut done = done_tx.subscribe();
                    held.push(tokio::spawn(async move {
                        let mut hello = [0u8; 1];
                        s.read_exact(&mut hello).await.unwrap();
                        for i in 0..PIECES {
                            s.write_all(&[i as u8; PIECE]).await.unwrap();
                            tokio::task::yield_now().await;
                        }
                        // Open until the test ends: no EOF to wake a reader.
                        let _ = done.recv().await;
                    }));
                }
                held
            })
        };
        let mut readers = Vec::new();
        for _ in 0..CONNS {
            let mut c = StampedTcp::new(TcpStream::connect(addr).await.unwrap());
            readers.push(tokio::spawn(async move {
                c.write_all(&[1]).await.unwrap();
                let mut buf = [0u8; 4096];
                let mut got = 0;
                while got < PIECES * PIECE {
                    got += c.read(&mut buf).await.unwrap();
                }
                got
            }));
        }
        let all = async {
            for r in readers {
                assert_eq!(r.await.unwrap(), PIECES * PIECE);
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), all)
            .await
            .expect("every reader got every byte: none left waiting on a lost wakeup");
        let _ = done_tx.send(());
        for h in senders.await.unwrap() {
            h.await.unwrap();
        }
    }

    /// A datagram is read with its sender and, once stamping is on, the
    /// kernel's time of arrival, never later than the read.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn datagrams_carry_their_sender_and_kernel_stamps() {
        let rx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        assert!(stamp_udp(&rx));
        let tx = UdpSocket::bind("127.0.0.2:0").await.unwrap();
        let mut stamped = 0;
        let mut buf = [0u8; 64];
        for i in 0..20u8 {
            tx.send_to(&[i; 10], rx.local_addr().unwrap())
                .await
                .unwrap();
            let (n, from, at) = recv_from_stamped(&rx, &mut buf).await.unwrap();
            assert_eq!((n, &buf[..n]), (10, &[i; 10][..]));
            assert_eq!(from, tx.local_addr().unwrap());
            if let Some(at) = at {
                assert!(at <= SystemTime::now());
                stamped += 1;
            }
        }
        assert!(stamped > 0, "no datagram stamped");
    }
}
