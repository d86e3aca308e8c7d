//! serf's user events (`messageUserEvent`): a name and a payload stamped
//! with the event clock, gossiped to every member (`consul event`, and the
//! `consul:new-leader` a server fires when it takes leadership), and the
//! recent ones a push-pull's serf state carries in its event buffer.

use agent_sim_proto::msgpack::Writer;

use super::kind_serf;
use crate::wire::read::Reader;
use crate::wire::{WireError, kind};

/// The event a Consul server fires when it becomes the leader; its
/// payload is the new leader's node name. A client agent then treats the
/// servers as up again and runs a full anti-entropy sync.
pub const NEW_LEADER: &str = "consul:new-leader";

/// One user event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UserEvent<'a> {
    /// Its time on the event clock.
    pub ltime: u64,
    /// Its name.
    pub name: &'a str,
    /// Its payload.
    pub payload: &'a [u8],
    /// "Can coalesce": the handler may fold several into the last.
    pub cc: bool,
}

impl<'a> UserEvent<'a> {
    /// The event wrapped as the memberlist user message it travels in.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(kind::USER);
        out.push(kind_serf::USER_EVENT);
        let mut w = Writer(out);
        w.map(4)
            .kv_bool("CC", self.cc)
            .kv_uint("LTime", self.ltime)
            .kv_str("Name", self.name)
            .str("Payload");
        raw_or_nil(&mut w, self.payload);
    }

    /// From a user message's body (serf's type byte first): `None` for
    /// serf's other messages.
    pub fn decode(body: &'a [u8]) -> Result<Option<Self>, WireError> {
        let (&t, rest) = body.split_first().ok_or(WireError::Truncated)?;
        if t != kind_serf::USER_EVENT {
            return Ok(None);
        }
        let mut e = UserEvent::default();
        Reader::new(rest).fields(|k, r| {
            match k {
                "LTime" => e.ltime = r.uint()?,
                "Name" => e.name = r.str()?,
                "Payload" => e.payload = r.bytes()?,
                "CC" => e.cc = r.bool()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(Some(e))
    }
}

/// `[]byte` as Go's codec writes it: nil when empty (a nil slice), raw
/// otherwise.
pub(crate) fn raw_or_nil(w: &mut Writer<'_>, b: &[u8]) {
    if b.is_empty() {
        w.nil();
    } else {
        w.raw(b);
    }
}

/// The events of one Lamport time in an event buffer: `(name, payload)`.
pub type Slot<'a> = (u64, Vec<(&'a str, &'a [u8])>);

/// The event buffer a push-pull's serf state carries (its `Events`: one
/// entry per Lamport time kept, nil where none), the empty slots left out.
/// `buf` is the whole state, serf's type byte first.
pub fn state_events(buf: &[u8]) -> Result<Vec<Slot<'_>>, WireError> {
    let (&t, rest) = buf.split_first().ok_or(WireError::Truncated)?;
    if t != kind_serf::PUSH_PULL {
        return Err(WireError::Unknown(t));
    }
    let mut out = Vec::new();
    Reader::new(rest).fields(|k, r| {
        if k != "Events" {
            return r.skip();
        }
        let n = r.array()?;
        for _ in 0..n {
            if r.nil()? {
                continue;
            }
            out.push(slot(r)?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// One `userEvents` entry: its time and its events.
fn slot<'a>(r: &mut Reader<'a>) -> Result<Slot<'a>, WireError> {
    let mut s: Slot<'a> = (0, Vec::new());
    r.fields(|k, r| {
        match k {
            "LTime" => s.0 = r.uint()?,
            "Events" => {
                let n = r.array()?;
                for _ in 0..n {
                    let (mut name, mut payload) = ("", &[][..]);
                    r.fields(|k, r| {
                        match k {
                            "Name" => name = r.str()?,
                            "Payload" => payload = r.bytes()?,
                            _ => r.skip()?,
                        }
                        Ok(())
                    })?;
                    s.1.push((name, payload));
                }
            }
            _ => r.skip()?,
        }
        Ok(())
    })?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_and_other_serf_messages_are_not_one() {
        let e = UserEvent {
            ltime: 7,
            name: NEW_LEADER,
            payload: b"srv",
            cc: false,
        };
        let mut b = Vec::new();
        e.encode(&mut b);
        assert_eq!(b[0], kind::USER);
        assert_eq!(UserEvent::decode(&b[1..]).unwrap(), Some(e));
        let mut intent = Vec::new();
        super::super::intent(false, 1, "a", &mut intent);
        assert_eq!(UserEvent::decode(&intent[1..]).unwrap(), None);
    }

    #[test]
    fn the_event_buffer_of_a_state_reads_its_kept_slots() {
        // serf's state with one slot kept among nils.
        let mut b = vec![kind_serf::PUSH_PULL];
        let mut w = Writer(&mut b);
        w.map(2).kv_uint("EventLTime", 3).str("Events").array(3);
        w.nil();
        w.map(2).kv_uint("LTime", 1).str("Events").array(1);
        w.map(2)
            .kv_str("Name", NEW_LEADER)
            .str("Payload")
            .raw(b"srv");
        w.nil();
        let got = state_events(&b).unwrap();
        assert_eq!(got, vec![(1, vec![(NEW_LEADER, &b"srv"[..])])]);
    }
}
