//! Why a catalog or session write of the embedded Consul server was
//! refused: one variant per cause, whose Display is Consul's own words as
//! they travel (an HTTP 500 body, an RPC error answer, a txn's `What`).

use super::sessions::DurationError;

/// The words of a write refused by one of the store's bounds.
pub(crate) const CATALOG_FULL: &str = "agent-sim serve: catalog is full (bounded store)";

/// Why a catalog or session write was refused, each cause its own
/// variant; the Display is Consul's words as they travel (the HTTP 500
/// body, the RPC error answer, a txn's `What`), byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WriteError {
    /// The node is not registered.
    #[error("Missing node registration")]
    MissingNode,
    /// A check names a service the node does not have.
    #[error("Missing service registration")]
    MissingService,
    /// A write would go past this server's bounds.
    #[error("{}", CATALOG_FULL)]
    Full,
    /// No node named.
    #[error("Must provide node")]
    NoNode,
    /// A node write without an address.
    #[error("Must provide address if SkipNodeUpdate is not set")]
    NoAddress,
    /// A service without a name.
    #[error("Must provide service name (Service.Service)")]
    NoServiceName,
    /// A connect proxy whose upstreams name one service twice (its key as
    /// Consul prints it: `[type="service", name="web", partition="", ...]`),
    /// in the multi-error list Consul answers with.
    #[error("1 error occurred:\n\t* upstreams cannot contain duplicates of {0}\n\n")]
    DuplicateUpstream(String),
    /// A check without an ID or a name.
    #[error("Must provide a check ID or name")]
    NoCheckId,
    /// A check of another node than the registration's.
    #[error("Check node must match the registration node")]
    CheckNodeMismatch,
    /// A session TTL that is no Go duration.
    #[error("Session TTL '{ttl}' invalid: {source}")]
    BadTtl {
        /// The TTL as sent.
        ttl: String,
        /// Why it does not parse.
        source: DurationError,
    },
    /// A session TTL out of the server's range (nanoseconds; the bounds as
    /// Go prints them).
    #[error("Invalid Session TTL '{nanos}', must be between [{min}={max}]")]
    TtlRange {
        /// The TTL asked, in nanoseconds.
        nanos: u128,
        /// The shortest allowed.
        min: String,
        /// The longest allowed.
        max: String,
    },
    /// A session behavior other than `release` or `delete`.
    #[error("Invalid Behavior setting '{0}'")]
    BadBehavior(String),
    /// A session names a check the node does not have.
    #[error("Missing check '{0}' registration")]
    MissingCheck(String),
    /// A session names a check that is critical.
    #[error("Check '{0}' is in critical state")]
    CriticalCheck(String),
}
