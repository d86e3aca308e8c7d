//! The summary's `vault` section: what a run's simulated Vault servers did
//! to the Consul cluster they stored in (`--vault-nodes`), what the run
//! checked while they did (one lock holder, the sampled read-back) and
//! what it removed at the end; and its lines of the final table.
//!
//! What it is not: the Vault simulation (in the Consul crate); this is
//! only the shape of its report.

use serde::{Deserialize, Serialize};

/// The lock checker's tallies: the server's lock holder read every
/// interval and compared with the node that believed it was active.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockCheck {
    /// Reads of the lock key answered.
    pub checks: u64,
    /// One node believed it was active and the server's holder was its
    /// session.
    pub agree: u64,
    /// More than one node believed it was active.
    pub split_brain: u64,
    /// The server's holder differed from the believing node's session.
    pub mismatch: u64,
    /// A node's belief changed during the read (a handover in progress).
    pub in_transition: u64,
    /// No holder and no believer (between terms: lock-delay, a wait).
    pub none_held: u64,
    /// Held by a session not of the run (another Vault, a killed run).
    pub held_by_other: u64,
    /// Held by the session of a node the run killed
    /// (`--vault-kill-active-at`), until the server expires it.
    #[serde(default)]
    pub held_by_dead: u64,
    /// Reads that failed.
    pub unread: u64,
}

/// The sampled read-back: one token entry in N read back, consistently,
/// just before the run deletes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadBackSummary {
    /// Read back as written.
    pub ok: u64,
    /// Not found (404).
    pub lost: u64,
    /// Found with other bytes.
    pub changed: u64,
    /// The read failed (error counted in the server's words).
    pub unread: u64,
    /// Sampled tokens not yet due for revocation at the end (removed by
    /// the clean-up unread).
    pub pending_at_end: u64,
}

/// One token storm (`--vault-burst`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BurstSummary {
    /// When it was due, seconds from the start.
    pub at_s: f64,
    /// Token creates asked.
    pub tokens: u32,
    /// Created.
    pub created: u64,
    /// When its last token was created, seconds from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_s: Option<f64>,
}

/// What the end's clean-up (or `agent-sim cleanup`) removed and found
/// left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VaultCleanup {
    /// Keys under the path removed.
    pub keys_removed: u64,
    /// Lock sessions of the run destroyed (those its nodes had not).
    pub sessions_removed: u64,
    /// Keys under the path still there afterwards.
    pub keys_left: u64,
    /// Lock sessions of the run still there afterwards.
    pub sessions_left: u64,
    /// What failed, in the server's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The `vault` section of the summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VaultSummary {
    /// Simulated Vault servers.
    pub nodes: u32,
    /// Their storage path in the KV store.
    pub path: String,
    /// Steady token creates per second asked.
    pub tokens_per_s: f64,
    /// A token's life (renewed at half, revoked at the end).
    pub token_ttl_s: f64,
    /// Tokens created.
    pub tokens_created: u64,
    /// Tokens renewed.
    pub tokens_renewed: u64,
    /// Tokens revoked at their TTL.
    pub tokens_revoked: u64,
    /// Tokens alive when the run ended (removed by the clean-up).
    pub tokens_live_at_end: u64,
    /// Storage calls (gets, lists, txns).
    pub kv_ops: u64,
    /// Storage writes (puts and deletes).
    pub kv_writes: u64,
    /// Locks acquired.
    pub lock_acquisitions: u64,
    /// Another node became active.
    pub leadership_changes: u64,
    /// Writes refused by their session check.
    pub fenced_writes: u64,
    /// When the first node became active, seconds from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_active_s: Option<f64>,
    /// Seconds without an active node at each handover.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handovers_s: Vec<f64>,
    /// The lock checker.
    pub lock_check: LockCheck,
    /// The sampled read-back.
    pub read_back: ReadBackSummary,
    /// The token storms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bursts: Vec<BurstSummary>,
    /// The end's clean-up.
    pub cleanup: VaultCleanup,
}

/// The `vault.<field>` paths of `--assert`.
pub const VAULT_FIELDS: [&str; 10] = [
    "split_brain",
    "mismatch",
    "read_back_lost",
    "read_back_changed",
    "keys_left",
    "sessions_left",
    "tokens_created",
    "leadership_changes",
    "fenced_writes",
    "handover_max_s",
];

/// The `vault.<f>` path's field, if it is one.
pub(crate) fn field(f: &str) -> Option<&'static str> {
    VAULT_FIELDS.into_iter().find(|x| *x == f)
}

impl LockCheck {
    /// What the checker saw, in the words of both the table and the page:
    /// `12 checks: 11 agreed, 0 split-brain, ...`.
    pub fn describe(&self) -> String {
        format!(
            "{} checks: {} agreed, {} split-brain, {} mismatched, {} in transition, {} free, {} \
             held by another, {} by a killed node",
            self.checks,
            self.agree,
            self.split_brain,
            self.mismatch,
            self.in_transition,
            self.none_held,
            self.held_by_other,
            self.held_by_dead
        )
    }
}

impl VaultSummary {
    /// The value of a [`VAULT_FIELDS`] path.
    pub fn stat(&self, field: &str) -> Option<f64> {
        let n = |v: u64| Some(v as f64);
        match field {
            "split_brain" => n(self.lock_check.split_brain),
            "mismatch" => n(self.lock_check.mismatch),
            "read_back_lost" => n(self.read_back.lost),
            "read_back_changed" => n(self.read_back.changed),
            "keys_left" => n(self.cleanup.keys_left),
            "sessions_left" => n(self.cleanup.sessions_left),
            "tokens_created" => n(self.tokens_created),
            "leadership_changes" => n(self.leadership_changes),
            "fenced_writes" => n(self.fenced_writes),
            "handover_max_s" => Some(self.handovers_s.iter().copied().fold(0.0, f64::max)),
            _ => None,
        }
    }

    /// The final table's lines.
    pub fn table_lines(&self) -> Vec<String> {
        let c = &self.lock_check;
        let r = &self.read_back;
        let mut out = vec![
            format!(
                "vault       {} nodes at {}: {} tokens created, {} renewed, {} revoked; {} storage \
                 calls ({} writes)",
                self.nodes,
                self.path,
                self.tokens_created,
                self.tokens_renewed,
                self.tokens_revoked,
                self.kv_ops,
                self.kv_writes
            ),
            format!(
                "vault lock  {} acquisitions, {} leadership changes, {} fenced writes; {}",
                self.lock_acquisitions,
                self.leadership_changes,
                self.fenced_writes,
                c.describe()
            ),
            format!(
                "vault read  back {} ok, {} lost, {} changed, {} unread ({} sampled still live at \
                 the end)",
                r.ok, r.lost, r.changed, r.unread, r.pending_at_end
            ),
        ];
        for b in &self.bursts {
            out.push(format!(
                "vault burst at {:.0}s: {} of {} tokens{}",
                b.at_s,
                b.created,
                b.tokens,
                b.done_s
                    .map(|d| format!(", all created {:.1}s after", d - b.at_s))
                    .unwrap_or_default()
            ));
        }
        if !self.handovers_s.is_empty() {
            let h: Vec<String> = self
                .handovers_s
                .iter()
                .map(|s| format!("{s:.2}s"))
                .collect();
            out.push(format!(
                "vault handover without an active node: {}",
                h.join(", ")
            ));
        }
        let k = &self.cleanup;
        out.push(format!(
            "vault clean {} keys and {} sessions removed; left: {} keys, {} sessions{}",
            k.keys_removed,
            k.sessions_removed,
            k.keys_left,
            k.sessions_left,
            k.error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assert::{Assertion, evaluate};
    use crate::summary::Summary;

    #[test]
    fn vault_paths_read_the_section_and_name_what_is_missing() {
        let mut s = Summary {
            vault: Some(VaultSummary {
                tokens_created: 10,
                handovers_s: vec![0.2, 1.5],
                ..Default::default()
            }),
            ..Default::default()
        };
        let asserts: Vec<Assertion> = [
            "vault.split_brain == 0",
            "vault.tokens_created >= 10",
            "vault.handover_max_s < 2",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert!(
            evaluate(&asserts, &s).iter().all(|v| v.passed),
            "{:?}",
            evaluate(&asserts, &s)
        );
        for f in VAULT_FIELDS {
            assert!(s.vault.as_ref().unwrap().stat(f).is_some(), "{f}");
        }
        let e = "vault.nope == 0"
            .parse::<Assertion>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown vault field") && e.contains("split_brain"),
            "{e}"
        );
        s.vault = None;
        let v = evaluate(&asserts[..1], &s);
        assert!(!v[0].passed);
        assert_eq!(
            v[0].note.as_deref(),
            Some("the run had no Vault servers (--vault-nodes)")
        );
    }

    #[test]
    fn the_table_says_the_lock_check_as_the_page_does() {
        let v = VaultSummary {
            lock_check: LockCheck {
                checks: 12,
                agree: 10,
                split_brain: 1,
                in_transition: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let said = v.lock_check.describe();
        assert!(
            said.starts_with("12 checks: 10 agreed, 1 split-brain, 0 mismatched, 1 in transition"),
            "{said}"
        );
        let lock = v
            .table_lines()
            .into_iter()
            .find(|l| l.starts_with("vault lock"))
            .unwrap();
        assert!(lock.ends_with(&format!("fenced writes; {said}")), "{lock}");
    }
}
