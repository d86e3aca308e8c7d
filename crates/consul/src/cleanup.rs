//! `agent-sim cleanup`: removes what a run with name prefix `P` left in a
//! Consul cluster when it could not clean up itself (killed, host lost).
//!
//! Only objects the run marked as its own are touched: nodes named `P-…`
//! that carry node meta `agent-sim-prefix = P` (the agents' nodes, the
//! seeded service's nodes `P-seed-N` and the probe node `P-probe`, with
//! their services, checks and sessions), and the probe's
//! `service-intentions` entry `P-probe` if its meta names `P`, and the KV
//! probe's key `P/probe/kv` if it holds a probe id.
//! A node that matches the name but not the meta is reported and left.

use ::http::Method;
use bytes::Bytes;
use serde::Deserialize;

use crate::http::{self, HttpApi, HttpError};

/// Node deletes per `/v1/txn` request.
const DELETES_PER_TXN: usize = 64;

/// What a cleanup found and removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CleanupReport {
    /// Nodes removed (or, on a dry run, that would be).
    pub nodes: Vec<String>,
    /// Sessions on those nodes (they go with their node).
    pub sessions: usize,
    /// Config entries removed (`kind/name`).
    pub config_entries: Vec<String>,
    /// KV keys removed (the KV probe's).
    pub kv_keys: Vec<String>,
    /// Objects with the run's names that are not marked as its own: left.
    pub left_alone: Vec<String>,
    /// ACL tokens the run created (`--acl-tokens node-identity`), by
    /// accessor, removed.
    pub acl_tokens: Vec<String>,
    /// ACL policies the run created, by ID, removed.
    pub acl_policies: Vec<String>,
    /// Why the run's ACL tokens could not be looked for (the cleanup's
    /// token cannot list tokens), if so: the server's words.
    pub acl_unchecked: Option<String>,
}

#[derive(Deserialize)]
struct NodeRow {
    #[serde(rename = "Node")]
    node: String,
    #[serde(rename = "Meta", default)]
    meta: http::Meta,
}

#[derive(Deserialize)]
struct SessionRow {
    #[serde(rename = "Node", default)]
    node: String,
}

fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, HttpError> {
    serde_json::from_slice(b).map_err(|_| HttpError::io("http_decode"))
}

/// Finds (and unless `dry_run`, removes) what runs with `prefix` left.
pub async fn cleanup(
    api: &HttpApi,
    prefix: &str,
    dry_run: bool,
) -> Result<CleanupReport, HttpError> {
    let mut report = CleanupReport::default();
    let name_start = format!("{prefix}-");
    let nodes: Vec<NodeRow> = decode(
        &api.call_limited(
            Method::GET,
            "/v1/catalog/nodes",
            Bytes::new(),
            http::MAX_LIST_BODY,
        )
        .await?,
    )?;
    for n in nodes {
        if !n.node.starts_with(&name_start) {
            continue;
        }
        if http::marked_by(&n.meta, prefix) {
            report.nodes.push(n.node);
        } else {
            report.left_alone.push(format!("node {}", n.node));
        }
    }
    let sessions: Vec<SessionRow> = decode(
        &api.call_limited(
            Method::GET,
            "/v1/session/list",
            Bytes::new(),
            http::MAX_LIST_BODY,
        )
        .await?,
    )?;
    let ours: std::collections::HashSet<&str> = report.nodes.iter().map(String::as_str).collect();
    report.sessions = sessions
        .iter()
        .filter(|s| ours.contains(s.node.as_str()))
        .count();

    let entry = format!("service-intentions/{prefix}-probe");
    let entry_path = format!("/v1/config/{entry}");
    let probe_entry = match api.call(Method::GET, &entry_path, Bytes::new()).await {
        Ok(b) => Some(decode::<http::EntryHead>(&b)?),
        Err(e) if e.status == Some(404) => None,
        Err(e) => return Err(e),
    };
    match probe_entry {
        Some(e) if http::marked_by(&e.meta, prefix) => {
            if !dry_run {
                let path = format!("{entry_path}?cas={}", e.modify_index);
                api.call(Method::DELETE, &path, Bytes::new()).await?;
            }
            report.config_entries.push(entry);
        }
        Some(_) => report.left_alone.push(format!("config entry {entry}")),
        None => {}
    }

    kv_probe_key(api, prefix, dry_run, &mut report).await?;
    acl_left(api, prefix, dry_run, &mut report).await?;
    if !dry_run {
        for chunk in report.nodes.chunks(DELETES_PER_TXN) {
            let ops: Vec<String> = chunk.iter().map(|n| http::deregistration_op(n)).collect();
            let body = format!("[{}]", ops.join(","));
            api.put("/v1/txn", Bytes::from(body)).await?;
        }
    }
    Ok(report)
}

/// The ACL tokens and policies the run created: the run's by their
/// description. A cleanup whose token may not list tokens says so and
/// removes the rest.
async fn acl_left(
    api: &HttpApi,
    prefix: &str,
    dry_run: bool,
    report: &mut CleanupReport,
) -> Result<(), HttpError> {
    match crate::acl::left_by(api, prefix).await {
        Ok(None) => Ok(()),
        Ok(Some((tokens, policies))) => {
            if !dry_run {
                let (_, failed) = crate::acl::delete(api, &tokens, &policies).await;
                if let Some(e) = failed {
                    return Err(e);
                }
            }
            report.acl_tokens = tokens;
            report.acl_policies = policies;
            Ok(())
        }
        Err(e) if e.status == Some(403) => {
            report.acl_unchecked = e.words();
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The KV probe's key (`--probe kv`): the run's by its name and its value,
/// a probe id; anything else at that name is left alone.
async fn kv_probe_key(
    api: &HttpApi,
    prefix: &str,
    dry_run: bool,
    report: &mut CleanupReport,
) -> Result<(), HttpError> {
    let key = crate::kv::probe_key(prefix);
    let path = format!("/v1/kv/{key}");
    match api
        .call(Method::GET, &format!("{path}?raw"), Bytes::new())
        .await
    {
        Ok(v) if crate::kv::probe_value(&v).is_some() => {
            if !dry_run {
                api.call(Method::DELETE, &path, Bytes::new()).await?;
            }
            report.kv_keys.push(key);
        }
        Ok(_) => report.left_alone.push(format!("kv key {key}")),
        Err(e) if e.status == Some(404) => {}
        Err(e) => return Err(e),
    }
    Ok(())
}
