//! The frames captured on a real client agent's RPC connection
//! (`testdata/vectors/consul/agent-rpc/`) and their manifest, as the
//! vector tests read them.

use std::path::Path;

use serde_json::Value;

/// Where the captured frames are.
pub const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/vectors/consul/agent-rpc"
);

/// A vector's bytes.
pub fn read(file: &str) -> Vec<u8> {
    std::fs::read(Path::new(DIR).join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The manifest's expected fields of `file`.
pub fn fields(file: &str) -> Value {
    let m: Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    m.as_array()
        .unwrap()
        .iter()
        .find(|e| e["file"] == format!("consul/agent-rpc/{file}"))
        .unwrap_or_else(|| panic!("{file} not in the manifest"))["expected_decoded_fields"]
        .clone()
}

/// The payload of a one-frame vector: a data frame without flags, on the
/// stream the manifest names (`yamux_stream`; stream 1 when it names none).
pub fn payload(file: &str) -> Vec<u8> {
    let b = read(file);
    assert_eq!(&b[..4], &[0, 0, 0, 0], "{file}: a data frame without flags");
    let stream = u32::from_be_bytes(b[4..8].try_into().unwrap());
    let want = fields(file)["yamux_stream"].as_u64().unwrap_or(1);
    assert_eq!(u64::from(stream), want, "{file}: its stream");
    let len = u32::from_be_bytes(b[8..12].try_into().unwrap()) as usize;
    assert_eq!(b.len(), 12 + len, "{file}: one whole frame");
    b[12..].to_vec()
}
