//! The golden vectors under `testdata/vectors` (bytes captured from a real
//! Sensu Go 6.12 backend and a real Consul 1.20 server, copied from the
//! project's shared data) are exactly what their manifest lists: every file
//! present with its size and sha256, and no file the manifest does not name.
//! The decoding tests of the protocol crates read the same directory.
//! `consul/rpc/`, `consul/agent-rpc/` and `consul/agent-rpc-connect/` hold
//! this project's own captures (blocking queries, and a real client agent's
//! own calls, on the multiplexed RPC port of a real Consul 1.20.1), and
//! `consul/h2/` the HTTP/2 frames of a Subscribe stream and of a sidecar's
//! connection (bootstrap, Delta ADS, `WatchServers`); each with its own
//! manifest, checked the same way.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/vectors")
}

fn files_under(dir: &Path, base: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, base, out);
        } else {
            let rel = path.strip_prefix(base).unwrap();
            out.insert(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The files a manifest lists, each checked for its size and sha256.
fn checked(root: &Path, manifest: &Path) -> BTreeSet<String> {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(manifest).unwrap()).unwrap();
    let entries = manifest.as_array().expect("manifest is a list of files");
    let mut listed = BTreeSet::new();
    for e in entries {
        let file = e["file"].as_str().unwrap();
        let bytes = std::fs::read(root.join(file)).unwrap_or_else(|err| panic!("{file}: {err}"));
        assert_eq!(
            bytes.len() as u64,
            e["size"].as_u64().unwrap(),
            "{file}: size"
        );
        let digest: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(digest, e["sha256"].as_str().unwrap(), "{file}: sha256");
        listed.insert(file.to_string());
    }
    listed
}

/// This project's own captures, kept across a refresh of the shared ones,
/// and how many files each holds at least.
const OWN_CAPTURES: [(&str, usize); 6] = [
    ("consul/rpc", 10),
    ("consul/agent-rpc", 10),
    ("consul/agent-rpc-connect", 10),
    ("consul/gossip", 10),
    ("consul/serf", 10),
    ("consul/h2", 6),
];

#[test]
fn every_vector_matches_the_manifest() {
    let root = root();
    let shared = checked(&root, &root.join("manifest.json"));
    assert!(shared.len() > 90, "{} entries", shared.len());
    let mut on_disk = BTreeSet::new();
    files_under(&root, &root, &mut on_disk);
    on_disk.remove("manifest.json");
    on_disk.remove("README.md");
    let mut listed = shared;
    for (dir, least) in OWN_CAPTURES {
        let ours = checked(&root, &root.join(dir).join("manifest.json"));
        assert!(ours.len() >= least, "{dir}: {} entries", ours.len());
        listed.extend(ours);
        on_disk.remove(&format!("{dir}/manifest.json"));
        on_disk.remove(&format!("{dir}/README.md"));
    }
    assert_eq!(on_disk, listed, "files on disk vs manifests");
}
