//! What a gossip member does with bytes a peer sent, for the property
//! tests (`hostile.rs`) and the fuzz targets (`fuzz/fuzz_targets/gossip_*`):
//! every layer and decoder, and the shared view taking in whatever decoded.

use agent_sim_gossip::coordinate::Coord;
use agent_sim_gossip::pool::view::{Shown, View};
use agent_sim_gossip::serf::{self, SerfState};
use agent_sim_gossip::wire::msgs::{Ack, Alive, IndirectPing, Nack, Ping, PushPull, Verdict};
use agent_sim_gossip::wire::{self, Keyring, Security, kind, lzw};

const KEY: &str = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";

fn view() -> View {
    View {
        endpoints: vec!["127.0.0.1:7946".parse().unwrap()],
        tags: vec![("role".into(), "node".into())],
        ..View::default()
    }
}

/// One message (type byte, body) as the pool's UDP loop takes it.
fn message(v: &mut View, t: u8, body: &[u8]) {
    match t {
        kind::PING => drop(Ping::decode(body)),
        kind::INDIRECT_PING => drop(IndirectPing::decode(body)),
        kind::ACK => {
            if let Ok(a) = Ack::decode(body) {
                let _ = Coord::from_ack_payload(a.payload);
            }
        }
        kind::NACK => drop(Nack::decode(body)),
        kind::ALIVE => {
            if let Ok(a) = Alive::decode(body) {
                v.on_alive(&a, None, 3);
                let _ = serf::decode_tags(a.meta);
            }
        }
        kind::SUSPECT | kind::DEAD => {
            if let Ok(d) = Verdict::decode(body) {
                v.on_verdict(t, &d, None, 3);
            }
        }
        kind::USER => {
            if let Ok(Some((leave, ltime, node))) = serf::decode_intent(body) {
                v.on_intent((leave, ltime), node, body, None, 3);
            }
        }
        _ => {}
    }
    v.refresh_size();
}

/// A UDP packet, plain and as an encrypted pool reads it.
pub fn packet(bytes: &[u8]) {
    let keyed = Security {
        label: String::new(),
        keyring: Some(Keyring::from_base64(&[KEY]).unwrap()),
    };
    let mut v = view();
    for sec in [Security::default(), keyed] {
        if let Ok(plain) = sec.open_packet(bytes) {
            let _ = wire::each_message(&plain, &mut |t, b| message(&mut v, t, b));
        }
    }
    let _ = lzw::decompress(bytes, 1 << 20);
}

/// A stream's bytes (after the label): one message, read whole, then as a
/// push-pull merged into a view and its serf state.
pub fn stream(bytes: &[u8]) {
    let mut v = view();
    if let Ok(Some((msg, _))) = Security::default().open_stream(bytes)
        && let Some((&kind::PUSH_PULL, body)) = msg.split_first()
        && let Ok(pp) = PushPull::decode(body)
    {
        v.merge(&pp, None, 3);
        let _ = v.push_pull(false, Shown::Intents);
    }
    let _ = SerfState::decode(bytes);
}
