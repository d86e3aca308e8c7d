//! The WebSocket upgrade of an agent session (RFC 6455 §4.1, client side).
//!
//! tungstenite's own client handshake reads the backend's answer into a
//! 4 KiB buffer and hands that buffer, capacity and all, to the WebSocket as
//! its read buffer: 4 KiB kept for the whole life of every session, more than
//! half of what a session costs otherwise. Here the request is written with
//! tungstenite's request writer and the answer parsed with its parser, but
//! read into a buffer that is dropped after the upgrade: the WebSocket gets
//! only the bytes that followed the answer (usually none) and allocates its
//! read buffer at the size [`crate::session::ws_config`] sets.
//!
//! Failures are tungstenite's own errors, as its handshake would return them
//! (a status other than 101 is `Error::Http` with the bytes that came after
//! the head as the body), so that the session reports them alike.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::handshake::client::{Response, generate_request};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::handshake::machine::TryParse as _;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Error};

/// Most bytes of an answer's head (status line and headers) read before
/// the upgrade fails: a Sensu backend's is ~200 bytes.
pub const MAX_ANSWER_HEAD: usize = 16 * 1024;

/// First capacity of the buffer the answer is read into (grown as needed up
/// to [`MAX_ANSWER_HEAD`], dropped after the upgrade).
const ANSWER_BUFFER: usize = 512;

/// Sends the upgrade `request` on `stream` and reads the answer; a 101 with
/// the right `Sec-WebSocket-Accept` gives the WebSocket (configured with
/// `config`) and the answer.
pub async fn upgrade<S>(
    mut stream: S,
    request: http::Request<()>,
    config: WebSocketConfig,
) -> Result<(WebSocketStream<S>, Response), Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (bytes, key) = generate_request(request)?;
    stream.write_all(&bytes).await?;
    stream.flush().await?;
    drop(bytes);
    let mut buf = Vec::with_capacity(ANSWER_BUFFER);
    let (head, answer) = loop {
        if buf.len() >= MAX_ANSWER_HEAD {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the upgrade answer's head is over {MAX_ANSWER_HEAD} bytes"),
            )));
        }
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity().min(MAX_ANSWER_HEAD - buf.len()));
        }
        if stream.read_buf(&mut buf).await? == 0 {
            // The connection ended before a whole answer came.
            return Err(Error::Protocol(ProtocolError::HandshakeIncomplete));
        }
        if let Some(parsed) = Response::try_parse(&buf)? {
            break parsed;
        }
    };
    // Exactly the bytes after the head: no spare capacity kept.
    let tail = buf[head..].to_vec();
    drop(buf);
    if answer.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        // A refusal: the bytes after the head are (the start of) its body.
        return Err(Error::Http(Box::new(answer.map(|_| Some(tail)))));
    }
    verify(&answer, &key)?;
    // After the head: the first WebSocket bytes, if the backend sent any.
    let ws = WebSocketStream::from_partially_read(stream, tail, Role::Client, Some(config)).await;
    Ok((ws, answer))
}

/// RFC 6455 §4.1 checks of a 101 answer to a request with `key`.
fn verify(answer: &Response, key: &str) -> Result<(), Error> {
    let header = |name: &str| answer.headers().get(name).and_then(|v| v.to_str().ok());
    if !header("Upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket")) {
        return Err(Error::Protocol(
            ProtocolError::MissingUpgradeWebSocketHeader,
        ));
    }
    if !header("Connection").is_some_and(|v| {
        v.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
    }) {
        return Err(Error::Protocol(
            ProtocolError::MissingConnectionUpgradeHeader,
        ));
    }
    if header("Sec-WebSocket-Accept") != Some(derive_accept_key(key.as_bytes()).as_str()) {
        return Err(Error::Protocol(
            ProtocolError::SecWebSocketAcceptKeyMismatch,
        ));
    }
    if header("Sec-WebSocket-Protocol").is_some() {
        // This agent asks for no subprotocol.
        return Err(Error::Protocol(
            ProtocolError::SecWebSocketSubProtocolError(
                tungstenite::error::SubProtocolError::ServerSentSubProtocolNoneRequested,
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

    use super::*;

    /// Reads the request's head on the backend's end; its
    /// `Sec-WebSocket-Key` and the whole head.
    async fn read_request(backend: &mut DuplexStream) -> (String, String) {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(backend.read(&mut b).await.unwrap(), 1, "request cut short");
            head.push(b[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let key = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(": ")?;
                name.eq_ignore_ascii_case("sec-websocket-key")
                    .then(|| value.to_owned())
            })
            .expect("a key");
        (key, head)
    }

    /// Runs the upgrade against a backend that answers `answer(key)`.
    async fn against(
        answer: impl FnOnce(&str) -> Vec<u8>,
    ) -> (
        Result<(WebSocketStream<DuplexStream>, Response), Error>,
        String,
        DuplexStream,
    ) {
        let (agent, mut backend) = tokio::io::duplex(64 * 1024);
        let mut req = "ws://127.0.0.1:8081/agentd".into_client_request().unwrap();
        req.headers_mut()
            .insert("Sensu-AgentName", http::HeaderValue::from_static("a-1"));
        let up = tokio::spawn(upgrade(agent, req, WebSocketConfig::default()));
        let (key, head) = read_request(&mut backend).await;
        backend.write_all(&answer(&key)).await.unwrap();
        (up.await.unwrap(), head, backend)
    }

    fn switching(key: &str, connection: &str) -> String {
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: {connection}\r\n\
             Sec-WebSocket-Accept: {}\r\n\r\n",
            derive_accept_key(key.as_bytes())
        )
    }

    #[tokio::test]
    async fn an_upgrade_keeps_the_frames_that_came_with_the_answer() {
        let (r, head, _backend) = against(|key| {
            // The answer and a first binary frame "hi" in one write.
            let mut a = switching(key, "Upgrade").into_bytes();
            a.extend_from_slice(&[0x82, 0x02, b'h', b'i']);
            a
        })
        .await;
        assert!(head.starts_with("GET /agentd HTTP/1.1\r\n"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("sensu-agentname: a-1\r\n"),
            "{head}"
        );
        let (mut ws, answer) = r.unwrap();
        assert_eq!(answer.status(), 101);
        let m = ws.next().await.unwrap().unwrap();
        assert_eq!(m, Message::Binary(b"hi".to_vec().into()));
    }

    #[tokio::test]
    async fn connection_may_list_upgrade_among_other_tokens() {
        let (r, _, _b) = against(|key| switching(key, "keep-alive, Upgrade").into_bytes()).await;
        assert!(r.is_ok());
    }

    #[tokio::test]
    async fn a_refusal_is_an_http_error_with_the_backends_words() {
        let (r, _, _b) = against(|_| {
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 22\r\n\r\nbad username/password\n"
                .to_vec()
        })
        .await;
        let Err(Error::Http(resp)) = r else {
            panic!("not an HTTP error")
        };
        assert_eq!(resp.status(), 401);
        assert_eq!(
            resp.body().as_deref(),
            Some(&b"bad username/password\n"[..])
        );
    }

    #[tokio::test]
    async fn a_wrong_accept_key_or_missing_headers_fail_the_upgrade() {
        let (r, _, _b) = against(|_| switching("not the key", "Upgrade").into_bytes()).await;
        assert!(matches!(
            r,
            Err(Error::Protocol(
                ProtocolError::SecWebSocketAcceptKeyMismatch
            ))
        ));
        let (r, _, _b) = against(|key| switching(key, "keep-alive").into_bytes()).await;
        assert!(matches!(
            r,
            Err(Error::Protocol(
                ProtocolError::MissingConnectionUpgradeHeader
            ))
        ));
        let (r, _, _b) = against(|key| {
            switching(key, "Upgrade")
                .replace("Upgrade: websocket", "Upgrade: h2c")
                .into_bytes()
        })
        .await;
        assert!(matches!(
            r,
            Err(Error::Protocol(
                ProtocolError::MissingUpgradeWebSocketHeader
            ))
        ));
    }

    #[tokio::test]
    async fn an_answer_cut_short_or_too_long_fails_the_upgrade() {
        let (agent, mut backend) = tokio::io::duplex(64 * 1024);
        let req = "ws://127.0.0.1:8081/".into_client_request().unwrap();
        let up = tokio::spawn(upgrade(agent, req, WebSocketConfig::default()));
        read_request(&mut backend).await;
        backend.write_all(b"HTTP/1.1 101 Swi").await.unwrap();
        drop(backend);
        assert!(matches!(
            up.await.unwrap(),
            Err(Error::Protocol(ProtocolError::HandshakeIncomplete))
        ));

        let (r, _, _b) = against(|_| {
            // One endless header (many short ones meet the parser's limit
            // on their number first, also an error).
            let mut a = b"HTTP/1.1 101 Switching Protocols\r\nX-Filler: ".to_vec();
            a.resize(MAX_ANSWER_HEAD + 100, b'x');
            a
        })
        .await;
        let Err(Error::Io(e)) = r else {
            panic!("not an I/O error")
        };
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("over 16384 bytes"), "{e}");
    }
}
