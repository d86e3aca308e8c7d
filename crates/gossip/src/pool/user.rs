//! serf's messages the members take in besides intents (which `net` hands
//! the view), as a Consul 1.20 client's serf handles them:
//!
//! - **user events**: taken in once (the view's `seen`), passed on to the
//!   servers like any broadcast; `consul:new-leader` is news for the agents;
//! - **queries**: taken in once, passed on (unless `NoBroadcast`), and
//!   answered by each simulated member they are for (their filters), by
//!   the outbox: the ack when asked, then the answer of serf's internal
//!   queries (`_serf_conflict`, the keyring's). `_serf_ping`, other
//!   internal names and Consul's own queries get the ack only: a client's
//!   serf answers nothing more. A keyring query changes the pool's keyring
//!   once, as it would each member's;
//! - **relays**: passed on to their destination.

use std::sync::Arc;

use base64::Engine;
use regex::Regex;
use tokio::time::Instant;

use super::Inner;
use super::outbox::{self, Pending};
use super::view::{Phase, VSN, View, Who};
use crate::serf::event::UserEvent;
use crate::serf::keys::{self, KeyResponse, Member, status};
use crate::serf::query::{FLAG_ACK, FLAG_NO_BROADCAST, Filter, Query, RESPONSE_LIMIT, Relay};
use crate::serf::{self, kind_serf};
use crate::wire::msgs::state;
use crate::wire::{WireError, ip_bytes, kind};

/// What an answer adds to its payload (field names, the member's name):
/// a payload past `RESPONSE_LIMIT` less this is not sent, as serf refuses
/// an answer past the limit.
const RESPONSE_OVERHEAD: usize = 128;
/// The compiled size a query's tag expression may take.
const REGEX_SIZE: usize = 1 << 20;

/// A serf message other than an intent; `body` starts with serf's type
/// byte.
pub(super) fn take(inner: &Inner, body: &[u8], limit: u8) -> Result<(), WireError> {
    let (&t, _) = body.split_first().ok_or(WireError::Truncated)?;
    match t {
        kind_serf::USER_EVENT => {
            let Some(e) = UserEvent::decode(body)? else {
                return Ok(());
            };
            let mut v = inner.lock();
            if v.take_event(e.ltime, e.name, e.payload) {
                // To every server, its sender too: real members pass it
                // on to random members, the one it came from among them.
                v.broadcast(None, user_message(body), limit, &[]);
            }
        }
        kind_serf::QUERY => {
            if let Some(q) = Query::decode(body)? {
                query(inner, &q, body, limit);
            }
        }
        kind_serf::RELAY => {
            if let Some(r) = Relay::decode(body)? {
                outbox::send_plain(inner, 0, r.to, &user_message(r.msg));
            }
        }
        // The pool asks nothing; serf ignores what it does not know.
        _ => {}
    }
    Ok(())
}

/// A serf message wrapped as the memberlist user message it travels in.
fn user_message(body: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(body.len() + 1);
    raw.push(kind::USER);
    raw.extend_from_slice(body);
    raw
}

/// A query: taken in once, passed on, its answers queued.
fn query(inner: &Inner, q: &Query<'_>, body: &[u8], limit: u8) {
    let members = {
        let mut v = inner.lock();
        if !v.seen.query(q.ltime, q.id) {
            return;
        }
        if q.flags & FLAG_NO_BROADCAST == 0 {
            v.broadcast(None, user_message(body), limit, &[]);
        }
        members_for(&v, &q.filters)
    };
    let Some(to) = q.reply_to() else {
        return;
    };
    let (response, mute) = response_of(inner, q);
    let ack = q.flags & FLAG_ACK != 0;
    if members.is_empty() || (!ack && response.is_none()) {
        return;
    }
    let now = Instant::now();
    let pending = Pending {
        to,
        ltime: q.ltime,
        id: q.id,
        ack,
        response,
        mute,
        // serf relays through at most 5 members.
        copies: 1 + q.relay_factor.min(5),
        total: members.len(),
        members,
        start: now,
        spread: q.timeout / 2,
        deadline: now + q.timeout,
    };
    let dropped = inner.outbox().push(pending);
    if dropped > 0 {
        inner.metrics.add(inner.ids.answers_dropped, dropped as u64);
    }
}

/// The alive members a query's filters pass, as slots. A filter that does
/// not decode, or a tag expression that does not compile, passes none
/// (serf then does not answer).
fn members_for(v: &View, filters: &[&[u8]]) -> Vec<u32> {
    let mut names: Vec<Vec<&str>> = Vec::new();
    let mut by_id: Vec<Regex> = Vec::new();
    for f in filters {
        match Filter::decode(f) {
            Ok(Filter::Nodes(n)) => names.push(n),
            Ok(Filter::Tag { tag, expr }) => {
                let Ok(re) = regex::RegexBuilder::new(expr)
                    .size_limit(REGEX_SIZE)
                    .build()
                else {
                    return Vec::new();
                };
                if tag == "id" {
                    by_id.push(re);
                    continue;
                }
                // Every member has the same other tags: one look for all.
                let value = v.tags.iter().find(|(k, _)| k == tag);
                if !re.is_match(value.map_or("", |(_, x)| x)) {
                    return Vec::new();
                }
            }
            Err(_) => return Vec::new(),
        }
    }
    let passes = |name: &str, id: &str| {
        names.iter().all(|n| n.contains(&name)) && by_id.iter().all(|re| re.is_match(id))
    };
    (0..v.locals.len())
        .filter(|&s| {
            let l = &v.locals[s];
            l.phase == Phase::Alive && passes(&l.name, &l.id)
        })
        .map(|s| s as u32)
        .collect()
}

/// What every member answers a query with (besides the ack), and the
/// member that does not answer it.
fn response_of(inner: &Inner, q: &Query<'_>) -> (Option<Arc<[u8]>>, Option<usize>) {
    let (payload, mute) = match q.name {
        keys::CONFLICT => conflict(&inner.lock(), q.payload),
        keys::INSTALL_KEY | keys::USE_KEY | keys::REMOVE_KEY | keys::LIST_KEYS => {
            (Some(keyring(inner, q)), None)
        }
        _ => (None, None),
    };
    let fits = |p: &Vec<u8>| p.len() + RESPONSE_OVERHEAD <= RESPONSE_LIMIT;
    (payload.filter(fits).map(Arc::from), mute)
}

/// A conflict query about `node`: the members' view of it (nil when they
/// know none), from each member but the one of that name.
fn conflict(v: &View, node: &[u8]) -> (Option<Vec<u8>>, Option<usize>) {
    let name = std::str::from_utf8(node).unwrap_or_default();
    // Its address, metadata, serf status and versions.
    let (found, mute) = match v.names.get(name).copied() {
        Some(Who::Local(slot)) => {
            let l = &v.locals[slot];
            let st = match l.phase {
                Phase::Alive => Some(status::ALIVE),
                Phase::Leaving(_) => Some(status::LEAVING),
                Phase::Left(Some(_)) => Some(status::LEFT),
                Phase::Joining | Phase::Left(None) => None,
            };
            let ep = v.endpoints[usize::from(l.endpoint)];
            (st.map(|s| (ep, v.meta(slot), s, VSN)), Some(slot))
        }
        Some(Who::Remote(i)) => {
            let r = &v.remotes[i];
            let st = match r.state {
                state::DEAD => status::FAILED,
                state::LEFT => status::LEFT,
                _ => status::ALIVE,
            };
            (Some((r.addr, r.meta.clone(), st, r.vsn)), None)
        }
        None => (None, None),
    };
    let mut out = Vec::new();
    match found {
        Some((addr, meta, status, vsn)) => {
            let ip = ip_bytes(addr.ip());
            let m = Member {
                name,
                addr: &ip,
                port: addr.port(),
                tags: serf::decode_tags(&meta).unwrap_or_default(),
                status,
                vsn,
            };
            keys::encode_conflict(Some(&m), &mut out);
        }
        None => keys::encode_conflict(None, &mut out),
    }
    (Some(out), mute)
}

/// A keyring query's answer, the pool's keyring changed as asked (serf's
/// `handleInstallKey`, `handleUseKey`, `handleRemoveKey`,
/// `handleListKeys`, their messages word for word).
fn keyring(inner: &Inner, q: &Query<'_>) -> Vec<u8> {
    let mut resp = KeyResponse::default();
    let b64 = |k: &[u8]| base64::engine::general_purpose::STANDARD.encode(k);
    match (q.name, &inner.cfg.security.keyring) {
        (keys::LIST_KEYS, None) => {
            resp.message = "Keyring is empty (encryption not enabled)".into();
        }
        (_, None) => resp.message = "No keyring to modify (encryption not enabled)".into(),
        (keys::LIST_KEYS, Some(ring)) => {
            resp.keys = ring.keys().iter().map(|k| b64(k)).collect();
            resp.primary = resp.keys.first().cloned().unwrap_or_default();
            resp.result = true;
        }
        (name, Some(ring)) => {
            if let Ok(key) = keys::decode_key_request(q.payload) {
                let done = match name {
                    keys::INSTALL_KEY => ring.install(key),
                    keys::USE_KEY => ring.use_key(key),
                    _ => ring.remove(key),
                };
                match done {
                    Ok(()) => resp.result = true,
                    Err(e) => resp.message = e.to_string(),
                }
            }
        }
    }
    let mut out = Vec::new();
    resp.encode(&mut out);
    let actual = resp.keys.len();
    // serf's truncation of a listing too long for one answer.
    while out.len() + RESPONSE_OVERHEAD > RESPONSE_LIMIT && !resp.keys.is_empty() {
        resp.keys.pop();
        resp.message = format!(
            "truncated key list response, showing first {} of {actual} keys",
            resp.keys.len()
        );
        out.clear();
        resp.encode(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(n: usize) -> View {
        let mut v = View {
            endpoints: vec!["127.0.0.1:7946".parse().unwrap()],
            tags: vec![("role".into(), "node".into()), ("dc".into(), "dc1".into())],
            ..View::default()
        };
        for i in 0..n {
            let s = v.add_local(&format!("m{i}"), &format!("id-{i}"), 0);
            v.joined(s, 1);
        }
        v
    }

    fn filter(f: Filter<'_>) -> Vec<u8> {
        let mut b = Vec::new();
        f.encode(&mut b);
        b
    }

    #[test]
    fn filters_pick_the_members_a_query_is_for() {
        let v = view(4);
        assert_eq!(members_for(&v, &[]), vec![0, 1, 2, 3]);
        let names = filter(Filter::Nodes(vec!["m1", "m3", "other"]));
        assert_eq!(members_for(&v, &[&names]), vec![1, 3]);
        let role = filter(Filter::Tag {
            tag: "role",
            expr: "^no",
        });
        assert_eq!(members_for(&v, &[&names, &role]), vec![1, 3]);
        let id = filter(Filter::Tag {
            tag: "id",
            expr: "-[23]$",
        });
        assert_eq!(members_for(&v, &[&names, &id]), vec![3]);
        let consul = filter(Filter::Tag {
            tag: "role",
            expr: "consul",
        });
        assert!(members_for(&v, &[&consul]).is_empty());
        let broken = filter(Filter::Tag {
            tag: "role",
            expr: "(",
        });
        assert!(members_for(&v, &[&broken]).is_empty());
        assert!(members_for(&v, &[&[9u8, 0x90][..]]).is_empty());
    }

    #[test]
    fn a_conflict_is_answered_with_the_member_known_by_all_but_itself() {
        let v = view(2);
        let (payload, mute) = conflict(&v, b"m1");
        assert_eq!(mute, Some(1));
        let payload = payload.unwrap();
        let got = keys::decode_conflict(&payload).unwrap();
        assert_eq!(got, Some(("m1", status::ALIVE)));
        let (payload, mute) = conflict(&v, b"nobody");
        let payload = payload.unwrap();
        assert_eq!(
            (keys::decode_conflict(&payload).unwrap(), mute),
            (None, None)
        );
    }
}
