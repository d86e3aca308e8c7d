//! Each agent's own ACL token (`--acl-tokens`), as production clusters run
//! them: every client agent carries its own agent token, usually a node
//! identity, and every RPC and stream it makes is authorized with it.
//!
//! Two sources: the run creates one token per agent through the HTTP API
//! with the run's management token ([`TokenSource::NodeIdentity`]: the
//! node's identity, a service identity for the agent's own service and,
//! when the run's features need more than identities grant, one policy
//! `agent-sim-<prefix>-from-<first>` with just that) and deletes them at the end; or a
//! file holds one secret per line, line `i` being agent `i`'s
//! ([`TokenSource::File`]). A created token's description marks it as the
//! run's own (`agent-sim:<prefix> <node>`), so `agent-sim cleanup` finds
//! what a killed run left.
//!
//! What it is not: no authorization of its own (the server decides, and
//! the agents count its denials) and no token renewal (tokens do not
//! expire unless the user's file holds ones that do).

use std::path::PathBuf;
use std::time::Duration;

use ::http::Method;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::http::{self, HttpApi, HttpError};

/// Token creates in flight at once.
const IN_FLIGHT: usize = 16;
/// Most tokens one file may hold (a run's agents are far fewer).
const MAX_FILE_TOKENS: usize = 10_000_000;
pub use crate::modes::DEFAULT_TOKEN_RATE as DEFAULT_CREATE_RATE;
/// The description of every token a run with `prefix` creates starts so.
pub fn description_head(prefix: &str) -> String {
    format!("agent-sim:{prefix} ")
}

/// The name of the policy a run (or shard) with `prefix` whose agents start
/// at `first` creates, when needed; its description starts like the
/// tokens' ([`description_head`]), which is what marks it as the run's.
pub fn policy_name(prefix: &str, first: u64) -> String {
    format!("agent-sim-{prefix}-from-{first}")
}

pub use crate::modes::TokenSource;

/// Why the agents' tokens could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    /// The token file cannot be read.
    #[error("--acl-tokens {path}: {source}", path = .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// The token file has too few tokens for the agents' indices.
    #[error(
        "--acl-tokens {path}: {lines} tokens, but the agents need {needed} (one per line, \
         line i for agent i)",
        path = .path.display()
    )]
    TooFew {
        /// The file.
        path: PathBuf,
        /// Non-empty lines it has.
        lines: usize,
        /// Lines the fleet's last agent needs.
        needed: u64,
    },
    /// The server refused or failed a create (its words kept).
    #[error("creating ACL {what}: {answer}")]
    Create {
        /// `policy agent-sim-P-from-0` or `token for P-7`.
        what: String,
        /// The server's answer (its kind and words).
        answer: HttpError,
    },
    /// The server's answer to a create is not a token or policy.
    #[error("creating ACL {what}: the answer has no {field}")]
    Answer {
        /// What was created.
        what: String,
        /// The field missing.
        field: &'static str,
    },
    /// The run ended (Ctrl-C) before every token was created.
    #[error("the run ended while its ACL tokens were being created")]
    Cancelled,
}

/// The agents' secrets by index.
#[derive(Debug, Default)]
pub struct AgentTokens {
    first: u64,
    secrets: Box<[Box<str>]>,
}

impl AgentTokens {
    /// Agent `index`'s secret, if it has one.
    pub fn get(&self, index: u64) -> Option<&str> {
        let i = usize::try_from(index.checked_sub(self.first)?).ok()?;
        self.secrets.get(i).map(|s| &**s)
    }

    /// How many agents have one.
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    /// Whether no agent has one.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }
}

/// Reads a token file: one secret per line (blank lines and `#` comments
/// skipped), enough for agents `first..first + count`.
pub fn read_file(path: &std::path::Path, first: u64, count: u64) -> Result<AgentTokens, AclError> {
    let text = std::fs::read_to_string(path).map_err(|source| AclError::Read {
        path: path.to_owned(),
        source,
    })?;
    let all: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .take(MAX_FILE_TOKENS)
        .collect();
    let needed = first + count;
    if (all.len() as u64) < needed {
        return Err(AclError::TooFew {
            path: path.to_owned(),
            lines: all.len(),
            needed,
        });
    }
    Ok(AgentTokens {
        first,
        secrets: all[first as usize..needed as usize]
            .iter()
            .map(|s| Box::from(*s))
            .collect(),
    })
}

/// What one run's agents' tokens are made of.
#[derive(Debug, Clone)]
pub struct TokenPlan {
    /// The run's name prefix (node names `P-i`).
    pub prefix: String,
    /// The datacenter of the node identities (the server's own).
    pub datacenter: String,
    /// The agents' own service (a service identity), if they register one.
    pub service: Option<String>,
    /// With a service chain: `service` is the base of each agent's tier
    /// service ([`crate::chain`]).
    pub chains: Option<crate::chain::Chains>,
    /// Rules identities do not grant and the run's features need.
    pub rules: Option<String>,
    /// Creates per second.
    pub rate: f64,
}

/// Tokens (and the policy) a run created: what it deletes at its end.
#[derive(Debug, Default)]
pub struct Created {
    /// Every agent's secret, by index.
    pub tokens: AgentTokens,
    /// The accessors of the created tokens.
    pub accessors: Vec<String>,
    /// The created policy's ID.
    pub policy: Option<String>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(rename = "AccessorID", default)]
    accessor: String,
    #[serde(rename = "SecretID", default)]
    secret: String,
}

#[derive(Deserialize)]
struct PolicyAnswer {
    #[serde(rename = "ID", default)]
    id: String,
}

/// Creates the run's policy (if its plan has rules) and one token per agent
/// `first..first + count`, at most `plan.rate` per second, calling
/// `progress` with the count made so far. On an error or `end`, what was
/// created so far is returned beside the error, to be deleted.
pub async fn create(
    api: &HttpApi,
    plan: &TokenPlan,
    first: u64,
    count: u64,
    end: &CancellationToken,
    progress: &(dyn Fn(u64) + Sync),
) -> (Created, Option<AclError>) {
    let mut made = Created::default();
    if let Some(rules) = &plan.rules {
        match create_policy(api, &plan.prefix, first, rules).await {
            Ok(id) => made.policy = Some(id),
            Err(e) => return (made, Some(e)),
        }
    }
    let gap = Duration::from_secs_f64(1.0 / plan.rate.max(0.001));
    let start = tokio::time::Instant::now();
    let policy = made
        .policy
        .is_some()
        .then(|| policy_name(&plan.prefix, first));
    let policy = policy.as_deref();
    let mut stream = futures_util::stream::iter(first..first + count)
        .map(|i| {
            // Each create waits for its slot: at most `rate` per second.
            let at = start + gap.mul_f64((i - first) as f64);
            async move {
                tokio::time::sleep_until(at).await;
                create_token(api, plan, policy, i).await
            }
        })
        .buffered(IN_FLIGHT);
    let mut secrets = Vec::with_capacity(count as usize);
    let mut failed = None;
    loop {
        let next = tokio::select! {
            n = stream.next() => n,
            _ = end.cancelled() => {
                failed = Some(AclError::Cancelled);
                break;
            }
        };
        let Some(r) = next else { break };
        match r {
            Ok(t) => {
                made.accessors.push(t.accessor);
                secrets.push(t.secret.into_boxed_str());
                if secrets.len() % 500 == 0 {
                    progress(secrets.len() as u64);
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    // Creates still in flight finish (their tokens must be deleted too).
    if failed.is_some() {
        while let Some(r) = stream.next().await {
            if let Ok(t) = r {
                made.accessors.push(t.accessor);
            }
        }
    }
    progress(secrets.len() as u64);
    made.tokens = AgentTokens {
        first,
        secrets: secrets.into_boxed_slice(),
    };
    (made, failed)
}

async fn create_policy(
    api: &HttpApi,
    prefix: &str,
    first: u64,
    rules: &str,
) -> Result<String, AclError> {
    let name = policy_name(prefix, first);
    let what = format!("policy {name}");
    let body = json!({
        "Name": name,
        "Description": format!(
            "{}what agents from {first} need beyond their identities",
            description_head(prefix)
        ),
        "Rules": rules,
    });
    let answer = api
        .put("/v1/acl/policy", Bytes::from(body.to_string()))
        .await
        .map_err(|answer| AclError::Create {
            what: what.clone(),
            answer,
        })?;
    let p: PolicyAnswer = serde_json::from_slice(&answer).map_err(|_| AclError::Answer {
        what: what.clone(),
        field: "ID",
    })?;
    if p.id.is_empty() {
        return Err(AclError::Answer { what, field: "ID" });
    }
    Ok(p.id)
}

/// The body of agent `index`'s token.
pub fn token_body(plan: &TokenPlan, policy: Option<&str>, index: u64) -> serde_json::Value {
    let node = http::node_name(&plan.prefix, index);
    let mut body = json!({
        "Description": format!("{}{node}", description_head(&plan.prefix)),
        "NodeIdentities": [{ "NodeName": node, "Datacenter": plan.datacenter }],
    });
    if let Some(s) = &plan.service {
        let name = match &plan.chains {
            Some(c) => c.place(index).service(s),
            None => s.clone(),
        };
        body["ServiceIdentities"] = json!([{ "ServiceName": name }]);
    }
    if let Some(p) = policy {
        body["Policies"] = json!([{ "Name": p }]);
    }
    body
}

async fn create_token(
    api: &HttpApi,
    plan: &TokenPlan,
    policy: Option<&str>,
    index: u64,
) -> Result<TokenAnswer, AclError> {
    let what = || format!("token for {}", http::node_name(&plan.prefix, index));
    let body = token_body(plan, policy, index);
    let answer = api
        .put("/v1/acl/token", Bytes::from(body.to_string()))
        .await
        .map_err(|answer| AclError::Create {
            what: what(),
            answer,
        })?;
    let t: TokenAnswer = serde_json::from_slice(&answer).map_err(|_| AclError::Answer {
        what: what(),
        field: "SecretID",
    })?;
    if t.accessor.is_empty() || t.secret.is_empty() {
        return Err(AclError::Answer {
            what: what(),
            field: "AccessorID and SecretID",
        });
    }
    Ok(t)
}

/// Deletes tokens (by accessor), `IN_FLIGHT` at once, then the policies:
/// how many tokens were deleted, and the first failure.
pub async fn delete(
    api: &HttpApi,
    accessors: &[String],
    policies: &[String],
) -> (usize, Option<HttpError>) {
    let mut results = futures_util::stream::iter(accessors)
        .map(|a| async move {
            let path = format!("/v1/acl/token/{a}");
            api.call(Method::DELETE, &path, Bytes::new()).await
        })
        .buffer_unordered(IN_FLIGHT);
    let (mut deleted, mut first) = (0, None);
    while let Some(r) = results.next().await {
        match r {
            Ok(_) => deleted += 1,
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    for id in policies {
        if let Err(e) = api
            .call(
                Method::DELETE,
                &format!("/v1/acl/policy/{id}"),
                Bytes::new(),
            )
            .await
        {
            first.get_or_insert(e);
        }
    }
    (deleted, first)
}

/// The rules a run's agents need beyond node and service identities:
/// sessions on their nodes, reads of the KV prefixes they watch. `None`
/// when identities are enough.
pub fn needed_rules(prefix: &str, sessions: bool, kv_reads: &[String]) -> Option<String> {
    let mut rules = String::new();
    if sessions {
        rules.push_str(&format!(
            "session_prefix \"{prefix}-\" {{\n  policy = \"write\"\n}}\n"
        ));
    }
    for k in kv_reads {
        // A pattern's literal head: `app/{i%10}/` reads under `app/`.
        let head = k.split('{').next().unwrap_or_default();
        rules.push_str(&format!(
            "key_prefix \"{head}\" {{\n  policy = \"read\"\n}}\n"
        ));
    }
    (!rules.is_empty()).then_some(rules)
}

/// The datacenter of the server the HTTP API reaches (the first of
/// `/v1/catalog/datacenters`, which lists its own first).
pub async fn server_datacenter(api: &HttpApi) -> Result<String, AclError> {
    let what = "tokens: asking the servers' datacenter".to_owned();
    let answer = api
        .call(Method::GET, "/v1/catalog/datacenters", Bytes::new())
        .await
        .map_err(|answer| AclError::Create {
            what: what.clone(),
            answer,
        })?;
    let dcs: Vec<String> = serde_json::from_slice(&answer).unwrap_or_default();
    dcs.into_iter()
        .next()
        .filter(|d| !d.is_empty())
        .ok_or(AclError::Answer {
            what,
            field: "datacenter",
        })
}

#[derive(Deserialize)]
struct TokenRow {
    #[serde(rename = "AccessorID", default)]
    accessor: String,
    #[serde(rename = "Description", default)]
    description: String,
}

#[derive(Deserialize)]
struct PolicyRow {
    #[serde(rename = "ID", default)]
    id: String,
    #[serde(rename = "Description", default)]
    description: String,
}

/// What runs with `prefix` left of ACLs: the accessors of their tokens
/// and the IDs of their policies. `Ok(None)` when the server runs without
/// ACLs.
pub async fn left_by(
    api: &HttpApi,
    prefix: &str,
) -> Result<Option<(Vec<String>, Vec<String>)>, HttpError> {
    let tokens = match api
        .call_limited(
            Method::GET,
            "/v1/acl/tokens",
            Bytes::new(),
            http::MAX_LIST_BODY,
        )
        .await
    {
        Ok(b) => b,
        // "ACL support disabled": nothing of ours can be there.
        Err(e) if e.status == Some(401) => return Ok(None),
        Err(e) => return Err(e),
    };
    let head = description_head(prefix);
    let rows: Vec<TokenRow> =
        serde_json::from_slice(&tokens).map_err(|_| HttpError::io("http_decode"))?;
    let accessors = rows
        .into_iter()
        .filter(|r| r.description.starts_with(&head))
        .map(|r| r.accessor)
        .collect();
    let policies = api
        .call_limited(
            Method::GET,
            "/v1/acl/policies",
            Bytes::new(),
            http::MAX_LIST_BODY,
        )
        .await?;
    let rows: Vec<PolicyRow> =
        serde_json::from_slice(&policies).map_err(|_| HttpError::io("http_decode"))?;
    let policies = rows
        .into_iter()
        .filter(|r| r.description.starts_with(&head))
        .map(|r| r.id)
        .collect();
    Ok(Some((accessors, policies)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_parses_and_prints() {
        assert_eq!(
            "node-identity".parse::<TokenSource>().unwrap(),
            TokenSource::NodeIdentity
        );
        let f: TokenSource = "/tmp/t.txt".parse().unwrap();
        assert_eq!(f, TokenSource::File("/tmp/t.txt".into()));
        assert_eq!(f.to_string(), "/tmp/t.txt");
    }

    #[test]
    fn a_file_gives_each_agent_its_line() {
        let dir = std::env::temp_dir().join(format!("acl-tokens-{}", std::process::id()));
        std::fs::write(&dir, "# tokens\na\n\nb\nc\n d \n").unwrap();
        let t = read_file(&dir, 1, 3).unwrap();
        assert_eq!(
            (t.get(0), t.get(1), t.get(2), t.get(3), t.get(4)),
            (None, Some("b"), Some("c"), Some("d"), None)
        );
        let e = read_file(&dir, 2, 3).unwrap_err();
        assert!(
            e.to_string().contains("4 tokens, but the agents need 5"),
            "{e}"
        );
        std::fs::remove_file(&dir).unwrap();
        assert!(matches!(read_file(&dir, 0, 1), Err(AclError::Read { .. })));
    }

    #[test]
    fn a_token_names_its_node_service_and_the_runs_policy() {
        let plan = TokenPlan {
            prefix: "p".into(),
            datacenter: "dc1".into(),
            service: Some("app".into()),
            chains: None,
            rules: None,
            rate: 1.0,
        };
        let b = token_body(&plan, Some("agent-sim-p-from-0"), 7);
        assert_eq!(b["Description"], "agent-sim:p p-7");
        assert_eq!(b["NodeIdentities"][0]["NodeName"], "p-7");
        assert_eq!(b["NodeIdentities"][0]["Datacenter"], "dc1");
        assert_eq!(b["ServiceIdentities"][0]["ServiceName"], "app");
        assert_eq!(b["Policies"][0]["Name"], "agent-sim-p-from-0");
    }

    #[test]
    fn rules_only_for_what_identities_do_not_grant() {
        assert_eq!(needed_rules("p", false, &[]), None);
        let r = needed_rules("p", true, &["app/{i%10}/".into()]).unwrap();
        assert!(
            r.contains("session_prefix \"p-\" {\n  policy = \"write\"\n}"),
            "{r}"
        );
        assert!(
            r.contains("key_prefix \"app/\" {\n  policy = \"read\"\n}"),
            "{r}"
        );
    }
}
