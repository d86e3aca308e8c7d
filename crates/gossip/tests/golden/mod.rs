//! What the golden-vector tests share: where the captured files are, and
//! the security layer that opens them.

use std::path::PathBuf;

use agent_sim_gossip::wire::{Keyring, Security};

/// `testdata/vectors`: the manifests' paths start there.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/vectors")
}

/// The manifest of one set (`consul/gossip`, `consul/serf`), whose file
/// paths start at `dir()` or at the set's own folder.
pub fn manifest(set: &str) -> serde_json::Value {
    let m = dir().join(set).join("manifest.json");
    serde_json::from_str(&std::fs::read_to_string(m).unwrap()).unwrap()
}

/// No label; the capture's key when it was encrypted.
pub fn security(encrypted: bool, key: &str) -> Security {
    Security {
        label: String::new(),
        keyring: encrypted.then(|| Keyring::from_base64(&[key]).unwrap()),
    }
}
