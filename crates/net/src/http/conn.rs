//! One kept-alive HTTP/1 connection held by its caller: hyper's sender,
//! and the connection's driver on a task of its own (the one task per
//! connection; aborted when the connection is dropped).

use std::future::{Future, poll_fn};
use std::task::{Poll, ready};

use futures_util::TryFutureExt as _;
use http::Request;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;

use super::{Answer, BoxError, Error, MAX_BUF, identify, read};

/// A kept-alive HTTP/1 connection sending bodies of type `B`.
pub struct Conn<B> {
    send: http1::SendRequest<B>,
    driver: JoinHandle<()>,
}

impl<B> std::fmt::Debug for Conn<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("closed", &self.send.is_closed())
            .finish()
    }
}

impl<B> Drop for Conn<B> {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl<B> Conn<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// HTTP/1 on an open socket (plain or TLS, counted or not).
    pub async fn handshake<S>(io: S) -> Result<Self, Error>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (send, conn) = http1::Builder::new()
            .max_buf_size(MAX_BUF)
            .handshake(TokioIo::new(io))
            .await
            .map_err(Error::Handshake)?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { send, driver })
    }

    /// Sends `req` once the connection is ready and reads the answer up to
    /// `limit` bytes. After an [`Error::Exchange`] or a body error the
    /// connection is of no further use. Each step's state takes the place
    /// of the one before (the request is not kept while the answer is
    /// awaited): a long poll holds this future for minutes.
    pub fn send(
        &mut self,
        mut req: Request<B>,
        limit: usize,
    ) -> impl Future<Output = Result<Answer, Error>> + '_ {
        identify(&mut req);
        let mut sender = Some(&mut self.send);
        let ready = poll_fn(move |cx| {
            let Some(s) = sender.as_mut() else {
                return Poll::Ready(Err(Error::Closed));
            };
            ready!(s.poll_ready(cx)).map_err(Error::Exchange)?;
            Poll::Ready(sender.take().ok_or(Error::Closed))
        });
        ready
            .and_then(move |s| s.send_request(req).map_err(Error::Exchange))
            .and_then(move |resp| read(resp, limit))
    }
}
