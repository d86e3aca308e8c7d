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
    # consul/rpc, agent-rpc, agent-rpc-connect, gossip, serf and h2 are this project's own captures: kept across a refresh.
    rm -rf /tmp/agent-sim-own-vectors && mkdir -p /tmp/agent-sim-own-vectors
    for d in rpc agent-rpc agent-rpc-connect gossip serf h2; do mv testdata/vectors/consul/$d /tmp/agent-sim-own-vectors/; done
    rm -rf testdata/vectors && cp -r ../shared/vectors testdata/vectors
    for d in rpc agent-rpc agent-rpc-connect gossip serf h2; do mv /tmp/agent-sim-own-vectors/$d testdata/vectors/consul/; done
    cargo test -p agent-sim-proto --test integration vectors_manifest
