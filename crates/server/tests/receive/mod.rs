//! What the embedded backend does with bytes its clients sent, without a
//! socket: shared by the property tests (`tests/hostile.rs`, `mod
//! receive`) and the fuzz targets `sensu_server_frame` and
//! `consul_server_http` (`#[path = "../../crates/server/tests/receive/mod.rs"]`),
//! so that both drive the same code.

#![allow(dead_code)] // each includer (test file, fuzz target) uses a part

use std::io::Cursor;

use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_server::consul::{ApiRequest, ConsulState, ConsulTargetConfig, dispatch};
use agent_sim_server::sensu::{inbound, ws_config};
use http::Method;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket};

/// One agent message at the Sensu endpoint: `inbound::classify` (decode
/// and the backend's validation of a keepalive or event), both encodings.
pub fn agent_message(payload: &[u8]) {
    for enc in [Encoding::Protobuf, Encoding::Json] {
        let _ = inbound::classify(payload, enc);
    }
}

/// Raw bytes at the Sensu endpoint: tungstenite in server role with the
/// endpoint's config, each message (at most 64) then as [`agent_message`].
pub fn endpoint_socket(bytes: &[u8]) {
    let mut ws =
        WebSocket::from_raw_socket(Cursor::new(bytes.to_vec()), Role::Server, Some(ws_config()));
    for _ in 0..64 {
        let Ok(m) = ws.read() else {
            return;
        };
        assert!(m.len() <= codec::MAX_MESSAGE);
        agent_message(&m.into_data());
    }
}

/// The write routes of the HTTP API (path, query) a request body is sent to.
pub const WRITE_ROUTES: &[(&str, &str)] = &[
    ("/v1/catalog/register", ""),
    ("/v1/catalog/deregister", ""),
    ("/v1/txn", ""),
    ("/v1/session/create", ""),
    ("/v1/config", ""),
    ("/v1/config", "cas=0"),
    ("/v1/config", "cas=1"),
    ("/v1/kv/app/a", ""),
    ("/v1/kv/app/b", "cas=0&flags=3"),
    ("/v1/kv/app/l", "acquire=x"),
];

/// The read routes, every one answered after a write.
pub const READ_ROUTES: &[&str] = &[
    "/v1/catalog/nodes",
    "/v1/catalog/node/n1",
    "/v1/catalog/node/sim-node-1",
    "/v1/catalog/service/web",
    "/v1/health/service/web",
    "/v1/session/list",
    "/v1/config/service-intentions/web",
    "/v1/kv/app/a",
];

/// One request to the HTTP API (no token); its status code.
pub fn call(state: &ConsulState, method: &Method, path: &str, query: &str, body: &[u8]) -> u16 {
    dispatch(
        state,
        &ApiRequest {
            method,
            path,
            query,
            token: "",
            body,
        },
    )
    .status()
    .as_u16()
}

/// `body` sent to write route `route` (any number: taken modulo the routes),
/// then every read route: no panic, a status for each, and reads that
/// still succeed (or say not found).
pub fn write_then_read(state: &ConsulState, route: usize, body: &[u8]) {
    let (path, query) = WRITE_ROUTES[route % WRITE_ROUTES.len()];
    let status = call(state, &Method::PUT, path, query, body);
    assert!((200..600).contains(&status), "{path}: {status}");
    for path in READ_ROUTES {
        let status = call(state, &Method::GET, path, "", b"");
        assert!((200..500).contains(&status), "{path}: {status}");
    }
}

/// A catalog holding node `n1` with a `web` instance and its check, and a
/// session on it.
pub fn seeded() -> ConsulState {
    let s = ConsulState::new(ConsulTargetConfig::default());
    let reg = br#"{"Node":"n1","Address":"10.0.0.1","Service":{"ID":"web-1","Service":"web","Port":8080},"Check":{"CheckID":"c","Name":"c","ServiceID":"web-1","Status":"passing"}}"#;
    assert_eq!(call(&s, &Method::PUT, "/v1/catalog/register", "", reg), 200);
    let sess = br#"{"Node":"n1","TTL":"30s","NodeChecks":[]}"#;
    assert_eq!(call(&s, &Method::PUT, "/v1/session/create", "", sess), 200);
    s
}
