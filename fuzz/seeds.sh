#!/usr/bin/env bash
# Seeds each fuzz target's corpus (fuzz/corpus/<target>/) from the captured
# vectors in testdata/vectors, shaped as that target reads its input:
# WebSocket frames around Sensu messages, 5-byte gRPC prefixes around
# Consul events, a route byte before HTTP request bodies. Idempotent.
set -euo pipefail
cd "$(dirname "$0")"
V=../testdata/vectors
C=corpus

mk() { mkdir -p "$C/$1"; }

# One unmasked (backend) or zero-key masked (agent) binary frame.
ws_frame() { # file masked(0|1)
    local n; n=$(stat -c %s "$1")
    local m=0; [ "$2" = 1 ] && m=128
    if [ "$n" -lt 126 ]; then
        printf "\\x82\\x$(printf %02x $((m + n)))"
    else
        printf "\\x82\\x$(printf %02x $((m + 126)))\\x$(printf %02x $((n >> 8)))\\x$(printf %02x $((n & 255)))"
    fi
    [ "$2" = 1 ] && printf '\x00\x00\x00\x00'
    cat "$1"
}

grpc_frame() { # file
    local n; n=$(stat -c %s "$1")
    printf "\\x00\\x$(printf %02x $((n >> 24 & 255)))\\x$(printf %02x $((n >> 16 & 255)))\\x$(printf %02x $((n >> 8 & 255)))\\x$(printf %02x $((n & 255)))"
    cat "$1"
}

mk sensu_message; mk sensu_ws_client; mk sensu_server_frame
for f in "$V"/sensu/protobuf/*.bin "$V"/sensu/json/*.bin "$V"/sensu/rejected/*.bin; do
    [ -s "$f" ] || continue
    name=$(basename "$(dirname "$f")")-$(basename "$f")
    cp "$f" "$C/sensu_message/$name"
    case "$f" in
        *-backend-*) ws_frame "$f" 0 > "$C/sensu_ws_client/$name" ;;
        *) cp "$f" "$C/sensu_server_frame/$name"
           ws_frame "$f" 1 > "$C/sensu_server_frame/masked-$name" ;;
    esac
done

mk consul_event; mk consul_grpc_stream
all="$C/consul_grpc_stream/whole-stream"
: > "$all"
for f in "$V"/consul/subscribe/0*.bin; do
    cp "$f" "$C/consul_event/"
    grpc_frame "$f" > "$C/consul_grpc_stream/$(basename "$f")"
    grpc_frame "$f" >> "$all"
done

mk consul_http_answer; mk consul_server_http
for f in "$V"/consul/http/*.response.*; do
    cp "$f" "$C/consul_http_answer/"
done
route() { # request file -> route byte
    case "$1" in
        *catalog-register*) printf '\x00' ;;
        *session-create*) printf '\x03' ;;
        *) printf '\x02' ;;
    esac
}
for f in "$V"/consul/http/*.request.txt; do
    { route "$f"; sed '1,/^\r\{0,1\}$/d' "$f"; } > "$C/consul_server_http/$(basename "$f")"
done
printf '\x02[{"Node":{"Verb":"set","Node":{"Node":"n2","Address":"10.0.0.2"}}},{"Service":{"Verb":"set","Node":"n2","Service":{"ID":"app-2","Service":"app","Port":8080}}}]' \
    > "$C/consul_server_http/txn-register"
printf '\x04{"Kind":"service-intentions","Name":"web","Sources":[{"Name":"a","Action":"allow"}]}' \
    > "$C/consul_server_http/config-intentions"

for t in "$C"/*; do echo "$(basename "$t"): $(ls "$t" | wc -l) seeds"; done

# Gossip: UDP payloads as packets, TCP directions as streams (plain ones;
# the encrypted packets exercise the key the receive module also holds).
mk gossip_packet
mk gossip_stream
for f in "$V"/consul/gossip/plain/udp-*.bin "$V"/consul/gossip/encrypted/udp-*.bin; do
    cp "$f" "$C/gossip_packet/$(basename "$(dirname "$f")")-$(basename "$f")"
done
for f in "$V"/consul/gossip/plain/tcp-*.bin; do
    cp "$f" "$C/gossip_stream/"
done
