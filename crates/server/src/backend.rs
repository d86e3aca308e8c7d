//! One embedded backend as a unit: the Sensu endpoint and/or the Consul RPC
//! port, HTTP API and (optionally) public gRPC port and serf LAN port on
//! their addresses, the faults they inject, and
//! restarts (stop, stay down, start again on the same ports, with or
//! without the state) — what `agent-sim serve` runs, and what a test starts
//! in-process to restart it from the test.
//!
//! Each start of the servers is a generation with its own cancellation
//! token; a restart cancels it (Sensu sessions get close 1001, Consul
//! streams end with the real server's shutting-down words), waits for the
//! servers to return, keeps the ports closed for `down`, then binds the same
//! addresses again. Counters and faults outlive generations.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "consul")]
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::faults::{FaultSnapshot, FaultSpec, Faults, RestartState, at_moments};
use crate::listen;

#[cfg(feature = "consul")]
use crate::consul::{ConsulState, ConsulTargetConfig, ConsulTargetSnapshot};
#[cfg(feature = "sensu")]
use crate::sensu::{SensuTargetConfig, SensuTargetSnapshot, SensuTargetStats};

/// How long a stopping generation's servers get to return.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a restart keeps trying to bind a port again.
const REBIND_FOR: Duration = Duration::from_secs(3);

/// What to serve, where, and which faults to inject.
#[derive(Clone, Default)]
pub struct BackendConfig {
    /// The Sensu agent endpoint: address and settings.
    #[cfg(feature = "sensu")]
    pub sensu: Option<(SocketAddr, SensuTargetConfig)>,
    /// The Consul RPC port, HTTP API and settings.
    #[cfg(feature = "consul")]
    pub consul: Option<ConsulAddrs>,
    /// `SO_REUSEPORT` on every listener.
    pub reuse_port: bool,
    /// Faults to inject (they replace any set in the protocol settings).
    pub faults: Vec<FaultSpec>,
    /// Seed of the faults' dice.
    pub faults_seed: u64,
    /// Told what happens to the backend (restarts), one line each.
    pub log: Option<Arc<dyn Fn(String) + Send + Sync>>,
}

impl std::fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendConfig")
            .field("faults", &self.faults)
            .field("faults_seed", &self.faults_seed)
            .finish_non_exhaustive()
    }
}

/// Where and how the Consul side serves.
#[cfg(feature = "consul")]
#[derive(Debug, Clone)]
pub struct ConsulAddrs {
    /// The server RPC port (`0x08` + gRPC).
    pub rpc: SocketAddr,
    /// The HTTP API.
    pub http: SocketAddr,
    /// The public gRPC port (dataplane, Envoy Delta xDS), if served.
    pub grpc: Option<SocketAddr>,
    /// Settings of the server.
    pub cfg: ConsulTargetConfig,
    /// The state to serve, when several servers share one (a cluster's
    /// replicated catalog: each server its own listeners); `None`: a new
    /// one from `cfg`.
    pub state: Option<ConsulState>,
}

/// A running backend (clones share it).
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").finish_non_exhaustive()
    }
}

struct Inner {
    #[cfg(feature = "sensu")]
    sensu: Option<(SocketAddr, SensuTargetConfig)>,
    #[cfg(feature = "sensu")]
    sensu_stats: Arc<SensuTargetStats>,
    #[cfg(feature = "consul")]
    consul: Option<(SocketAddr, SocketAddr)>,
    #[cfg(feature = "consul")]
    consul_grpc: Option<SocketAddr>,
    /// The serf LAN port (UDP and TCP), bound.
    #[cfg(feature = "consul")]
    consul_serf: Option<SocketAddr>,
    #[cfg(feature = "consul")]
    consul_state: Mutex<Option<ConsulState>>,
    reuse_port: bool,
    faults: Faults,
    generation: tokio::sync::Mutex<Generation>,
    stop: CancellationToken,
    log: Option<Arc<dyn Fn(String) + Send + Sync>>,
    restarts: AtomicU64,
}

/// One start of the servers.
#[derive(Default)]
struct Generation {
    token: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// Listeners bound for one generation.
#[derive(Default)]
struct Bound {
    #[cfg(feature = "sensu")]
    sensu: Option<TcpListener>,
    #[cfg(feature = "consul")]
    consul: Option<(TcpListener, TcpListener)>,
    #[cfg(feature = "consul")]
    consul_grpc: Option<TcpListener>,
    #[cfg(feature = "consul")]
    consul_serf: Option<(tokio::net::UdpSocket, TcpListener)>,
}

impl Backend {
    /// Binds every address (port 0: any; restarts reuse the port bound),
    /// arms the faults and starts serving.
    pub async fn start(cfg: BackendConfig) -> io::Result<Backend> {
        let faults = Faults::new(cfg.faults.clone(), cfg.faults_seed);
        let bind = |addr: SocketAddr, what: &str| {
            listen::bind(addr, cfg.reuse_port)
                .map_err(|e| io::Error::new(e.kind(), format!("{what} {addr}: {e}")))
        };
        let mut bound = Bound::default();
        #[cfg(feature = "sensu")]
        let sensu = match &cfg.sensu {
            Some((addr, s)) => {
                let l = bind(*addr, "sensu")?;
                let at = l.local_addr()?;
                bound.sensu = Some(l);
                Some((
                    at,
                    SensuTargetConfig {
                        faults: faults.clone(),
                        ..s.clone()
                    },
                ))
            }
            None => None,
        };
        #[cfg(feature = "consul")]
        let (consul, consul_grpc, consul_serf, consul_state) = match &cfg.consul {
            Some(c) => {
                let rpc = bind(c.rpc, "consul rpc")?;
                let http = bind(c.http, "consul http")?;
                let at = (rpc.local_addr()?, http.local_addr()?);
                bound.consul = Some((rpc, http));
                let grpc_at = match c.grpc {
                    Some(addr) => {
                        let l = bind(addr, "consul grpc")?;
                        let at = l.local_addr()?;
                        bound.consul_grpc = Some(l);
                        Some(at)
                    }
                    None => None,
                };
                let serf_at = match &c.cfg.serf {
                    Some(serf) => {
                        serf.validate()
                            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                        let (udp, tcp) = crate::consul::bind_serf(serf.bind).map_err(|e| {
                            io::Error::new(e.kind(), format!("consul serf {}: {e}", serf.bind))
                        })?;
                        let at = tcp.local_addr()?;
                        bound.consul_serf = Some((udp, tcp));
                        Some(at)
                    }
                    None => None,
                };
                let state = c.state.clone().unwrap_or_else(|| {
                    ConsulState::new(ConsulTargetConfig {
                        faults: faults.clone(),
                        serf: c.cfg.serf.clone().map(|s| s.logging_to(cfg.log.clone())),
                        ..c.cfg.clone()
                    })
                });
                (Some(at), grpc_at, serf_at, Some(state))
            }
            None => (None, None, None, None),
        };
        faults.start();
        let backend = Backend {
            inner: Arc::new(Inner {
                #[cfg(feature = "sensu")]
                sensu,
                #[cfg(feature = "sensu")]
                sensu_stats: Arc::default(),
                #[cfg(feature = "consul")]
                consul,
                #[cfg(feature = "consul")]
                consul_grpc,
                #[cfg(feature = "consul")]
                consul_serf,
                #[cfg(feature = "consul")]
                consul_state: Mutex::new(consul_state),
                reuse_port: cfg.reuse_port,
                faults,
                generation: tokio::sync::Mutex::new(Generation::default()),
                stop: CancellationToken::new(),
                log: cfg.log.clone(),
                restarts: AtomicU64::new(0),
            }),
        };
        *backend.inner.generation.lock().await = backend.spawn(bound);
        backend.schedule_restarts();
        Ok(backend)
    }

    /// Starts the servers on `bound`.
    fn spawn(&self, bound: Bound) -> Generation {
        let token = self.inner.stop.child_token();
        let mut tasks = Vec::new();
        #[cfg(feature = "sensu")]
        if let (Some(l), Some((_, cfg))) = (bound.sensu, &self.inner.sensu) {
            let (cfg, stats, t) = (cfg.clone(), self.inner.sensu_stats.clone(), token.clone());
            tasks.push(tokio::spawn(async move {
                let _ = crate::sensu::serve(l, cfg, stats, t).await;
            }));
        }
        #[cfg(feature = "consul")]
        if let (Some((rpc, http)), Some(state)) = (bound.consul, self.consul_state()) {
            let grpc_at = bound.consul_grpc.as_ref().and_then(|l| l.local_addr().ok());
            state.note_listeners(rpc.local_addr().ok(), grpc_at);
            if let Some((udp, tcp)) = bound.consul_serf {
                let (s4, t4) = (state.clone(), token.clone());
                tasks.push(tokio::spawn(async move {
                    let _ = crate::consul::serve_serf(udp, tcp, s4, t4).await;
                }));
            }
            let (s1, t1) = (state.clone(), token.clone());
            tasks.push(tokio::spawn(async move {
                let _ = crate::consul::serve_rpc(rpc, s1, t1).await;
            }));
            if let Some(grpc) = bound.consul_grpc {
                let (s3, t3) = (state.clone(), token.clone());
                tasks.push(tokio::spawn(async move {
                    let _ = crate::consul::serve_grpc(grpc, s3, t3).await;
                }));
            }
            let t2 = token.clone();
            tasks.push(tokio::spawn(async move {
                let _ = crate::consul::serve_http(http, state, t2).await;
            }));
        }
        Generation { token, tasks }
    }

    /// One task per scheduled `restart` fault.
    fn schedule_restarts(&self) {
        let Some(start) = self.inner.faults.started_at() else {
            return;
        };
        for (idx, spec) in self.inner.faults.restarts() {
            let weak = Arc::downgrade(&self.inner);
            let stop = self.inner.stop.clone();
            let (down, state) = (spec.down, spec.state.unwrap_or(RestartState::Keep));
            tokio::spawn(async move {
                at_moments(&spec, start, &stop, || {
                    // Gone with the backend: the task ends.
                    let alive = weak.upgrade();
                    async move {
                        let Some(inner) = alive else { return false };
                        let b = Backend { inner };
                        let restarted = b.restart_as(down, state, Some(idx)).await;
                        if let Err(e) = &restarted {
                            b.log(format!("restart failed: {e}"));
                        }
                        restarted.is_ok()
                    }
                })
                .await;
            });
        }
    }

    fn log(&self, line: String) {
        if let Some(log) = &self.inner.log {
            log(line);
        }
    }

    /// Stops the servers (sessions and streams end as on a shutdown), keeps
    /// the ports closed for `down`, then serves again on the same
    /// addresses, keeping or losing the Consul state.
    pub async fn restart(&self, down: Duration, state: RestartState) -> io::Result<()> {
        self.restart_as(down, state, None).await
    }

    async fn restart_as(
        &self,
        down: Duration,
        state: RestartState,
        idx: Option<usize>,
    ) -> io::Result<()> {
        let mut generation = self.inner.generation.lock().await;
        if self.inner.stop.is_cancelled() {
            return Ok(());
        }
        let what = match state {
            RestartState::Keep => "keep",
            RestartState::Lose => "lose",
        };
        self.log(format!(
            "restart: stopping, down for {down:?}, state:{what}"
        ));
        end(std::mem::take(&mut *generation)).await;
        self.inner.restarts.fetch_add(1, Ordering::Relaxed);
        if let Some(idx) = idx {
            self.inner.faults.restarted(idx);
        }
        tokio::select! {
            () = tokio::time::sleep(down) => {}
            () = self.inner.stop.cancelled() => return Ok(()),
        }
        #[cfg(feature = "consul")]
        {
            let mut cs = self
                .inner
                .consul_state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(s) = cs.as_ref() {
                *cs = Some(s.restarted(state));
            }
        }
        let bound = self.rebind().await?;
        *generation = self.spawn(bound);
        self.log("restart: serving again".to_owned());
        Ok(())
    }

    /// Binds the addresses of the first start again (retrying briefly: a
    /// port just closed may still be held for a moment).
    async fn rebind(&self) -> io::Result<Bound> {
        let deadline = tokio::time::Instant::now() + REBIND_FOR;
        loop {
            match self.try_bind() {
                Ok(b) => return Ok(b),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn try_bind(&self) -> io::Result<Bound> {
        let bind = |a: SocketAddr| listen::bind(a, self.inner.reuse_port);
        #[allow(unused_mut)]
        let mut b = Bound::default();
        #[cfg(feature = "sensu")]
        if let Some((addr, _)) = &self.inner.sensu {
            b.sensu = Some(bind(*addr)?);
        }
        #[cfg(feature = "consul")]
        if let Some((rpc, http)) = self.inner.consul {
            b.consul = Some((bind(rpc)?, bind(http)?));
        }
        #[cfg(feature = "consul")]
        if let Some(grpc) = self.inner.consul_grpc {
            b.consul_grpc = Some(bind(grpc)?);
        }
        #[cfg(feature = "consul")]
        if let Some(serf) = self.inner.consul_serf {
            b.consul_serf = Some(crate::consul::bind_serf(serf)?);
        }
        Ok(b)
    }

    /// Stops serving for good (bounded), and the faults' timers.
    pub async fn stop(&self) {
        self.inner.stop.cancel();
        self.inner.faults.stop();
        let mut generation = self.inner.generation.lock().await;
        end(std::mem::take(&mut *generation)).await;
    }

    /// Where the Sensu endpoint listens.
    #[cfg(feature = "sensu")]
    pub fn sensu_addr(&self) -> Option<SocketAddr> {
        self.inner.sensu.as_ref().map(|(a, _)| *a)
    }

    /// What the Sensu endpoint counted (across restarts).
    #[cfg(feature = "sensu")]
    pub fn sensu_stats(&self) -> Option<SensuTargetSnapshot> {
        self.inner
            .sensu
            .as_ref()
            .map(|_| self.inner.sensu_stats.snapshot())
    }

    /// Where the Consul RPC port and HTTP API listen.
    #[cfg(feature = "consul")]
    pub fn consul_addrs(&self) -> Option<(SocketAddr, SocketAddr)> {
        self.inner.consul
    }

    /// Where the Consul public gRPC port (dataplane, xDS) listens.
    #[cfg(feature = "consul")]
    pub fn consul_grpc_addr(&self) -> Option<SocketAddr> {
        self.inner.consul_grpc
    }

    /// Where the Consul serf LAN port (UDP and TCP) listens.
    #[cfg(feature = "consul")]
    pub fn consul_serf_addr(&self) -> Option<SocketAddr> {
        self.inner.consul_serf
    }

    /// The Consul server's state now (a restart that lost it replaces it).
    #[cfg(feature = "consul")]
    pub fn consul_state(&self) -> Option<ConsulState> {
        self.inner
            .consul_state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What the Consul server counted (across restarts).
    #[cfg(feature = "consul")]
    pub fn consul_stats(&self) -> Option<ConsulTargetSnapshot> {
        self.consul_state().map(|s| s.stats())
    }

    /// What the faults injected, and the restarts done.
    pub fn fault_stats(&self) -> FaultSnapshot {
        FaultSnapshot {
            restarts: self.inner.restarts.load(Ordering::Relaxed),
            ..self.inner.faults.snapshot()
        }
    }
}

/// Cancels a generation and waits (bounded) for its servers.
async fn end(generation: Generation) {
    generation.token.cancel();
    for t in generation.tasks {
        let _ = tokio::time::timeout(STOP_GRACE, t).await;
    }
}
