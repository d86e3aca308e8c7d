//! Helpers shared by the integration tests.

/// A per-process path in the temp directory (tests run in parallel processes).
pub fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("agent-sim-test-{}-{name}", std::process::id()))
}
