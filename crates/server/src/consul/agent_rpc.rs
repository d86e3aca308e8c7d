//! A client agent's own calls on the RPC port, as a Consul 1.20 server
//! answers them: anti-entropy's `Catalog.Register`, `Catalog.Deregister`,
//! `Catalog.NodeServiceList` and `Health.NodeChecks`, `Coordinate.Update`,
//! `Session.Apply` (create, destroy) and `Session.Renew`, and the router's
//! `Status.Ping`. Writes go through [`super::writes`], as the HTTP API's
//! do; answers are msgpack in the shapes Consul's structs have (a
//! `QueryMeta` beside the result), errors in Consul's words.
//!
//! A coordinate is kept on its node (dropped for a node the catalog does not
//! hold, as Consul's batch update drops it) and listed by
//! `/v1/coordinate/nodes`.

use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::ConsulState;
use super::acl::{Access, Authz, Resource, vet};
use super::render::{check_json, node_json, service_json};
use super::rpc_error::RpcError;
use super::writes::{self, DeregisterBody, RegisterBody, SessionBody, lock_delay, nullable};

/// Datacenter and token, which every call carries.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Common {
    #[serde(rename = "Datacenter", deserialize_with = "nullable")]
    datacenter: String,
    #[serde(rename = "Token", deserialize_with = "nullable")]
    token: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeRead {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    node: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CoordinateUpdate {
    #[serde(rename = "Node", deserialize_with = "nullable")]
    node: String,
    #[serde(rename = "Coord")]
    coord: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SessionApply {
    #[serde(rename = "Op", deserialize_with = "nullable")]
    op: String,
    #[serde(rename = "Session")]
    session: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SessionRenew {
    #[serde(rename = "SessionID", deserialize_with = "nullable")]
    session_id: String,
    #[serde(rename = "Session", deserialize_with = "nullable")]
    session: String,
}

type Answer = Result<Bytes, RpcError>;

fn decode<T: DeserializeOwned + Default>(args: &[u8]) -> Result<T, RpcError> {
    Ok(agent_sim_proto::msgpack::decode(args)?)
}

fn msgpack(v: &Value) -> Bytes {
    // serde_json values always encode.
    Bytes::from(agent_sim_proto::msgpack::encode_named(v).unwrap_or_default())
}

/// `struct{}`: what a write answers.
fn empty() -> Answer {
    Ok(Bytes::from_static(&[0x80]))
}

/// A read's `QueryMeta` with `result` beside it under `key`.
fn indexed(index: u64, key: &str, result: Value) -> Bytes {
    let mut v = json!({
        "Backend": 0,
        "ConsistencyLevel": "",
        "Index": index,
        "KnownLeader": true,
        "LastContact": 0,
        "NotModified": false,
        "ResultsFilteredByACLs": false,
    });
    v[key] = result;
    msgpack(&v)
}

/// What every call checks first: the token (`ACL not found`), then the
/// datacenter; what the token may do, for the call to check (writes as
/// Consul's endpoints check them, `acl::vet`; reads are not filtered).
fn admitted(state: &ConsulState, args: &[u8]) -> Result<Authz, RpcError> {
    let c: Common = decode(args)?;
    let authz = state.acl(&c.token)?;
    let dc = state.store().datacenter.clone();
    if !c.datacenter.is_empty() && c.datacenter != dc {
        return Err(RpcError::NoPathToDatacenter);
    }
    Ok(authz)
}

/// A call's handler: the state, what its token may do, its arguments.
type Handler = fn(&ConsulState, &Authz, &[u8]) -> Answer;

/// The answer to `method`, or `None` when it is not a client agent's call.
pub(crate) fn answer(state: &ConsulState, method: &str, args: &[u8]) -> Option<Answer> {
    let f: Handler = match method {
        "Catalog.Register" => register,
        "Catalog.Deregister" => deregister,
        "Catalog.NodeServiceList" => node_services,
        "Health.NodeChecks" => node_checks,
        "Coordinate.Update" => coordinate_update,
        "Session.Apply" => session_apply,
        "Session.Renew" => session_renew,
        "Status.Ping" => return Some(empty()),
        _ => return None,
    };
    Some(admitted(state, args).and_then(|authz| f(state, &authz, args)))
}

fn register(state: &ConsulState, authz: &Authz, args: &[u8]) -> Answer {
    let b: RegisterBody = decode(args)?;
    vet::register(state, authz, &b)?;
    writes::register(state, b)?;
    empty()
}

fn deregister(state: &ConsulState, authz: &Authz, args: &[u8]) -> Answer {
    let b: DeregisterBody = decode(args)?;
    vet::deregister(state, authz, &b)?;
    writes::deregister(state, b)?;
    empty()
}

fn node_services(state: &ConsulState, _: &Authz, args: &[u8]) -> Answer {
    let r: NodeRead = decode(args)?;
    let store = state.store();
    let result = match store.nodes.get(&r.node) {
        None => json!({"Node": null, "Services": null}),
        Some(n) => {
            let services: Vec<Value> = n.services.values().map(service_json).collect();
            json!({
                "Node": node_json(&store, &r.node, n),
                "Services": if services.is_empty() { Value::Null } else { Value::from(services) },
            })
        }
    };
    Ok(indexed(store.raft_index, "NodeServices", result))
}

fn node_checks(state: &ConsulState, _: &Authz, args: &[u8]) -> Answer {
    let r: NodeRead = decode(args)?;
    let store = state.store();
    let checks: Vec<Value> = store
        .nodes
        .get(&r.node)
        .map(|n| n.checks.values().map(|c| check_json(&r.node, c)).collect())
        .unwrap_or_default();
    let checks = if checks.is_empty() {
        Value::Null
    } else {
        Value::from(checks)
    };
    Ok(indexed(store.raft_index, "HealthChecks", checks))
}

fn coordinate_update(state: &ConsulState, authz: &Authz, args: &[u8]) -> Answer {
    let u: CoordinateUpdate = decode(args)?;
    let Some(coord) = u.coord.filter(valid_coordinate) else {
        return Err(RpcError::InvalidCoordinate);
    };
    authz.check(Resource::Node, Access::Write, &u.node)?;
    if let Some(n) = state.store().nodes.get_mut(&u.node) {
        n.coord = Some(coord);
    }
    let c = &state.inner.counters;
    c.bump(&c.coordinate_updates);
    empty()
}

/// A coordinate Consul accepts: 8 finite dimensions and finite scalars.
fn valid_coordinate(c: &Value) -> bool {
    let finite = |k: &str| c.get(k).and_then(Value::as_f64).is_some_and(f64::is_finite);
    let vec = c.get("Vec").and_then(Value::as_array);
    vec.is_some_and(|v| v.len() == 8 && v.iter().all(|x| x.as_f64().is_some_and(f64::is_finite)))
        && ["Error", "Adjustment", "Height"].into_iter().all(finite)
}

fn session_apply(state: &ConsulState, authz: &Authz, args: &[u8]) -> Answer {
    let a: SessionApply = decode(args)?;
    let session = a.session.unwrap_or(Value::Null);
    match a.op.as_str() {
        "create" => {
            let b: SessionBody = serde_json::from_value(session).map_err(RpcError::DecodeField)?;
            vet::session_create(state, authz, &b.node)?;
            let delay = lock_delay(b.lock_delay.as_ref())?;
            let id = writes::create_session(state, b, delay)?;
            Ok(msgpack(&Value::from(id)))
        }
        "destroy" => {
            let id = session
                .get("ID")
                .and_then(Value::as_str)
                .unwrap_or_default();
            vet::session_of(state, authz, id)?;
            writes::destroy_session(state, id);
            Ok(msgpack(&Value::from("")))
        }
        other => Err(RpcError::InvalidSessionOp(other.to_owned())),
    }
}

fn session_renew(state: &ConsulState, authz: &Authz, args: &[u8]) -> Answer {
    let r: SessionRenew = decode(args)?;
    let id = if r.session_id.is_empty() {
        r.session
    } else {
        r.session_id
    };
    vet::session_of(state, authz, &id)?;
    let sessions = match writes::renew_session(state, &id) {
        Some(s) => json!([s]),
        None => Value::Null,
    };
    let index = state.raft_index();
    Ok(indexed(index, "Sessions", sessions))
}
