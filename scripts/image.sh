#!/usr/bin/env bash
# Builds the agent-sim image without pulling anything (Dockerfile.scratch):
# the release binary with its debug info stripped, the shared libraries
# `ldd` lists for it at the paths it loads them from, the host's CA roots,
# and a non-root user (65532). Prints the image's name and size.
#
#   bash scripts/image.sh [TAG]          # default agent-sim:latest
#   AGENT_SIM_BIN=target/debug/agent-sim bash scripts/image.sh agent-sim:test
#
# AGENT_SIM_BIN names a binary already built (no cargo build). The
# Dockerfile (a Rust build stage, a distroless runtime) is the same image
# for hosts that reach Docker Hub and gcr.io.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-agent-sim:latest}
if [ -z "${AGENT_SIM_BIN:-}" ]; then
    nice cargo build --release --locked -p agent-sim
fi
BIN=${AGENT_SIM_BIN:-target/release/agent-sim}
CTX=target/image-context
rm -rf "$CTX" && mkdir -p "$CTX/rootfs/usr/local/bin" "$CTX/rootfs/etc/ssl/certs" "$CTX/rootfs/tmp"

# The binary, without its line tables (a backtrace still names functions).
if command -v strip >/dev/null 2>&1; then
    strip --strip-debug -o "$CTX/rootfs/usr/local/bin/agent-sim" "$BIN"
else
    cp "$BIN" "$CTX/rootfs/usr/local/bin/agent-sim"
fi
# What it links, at the paths the loader looks (the loader itself included;
# linux-vdso has no file). glibc's NSS for files and DNS is inside libc.so.6
# since 2.34, so host names resolve with nothing more than nsswitch.conf.
ldd "$BIN" | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$CTX/rootfs$(dirname "$lib")"
    cp -L "$lib" "$CTX/rootfs$lib"
done
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$CTX/rootfs/etc/ssl/certs/"
else
    echo "image.sh: no /etc/ssl/certs/ca-certificates.crt here: the image has no CA roots (--ca-file still works)" >&2
fi
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n' \
    >"$CTX/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$CTX/rootfs/etc/group"
printf 'hosts: files dns\n' >"$CTX/rootfs/etc/nsswitch.conf"
chmod 1777 "$CTX/rootfs/tmp"
cp Dockerfile.scratch "$CTX/Dockerfile"

docker build -q -t "$TAG" "$CTX" >/dev/null
SIZE=$(docker image inspect -f '{{.Size}}' "$TAG")
echo "image.sh: built $TAG, $((SIZE / 1000000)) MB ($SIZE bytes), FROM scratch, user 65532"
