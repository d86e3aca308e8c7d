//! `hashicorp.consul.serverdiscovery.ServerDiscoveryService/WatchServers`:
//! the list of servers (this one, on the gRPC port's address), once, then
//! silence until shutdown.

use std::pin::Pin;

use agent_sim_proto::consul::serverdiscovery::{Server, WatchServersRequest, WatchServersResponse};
use futures_util::Stream;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::server::ServerStreamingService;

use super::{BoxFuture, authorize};
use crate::consul::{ConsulState, lock};

/// The version `WatchServers` reports.
const VERSION: &str = "1.20.1";

type ServerStream = Pin<Box<dyn Stream<Item = Result<WatchServersResponse, Status>> + Send>>;

/// `WatchServers`.
pub(super) struct WatchServers(pub(super) ConsulState, pub(super) CancellationToken);

impl ServerStreamingService<WatchServersRequest> for WatchServers {
    type Response = WatchServersResponse;
    type ResponseStream = ServerStream;
    type Future = BoxFuture<Result<tonic::Response<ServerStream>, Status>>;

    fn call(&mut self, req: tonic::Request<WatchServersRequest>) -> Self::Future {
        let (state, shutdown) = (self.0.clone(), self.1.clone());
        Box::pin(async move {
            authorize(&state, req.metadata())?;
            let addr = lock(&state.inner.grpc_addr)
                .map(|a| a.ip().to_string())
                .unwrap_or_else(|| "127.0.0.1".into());
            let list = WatchServersResponse {
                servers: vec![Server {
                    id: state.inner.cfg.node_name.clone(),
                    address: addr,
                    version: VERSION.into(),
                }],
            };
            // The list once; then nothing until the server goes away.
            let stream = futures_util::stream::unfold(Some(list), move |first| {
                let shutdown = shutdown.clone();
                async move {
                    match first {
                        Some(l) => Some((Ok(l), None)),
                        None => {
                            shutdown.cancelled().await;
                            None
                        }
                    }
                }
            });
            Ok(tonic::Response::new(Box::pin(stream) as ServerStream))
        })
    }
}
