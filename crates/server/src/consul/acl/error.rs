//! Why an ACL request was refused by the store: one variant per cause,
//! whose Display is Consul 1.20's words as its HTTP API answers them (the
//! token writer's, the policy endpoint's, the handlers'), and the status
//! it answers with.

use super::rules::RulesError;

/// Why an ACL write or read was refused, in Consul 1.20's words (the
/// token writer's, the policy endpoint's, the HTTP handlers').
#[derive(Debug, thiserror::Error)]
pub(crate) enum BookError {
    #[error("Token decoding failed: {0}")]
    TokenDecode(#[source] serde_json::Error),
    #[error("Policy decoding failed: {0}")]
    PolicyDecode(#[source] serde_json::Error),
    #[error("Cannot specify the ID when creating a new policy")]
    PolicyIdOnCreate,
    #[error("Missing token AccessorID")]
    NoAccessor,
    #[error("Missing policy ID")]
    NoPolicyId,
    #[error("Invalid Token: {field} - {reason}")]
    BadTokenId {
        field: &'static str,
        reason: &'static str,
    },
    #[error("Invalid Token: {0} is already in use")]
    TokenIdInUse(&'static str),
    #[error("No such ACL policy with name {0:?}")]
    NoPolicyNamed(String),
    #[error("No such ACL policy with ID {0:?}")]
    NoPolicyWithId(String),
    #[error("No such ACL role with name {0:?}")]
    NoRoleNamed(String),
    #[error("No such ACL role with ID {0:?}")]
    NoRoleWithId(String),
    #[error("Service identity is missing the service name field on this token")]
    ServiceIdentityNoName,
    #[error("Service identity {0:?} cannot specify a list of datacenters on a local token")]
    ServiceIdentityLocalDcs(String),
    #[error(
        "Service identity {0:?} has an invalid name. Only lowercase alphanumeric characters, \
         '-' and '_' are allowed"
    )]
    ServiceIdentityName(String),
    #[error("Node identity is missing the node name field on this token")]
    NodeIdentityNoName,
    #[error("Node identity is missing the datacenter field on this token")]
    NodeIdentityNoDatacenter,
    #[error(
        "Node identity has an invalid name. Only lowercase alphanumeric characters, '-' and '_' \
         are allowed"
    )]
    NodeIdentityName,
    #[error("Invalid Policy: no Name is set")]
    PolicyNoName,
    #[error("Invalid Policy: invalid Name. Length must be greater than 0 and less than 128")]
    PolicyNameLength,
    #[error("Invalid Policy: invalid Name. Names cannot be prefixed with '/' or 'builtin/'")]
    PolicyNameReserved,
    #[error(
        "Invalid Policy: invalid Name. Only alphanumeric characters, a single '/', '-' and '_' \
         are allowed"
    )]
    PolicyNameChars,
    #[error("Invalid Policy: A Policy with Name {0:?} already exists")]
    PolicyNameTaken(String),
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error("Accessor ID is missing or an invalid UUID")]
    DeleteBadAccessor,
    #[error("Delete operation not permitted on the anonymous token")]
    DeleteAnonymous,
    #[error("Deletion of the request's authorization token is not permitted")]
    DeleteOwnToken,
    #[error("Delete operation not permitted on the builtin {0} policy")]
    DeleteBuiltin(String),
    #[error("Cannot find token to delete")]
    TokenGone,
    #[error("Cannot find policy to delete")]
    PolicyGone,
    #[error("Requested token does not exist: ACL not found")]
    NoToken,
    #[error("Requested policy does not exist: ACL not found")]
    NoPolicy,
    /// This server's bound (no Consul words: a real server has none).
    #[error("agent-sim serve: the ACL store holds at most {max} {what}")]
    Full { what: &'static str, max: usize },
}

impl BookError {
    /// The HTTP status Consul answers it with.
    pub(crate) fn status(&self) -> u16 {
        match self {
            BookError::TokenDecode(_)
            | BookError::PolicyDecode(_)
            | BookError::PolicyIdOnCreate
            | BookError::NoAccessor
            | BookError::NoPolicyId => 400,
            BookError::TokenGone
            | BookError::PolicyGone
            | BookError::NoToken
            | BookError::NoPolicy => 404,
            _ => 500,
        }
    }
}
