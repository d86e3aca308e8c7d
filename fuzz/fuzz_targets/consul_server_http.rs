//! Requests a client sends the embedded Consul HTTP API: the first byte
//! picks a route, the rest is the body; each input runs against a catalog
//! that already holds a node, a service and a session, then every read
//! route answers. Also decodes the bytes as a SubscribeRequest.
#![no_main]

use agent_sim_proto::consul::subscribe::SubscribeRequest;
use agent_sim_server::consul::{ApiRequest, ConsulState, ConsulTargetConfig, dispatch};
use http::Method;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

const ROUTES: &[(&str, &str)] = &[
    ("/v1/catalog/register", ""),
    ("/v1/catalog/deregister", ""),
    ("/v1/txn", ""),
    ("/v1/session/create", ""),
    ("/v1/config", ""),
    ("/v1/config", "cas=1"),
];

const READS: &[&str] = &[
    "/v1/catalog/nodes",
    "/v1/catalog/node/n1",
    "/v1/catalog/service/web",
    "/v1/health/service/web",
    "/v1/session/list",
    "/v1/config/service-intentions/web",
];

fn call(state: &ConsulState, method: &Method, path: &str, query: &str, body: &[u8]) -> u16 {
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

fn seeded() -> ConsulState {
    let s = ConsulState::new(ConsulTargetConfig::default());
    let reg = br#"{"Node":"n1","Address":"10.0.0.1","Service":{"ID":"web-1","Service":"web","Port":8080},"Check":{"CheckID":"c","Name":"c","ServiceID":"web-1","Status":"passing"}}"#;
    assert_eq!(call(&s, &Method::PUT, "/v1/catalog/register", "", reg), 200);
    let sess = br#"{"Node":"n1","TTL":"30s","NodeChecks":[]}"#;
    assert_eq!(call(&s, &Method::PUT, "/v1/session/create", "", sess), 200);
    s
}

fuzz_target!(|data: &[u8]| {
    let _ = SubscribeRequest::decode(data);
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    // A fresh catalog per input keeps runs independent (and bounded).
    let state = seeded();
    let (path, query) = ROUTES[pick as usize % ROUTES.len()];
    let status = call(&state, &Method::PUT, path, query, body);
    assert!((200..600).contains(&status));
    for p in READS {
        let status = call(&state, &Method::GET, p, "", b"");
        assert!((200..500).contains(&status), "{p}: {status}");
    }
});
