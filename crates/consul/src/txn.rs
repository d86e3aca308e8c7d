//! The shared registration batcher: agents submit their catalog operations,
//! one task packs them into `PUT /v1/txn` requests (≤ 128 ops, ≤ 512 KB,
//! never splitting one agent's ops) and answers each agent on a oneshot.
//!
//! A rolled-back txn (409) names the failing ops: their agents get an
//! error, the others are sent again once in a txn of their own.

use std::sync::Arc;
use std::time::Duration;

use agent_sim_metrics::Metrics;
use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::config::TXN_MAX_OPS;
use crate::http::{HttpApi, Refusal, TxnResponse};

/// Largest txn body a server accepts (`txn_max_req_len`).
pub const TXN_MAX_BYTES: usize = 512 * 1024;
/// How long the batcher waits to fill a txn after its first op.
pub const LINGER: Duration = Duration::from_millis(5);
/// Txn requests in flight at once.
pub const MAX_IN_FLIGHT: usize = 8;

/// One agent's operations, JSON objects.
#[derive(Debug, Clone, Default)]
pub struct TxnOps {
    ops: Vec<String>,
}

impl TxnOps {
    /// Wraps ops (each a JSON object).
    pub fn new(ops: Vec<String>) -> Self {
        TxnOps { ops }
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes this adds to a txn body (ops plus separators).
    pub fn bytes(&self) -> usize {
        self.ops.iter().map(|o| o.len() + 1).sum()
    }
}

/// Whether a submission of `next` fits a txn already holding `ops` ops and
/// `bytes` body bytes.
pub fn fits(ops: usize, bytes: usize, next: &TxnOps, max_ops: usize, max_bytes: usize) -> bool {
    ops + next.len() <= max_ops && bytes + next.bytes() <= max_bytes
}

/// Packs submissions (in order) into groups of at most `max_ops` ops and
/// `max_bytes` body bytes; returns the group sizes. A submission larger
/// than a limit goes alone.
pub fn pack(subs: &[TxnOps], max_ops: usize, max_bytes: usize) -> Vec<usize> {
    let mut groups = Vec::new();
    let (mut n, mut ops, mut bytes) = (0usize, 0usize, 2usize);
    for s in subs {
        if n > 0 && !fits(ops, bytes, s, max_ops, max_bytes) {
            groups.push(n);
            (n, ops, bytes) = (0, 0, 2);
        }
        n += 1;
        ops += s.len();
        bytes += s.bytes();
    }
    if n > 0 {
        groups.push(n);
    }
    groups
}

/// The JSON array body of a txn.
pub fn txn_body(subs: &[&TxnOps]) -> Bytes {
    let len = 2 + subs.iter().map(|s| s.bytes()).sum::<usize>();
    let mut out = String::with_capacity(len);
    out.push('[');
    let mut first = true;
    for s in subs {
        for op in &s.ops {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(op);
        }
    }
    out.push(']');
    Bytes::from(out)
}

type Reply = oneshot::Sender<Result<(), Refusal>>;

struct Submit {
    ops: TxnOps,
    reply: Reply,
}

/// Handle to the batcher task.
#[derive(Clone)]
pub struct TxnBatcher {
    tx: mpsc::Sender<Submit>,
}

impl std::fmt::Debug for TxnBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TxnBatcher")
    }
}

impl TxnBatcher {
    /// Spawns the batcher task (call inside a tokio runtime). `txn_requests`
    /// counts each HTTP request.
    pub fn spawn(http: Arc<HttpApi>, metrics: Metrics) -> Self {
        // Bound: 4096 submissions queued (each agent has at most one in
        // flight, so this is rarely reached; senders wait when it is), and
        // MAX_IN_FLIGHT txn requests of ≤ TXN_MAX_BYTES each.
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(run(rx, http, metrics));
        TxnBatcher { tx }
    }

    /// Submits one agent's ops and waits for the txn's outcome.
    pub async fn submit(&self, ops: TxnOps) -> Result<(), Refusal> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Submit { ops, reply })
            .await
            .map_err(|_| Refusal::kind("txn_closed"))?;
        rx.await.unwrap_or(Err(Refusal::kind("txn_closed")))
    }
}

async fn run(mut rx: mpsc::Receiver<Submit>, http: Arc<HttpApi>, metrics: Metrics) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let txn_requests = metrics.counter("txn_requests");
    let mut carry: Option<Submit> = None;
    loop {
        let first = match carry.take() {
            Some(s) => s,
            None => match rx.recv().await {
                Some(s) => s,
                None => return,
            },
        };
        let mut ops = first.ops.len();
        let mut bytes = 2 + first.ops.bytes();
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + LINGER;
        let mut closed = false;
        while ops < TXN_MAX_OPS {
            let next = match rx.try_recv() {
                Ok(s) => s,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
                Err(mpsc::error::TryRecvError::Empty) => {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(s)) => s,
                        Ok(None) => {
                            closed = true;
                            break;
                        }
                        Err(_) => break,
                    }
                }
            };
            if !fits(ops, bytes, &next.ops, TXN_MAX_OPS, TXN_MAX_BYTES) {
                carry = Some(next);
                break;
            }
            ops += next.ops.len();
            bytes += next.ops.bytes();
            batch.push(next);
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let http = http.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            send(batch, &http, &metrics, txn_requests, true).await;
            drop(permit);
        });
        if closed && carry.is_none() {
            return;
        }
    }
}

async fn send(
    batch: Vec<Submit>,
    http: &HttpApi,
    metrics: &Metrics,
    txn_requests: agent_sim_metrics::CounterId,
    retry_rollback: bool,
) {
    let body = txn_body(&batch.iter().map(|s| &s.ops).collect::<Vec<_>>());
    metrics.incr(txn_requests);
    match http.put("/v1/txn", body).await {
        Ok(_) => {
            for s in batch {
                let _ = s.reply.send(Ok(()));
            }
        }
        Err(e) if e.status == Some(409) && retry_rollback => {
            // Find which submissions hold failing ops (with the server's
            // words for them); retry the rest once.
            let failed = serde_json::from_slice::<TxnResponse>(&e.body)
                .ok()
                .and_then(|r| r.errors)
                .unwrap_or_default();
            let mut retry = Vec::new();
            let mut start = 0usize;
            for s in batch {
                let end = start + s.ops.len();
                let hit = failed
                    .iter()
                    .find(|f| f.op_index >= start && f.op_index < end);
                start = end;
                match hit {
                    Some(f) => {
                        let _ = s.reply.send(Err(Refusal {
                            kind: crate::http::cause_kind(&f.what).unwrap_or("txn_rollback"),
                            words: Some(format!("HTTP 409 (txn rolled back): {}", f.what)),
                        }));
                    }
                    None if failed.is_empty() => {
                        let mut r = Refusal::from(e.clone());
                        r.kind = "txn_rollback";
                        let _ = s.reply.send(Err(r));
                    }
                    None => retry.push(s),
                }
            }
            if !retry.is_empty() {
                Box::pin(send(retry, http, metrics, txn_requests, false)).await;
            }
        }
        Err(e) => {
            let mut refusal = Refusal::from(e.clone());
            if e.status == Some(409) {
                refusal.kind = "txn_rollback";
            }
            for s in batch {
                let _ = s.reply.send(Err(refusal.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(n: usize, size: usize) -> TxnOps {
        TxnOps::new((0..n).map(|_| "x".repeat(size)).collect())
    }

    #[test]
    fn packs_at_most_128_ops_without_splitting_an_agent() {
        let subs: Vec<_> = (0..100).map(|_| sub(3, 10)).collect();
        let groups = pack(&subs, TXN_MAX_OPS, TXN_MAX_BYTES);
        // 42 agents × 3 ops = 126 ≤ 128; 43 would be 129.
        assert_eq!(groups, vec![42, 42, 16]);
        let mut at = 0;
        for g in groups {
            let ops: usize = subs[at..at + g].iter().map(|s| s.len()).sum();
            assert!(ops <= TXN_MAX_OPS);
            at += g;
        }
        assert_eq!(at, 100);
    }

    #[test]
    fn packs_under_the_byte_limit() {
        let subs: Vec<_> = (0..10).map(|_| sub(1, 100_000)).collect();
        let groups = pack(&subs, TXN_MAX_OPS, TXN_MAX_BYTES);
        assert_eq!(groups, vec![5, 5]);
        // An oversized submission still goes (alone).
        assert_eq!(pack(&[sub(200, 1)], TXN_MAX_OPS, TXN_MAX_BYTES), vec![1]);
        assert!(pack(&[], 128, 100).is_empty());
    }

    #[test]
    fn body_is_one_json_array_of_all_ops() {
        let a = TxnOps::new(vec![r#"{"a":1}"#.into(), r#"{"b":2}"#.into()]);
        let b = TxnOps::new(vec![r#"{"c":3}"#.into()]);
        let body = txn_body(&[&a, &b]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 3);
        assert!(body.len() <= 2 + a.bytes() + b.bytes());
    }
}
