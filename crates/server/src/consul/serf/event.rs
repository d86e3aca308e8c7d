//! serf's user events on the server: the leader's `consul:new-leader`
//! fired (serf's `UserEvent`: the event clock's time, then the clock
//! moved on), events heard in gossip or in a peer's push-pull taken as
//! serf's `handleUserEvent` takes them (the clock witnessed; too old, or
//! already seen at its Lamport time: dropped), serf's event buffer (the
//! events of the latest 512 Lamport times, carried whole in every push-pull
//! state), and the messages' encoding: a user event (memberlist's user type
//! byte, serf's type byte 3, then `CC`, `LTime`, `Name`, `Payload`) and
//! serf's push-pull state with its buffer.
//!
//! The table's side (`members`): a new event is gossiped through the event
//! queue (`queue`, after memberlist's messages and serf's intents,
//! retransmitted as they are); an event heard is passed on once, as heard;
//! one merged from a push-pull is only taken.
//!
//! What it is not: no queries (serf's query clock is witnessed in
//! push-pulls only), no coalescing, no size limit of its own (what arrives
//! is bounded by its packet or stream).

use agent_sim_gossip::WireError;
use agent_sim_gossip::serf::event::{UserEvent, state_events};
use agent_sim_gossip::serf::{EVENT_BUFFER, SerfState};
use agent_sim_proto::msgpack::Writer;

/// Events kept per Lamport time at most (serf keeps every distinct one).
const MAX_PER_TIME: usize = 64;

/// The events of one Lamport time.
#[derive(Debug, Clone)]
struct Slot {
    ltime: u64,
    events: Vec<(Box<str>, Box<[u8]>)>,
}

/// serf's event buffer: the events of the latest EVENT_BUFFER Lamport
/// times, one slot per time modulo its length.
#[derive(Debug)]
pub(crate) struct Events {
    // Bound: EVENT_BUFFER slots of MAX_PER_TIME events each.
    slots: Vec<Option<Slot>>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            slots: vec![None; EVENT_BUFFER],
        }
    }
}

impl Events {
    /// serf's checks once the clock has witnessed `ev` (now at `clock`):
    /// `true` when it is neither too old nor already kept, and now kept.
    pub(crate) fn take(&mut self, clock: u64, ev: &UserEvent<'_>) -> bool {
        let len = EVENT_BUFFER as u64;
        if clock > len && ev.ltime < clock - len {
            return false;
        }
        let slot = &mut self.slots[(ev.ltime % len) as usize];
        let kept = match slot {
            Some(s) if s.ltime == ev.ltime => s,
            _ => slot.insert(Slot {
                ltime: ev.ltime,
                events: Vec::new(),
            }),
        };
        let seen = kept
            .events
            .iter()
            .any(|(n, p)| &**n == ev.name && &**p == ev.payload);
        if seen || kept.events.len() >= MAX_PER_TIME {
            return false;
        }
        kept.events.push((ev.name.into(), ev.payload.into()));
        true
    }

    /// The buffer as serf's push-pull carries it: an array of
    /// EVENT_BUFFER entries, nil where no event is kept.
    fn encode(&self, w: &mut Writer<'_>) {
        w.array(EVENT_BUFFER as u32);
        for slot in &self.slots {
            let Some(s) = slot else {
                w.nil();
                continue;
            };
            w.map(2).str("Events").array(s.events.len() as u32);
            for (name, payload) in &s.events {
                w.map(2).kv_str("Name", name).str("Payload");
                // Go's codec writes an empty (nil) `[]byte` as nil.
                if payload.is_empty() {
                    w.nil();
                } else {
                    w.raw(payload);
                }
            }
            w.kv_uint("LTime", s.ltime);
        }
    }
}

/// serf's push-pull state (type byte first) with the server's event
/// buffer, fields in the order a real server writes them.
pub(crate) fn encode_state(s: &SerfState<'_>, events: &Events, out: &mut Vec<u8>) {
    s.encode_with_events(out, &|w| events.encode(w));
}

/// The events a peer's push-pull state carries (serf's type byte first),
/// one by one.
pub(crate) fn state_user_events(state: &[u8]) -> Result<Vec<UserEvent<'_>>, WireError> {
    let slots = state_events(state)?;
    let events = slots.into_iter().flat_map(|(ltime, these)| {
        these.into_iter().map(move |(name, payload)| UserEvent {
            ltime,
            name,
            payload,
            cc: false,
        })
    });
    Ok(events.collect())
}

#[cfg(test)]
mod tests {
    use agent_sim_gossip::Security;
    use agent_sim_gossip::serf::event::NEW_LEADER;
    use agent_sim_gossip::wire::msgs::PushPull;
    use agent_sim_gossip::wire::{each_message, kind};

    use super::super::members::Table;
    use super::super::tests::table;
    use super::*;

    fn vector(name: &str) -> Vec<u8> {
        let dir = agent_sim_testkit::hostile::vectors_dir().join("consul/gossip/plain");
        std::fs::read(dir.join(name)).unwrap()
    }

    /// The serf messages (user message bodies) a captured packet holds.
    fn serf_messages(packet: &[u8]) -> Vec<Vec<u8>> {
        let plain = Security::default().open_packet(packet).unwrap();
        let mut out = Vec::new();
        each_message(&plain, &mut |t, body| {
            if t == kind::USER {
                out.push(body.to_vec());
            }
        })
        .unwrap();
        out
    }

    #[test]
    fn the_leader_s_event_is_byte_for_byte_a_real_server_s() {
        let heard = serf_messages(&vector(
            "udp-001-compound-ping_alive_alive_serf-user-event.bin",
        ));
        let real = heard.last().unwrap();
        let mut t = table();
        t.fire_event(NEW_LEADER, b"srv");
        let sent = t.queue.take(1400, 2, 1);
        assert_eq!(&sent[0][1..], &real[..]);
        assert_eq!(t.event_clock, 2, "the clock moved on");
    }

    #[test]
    fn the_push_pull_state_with_the_event_is_byte_for_byte_a_real_server_s() {
        let stream = vector("tcp-001-pushpull-join-from-responder.bin");
        let (msg, _) = Security::default().open_stream(&stream).unwrap().unwrap();
        let pp = PushPull::decode(&msg[1..]).unwrap();
        let real = pp.user_state;
        let mut t = table();
        t.event_clock = 1;
        t.fire_event(NEW_LEADER, b"srv");
        let s = SerfState {
            ltime: 1,
            status: vec![("srv", 0)],
            left: vec![],
            event_ltime: t.event_clock,
            query_ltime: 1,
        };
        let mut ours = Vec::new();
        encode_state(&s, &t.events, &mut ours);
        assert_eq!(ours, real);
        let events = state_user_events(real).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].ltime, events[0].name), (1, NEW_LEADER));
    }

    #[test]
    fn an_event_is_taken_once_and_old_ones_not_at_all() {
        let mut t = table();
        let counted = |t: &Table| t.counters.events.load(std::sync::atomic::Ordering::Relaxed);
        let ev = |ltime, name| UserEvent {
            ltime,
            name,
            payload: b"x",
            cc: false,
        };
        assert!(t.take_event(&ev(5, "deploy")));
        assert_eq!(t.event_clock, 6, "witnessed");
        assert!(!t.take_event(&ev(5, "deploy")), "seen at its time");
        assert!(t.take_event(&ev(5, "other")), "another at the same time");
        assert!(t.take_event(&ev(600, "late")));
        assert!(!t.take_event(&ev(10, "too-old")), "older than the buffer");
        assert_eq!(counted(&t), 3);
        let by = t.counters.events_by_name.lock().unwrap().clone();
        assert_eq!(by.get("deploy"), Some(&1));
        // A heard event is passed on as heard, once.
        let mut msg = Vec::new();
        ev(700, "fresh").encode(&mut msg);
        let before = t.queue.depths().events;
        t.heard_event(&UserEvent::decode(&msg[1..]).unwrap().unwrap(), &msg[1..]);
        t.heard_event(&UserEvent::decode(&msg[1..]).unwrap().unwrap(), &msg[1..]);
        assert_eq!(t.queue.depths().events, before + 1);
        assert_eq!(t.queue.take(1400, 2, 1), vec![msg]);
    }
}
