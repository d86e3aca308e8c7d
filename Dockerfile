# agent-sim container image: build with the Rust toolchain, run the single
# static-enough binary on a small base that has glibc, CA roots and a
# non-root user, and nothing else (no shell, no package manager).
#
#   docker build -t agent-sim:latest .
#   docker run --rm agent-sim:latest --agents 200 --duration 10s
#
# configs/kubernetes/, configs/nomad/ and configs/swarm/ run this image. A host
# that reaches no registry builds the same image FROM scratch with
# scripts/image.sh (Dockerfile.scratch): same entrypoint, same user id.

# --- build ---------------------------------------------------------------
FROM rust:1.95-bookworm AS build
WORKDIR /src
# Protos are compiled from checked-in code: no protoc is needed.
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY benches benches
COPY proto proto
RUN cargo build --release --locked -p agent-sim \
 && install -D -m 0755 target/release/agent-sim /out/agent-sim

# --- runtime -------------------------------------------------------------
# distroless/cc: glibc, libgcc, CA certificates (/etc/ssl/certs), a nonroot
# user (uid 65532); rustls reads the CA roots through rustls-native-certs.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/agent-sim /usr/local/bin/agent-sim
USER nonroot:nonroot
# Prometheus /metrics when run with --metrics-addr 0.0.0.0:9090.
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/agent-sim"]
