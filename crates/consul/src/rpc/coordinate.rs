//! Network coordinates: the agent's Vivaldi estimate (serf's coordinate
//! client: 8 dimensions, a height, an adjustment and an error, moved by
//! each measured round trip) and `Coordinate.Update`, which sends it to the
//! servers every 15 s or more (the agent's `sendCoordinate`), written as
//! Consul 1.20's agent writes it.
//!
//! Until the agents gossip, the round trips are those of the agent's own
//! RPC calls to its server, and the server stands at the origin with a
//! fresh coordinate; the estimate moves as a real agent's would against a
//! peer it knows nothing of.

use std::time::Duration;

pub use agent_sim_gossip::coordinate::{Coord, DIMENSIONS, Vivaldi};
use agent_sim_proto::msgpack::Writer;

use super::request_header;

/// `Coordinate.Update`.
pub const UPDATE: &str = "Coordinate.Update";

/// How often an agent sends its coordinate in a cluster of `nodes`:
/// Consul's rate-scaled interval (at most 64 updates a second across the
/// cluster, at least 15 s apart), plus a random stagger of up to as much.
pub fn update_interval(nodes: u64) -> Duration {
    let base = Duration::from_secs(15).max(Duration::from_secs_f64(nodes as f64 / 64.0));
    base + base.mul_f64(fastrand::f64())
}

/// `Coordinate.Update` of `node`'s coordinate.
pub fn encode_update(
    seq: u64,
    datacenter: &str,
    node: &str,
    c: &Coord,
    token: &str,
    out: &mut Vec<u8>,
) {
    request_header(out, seq, UPDATE);
    let mut w = Writer(out);
    w.map(5).str("Coord").map(4);
    w.str("Adjustment").f64(c.adjustment);
    w.str("Error").f64(c.error);
    w.str("Height").f64(c.height);
    w.str("Vec").array(DIMENSIONS as u32);
    for x in c.vec {
        w.f64(x);
    }
    w.kv_str("Datacenter", datacenter).kv_str("Node", node);
    w.kv_str("Segment", "").kv_str("Token", token);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_scales_past_960_nodes() {
        for _ in 0..100 {
            let small = update_interval(100);
            assert!(small >= Duration::from_secs(15) && small <= Duration::from_secs(30));
            let big = update_interval(6_400);
            assert!(big >= Duration::from_secs(100) && big <= Duration::from_secs(200));
        }
    }
}
