//! One backend message as a Sensu agent receives it: the `<kind>\n<body>`
//! split, the unknown-field scan and every body decoder, in both encodings,
//! then what the agent builds from it (a check reply, keepalives carrying
//! the entity config).
#![no_main]

use std::sync::Arc;

use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_sensu::messages::{MessageBuilder, Templates, agent_name};
use libfuzzer_sys::fuzz_target;

fn builder(enc: Encoding) -> MessageBuilder {
    let cfg = agent_sim_sensu::SensuConfig {
        encoding: enc,
        ..Default::default()
    };
    MessageBuilder::new(Arc::new(Templates::new(&cfg)), agent_name("a", 1), 1)
}

fuzz_target!(|payload: &[u8]| {
    let Ok(f) = codec::split_frame(payload) else {
        return;
    };
    for enc in [Encoding::Protobuf, Encoding::Json] {
        let _ = codec::unknown_fields(codec::KIND_CHECK_REQUEST, f.body, enc);
        let _ = codec::unknown_fields(codec::KIND_ENTITY_CONFIG, f.body, enc);
        let mut b = builder(enc);
        let mut out = Vec::new();
        if let Ok(r) = codec::decode_check_request(f.body, enc) {
            let _ = codec::encode_check_request(&r, enc);
            let check = b.check_result(&r, 1);
            let _ = b.write_event_frame(&mut out, check, 1, [1; 16], 1);
        }
        if let Ok(ec) = codec::decode_entity_config(f.body, enc) {
            b.apply_entity_config(ec);
            let _ = b.write_keepalive_frame(&mut out, 1, [2; 16], 1);
        }
        if let Ok(ev) = codec::decode_event(f.body, enc) {
            let _ = codec::validate_event(&ev, true);
            let _ = codec::encode_event(&ev, enc);
        }
    }
});
