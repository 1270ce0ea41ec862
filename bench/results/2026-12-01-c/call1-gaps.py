# Diagnostic only: where a profiled step's GPU sat idle, and what the host did meanwhile.
import json, sys, glob, collections
for path in sorted(glob.glob(sys.argv[1] + "/**/rank*.trace.json", recursive=True)):
    ev = json.load(open(path))["traceEvents"]
    X = [e for e in ev if e.get("ph") == "X" and "ts" in e]
    gpu = sorted([e for e in X if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")], key=lambda e: e["ts"])
    cpu = [e for e in X if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "python_function", "user_annotation")]
    t0 = min(e["ts"] for e in X); t1 = max(e["ts"] + e.get("dur", 0) for e in X)
    busy = sum(e.get("dur", 0) for e in gpu)
    print(f"== {path}\nspan {(t1-t0)/1e3:.1f} ms, gpu ops {len(gpu)}, gpu busy (sum) {busy/1e3:.1f} ms, "
          f"first gpu op at +{(gpu[0]['ts']-t0)/1e3:.1f} ms, last ends +{(gpu[-1]['ts']+gpu[-1].get('dur',0)-t0)/1e3:.1f} ms")
    gaps, end = [], gpu[0]["ts"]
    for e in gpu:
        if e["ts"] - end > 2000:
            gaps.append((end, e["ts"]))
        end = max(end, e["ts"] + e.get("dur", 0))
    print(f"gaps > 2 ms: {len(gaps)}, total {sum(b-a for a,b in gaps)/1e3:.1f} ms")
    for a, b in sorted(gaps, key=lambda g: g[0]-g[1])[:12]:
        inside = collections.Counter()
        for e in cpu:
            s, d = e["ts"], e.get("dur", 0)
            ov = min(b, s + d) - max(a, s)
            if ov > 0 and d < 5e6:
                inside[(e["cat"], e["name"][:70])] += ov
        top = ", ".join(f"{n[1]}[{n[0][:4]}] {v/1e3:.1f}" for n, v in inside.most_common(8))
        print(f"  gap +{(a-t0)/1e3:8.1f} ms  {(b-a)/1e3:7.1f} ms: {top}")
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in X:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            a = agg[e["name"]]; a[0] += 1; a[1] += e.get("dur", 0) / 1e3
    print("runtime calls:", ", ".join(f"{k} {v[1]:.1f} ms/{v[0]}" for k, v in sorted(agg.items(), key=lambda kv: -kv[1][1])[:10]))
