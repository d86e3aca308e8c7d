//! One of each codec: the tree reads and writes msgpack through one module
//! (`agent_sim_proto::msgpack`), and only its crate links the msgpack
//! crates. A second reader or a direct `rmp-serde` call elsewhere fails
//! here with its file named.

use agent_sim_testkit::source::{repo_root, sources};

/// Where msgpack is read and written.
const HOME: &str = "crates/proto/src/msgpack/";

#[test]
fn msgpack_is_read_and_written_in_one_module() {
    let root = repo_root();
    let mut elsewhere = Vec::new();
    for f in sources() {
        let rel = f.path.strip_prefix(&root).unwrap_or(&f.path);
        let rel = rel.to_string_lossy().replace('\\', "/");
        if rel.starts_with(HOME) {
            continue;
        }
        let code = agent_sim_testkit::source::code(&f.text);
        for needle in ["rmp_serde::", "rmp::"] {
            if code.contains(needle) {
                elsewhere.push(format!("{rel}: names {needle}"));
            }
        }
    }
    assert!(
        elsewhere.is_empty(),
        "msgpack goes through agent_sim_proto::msgpack:\n{}",
        elsewhere.join("\n")
    );
}

#[test]
fn only_the_proto_crate_links_the_msgpack_crates() {
    let root = repo_root();
    let mut manifests = vec![root.join("benches/Cargo.toml")];
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        manifests.push(e.unwrap().path().join("Cargo.toml"));
    }
    let mut linking = Vec::new();
    for m in manifests {
        let Ok(text) = std::fs::read_to_string(&m) else {
            continue;
        };
        let links = text
            .lines()
            .any(|l| l.starts_with("rmp-serde") || l.starts_with("rmp.") || l.starts_with("rmp "));
        if links && !m.ends_with("crates/proto/Cargo.toml") {
            linking.push(m.display().to_string());
        }
    }
    assert!(
        linking.is_empty(),
        "link agent-sim-proto instead: {linking:?}"
    );
}
