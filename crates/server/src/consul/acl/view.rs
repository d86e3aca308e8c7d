//! The JSON views of tokens and policies, as Consul 1.20's HTTP API
//! prints them: Go's field order, `omitempty` fields left out when empty,
//! links to policies that are gone dropped (as Consul drops them when it
//! reads a token).

use serde::Serialize;

use super::book::{Book, NodeIdentity, Policy, ServiceIdentity, Token};

/// A policy link as a token prints it.
#[derive(Serialize)]
pub(crate) struct LinkView<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    #[serde(rename = "Name")]
    name: &'a str,
}

/// A token as Consul 1.20 prints it (`ACLToken`, and the list's
/// `ACLTokenListStub`, which has the same fields here).
#[derive(Serialize)]
pub(crate) struct TokenView<'a> {
    #[serde(rename = "AccessorID")]
    accessor: &'a str,
    #[serde(rename = "SecretID")]
    secret: &'a str,
    #[serde(rename = "Description")]
    description: &'a str,
    #[serde(rename = "Policies", skip_serializing_if = "Vec::is_empty")]
    policies: Vec<LinkView<'a>>,
    #[serde(rename = "ServiceIdentities", skip_serializing_if = "<[_]>::is_empty")]
    service_identities: &'a [ServiceIdentity],
    #[serde(rename = "NodeIdentities", skip_serializing_if = "<[_]>::is_empty")]
    node_identities: &'a [NodeIdentity],
    #[serde(rename = "Local")]
    local: bool,
    #[serde(rename = "CreateTime")]
    create_time: &'a str,
    #[serde(rename = "Hash")]
    hash: &'a str,
    #[serde(rename = "CreateIndex")]
    create_index: u64,
    #[serde(rename = "ModifyIndex")]
    modify_index: u64,
}

impl Book {
    /// `t` as the API prints it (links to missing policies dropped).
    pub(crate) fn token_view<'a>(&'a self, t: &'a Token) -> TokenView<'a> {
        TokenView {
            accessor: &t.accessor,
            secret: &t.secret,
            description: &t.description,
            policies: t
                .policies
                .iter()
                .filter_map(|id| self.policy(id).ok())
                .map(|p| LinkView {
                    id: &p.id,
                    name: &p.name,
                })
                .collect(),
            service_identities: &t.service_identities,
            node_identities: &t.node_identities,
            local: t.local,
            create_time: &t.create_time,
            hash: &t.hash,
            create_index: t.create_index,
            modify_index: t.modify_index,
        }
    }
}

/// A policy as Consul 1.20 prints it (`ACLPolicy`).
#[derive(Serialize)]
pub(crate) struct PolicyView<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    #[serde(rename = "Name")]
    name: &'a str,
    #[serde(rename = "Description")]
    description: &'a str,
    #[serde(rename = "Rules")]
    rules: &'a str,
    #[serde(rename = "Datacenters", skip_serializing_if = "<[_]>::is_empty")]
    datacenters: &'a [String],
    #[serde(rename = "Hash")]
    hash: &'a str,
    #[serde(rename = "CreateIndex")]
    create_index: u64,
    #[serde(rename = "ModifyIndex")]
    modify_index: u64,
}

/// A policy in the list (`ACLPolicyListStub`: no rules, `Datacenters`
/// always printed).
#[derive(Serialize)]
pub(crate) struct PolicyStub<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
    #[serde(rename = "Name")]
    name: &'a str,
    #[serde(rename = "Description")]
    description: &'a str,
    #[serde(rename = "Datacenters")]
    datacenters: Option<&'a [String]>,
    #[serde(rename = "Hash")]
    hash: &'a str,
    #[serde(rename = "CreateIndex")]
    create_index: u64,
    #[serde(rename = "ModifyIndex")]
    modify_index: u64,
}

impl Policy {
    /// As `GET /v1/acl/policy/<id>` prints it.
    pub(crate) fn view(&self) -> PolicyView<'_> {
        PolicyView {
            id: &self.id,
            name: &self.name,
            description: &self.description,
            rules: &self.rules,
            datacenters: &self.datacenters,
            hash: &self.hash,
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }

    /// As `GET /v1/acl/policies` lists it.
    pub(crate) fn stub(&self) -> PolicyStub<'_> {
        PolicyStub {
            id: &self.id,
            name: &self.name,
            description: &self.description,
            datacenters: (!self.datacenters.is_empty()).then_some(self.datacenters.as_slice()),
            hash: &self.hash,
            create_index: self.create_index,
            modify_index: self.modify_index,
        }
    }
}
