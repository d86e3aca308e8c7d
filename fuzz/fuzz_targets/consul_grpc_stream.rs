//! A Subscribe response body as a server streams it: tonic's gRPC framing
//! (5-byte length prefixes) with the agents' decoder and message limit; and
//! the same bytes as the first bytes a server sent on a connection that
//! failed (`conn::what_answered`).
#![no_main]

use agent_sim_consul::codec::{MAX_EVENT_MESSAGE, SmallCodec};
use agent_sim_consul::conn::{FirstBytes, FirstRead, SNIFF_LEN, what_answered};
use libfuzzer_sys::fuzz_target;
use tonic::codec::{Codec as _, Streaming};

fuzz_target!(|body: &[u8]| {
    let first = FirstBytes::default();
    let _ = first.set(FirstRead::Bytes(body[..body.len().min(SNIFF_LEN)].into()));
    let _ = what_answered(&first);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let body = http_body_util::Full::new(bytes::Bytes::copy_from_slice(body));
    rt.block_on(async move {
        let mut s = Streaming::new_response(
            SmallCodec::default().decoder(),
            body,
            http::StatusCode::OK,
            None,
            Some(MAX_EVENT_MESSAGE),
        );
        while let Ok(Some(_ev)) = s.message().await {}
    });
});
