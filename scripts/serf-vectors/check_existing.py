import json, sys, base64
sys.path.insert(0, ".")
import extract as X
root = "/work/main/testdata/vectors/"
m = json.load(open(root + "consul/gossip/manifest.json"))
ok = bad = 0
for e in m:
    if e["transport"] != "udp": continue
    data = open(root + e["file"], "rb").read()
    ctx = {"wrappers": [], "names": [], "serf": [], "queries": {}}
    body = data
    if "gossip_key_base64" in e:
        vsn, body = X.decrypt(body, base64.b64decode(e["gossip_key_base64"]))
        ctx["wrappers"].append(f"encrypt v{vsn}")
    d = X.decode_msg(body, ctx)
    s = json.dumps(d, sort_keys=True); t = json.dumps(e["decoded"], sort_keys=True)
    if s == t and ctx["wrappers"] == e["wrappers"] and "+".join(ctx["names"]) == e["summary"]:
        ok += 1
    else:
        bad += 1
        if bad <= 3:
            print(e["file"], ctx["wrappers"], e["wrappers"], "+".join(ctx["names"]), e["summary"]); print(s[:600]); print(t[:600])
print("ok", ok, "bad", bad)
