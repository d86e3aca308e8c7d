//! The upkeep's calls as a Consul 1.20 client agent makes them
//! (`--consul-agent client`): on its RPC connection's call stream,
//! anti-entropy reads the node's services and checks and registers what the
//! catalog lacks (the node first, then each service with its check, each
//! its own `Catalog.Register`), sessions are `Session.Apply` and
//! `Session.Renew`, a flap re-registers the service with its check's new
//! status, and the agent sends `Coordinate.Update` and its router's
//! `Status.Ping`.

use std::borrow::Cow;

use tokio::time::Instant;

use super::{Done, Op, UpkeepCall};
use crate::agent::ConsulAgent;
use crate::agent::link::{CallLine, Caller, Rpc};
use crate::http::{self, META_PREFIX, Refusal};
use crate::modes::WatchMode;
use crate::rpc::MsgpackError;
use crate::rpc::catalog::{
    self, CheckDef, NodeIdent, ServiceDef, ServiceKind, decode_node_services,
};
use crate::rpc::mux::CallError;
use crate::rpc::{encode_ping, session};

/// An answer that is not what the method returns: counted with the
/// decoder's words (what it found where).
impl From<MsgpackError> for Refusal {
    fn from(e: MsgpackError) -> Self {
        Refusal {
            kind: e.kind(),
            words: Some(format!("the answer did not decode: {e}")),
        }
    }
}

impl From<CallError> for Refusal {
    fn from(e: CallError) -> Self {
        Refusal {
            kind: e.kind,
            words: Some(e.detail),
        }
    }
}

/// What an agent registers, owned (the call outlives the agent's borrow).
struct Node {
    ident: Ident,
    services: Vec<Service>,
}

/// The node's identity as every catalog call carries it.
struct Ident {
    datacenter: String,
    id: String,
    node: String,
    address: String,
    prefix: String,
    token: String,
}

impl Ident {
    fn borrow<'a>(&'a self, meta: &'a [(&'a str, &'a str)]) -> NodeIdent<'a> {
        NodeIdent {
            datacenter: &self.datacenter,
            id: &self.id,
            node: &self.node,
            address: &self.address,
            meta,
            token: &self.token,
        }
    }

    /// Consul's own node meta, then the run's marks (what `cleanup` finds).
    fn meta(&self) -> [(&str, &str); 4] {
        [
            ("consul-network-segment", ""),
            ("consul-version", CONSUL_VERSION),
            ("agent-sim", "1"),
            (META_PREFIX, &self.prefix),
        ]
    }
}

/// The version a client agent reports in its node meta.
const CONSUL_VERSION: &str = "1.20.1";

/// One service with its check (instances) or without (sidecars).
struct Service {
    id: String,
    service: String,
    port: u16,
    sidecar: Option<Sidecar>,
    status: Option<&'static str>,
}

/// What a sidecar proxies: its instance's ID and port, and its upstreams
/// (name, local bind port).
struct Sidecar {
    destination_id: String,
    local_port: u16,
    upstreams: Vec<(String, u16)>,
}

impl Service {
    fn with<T>(&self, address: &str, f: impl FnOnce(&ServiceDef<'_>, &[CheckDef<'_>]) -> T) -> T {
        let upstreams: Vec<(&str, u16)> = self
            .sidecar
            .iter()
            .flat_map(|s| s.upstreams.iter().map(|(n, p)| (n.as_str(), *p)))
            .collect();
        let kind = match &self.sidecar {
            None => ServiceKind::Plain,
            Some(s) => ServiceKind::Sidecar {
                destination: self.service.trim_end_matches("-sidecar-proxy"),
                destination_id: &s.destination_id,
                local_address: "127.0.0.1",
                local_port: s.local_port,
                upstreams: &upstreams,
            },
        };
        let def = ServiceDef {
            id: &self.id,
            service: &self.service,
            port: self.port,
            address,
            tags: &["agent-sim"],
            kind,
        };
        let check_id = http::check_id(&self.id);
        let name = format!("{} health", self.service);
        let checks: Vec<CheckDef<'_>> = self
            .status
            .map(|status| CheckDef {
                check_id: &check_id,
                name: &name,
                status,
                service_id: &self.id,
                service_name: &self.service,
                kind: "ttl",
                interval: "",
                output: "",
            })
            .into_iter()
            .collect();
        f(&def, &checks)
    }
}

/// A node ID for a node name: the same name always gets the same ID (a
/// restarted run's agents are the same nodes), shaped as a UUID v4.
pub(in crate::agent) fn node_id(name: &str) -> String {
    let fnv = |seed: u64| {
        name.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    };
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x8422_2325_cbf2_9ce4));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

impl ConsulAgent {
    /// What this agent registers, with each check's current status.
    fn node_spec(&self) -> Node {
        let sh = &self.shared;
        let node = self.node();
        let ident = Ident {
            datacenter: sh.cfg.conn.datacenter.clone(),
            id: node_id(&node),
            address: self.node_address(),
            node,
            prefix: sh.cfg.conn.name_prefix.clone(),
            token: self.token().to_owned(),
        };
        let own = sh.own(self.index);
        let n = own.instances;
        let upstreams: Vec<(String, u16)> = self
            .upstream_names()
            .into_iter()
            .enumerate()
            .map(|(j, name)| (name.to_owned(), 9191 + j as u16))
            .collect();
        let mut services = Vec::with_capacity(n as usize * 2);
        for k in 0..n {
            let id = http::instance_id(&own.service, self.index, k);
            let port = 8080 + k as u16;
            if sh.cfg.sidecars {
                services.push(Service {
                    id: format!("{id}-sidecar-proxy"),
                    service: format!("{}-sidecar-proxy", own.service),
                    port: 21000 + k as u16,
                    sidecar: Some(Sidecar {
                        destination_id: id.clone(),
                        local_port: port,
                        upstreams: upstreams.clone(),
                    }),
                    status: None,
                });
            }
            services.push(Service {
                id,
                service: own.service.to_string(),
                port,
                sidecar: None,
                status: Some(self.check_status(k, n)),
            });
        }
        Node { ident, services }
    }

    /// The status instance `k` of the agent's `instances` has after the
    /// flaps so far.
    fn check_status(&self, k: u32, instances: u32) -> &'static str {
        let n = instances.max(1);
        if self.flaps <= k {
            return "passing";
        }
        let last = k + (self.flaps - 1 - k) / n * n;
        if (last / n).is_multiple_of(2) {
            "warning"
        } else {
            "passing"
        }
    }

    /// A rebalance's check of the server it put in front, as Consul's
    /// router pings a server before it takes it: the RPC connection to it
    /// dialed from the session's source address, and `Status.Ping` on it.
    /// Answered: the move, with that connection for the next session (a
    /// real agent's pool keeps it); otherwise that server is skipped (not
    /// an error: the agent stays where it is).
    pub(super) fn check_move(&self, bind: Option<std::net::IpAddr>) -> UpkeepCall {
        let server = self.router.current();
        let watching = self.shared.cfg.watch == WatchMode::Blocking;
        let dial = self.dial_link(server, bind, watching);
        let caller = Caller {
            line: CallLine::default(),
            sh: self.shared.clone(),
            key: self.index as usize,
        };
        Box::pin(async move {
            let Ok(mut link) = dial.await else {
                return Done::Skipped(server);
            };
            let caller = Caller {
                line: link.line.clone(),
                ..caller
            };
            match link
                .driving(caller.call(Rpc::StatusPing, encode_ping))
                .await
            {
                Ok(_) => {
                    caller.sh.metrics.incr(caller.sh.ids.pings);
                    Done::Moved(Some(link))
                }
                Err(_) => Done::Skipped(server),
            }
        })
    }

    /// `op` on the agent's call stream.
    pub(super) fn rpc_call(&self, op: Op, line: CallLine) -> UpkeepCall {
        let sh = self.shared.clone();
        let c = Caller {
            line,
            sh: sh.clone(),
            key: self.index as usize,
        };
        match op {
            Op::Register => {
                let node = self.node_spec();
                Box::pin(async move { Done::Registered(register(&c, &node).await) })
            }
            Op::Sync if !sh.cfg.register => Box::pin(async move {
                let r = c.call(Rpc::StatusPing, encode_ping).await;
                Done::Synced(r.map(|_| true).map_err(Refusal::from))
            }),
            Op::Sync => {
                let node = self.node_spec();
                Box::pin(async move {
                    let r = read_node(&c, &node).await.map(|seen| seen.in_sync(&node));
                    Done::Synced(r)
                })
            }
            Op::CreateSession => self.create_session_call(c),
            Op::Renew => self.renew_call(c),
            Op::Flap => self.flap_call(c),
            Op::Coordinate => self.coordinate_call(c),
            Op::Ping => Box::pin(async move {
                let r = c.call(Rpc::StatusPing, encode_ping).await;
                Done::Pinged(r.map(|_| ()).map_err(Refusal::from))
            }),
            Op::Move => Box::pin(async { Done::Moved(None) }),
            Op::Sign => self.sign_call(c),
        }
    }

    /// `Session.Apply` creating the agent's TTL session.
    fn create_session_call(&self, c: Caller) -> UpkeepCall {
        let node = self.node();
        let sh = c.sh.clone();
        let ttl = sh.ttl.as_ref().map(|(_, t)| t.clone()).unwrap_or_default();
        let index = self.index;
        Box::pin(async move {
            let s = session::NewSession {
                datacenter: &sh.cfg.conn.datacenter,
                node: &node,
                name: "agent-sim",
                ttl: &ttl,
                behavior: "release",
                // A node that is no gossip member has no serfHealth.
                node_checks: &[],
                token: sh.token(index),
            };
            let create = |seq, out: &mut Vec<u8>| session::encode_create(seq, &s, out);
            let r = match c.call(Rpc::SessionApply, create).await {
                Ok(reply) => session::decode_apply(&reply.body)
                    .map(|id| id.into_owned())
                    .map_err(Refusal::from),
                Err(e) => Err(e.into()),
            };
            Done::SessionCreated(r)
        })
    }

    /// `Session.Renew` of the agent's session, timed.
    fn renew_call(&self, c: Caller) -> UpkeepCall {
        let id = self.session_id.as_deref().unwrap_or_default().to_owned();
        let index = self.index;
        Box::pin(async move {
            let start = Instant::now();
            let sh = &c.sh;
            let dc = &sh.cfg.conn.datacenter;
            let r = match c
                .call(Rpc::SessionRenew, |seq, out| {
                    session::encode_renew(seq, dc, &id, sh.token(index), out)
                })
                .await
            {
                Ok(reply) => session::decode_renew(&reply.body).map_err(Refusal::from),
                Err(e) => Err(e.into()),
            };
            Done::Renewed(r, start.elapsed())
        })
    }

    /// The next flap: the service registered again with its check's new
    /// status.
    fn flap_call(&self, c: Caller) -> UpkeepCall {
        let node = self.node_spec();
        let (id, status) = self.next_flap();
        Box::pin(async move {
            let Some(svc) = node.services.iter().find(|s| s.id == id) else {
                return Done::Flapped(Ok(()));
            };
            let flipped = Service {
                status: Some(status),
                id: svc.id.clone(),
                service: svc.service.clone(),
                port: svc.port,
                sidecar: None,
            };
            Done::Flapped(register_service(&c, &node.ident, &flipped).await)
        })
    }

    /// `Coordinate.Update` with the agent's coordinate (its gossip
    /// member's, else its own Vivaldi's), timed.
    fn coordinate_call(&self, c: Caller) -> UpkeepCall {
        let node = self.node();
        let coord = match self.member() {
            Some((pool, slot)) => pool.coordinate(slot),
            None => self
                .extra
                .as_ref()
                .and_then(|e| e.vivaldi.as_ref())
                .map_or_else(Default::default, |v| v.coord().clone()),
        };
        let index = self.index;
        Box::pin(async move {
            let start = Instant::now();
            let sh = &c.sh;
            let dc = &sh.cfg.conn.datacenter;
            let r = c
                .call(Rpc::CoordinateUpdate, |seq, out| {
                    crate::rpc::coordinate::encode_update(
                        seq,
                        dc,
                        &node,
                        &coord,
                        sh.token(index),
                        out,
                    )
                })
                .await;
            Done::Coordinated(r.map(|_| ()).map_err(Refusal::from), start.elapsed())
        })
    }

    /// `ConnectCA.Sign` of a new leaf's CSR.
    fn sign_call(&self, c: Caller) -> UpkeepCall {
        let req = self.sign_request();
        let index = self.index;
        Box::pin(async move {
            let (csr, dc) = match req {
                Ok(r) => r,
                Err(r) => return Done::Signed(Err(r)),
            };
            let sh = &c.sh;
            let r = c
                .call(Rpc::ConnectSign, |seq, out| {
                    crate::rpc::connect_ca::encode_sign(seq, &csr, &dc, sh.token(index), out)
                })
                .await;
            Done::Signed(match r {
                Ok(reply) => crate::agent::connect::signed(&reply),
                Err(e) => Err(e.into()),
            })
        })
    }
}

/// What anti-entropy's reads found of the node.
struct Seen {
    /// The catalog holds the node at the agent's address with the agent's
    /// node meta (a real agent's `syncNodeInfo` compares both: the leader's
    /// reconcile of a gossip join registers the node with only
    /// `consul-version`, and the run's marks must come back or `cleanup`
    /// cannot tell the node is the run's).
    node_ok: bool,
    /// Its services: ID, name, port.
    services: Vec<(String, String, u32)>,
}

impl Seen {
    fn has(&self, want: &Service) -> bool {
        self.services.iter().any(|(id, name, port)| {
            *id == want.id && *name == want.service && *port == u32::from(want.port)
        })
    }

    /// Whether the catalog holds the node with every service.
    fn in_sync(&self, node: &Node) -> bool {
        self.node_ok && node.services.iter().all(|want| self.has(want))
    }
}

/// Whether the catalog's node meta (sorted by key) is the agent's.
fn same_meta(seen: &[(Cow<'_, str>, Cow<'_, str>)], want: &[(&str, &str)]) -> bool {
    let mut want = want.to_vec();
    want.sort_unstable();
    seen.len() == want.len()
        && seen
            .iter()
            .zip(&want)
            .all(|((k, v), (wk, wv))| k == wk && v == wv)
}

/// Anti-entropy's reads: the node's services, then its checks.
async fn read_node(c: &Caller, node: &Node) -> Result<Seen, Refusal> {
    let meta = node.ident.meta();
    let n = node.ident.borrow(&meta);
    let reply = c
        .call(Rpc::NodeServices, |seq, out| {
            catalog::encode_node_read(seq, catalog::NODE_SERVICE_LIST, &n, out)
        })
        .await?;
    let list = decode_node_services(&reply.body)?;
    let seen = Seen {
        node_ok: list.node_known
            && list.node_address.as_deref() == Some(n.address)
            && same_meta(&list.node_meta, n.meta),
        services: list
            .services
            .iter()
            .map(|s| (s.id.to_string(), s.service.to_string(), s.port))
            .collect(),
    };
    let reply = c
        .call(Rpc::NodeChecks, |seq, out| {
            catalog::encode_node_read(seq, catalog::NODE_CHECKS, &n, out)
        })
        .await?;
    catalog::decode_node_checks(&reply.body)?;
    Ok(seen)
}

/// A client agent's full sync: read the node, then register what the
/// catalog lacks, the node first and then each missing service with its
/// check (as many `Catalog.Register` calls).
async fn register(c: &Caller, node: &Node) -> Result<(), Refusal> {
    let seen = read_node(c, node).await?;
    if !seen.node_ok {
        let meta = node.ident.meta();
        let n = node.ident.borrow(&meta);
        c.call(Rpc::Register, |seq, out| {
            catalog::encode_register(seq, &n, None, &[], false, out)
        })
        .await?;
    }
    for svc in node.services.iter().filter(|s| !seen.has(s)) {
        register_service(c, &node.ident, svc).await?;
    }
    Ok(())
}

/// One service with its check, the node's update skipped.
async fn register_service(c: &Caller, ident: &Ident, svc: &Service) -> Result<(), Refusal> {
    let meta = ident.meta();
    let n = ident.borrow(&meta);
    c.call(Rpc::Register, |seq, out| {
        svc.with(&ident.address, |def, checks| {
            catalog::encode_register(seq, &n, Some(def), checks, true, out)
        })
    })
    .await?;
    Ok(())
}
