//! `hashicorp.consul.dataplane.DataplaneService`: what consul-dataplane
//! asks before Envoy starts. `GetEnvoyBootstrapParams` looks the proxy up
//! on its node in the catalog (`node not found`, `Service not found` as
//! Consul says them) and answers its destination service, datacenter and
//! node; `GetSupportedDataplaneFeatures` lists what this server offers.

use std::future::ready;

use agent_sim_proto::consul::dataplane::{
    DataplaneFeatureSupport, DataplaneFeatures, GetEnvoyBootstrapParamsRequest,
    GetEnvoyBootstrapParamsResponse, GetSupportedDataplaneFeaturesRequest,
    GetSupportedDataplaneFeaturesResponse, ServiceKind,
    get_envoy_bootstrap_params_request::NodeSpec,
};
use tonic::Status;
use tonic::server::UnaryService;

use super::{BoxFuture, authorize};
use crate::consul::ConsulState;

/// `GetEnvoyBootstrapParams`.
pub(super) struct Bootstrap(pub(super) ConsulState);

impl UnaryService<GetEnvoyBootstrapParamsRequest> for Bootstrap {
    type Response = GetEnvoyBootstrapParamsResponse;
    type Future = BoxFuture<Result<tonic::Response<Self::Response>, Status>>;

    fn call(&mut self, req: tonic::Request<GetEnvoyBootstrapParamsRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            authorize(&state, req.metadata())?;
            let r = req.into_inner();
            let proxy_id = if r.service_id.is_empty() {
                r.proxy_id
            } else {
                r.service_id
            };
            let store = state.store();
            let node = match r.node_spec {
                Some(NodeSpec::NodeName(n)) => n,
                Some(NodeSpec::NodeId(id)) => store
                    .nodes
                    .iter()
                    .find(|(_, n)| n.def.id == id)
                    .map(|(name, _)| name.clone())
                    .ok_or_else(|| Status::not_found("node not found"))?,
                None => return Err(Status::invalid_argument("Node ID or name required")),
            };
            let n = store
                .nodes
                .get(&node)
                .ok_or_else(|| Status::not_found("node not found"))?;
            let svc = n
                .services
                .get(&proxy_id)
                .ok_or_else(|| Status::not_found("Service not found"))?;
            let (kind, service) = match svc.def.connect_destination() {
                Some(dest) => (ServiceKind::ConnectProxy, dest.to_owned()),
                None => (ServiceKind::Typical, svc.def.service.clone()),
            };
            let resp = GetEnvoyBootstrapParamsResponse {
                service_kind: kind as i32,
                service,
                namespace: "default".into(),
                partition: "default".into(),
                datacenter: store.datacenter.clone(),
                node_id: n.def.id.clone(),
                node_name: node,
            };
            drop(store);
            let c = &state.inner.counters;
            c.bump(&c.xds_bootstraps);
            Ok(tonic::Response::new(resp))
        })
    }
}

/// `GetSupportedDataplaneFeatures`.
pub(super) struct Features;

impl UnaryService<GetSupportedDataplaneFeaturesRequest> for Features {
    type Response = GetSupportedDataplaneFeaturesResponse;
    type Future = BoxFuture<Result<tonic::Response<Self::Response>, Status>>;

    fn call(&mut self, _: tonic::Request<GetSupportedDataplaneFeaturesRequest>) -> Self::Future {
        let f = |feature: DataplaneFeatures| DataplaneFeatureSupport {
            feature_name: feature as i32,
            supported: true,
        };
        Box::pin(ready(Ok(tonic::Response::new(
            GetSupportedDataplaneFeaturesResponse {
                supported_dataplane_features: vec![
                    f(DataplaneFeatures::WatchServers),
                    f(DataplaneFeatures::EdgeCertificateManagement),
                    f(DataplaneFeatures::EnvoyBootstrapConfiguration),
                ],
            },
        ))))
    }
}
