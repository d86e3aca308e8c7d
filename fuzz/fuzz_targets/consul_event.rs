//! One Subscribe message as a Consul agent receives it: the unknown-field
//! scan, prost's `Event` decode, and both kinds of view applying it (twice:
//! a register after a register, a deregister of what was never there).
#![no_main]

use agent_sim_consul::codec::unknown_event_fields;
use agent_sim_consul::view::{View, ViewKind};
use agent_sim_proto::consul::subscribe::Event;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|msg: &[u8]| {
    let _ = unknown_event_fields(msg);
    let Ok(ev) = Event::decode(msg) else {
        return;
    };
    for kind in [ViewKind::Health, ViewKind::Intentions] {
        let mut v = View::new(kind);
        let _ = v.apply(&ev, &mut |_| {});
        let _ = v.apply(&ev, &mut |_| {});
        let _ = v.take_dropped();
        let _ = v.resume_index();
    }
    let _ = ev.encode_to_vec();
});
