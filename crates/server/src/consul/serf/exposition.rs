//! The serf port's figures as a Consul 1.20.1 server exports its gossip at
//! `/v1/agent/metrics?format=prometheus`: go-metrics names under Consul's
//! `consul` prefix, dots (and `-`) made `_`, every series labelled
//! `network="lan"` (Consul's LAN pool sets that label on memberlist and
//! serf); counters and gauges as `# TYPE ... counter|gauge`, samples as
//! summaries (`timing::Summary`). Where each comes from in hashicorp's
//! sources is beside it. One series is agent-sim's own: the handler queue's
//! drops, which a real server only logs.
//!
//! Unlike a real server, every series is printed from the start (a real
//! one prints a series once it was first touched).

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Serf, lock};
use crate::consul::timing::{Summary, go_float};

/// The label on every series (Consul's `metricLabels` for the LAN pool).
const LAN: &str = "network=\"lan\"";

/// One counter or gauge: `# HELP` (a real server's help for these is
/// their name), `# TYPE`, the value.
fn single(out: &mut String, name: &str, kind: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {name}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{{{LAN}}} {}", go_float(v));
}

fn counter(out: &mut String, name: &str, c: &AtomicU64) {
    single(out, name, "counter", c.load(Ordering::Relaxed) as f64);
}

fn summary(out: &mut String, name: &str, s: &Mutex<Summary>) {
    lock(s).write(out, name, LAN, name);
}

/// go-metrics' Prometheus name for a key part (`consul:new-leader` is
/// `consul:new_leader`); `None` when what is left is not a valid name.
fn flatten(part: &str) -> Option<String> {
    let name: String = part
        .chars()
        .map(|c| if " .=-/".contains(c) { '_' } else { c })
        .collect();
    let valid = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    (valid && !name.is_empty()).then_some(name)
}

impl Serf {
    /// The Prometheus text of the serf port's series.
    pub(crate) fn prometheus(&self, out: &mut String) {
        let c = &self.counters;
        let s = &c.samples;
        // memberlist net_transport.go `udpListen`: {"memberlist", "udp",
        // "received"} by the bytes of each packet; net.go
        // `rawSendMsgPacket`: {"memberlist", "udp", "sent"} likewise.
        counter(out, "consul_memberlist_udp_received", &c.udp_bytes_received);
        counter(out, "consul_memberlist_udp_sent", &c.udp_bytes_sent);
        // net.go `handleConn`: {"memberlist", "tcp", "accept"} per stream;
        // `sendAndReceiveState`: {"memberlist", "tcp", "connect"};
        // `rawSendMsgStream`: {"memberlist", "tcp", "sent"} in bytes.
        counter(out, "consul_memberlist_tcp_accept", &c.tcp_accepted);
        counter(out, "consul_memberlist_tcp_connect", &c.tcp_dialed);
        counter(out, "consul_memberlist_tcp_sent", &c.tcp_bytes_sent);
        // state.go `aliveNode`, `suspectNode`, `deadNode`: {"memberlist",
        // "msg", "alive"|"suspect"|"dead"}, once a message is applied.
        counter(out, "consul_memberlist_msg_alive", &c.msg_alive);
        counter(out, "consul_memberlist_msg_suspect", &c.suspicions);
        counter(out, "consul_memberlist_msg_dead", &c.msg_dead);
        // state.go `probeNode`: {"memberlist", "degraded", "probe"} when
        // the awareness stretched the interval, and {"memberlist",
        // "probeNode"} its time; awareness.go: {"memberlist", "health",
        // "score"}.
        counter(out, "consul_memberlist_degraded_probe", &c.degraded_probes);
        summary(out, "consul_memberlist_probeNode", &s.probe_node);
        let score = lock(&self.table).awareness.score();
        single(
            out,
            "consul_memberlist_health_score",
            "gauge",
            f64::from(score),
        );
        // memberlist.go `checkBroadcastQueueDepth`: {"memberlist", "queue",
        // "broadcasts"} every QueueCheckInterval.
        summary(
            out,
            "consul_memberlist_queue_broadcasts",
            &s.queue_broadcasts,
        );
        // serf delegate.go `NotifyMsg`: {"serf", "msgs", "received"} by
        // each serf message's size; `GetBroadcasts`: {"serf", "msgs",
        // "sent"}.
        summary(out, "consul_serf_msgs_received", &s.msgs_received);
        summary(out, "consul_serf_msgs_sent", &s.msgs_sent);
        // serf.go `checkQueueDepth`: {"serf", "queue", "Intent"|"Event"|
        // "Query"} every QueueCheckInterval.
        summary(out, "consul_serf_queue_Intent", &s.queue_intent);
        summary(out, "consul_serf_queue_Event", &s.queue_event);
        summary(out, "consul_serf_queue_Query", &s.queue_query);
        // serf.go `handleNodeJoin`: {"serf", "member", "join"};
        // `handleNodeLeave`: {"serf", "member", "failed"|"left"} by the
        // member's new status.
        counter(out, "consul_serf_member_join", &c.joins);
        counter(out, "consul_serf_member_failed", &c.failures);
        counter(out, "consul_serf_member_left", &c.member_left);
        // serf.go `handleUserEvent`: {"serf", "events"} and {"serf",
        // "events", name} per event taken.
        counter(out, "consul_serf_events", &c.events);
        for (name, n) in lock(&c.events_by_name).iter() {
            if let Some(part) = flatten(name) {
                single(
                    out,
                    &format!("consul_serf_events_{part}"),
                    "counter",
                    *n as f64,
                );
            }
        }
        // agent-sim's own: memberlist logs "handler queue full, dropping
        // message" and counts nothing.
        counter(
            out,
            "agent_sim_memberlist_handler_queue_dropped",
            &c.handler_dropped,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_flatten_as_go_metrics_flattens_them() {
        assert_eq!(
            flatten("consul:new-leader").as_deref(),
            Some("consul:new_leader")
        );
        assert_eq!(flatten("a.b c").as_deref(), Some("a_b_c"));
        assert_eq!(flatten("déploy"), None);
        assert_eq!(flatten(""), None);
    }
}
