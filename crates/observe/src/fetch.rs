//! One HTTP(S) GET of a metrics endpoint, on a connection of its own (the
//! project's HTTP/1 client), with a size limit; the caller bounds it in
//! time. What a server said when it refused is kept for the warning.

use std::sync::Arc;

use agent_sim_net::http::{Answer, Conn, Dest, Peer};
use bytes::Bytes;
use http_body_util::Empty;
use rustls_pki_types::ServerName;
use tokio_rustls::rustls::ClientConfig;

use crate::ObserveError;
use crate::target::Endpoint;

/// Largest answer read (a Sensu backend's exposition is ~250 KB).
pub const MAX_BODY: usize = 32 << 20;

/// GETs `url` with the endpoint's headers; `tls` for `https://`. Any
/// status is an answer; the caller judges it.
pub async fn get(
    ep: &Endpoint,
    url: &str,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<Answer, ObserveError> {
    let uri: http::Uri = url.parse().map_err(ObserveError::Url)?;
    let https = uri.scheme_str() == Some("https");
    let host = uri.host().ok_or(ObserveError::NoHost)?;
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = http::Request::get(path)
        .header(http::header::HOST, format!("{host}:{port}"))
        .header(
            http::header::ACCEPT,
            "text/plain;version=0.0.4, application/json;q=0.5",
        );
    for (k, v) in &ep.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(agent_sim_net::http::Error::from)?;
    let tls = if https {
        let config = tls.ok_or(ObserveError::NoTls)?.clone();
        let name = ep.server_name.clone().unwrap_or_else(|| bare.to_string());
        let server_name = ServerName::try_from(name.clone())
            .map_err(|source| ObserveError::ServerName { name, source })?;
        Some((tokio_rustls::TlsConnector::from(config), server_name))
    } else {
        None
    };
    let peer = Peer {
        dest: Dest::Host(bare.to_string(), port),
        bind: None,
        tls,
    };
    let io = peer.open_with(|tcp| tcp).await?;
    // Dropped after the answer: its driver task ends with it.
    let mut conn = Conn::handshake(io).await?;
    Ok(conn.send(req, MAX_BODY).await?)
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
        assert_eq!((a.status.as_u16(), &a.body[..]), (200, &b"up 1\n"[..]));
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
        let e = get(&ep, &ep.url.clone(), None)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("connect 127.0.0.1:"), "{e}");
    }
}
