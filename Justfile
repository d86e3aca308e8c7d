# Convenience recipes; README's commands work without `just`.

# fmt check, clippy and tests: what CI runs
check:
    bash .ci/run

test:
    cargo test --workspace

# demo: 2,000 Sensu agents against the embedded backend for 30 s
demo agents="2000":
    cargo run --release -p agent-sim -- --agents {{agents}} --duration 30s

# Consul demo with a propagation probe every 5 s
demo-consul agents="500":
    cargo run --release -p agent-sim -- --kind consul --agents {{agents}} --duration 30s --probe-every 5s

# serialization benches (quick profile)
bench:
    cargo bench -p agent-sim-benches -- --quick

# the 19,000-session Sensu benchmark of BENCHMARKS.md
bench-sessions:
    bash benches/scripts/sensu-sessions.sh

# refresh the repository's copy of the golden vectors from the project's shared data
refresh-vectors:
    # consul/rpc/ is this project's own capture: kept across a refresh.
    mv testdata/vectors/consul/rpc /tmp/agent-sim-rpc-vectors
    rm -rf testdata/vectors && cp -r ../shared/vectors testdata/vectors
    mv /tmp/agent-sim-rpc-vectors testdata/vectors/consul/rpc
    cargo test -p agent-sim-proto --test vectors_manifest
