//! The upkeep's calls through the HTTP API (`--consul-agent api`):
//! registrations batched into `/v1/txn`, anti-entropy as a read of
//! `/v1/catalog/node/<node>`, sessions through `/v1/session`, check flaps
//! as catalog registrations that skip the node.

use std::time::Duration;

use ::http::Method;
use bytes::Bytes;
use tokio::time::Instant;

use super::{Done, Op, UpkeepCall};
use crate::agent::ConsulAgent;
use crate::http::{self, Refusal};
use crate::txn::TxnOps;

impl ConsulAgent {
    /// `op` as an HTTP call.
    pub(super) fn api_call(&self, op: Op) -> UpkeepCall {
        let sh = self.shared.clone();
        match op {
            Op::Register => {
                let ops = self.with_registration(http::registration_ops);
                Box::pin(
                    async move { Done::Registered(sh.batcher().submit(TxnOps::new(ops)).await) },
                )
            }
            Op::Sync => self.api_sync(),
            Op::CreateSession => {
                let ttl = sh.ttl.as_ref().map(|(_, t)| t.as_str()).unwrap_or_default();
                let body = Bytes::from(http::session_create_body(&self.node(), ttl));
                Box::pin(async move {
                    let r = match sh.http.put("/v1/session/create", body).await {
                        Ok(b) => serde_json::from_slice::<http::SessionCreated>(&b)
                            .map(|s| s.id)
                            .map_err(|_| Refusal::kind("http_decode")),
                        Err(e) => Err(e.into()),
                    };
                    Done::SessionCreated(r)
                })
            }
            Op::Renew => {
                let path = format!(
                    "/v1/session/renew/{}",
                    self.session_id.as_deref().unwrap_or("")
                );
                Box::pin(async move {
                    let start = Instant::now();
                    let r = match sh.http.put(&path, Bytes::new()).await {
                        Ok(_) => Ok(true),
                        // Expired, or the server lost it.
                        Err(e) if e.kind == "http_404" => Ok(false),
                        Err(e) => Err(Refusal::from(e)),
                    };
                    Done::Renewed(r, start.elapsed())
                })
            }
            Op::Flap => self.api_flap(),
            // The router's check of a server: whether it names a leader.
            Op::Ping => Box::pin(async move {
                let r = sh
                    .http
                    .call(Method::GET, "/v1/status/leader", Bytes::new())
                    .await
                    .map(|_| ())
                    .map_err(Refusal::from);
                Done::Pinged(r)
            }),
            // Only the client wire schedules coordinates.
            Op::Coordinate => Box::pin(async { Done::Coordinated(Ok(()), Duration::ZERO) }),
            Op::Move | Op::Sign => Box::pin(async { Done::Moved(None) }),
        }
    }

    /// Anti-entropy: the catalog's node compared with the registration,
    /// or, with nothing registered, whether the server has a leader.
    fn api_sync(&self) -> UpkeepCall {
        let sh = self.shared.clone();
        if !sh.cfg.register {
            return Box::pin(async move {
                let r = match sh
                    .http
                    .call(Method::GET, "/v1/status/leader", Bytes::new())
                    .await
                {
                    Ok(b) => serde_json::from_slice::<String>(&b)
                        .map(|l| !l.is_empty())
                        .map_err(|_| Refusal::kind("http_decode")),
                    Err(e) => Err(e.into()),
                };
                Done::Synced(r)
            });
        }
        let expected = self.with_registration(http::expected_services);
        let address = http::node_address(self.index);
        let path = format!("/v1/catalog/node/{}", self.node());
        Box::pin(async move {
            let r = match sh.http.call(Method::GET, &path, Bytes::new()).await {
                Ok(b) => http::node_in_sync(&b, &address, &expected).map_err(Refusal::kind),
                Err(e) => Err(e.into()),
            };
            Done::Synced(r)
        })
    }

    /// The next check flap: the agent's instances in turn, each to
    /// `warning` and back to `passing`.
    fn api_flap(&self) -> UpkeepCall {
        let sh = self.shared.clone();
        let (id, status) = self.next_flap();
        let body = Bytes::from(http::check_status_body(
            &self.node(),
            &http::node_address(self.index),
            &id,
            &sh.own(self.index).service,
            status,
        ));
        Box::pin(async move {
            let r = sh
                .http
                .put("/v1/catalog/register", body)
                .await
                .map(|_| ())
                .map_err(Refusal::from);
            Done::Flapped(r)
        })
    }
}
