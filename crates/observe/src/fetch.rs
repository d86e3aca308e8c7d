//! One HTTP(S) GET of a metrics endpoint, on a connection of its own, with
//! a size limit; the caller bounds it in time. What a server said when it
//! refused is kept for the warning.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::rustls::ClientConfig;

use crate::target::Endpoint;

/// Largest answer read (a Sensu backend's exposition is ~250 KB).
pub const MAX_BODY: usize = 32 << 20;

/// What a GET brought back.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

/// GETs `url` with the endpoint's headers; `tls` for `https://`.
pub async fn get(
    ep: &Endpoint,
    url: &str,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<Answer, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    let https = uri.scheme_str() == Some("https");
    let host = uri.host().ok_or("no host in the URL")?.to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let tcp = TcpStream::connect((bare.as_str(), port))
        .await
        .map_err(|e| format!("connect {host}:{port}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let path = uri
        .path_and_query()
        .map_or("/".to_string(), |p| p.as_str().to_string());
    let mut req = http::Request::get(path)
        .header(http::header::HOST, format!("{host}:{port}"))
        .header(
            http::header::USER_AGENT,
            concat!("agent-sim/", env!("CARGO_PKG_VERSION")),
        )
        .header(
            http::header::ACCEPT,
            "text/plain;version=0.0.4, application/json;q=0.5",
        );
    for (k, v) in &ep.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("request: {e}"))?;
    if https {
        let config = tls.ok_or("https:// without TLS settings")?.clone();
        let name = ep.server_name.clone().unwrap_or(bare);
        let server_name = rustls_pki_types::ServerName::try_from(name.clone())
            .map_err(|e| format!("server name {name:?}: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        exchange(TokioIo::new(stream), req).await
    } else {
        exchange(TokioIo::new(tcp), req).await
    }
}

async fn exchange<IO>(io: IO, req: http::Request<Empty<Bytes>>) -> Result<Answer, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let driver = tokio::spawn(conn);
    let result = async {
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok(Answer { status, body })
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn gets_a_body_with_the_endpoints_headers() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap();
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nup 1\n")
                .await
                .unwrap();
            head
        });
        let mut ep = Endpoint::url(format!("http://{addr}/metrics"));
        ep.headers.push(("X-Consul-Token".into(), "t0k".into()));
        let a = get(&ep, &ep.url.clone(), None).await.unwrap();
        assert_eq!((a.status, &a.body[..]), (200, &b"up 1\n"[..]));
        let head = server.await.unwrap();
        assert!(head.starts_with("GET /metrics HTTP/1.1"), "{head}");
        assert!(
            head.to_ascii_lowercase().contains("x-consul-token: t0k"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_closed_port_says_so() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let ep = Endpoint::url(format!("http://{addr}/metrics"));
        let e = get(&ep, &ep.url.clone(), None).await.unwrap_err();
        assert!(e.starts_with("connect 127.0.0.1:"), "{e}");
    }
}
