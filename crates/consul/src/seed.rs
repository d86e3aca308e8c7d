//! `--seed-service NAME=COUNT`: a service of COUNT instances that the run
//! registers before its agents start and removes after them (the
//! 5,000-instance service of Criteo's streaming comparison). Instances are
//! spread over the run's nodes `<prefix>-seed-<n>`, [`PER_NODE`] each, one
//! passing check per instance (the size of a real `CheckServiceNode`);
//! the nodes carry the run's prefix in their meta, so `agent-sim cleanup`
//! finds them after a run that could not remove them.

use bytes::Bytes;
use serde_json::json;

pub use crate::modes::{MAX_SEED, SeedService};

use crate::http::{self, HttpApi, HttpError, META_PREFIX};
use crate::txn::{TxnOps, txn_body};

/// Instances per seed node: a node's ops (itself, an instance and its
/// check each) fit one txn of 128 ops.
pub const PER_NODE: u32 = 50;
/// Name of seed node `n`.
pub fn seed_node(prefix: &str, n: u32) -> String {
    format!("{prefix}-seed-{n}")
}

/// Txn ops of seed node `n` and its instances.
fn node_ops(prefix: &str, seed: &SeedService, n: u32) -> TxnOps {
    let node = seed_node(prefix, n);
    let address = format!(
        "10.{}.{}.{}",
        200 + (n >> 16) % 50,
        (n >> 8) & 0xff,
        n & 0xff
    );
    let first = n * PER_NODE;
    let last = (first + PER_NODE).min(seed.count);
    let mut ops = vec![
        json!({"Node": {"Verb": "set", "Node": {
            "Node": node, "Address": address,
            "Meta": {"agent-sim": "seed", META_PREFIX: prefix}}}})
        .to_string(),
    ];
    for i in first..last {
        let id = format!("{}-{i}", seed.name);
        ops.push(
            json!({"Service": {"Verb": "set", "Node": node, "Service": {
                "ID": id, "Service": seed.name, "Port": 8080, "Address": address,
                "Tags": ["agent-sim-seed"], "Meta": {"seed": i.to_string()}}}})
            .to_string(),
        );
        ops.push(
            json!({"Check": {"Verb": "set", "Check": {
                "Node": node, "CheckID": format!("{id}-health"),
                "Name": format!("{} health", seed.name), "Status": "passing",
                "ServiceID": id, "ServiceName": seed.name}}})
            .to_string(),
        );
    }
    TxnOps::new(ops)
}

/// Seed nodes of `seed`.
pub fn nodes(seed: &SeedService) -> u32 {
    seed.count.div_ceil(PER_NODE)
}

/// Registers the seeded service (a txn per node, in order).
pub async fn seed(http: &HttpApi, prefix: &str, seed: &SeedService) -> Result<(), HttpError> {
    for n in 0..nodes(seed) {
        let ops = node_ops(prefix, seed, n);
        http.put("/v1/txn", txn_body(&[&ops])).await?;
    }
    Ok(())
}

/// Removes the seed nodes with their instances (every node tried; the
/// first failure is returned).
pub async fn unseed(http: &HttpApi, prefix: &str, seed: &SeedService) -> Result<(), HttpError> {
    let mut first = Ok(());
    for n in 0..nodes(seed) {
        let body = Bytes::from(http::node_deregister_body(&seed_node(prefix, n)));
        if let Err(e) = http.put("/v1/catalog/deregister", body).await
            && first.is_ok()
        {
            first = Err(e);
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_and_count() {
        let s: SeedService = "big=5000".parse().unwrap();
        assert_eq!((s.name.as_str(), s.count), ("big", 5000));
        assert_eq!(s.to_string(), "big=5000");
        for bad in ["big", "=5", "big=0", "big=x", "a/b=3", "big=100001"] {
            assert!(bad.parse::<SeedService>().is_err(), "{bad}");
        }
    }

    #[test]
    fn instances_spread_over_nodes_that_fit_a_txn() {
        let s = SeedService {
            name: "big".into(),
            count: 5001,
        };
        assert_eq!(nodes(&s), 101);
        let full = node_ops("p", &s, 0);
        assert_eq!(full.len(), 1 + 2 * PER_NODE as usize);
        assert!(full.len() <= crate::config::TXN_MAX_OPS);
        assert_eq!(node_ops("p", &s, 100).len(), 1 + 2);
    }
}
