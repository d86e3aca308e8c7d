//! A Subscribe response body as a server streams it (gRPC's 5-byte length
//! prefixes in HTTP/2 DATA frames) through the agents' HTTP/2 client,
//! decoder and message limit; the same bytes as all a server sent on that
//! connection (frames, header blocks, Huffman), read in pieces whose size
//! the first byte picks; and as the first bytes a server sent on a
//! connection that failed (`conn::what_answered`); and as a server's bytes
//! on a sidecar's bidirectional call whose requests (sizes from the second
//! byte) wait for the windows those bytes grant. The same code as the
//! property tests (`crates/consul/tests/receive`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/consul/tests/receive/mod.rs"]
mod receive;

fuzz_target!(|body: &[u8]| {
    let _ = receive::first_bytes(body);
    let _ = receive::stream(body.to_vec());
    let chunk = body.first().map_or(1, |b| usize::from(*b % 64) + 1);
    let _ = receive::connection(body.to_vec(), chunk);
    let size = body.get(1).map_or(0, |b| usize::from(*b) * 300);
    let _ = receive::bidi(body.to_vec(), chunk, &[size, size / 2, 1]);
});
