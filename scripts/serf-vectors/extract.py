#!/usr/bin/env python3
"""Cuts serf user messages (queries, query responses, user events) out of a
tcpdump capture of the serf LAN port and writes one file per UDP datagram plus
manifest entries in the format of testdata/vectors/consul/gossip/manifest.json.

usage: extract.py PCAP OUTDIR SET [--key BASE64[,BASE64...]] [--names ip=name,...] [--t0 EPOCH]
SET is "plain" or "encrypted"; files go to OUTDIR/SET/, the entries (JSON list)
to OUTDIR/SET/entries.json.
"""
import argparse, base64, binascii, hashlib, json, os, struct, sys, zlib

SYSTEM = "consul 1.20.1 (memberlist v0.5.0, serf v0.10.1)"
ML = {0: "ping", 1: "indirect-ping", 2: "ack", 3: "suspect", 4: "alive", 5: "dead",
      6: "pushpull", 7: "compound", 8: "user", 9: "compress", 10: "encrypt", 11: "nack",
      12: "crc", 13: "err"}
SERF = {0: "serf-leave", 1: "serf-join", 2: "serf-pushpull", 3: "serf-user-event",
        4: "serf-query", 5: "serf-query-response", 6: "serf-conflict-response",
        7: "serf-key-request", 8: "serf-key-response", 9: "serf-relay"}
KEEP = {3, 4, 5, 9}


# ---- msgpack (go-msgpack writes strings and []byte alike as raw str) ----
class Raw(bytes):
    pass


def mp_unpack(b, i=0):
    t = b[i]
    i += 1
    if t <= 0x7f:
        return t, i
    if t >= 0xe0:
        return t - 0x100, i
    if 0x80 <= t <= 0x8f:
        return mp_map(b, i, t & 0x0f)
    if 0x90 <= t <= 0x9f:
        return mp_arr(b, i, t & 0x0f)
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return Raw(b[i:i + n]), i + n
    if t == 0xc0:
        return None, i
    if t == 0xc2:
        return False, i
    if t == 0xc3:
        return True, i
    if t in (0xc4, 0xc5, 0xc6, 0xd9, 0xda, 0xdb):
        w = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}[t]
        n = int.from_bytes(b[i:i + w], "big")
        i += w
        return Raw(b[i:i + n]), i + n
    if t == 0xca:
        return struct.unpack(">f", b[i:i + 4])[0], i + 4
    if t == 0xcb:
        return struct.unpack(">d", b[i:i + 8])[0], i + 8
    if t in (0xcc, 0xcd, 0xce, 0xcf):
        w = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}[t]
        return int.from_bytes(b[i:i + w], "big"), i + w
    if t in (0xd0, 0xd1, 0xd2, 0xd3):
        w = {0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8}[t]
        return int.from_bytes(b[i:i + w], "big", signed=True), i + w
    if t in (0xdc, 0xdd):
        w = 2 if t == 0xdc else 4
        return mp_arr(b, i + w, int.from_bytes(b[i:i + w], "big"))
    if t in (0xde, 0xdf):
        w = 2 if t == 0xde else 4
        return mp_map(b, i + w, int.from_bytes(b[i:i + w], "big"))
    raise ValueError(f"msgpack type {t:#x} at {i - 1}")


def mp_arr(b, i, n):
    out = []
    for _ in range(n):
        v, i = mp_unpack(b, i)
        out.append(v)
    return out, i


def mp_map(b, i, n):
    out = {}
    for _ in range(n):
        k, i = mp_unpack(b, i)
        v, i = mp_unpack(b, i)
        out[k.decode() if isinstance(k, bytes) else k] = v
    return out, i


def mp_one(b):
    v, i = mp_unpack(b, 0)
    if i != len(b):
        raise ValueError(f"{len(b) - i} trailing bytes")
    return v


def printable(b):
    return all(0x20 <= c <= 0x7e for c in b)


def show(v, hexed=None, key=None):
    """JSON form: raw strings as text when every byte is printable ASCII, else
    lower-case hex (the field's name then goes to hexed)."""
    if isinstance(v, bytes):
        if printable(v):
            return v.decode()
        if hexed is not None and key is not None:
            hexed.add(key)
        return v.hex()
    if isinstance(v, list):
        if any(isinstance(x, bytes) and not printable(x) for x in v):
            if hexed is not None and key is not None:
                hexed.add(key)
            return [x.hex() if isinstance(x, bytes) else show(x) for x in v]
        return [show(x) for x in v]
    if isinstance(v, dict):
        return {k: show(x) for k, x in v.items()}
    return v


def ip_of(b):
    if len(b) == 4:
        return ".".join(str(c) for c in b)
    if len(b) == 16 and b[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(c) for c in b[12:])
    return b.hex()


# ---- LZW as Go's compress/lzw reads it (LSB, literal width 8) ----
def lzw_decode(data):
    clear, eof = 256, 257
    width, hi, overflow, last = 9, eof, 512, None
    prefix, suffix = {}, {}
    out = bytearray()
    bits = nbits = pos = 0

    def expand(c):
        s = bytearray()
        while c >= clear:
            s.append(suffix[c])
            c = prefix[c]
        s.append(c)
        return bytes(reversed(s))

    while True:
        while nbits < width:
            if pos >= len(data):
                raise ValueError("lzw: unexpected end")
            bits |= data[pos] << nbits
            pos += 1
            nbits += 8
        code = bits & ((1 << width) - 1)
        bits >>= width
        nbits -= width
        if code < clear:
            out.append(code)
            if last is not None:
                suffix[hi], prefix[hi] = code, last
        elif code == clear:
            width, hi, overflow, last = 9, eof, 512, None
            continue
        elif code == eof:
            return bytes(out)
        elif code <= hi:
            if code == hi and last is not None:
                s = expand(last)
                s = s + s[:1]
            else:
                s = expand(code)
            out += s
            if last is not None:
                suffix[hi], prefix[hi] = s[0], last
        else:
            raise ValueError("lzw: bad code")
        last, hi = code, hi + 1
        if hi >= overflow:
            if width == 12:
                last, hi = None, hi - 1
            else:
                width += 1
                overflow = 1 << width


# ---- memberlist / serf layers ----
def decode_serf(b, ctx):
    t = b[0]
    name = SERF.get(t, f"serf-{t}")
    out = {"serf_type": t, "serf_name": name}
    if t == 9:  # relay: header, then the relayed message
        hdr, i = mp_unpack(b, 1)
        out["relay_header"] = show(hdr)
        out["relayed"] = decode_serf(b[i:], ctx)
        ctx["serf"].append(out["relayed"])
        return out
    v = mp_one(b[1:])
    hexed = set()
    fields = {k: show(x, hexed, k) for k, x in v.items()} if isinstance(v, dict) else show(v)
    out["fields"] = fields
    if hexed:
        out["hex_fields"] = sorted(hexed)
    if isinstance(v, dict) and isinstance(v.get("Addr"), bytes):
        out["Addr_ip"] = ip_of(v["Addr"])
    p = v.get("Payload") if isinstance(v, dict) else None
    if p:
        pd = decode_payload(t, v, p, ctx)
        if pd is not None:
            out["Payload_decoded"] = pd
    ctx["serf"].append(out)
    return out


def decode_payload(t, v, p, ctx):
    """The payloads Consul puts in serf messages: a user event's msgpack
    UserEvent, a keyring query's key request, a keyring answer."""
    try:
        if t == 3 and v.get("Name", b"").startswith(b"consul:event:"):
            return {"format": "msgpack agent.UserEvent", "value": show(mp_one(p))}
        if t in (4, 5) and p[0] in (7, 8):
            kind = "keyRequest" if p[0] == 7 else "nodeKeyResponse"
            val = mp_one(p[1:])
            hexed = set()
            val = {k: show(x, hexed, k) for k, x in val.items()}
            d = {"format": f"serf type byte {p[0]} + msgpack {kind}", "value": val}
            if hexed:
                d["hex_fields"] = sorted(hexed)
            return d
    except Exception as e:  # noqa: BLE001 - a payload we cannot read stays hex
        return {"error": str(e)}
    return None


def decode_msg(b, ctx):
    t = b[0]
    if t == 12:
        crc = int.from_bytes(b[1:5], "big")
        ctx["wrappers"].append("crc")
        return {"crc": crc, "crc_ok": zlib.crc32(b[5:]) == crc, "inner": decode_msg(b[5:], ctx)}
    if t == 9:
        c = mp_one(b[1:])
        plain = lzw_decode(c["Buf"])
        ctx["wrappers"].append("compress lzw")
        return {"algo": c["Algo"], "compressed_len": len(c["Buf"]), "plain_len": len(plain),
                "inner": decode_msg(plain, ctx)}
    if t == 7:
        n = b[1]
        lens = [int.from_bytes(b[2 + 2 * k:4 + 2 * k], "big") for k in range(n)]
        i = 2 + 2 * n
        ctx["wrappers"].append("compound")
        parts = []
        for ln in lens:
            parts.append(decode_msg(b[i:i + ln], ctx))
            i += ln
        return {"type": 7, "name": "compound", "count": n, "lengths": lens, "parts": parts}
    name = ML.get(t, f"type-{t}")
    if t == 8:
        ctx["names"].append(None)
        slot = len(ctx["names"]) - 1
        s = decode_serf(b[1:], ctx)
        ctx["names"][slot] = s["serf_name"] + query_tag(s, ctx)
        if not ctx["wrappers"] or ctx["wrappers"][-1] != "compound":
            ctx["wrappers"].append("user")
        return {"type": 8, "name": "user", "len": len(b) - 1, "serf": s}
    ctx["names"].append(name)
    if not ctx["wrappers"] or ctx["wrappers"][-1] != "compound":
        ctx["wrappers"].append(name)
    v = mp_one(b[1:])
    fields = {}
    for k, x in v.items():
        if k in ("Addr", "SourceAddr", "Target") and isinstance(x, bytes):
            fields[k] = ip_of(x)
        elif k == "Vsn" and isinstance(x, bytes):
            fields[k] = list(x)
        elif k == "Meta" and isinstance(x, bytes):
            fields[k] = show(mp_one(x[1:] if x[:1] == b"\xff" else x)) if x else ""
            fields["Meta_hex"] = x.hex()
        elif k == "Payload" and isinstance(x, bytes) and t == 2 and x:
            fields[k] = {"ping_version": x[0], "coordinate": show(mp_one(x[1:]))}
            fields["Payload_hex"] = x.hex()
        else:
            fields[k] = show(x)
    return {"type": t, "name": name, "fields": fields}


def query_tag(s, ctx):
    f = s.get("fields", {})
    if s["serf_type"] == 4:
        ctx["queries"][f.get("ID")] = f.get("Name")
        return f"({f.get('Name')})"
    if s["serf_type"] == 5:
        q = ctx["queries"].get(f.get("ID"))
        ack = "ack " if f.get("Flags", 0) & 1 else ""
        return f"({ack}{q})" if q else ""
    if s["serf_type"] == 3:
        return f"({f.get('Name')})"
    return ""


def decrypt(b, key, label=b""):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    vsn = b[0]
    plain = AESGCM(key).decrypt(b[1:13], b[13:], label)
    if vsn == 0:
        plain = plain[:-plain[-1]]
    return vsn, plain


# ---- pcap ----
def packets(path):
    d = open(path, "rb").read()
    magic = d[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    else:
        e = ">"
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    link = struct.unpack(e + "I", d[20:24])[0]
    i = 24
    while i + 16 <= len(d):
        sec, frac, incl, _ = struct.unpack(e + "IIII", d[i:i + 16])
        frame = d[i + 16:i + 16 + incl]
        i += 16 + incl
        ts = sec + frac / (1e9 if nano else 1e6)
        if link == 1:
            if struct.unpack(">H", frame[12:14])[0] != 0x0800:
                continue
            ip = frame[14:]
        elif link == 113:
            ip = frame[16:]
        elif link == 276:
            ip = frame[20:]
        else:
            raise SystemExit(f"link type {link}")
        if ip[0] >> 4 != 4 or ip[9] != 17:
            continue
        ihl = (ip[0] & 15) * 4
        tot = struct.unpack(">H", ip[2:4])[0]
        src, dst = ip_of(ip[12:16]), ip_of(ip[16:20])
        udp = ip[ihl:tot]
        sp, dp = struct.unpack(">HH", udp[:4])
        yield ts, (src, sp), (dst, dp), bytes(udp[8:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pcap")
    ap.add_argument("outdir")
    ap.add_argument("set", choices=["plain", "encrypted"])
    ap.add_argument("--key")
    ap.add_argument("--names", default="")
    ap.add_argument("--port", type=int, default=8301)
    ap.add_argument("--start", type=int, default=0, help="first file number")
    ap.add_argument("--all", action="store_true", help="keep every datagram, not only serf events/queries")
    ap.add_argument("--every-copy", action="store_true",
                    help="keep gossip retransmissions too (default: the first datagram of each "
                         "sender, receiver, layering and serf content)")
    a = ap.parse_args()
    names = dict(x.split("=") for x in a.names.split(",") if x)
    keys = [k for k in (a.key or "").split(",") if k]
    od = os.path.join(a.outdir, a.set)
    os.makedirs(od, exist_ok=True)
    entries, t0, n = [], None, a.start
    queries = {}
    seen = set()
    # Pass 1 learns every query's name by ID (a node's answer to itself can
    # come before the query is gossiped); pass 2 writes.
    for pass_no in (1, 2):
        if pass_no == 2:
            break
        for ts, src, dst, data in packets(a.pcap):
            if a.port not in (src[1], dst[1]) or not data:
                continue
            body = data[2 + data[1]:] if data[0] == 244 else data
            for k64 in keys or [None]:
                try:
                    if k64:
                        _, body2 = decrypt(body, base64.b64decode(k64))
                    else:
                        body2 = body
                    decode_msg(body2, {"wrappers": [], "names": [], "serf": [], "queries": queries})
                    break
                except Exception:  # noqa: BLE001 - another key, or not ours
                    continue
    for ts, src, dst, data in packets(a.pcap):
        if a.port not in (src[1], dst[1]) or not data:
            continue
        t0 = ts if t0 is None else t0
        ctx = {"wrappers": [], "names": [], "serf": [], "queries": queries}
        entry_extra = {}
        body = data
        if body[0] == 244:
            ln = body[1]
            entry_extra["label"] = body[2:2 + ln].decode()
            ctx["wrappers"].append("label")
            body = body[2 + ln:]
        used = None
        if keys:
            for k64 in keys:
                try:
                    vsn, plain = decrypt(body, base64.b64decode(k64), entry_extra.get("label", "").encode())
                    used = k64
                    break
                except Exception:  # noqa: BLE001 - the next key of the keyring
                    continue
            if used is None:
                print(f"no key opens the datagram at {ts}", file=sys.stderr)
                continue
            body = plain
            ctx["wrappers"].append(f"encrypt v{vsn}")
            entry_extra["encryption"] = {"version": vsn, "plaintext_len": len(body),
                                         "plaintext_hex": body.hex(), "aad": entry_extra.get("label", "")}
        decoded = decode_msg(body, ctx)
        if not a.all and not any(s["serf_type"] in KEEP for s in ctx["serf"]):
            continue
        summary = "+".join(ctx["names"])
        sig = (src, dst, tuple(ctx["wrappers"]), summary, json.dumps(ctx["serf"], sort_keys=True))
        if not a.every_copy and sig in seen:
            continue
        seen.add(sig)
        stem = ("compound-" if "compound" in ctx["wrappers"] else "") + "_".join(ctx["names"])
        stem = stem.replace("(", "-").replace(")", "").replace(" ", "-").replace(":", "-")
        fname = f"udp-{n:03d}-{stem}.bin"
        n += 1
        open(os.path.join(od, fname), "wb").write(data)

        def who(ep):
            nm = names.get(ep[0])
            return f"{nm} ({ep[0]}:{ep[1]})" if nm else f"{ep[0]}:{ep[1]}"

        e = {"file": f"{a.set}/{fname}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
             "system": SYSTEM, "transport": "udp", "t": round(ts - t0, 6), "from": who(src),
             "to": who(dst), "length": len(data), "wrappers": ctx["wrappers"], "summary": summary}
        e.update(entry_extra)
        e["decoded"] = decoded
        if used is not None:
            e["gossip_key_base64"] = used
        entries.append(e)
    json.dump(entries, open(os.path.join(od, "entries.json"), "w"), indent=1)
    print(f"{len(entries)} datagrams kept", file=sys.stderr)


if __name__ == "__main__":
    main()
