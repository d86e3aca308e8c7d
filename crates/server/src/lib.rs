//! Embedded reference backends: what agent-sim talks to when no real backend
//! is given (the demo, the tests, and `agent-sim serve` in another process).
//!
//! - [`sensu`] (feature `sensu`): a Sensu Go–compatible agent WebSocket
//!   endpoint that checks upgrade headers and credentials, sends
//!   `entity_config`, validates keepalives and events the way the real backend
//!   does, schedules `check_request`s on subscriptions and counts what it gets.
//! - [`consul`] (feature `consul`): the RPC port (`0x08` then gRPC
//!   `subscribe.StateChangeSubscription/Subscribe`) and the HTTP subset agents
//!   use (catalog, txn, sessions with TTL expiry, config entries).
//! - [`listen`]: listeners with `SO_REUSEPORT`, so several `serve` processes
//!   can share one port, and the accept side every server shares (the
//!   accept loop of `agent_sim_net`, failed accepts counted).
//! - [`faults`]: what `agent-sim serve --faults` injects (delays, drops,
//!   resets, stalls, refusals, gRPC statuses, cut snapshots, bad frames), at
//!   rates or at times, counted.
//! - [`backend`]: the servers as one unit with their faults, and restarts
//!   with or without their state ([`backend::Backend`]).
//!
//! Every server is a library function taking a bound listener and a
//! cancellation token. This is a test double sized for load, not a Sensu or
//! Consul implementation: no storage, no clustering.

pub mod backend;
pub mod faults;
pub mod listen;

#[cfg(feature = "consul")]
pub mod consul;
#[cfg(feature = "sensu")]
pub mod sensu;
