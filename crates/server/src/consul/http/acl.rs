//! `/v1/acl/...`: tokens and policies as a Consul 1.20 agent answers
//! them: `PUT /v1/acl/token` (create), `GET|DELETE
//! /v1/acl/token/<accessor>`, `GET /v1/acl/token/self`, `GET
//! /v1/acl/tokens`; `PUT /v1/acl/policy` (create), `GET|DELETE
//! /v1/acl/policy/<id>`, `GET /v1/acl/policy/name/<name>`, `GET
//! /v1/acl/policies`. With ACLs off every one is `401 ACL support
//! disabled`; writes need `acl:write`, reads `acl:read` (secrets shown as
//! `<hidden>` without `acl:write`), in Consul's words. The store and its
//! checks are `consul::acl`'s.
//!
//! Not here: updates (`PUT` on a token or policy), roles, auth methods,
//! binding rules, login, bootstrap, templated policies.

use hyper::header::HeaderValue;
use hyper::{Method, Response, StatusCode};

use super::{ApiRequest, Body, acl_refused, json_response, not_allowed, not_found, ok_true, text};
use crate::consul::ConsulState;
use crate::consul::acl::{
    Access, AclError, Authz, Book, BookError, Denied, Resource, Token, decode_policy, decode_token,
};

/// What Consul prints instead of a secret the reader may not see.
const HIDDEN: &str = "<hidden>";

/// Why an ACL request was refused.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// The request's token: unknown, or without `acl:read`/`acl:write`.
    #[error(transparent)]
    Token(#[from] AclError),
    /// The store refused (Consul's words and status).
    #[error(transparent)]
    Book(#[from] BookError),
    /// `GET /v1/acl/policy/name/` without a name.
    #[error("Missing policy Name")]
    NoPolicyName,
    /// `GET /v1/acl/token/self` of a token gone meanwhile.
    #[error("Supplied token does not exist")]
    NoSelf,
}

impl From<Denied> for Refusal {
    fn from(d: Denied) -> Self {
        Refusal::Token(d.into())
    }
}

impl From<Refusal> for Response<Body> {
    fn from(r: Refusal) -> Self {
        let status = match &r {
            Refusal::Token(e) => return acl_refused(e),
            Refusal::Book(e) => e.status(),
            Refusal::NoPolicyName => 400,
            Refusal::NoSelf => 404,
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        text(status, r.to_string())
    }
}

/// The request's token, allowed `acl:<need>`, or the refusal.
fn authorized(state: &ConsulState, token: &str, need: Access) -> Result<Authz, Refusal> {
    let authz = state.acl(token)?;
    authz.check_unnamed(Resource::Acl, need)?;
    Ok(authz)
}

fn indexed(state: &ConsulState, mut r: Response<Body>) -> Response<Body> {
    r.headers_mut()
        .insert("X-Consul-Index", HeaderValue::from(state.raft_index()));
    r
}

/// `/v1/acl/<tail>`.
pub(super) fn acl_route(state: &ConsulState, req: &ApiRequest<'_>, tail: &str) -> Response<Body> {
    let m = req.method;
    let known = matches!(tail, "token" | "tokens" | "policy" | "policies")
        || tail.starts_with("token/")
        || tail.starts_with("policy/");
    if !known {
        return not_found();
    }
    let allowed = match tail {
        "token" | "policy" => *m == Method::PUT,
        "tokens" | "policies" | "token/self" => *m == Method::GET,
        t if t.starts_with("policy/name/") => *m == Method::GET,
        _ => *m == Method::GET || *m == Method::DELETE,
    };
    if !allowed {
        return not_allowed(m);
    }
    if !state.inner.acl.on() {
        return text(StatusCode::UNAUTHORIZED, "ACL support disabled");
    }
    let r = match tail {
        "token" => create_token(state, req),
        "tokens" => list_tokens(state, req.token),
        "token/self" => token_self(state, req.token),
        "policy" => create_policy(state, req),
        "policies" => list_policies(state, req.token),
        t if t.starts_with("policy/name/") => read_policy(state, req.token, &t[12..], true),
        t if t.starts_with("policy/") && *m == Method::GET => {
            read_policy(state, req.token, &t[7..], false)
        }
        t if t.starts_with("policy/") => delete_policy(state, req.token, &t[7..]),
        t if *m == Method::GET => read_token(state, req.token, &t[6..]),
        t => delete_token(state, req.token, &t[6..]),
    };
    r.unwrap_or_else(Into::into)
}

type Answer = Result<Response<Body>, Refusal>;

/// A token as the reader may see it.
fn token_json(book: &Book, t: &Token, may_write: bool) -> serde_json::Value {
    let mut v = serde_json::to_value(book.token_view(t)).unwrap_or_default();
    if !may_write {
        v["SecretID"] = HIDDEN.into();
    }
    v
}

fn create_token(state: &ConsulState, req: &ApiRequest<'_>) -> Answer {
    let body = decode_token(req.body)?;
    authorized(state, req.token, Access::Write)?;
    let acl = &state.inner.acl;
    let index = state.store().next_index();
    let mut book = acl.write();
    let t = book.create_token(body, index, acl.datacenter())?;
    Ok(json_response(StatusCode::OK, &book.token_view(&t)))
}

fn read_token(state: &ConsulState, token: &str, accessor: &str) -> Answer {
    if accessor.is_empty() {
        return Err(BookError::NoAccessor.into());
    }
    let authz = authorized(state, token, Access::Read)?;
    let may_write = authz.allows(Resource::Acl, Access::Write, "");
    let book = state.inner.acl.read();
    let t = book.token(accessor)?;
    let v = token_json(&book, t, may_write);
    drop(book);
    Ok(indexed(state, json_response(StatusCode::OK, &v)))
}

/// `GET /v1/acl/token/self`: the request's own token (no permission
/// needed).
fn token_self(state: &ConsulState, token: &str) -> Answer {
    state.acl(token)?;
    let book = state.inner.acl.read();
    let Some(t) = book.by_secret(if token.is_empty() { "anonymous" } else { token }) else {
        return Err(Refusal::NoSelf);
    };
    let v = token_json(&book, t, true);
    drop(book);
    Ok(indexed(state, json_response(StatusCode::OK, &v)))
}

fn delete_token(state: &ConsulState, token: &str, accessor: &str) -> Answer {
    if accessor.is_empty() {
        return Err(BookError::NoAccessor.into());
    }
    authorized(state, token, Access::Write)?;
    let acl = &state.inner.acl;
    acl.write().delete_token(accessor, token)?;
    state.store().next_index();
    Ok(ok_true())
}

fn list_tokens(state: &ConsulState, token: &str) -> Answer {
    let authz = authorized(state, token, Access::Read)?;
    let may_write = authz.allows(Resource::Acl, Access::Write, "");
    let book = state.inner.acl.read();
    let body = if may_write {
        let all: Vec<_> = book.tokens().map(|t| book.token_view(t)).collect();
        json_response(StatusCode::OK, &all)
    } else {
        let all: Vec<_> = book.tokens().map(|t| token_json(&book, t, false)).collect();
        json_response(StatusCode::OK, &all)
    };
    drop(book);
    Ok(indexed(state, body))
}

fn create_policy(state: &ConsulState, req: &ApiRequest<'_>) -> Answer {
    let body = decode_policy(req.body)?;
    authorized(state, req.token, Access::Write)?;
    let index = state.store().next_index();
    let p = state.inner.acl.write().create_policy(body, index)?;
    Ok(json_response(StatusCode::OK, &p.view()))
}

fn read_policy(state: &ConsulState, token: &str, key: &str, by_name: bool) -> Answer {
    if key.is_empty() {
        return Err(if by_name {
            Refusal::NoPolicyName
        } else {
            BookError::NoPolicyId.into()
        });
    }
    authorized(state, token, Access::Read)?;
    let book = state.inner.acl.read();
    let p = if by_name {
        book.policy_named(key)
    } else {
        book.policy(key)
    };
    let r = json_response(StatusCode::OK, &p?.view());
    drop(book);
    Ok(indexed(state, r))
}

fn delete_policy(state: &ConsulState, token: &str, id: &str) -> Answer {
    if id.is_empty() {
        return Err(BookError::NoPolicyId.into());
    }
    authorized(state, token, Access::Write)?;
    let acl = &state.inner.acl;
    acl.write().delete_policy(id, acl.datacenter())?;
    state.store().next_index();
    Ok(ok_true())
}

fn list_policies(state: &ConsulState, token: &str) -> Answer {
    authorized(state, token, Access::Read)?;
    let book = state.inner.acl.read();
    let all: Vec<_> = book.policies().map(|p| p.stub()).collect();
    let r = json_response(StatusCode::OK, &all);
    drop(book);
    Ok(indexed(state, r))
}
