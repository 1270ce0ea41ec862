# Diagnostic only: per fault, recovery seconds and the first two steps' dt after it.
import json, sys, glob, tarfile
for path in sorted(glob.glob(sys.argv[1] + "/**/*recovery*.json", recursive=True)):
    for name, r in json.load(open(path))["results"].items():
        if not isinstance(r, dict) or "faults" not in r:
            continue
        print(f"== {path} {name}: steps {r['steps_completed']}/{r['max_steps']} hash {str(r.get('param_sha256'))[:8]} "
              f"recovery mean {r.get('recovery_seconds_mean')} infra {r.get('infra_goodput_pct')} steady {r.get('steady_step_seconds')}")
        ev = []
        for tpath in glob.glob(sys.argv[1] + "/**/logs-*13*.tar.gz", recursive=True):
            with tarfile.open(tpath) as t:
                for m in t.getmembers():
                    if m.name.endswith(name + ".events.jsonl"):
                        ev = [json.loads(l) for l in t.extractfile(m)]
        for f in r["faults"]:
            steps = [e for e in ev if e["event"] == "step" and e["t"] > f["t"]][:3]
            print(f"  step {f['step']:3d} {f['type']:9s} {f.get('recovery_seconds') and round(f['recovery_seconds'], 2)} s "
                  f"loaded {f['breakdown_seconds'].get('loaded') and round(f['breakdown_seconds']['loaded'], 2)} "
                  f"first dts {[round(s['dt'], 3) for s in steps]}")
