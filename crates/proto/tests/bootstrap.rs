//! Regenerates the checked-in bindings from `proto/*.proto` with protox (no system
//! `protoc`) and fails when they drift from what is committed.
//!
//! After editing a `.proto` file run `cargo test -p agent-sim-proto --test integration bootstrap`
//! once: it rewrites `crates/proto/src/gen/` and fails, and the second run passes.

use std::path::{Path, PathBuf};

const PROTOS: &[&str] = &[
    "sensu/core_v2.proto",
    "sensu/core_v3.proto",
    "consul/subscribe.proto",
    "consul/dataplane.proto",
    "consul/serverdiscovery.proto",
];

#[test]
fn generated_code_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto_dir = crate_dir.join("../../proto");
    let gen_dir = crate_dir.join("src/gen");
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| proto_dir.join(p)).collect();

    let fds = protox::compile(&files, [&proto_dir]).expect("protos compile");
    let tmp = std::env::temp_dir().join(format!("agent-sim-proto-gen-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .out_dir(&tmp)
        .compile_fds(fds)
        .expect("codegen");

    let mut drifted = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for name in names {
        let fresh = std::fs::read_to_string(tmp.join(&name)).unwrap();
        let committed_path = gen_dir.join(&name);
        let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
        if fresh != committed {
            std::fs::write(&committed_path, fresh).unwrap();
            drifted.push(name.to_string_lossy().into_owned());
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        drifted.is_empty(),
        "generated code was out of date and has been rewritten: {drifted:?}; commit crates/proto/src/gen/"
    );
}
