#!/usr/bin/env python3
"""Times three `memcalc plan` searches with two builds, interleaved, and checks they rank alike.

Usage: scripts/plan-side-by-side.py path/to/before/memcalc path/to/after/memcalc
"""
import json, subprocess, statistics, sys
bins = {"before": sys.argv[1], "after": sys.argv[2]}
cases = {
 "405B, 16,384 H100s, --top 3": ["plan","--preset","llama-3.1-405b","--seq","8192","--gpus","16384","--gpu","h100-sxm","--global-batch","2048","--top","3","--format","json"],
 "405B, 1,024 GPUs of 80 GB, --top 10 (plan-throughput.py)": ["plan","--preset","llama-3.1-405b","--gpus","1024","--device-memory","80GB","--seq","8192","--global-batch","2048","--format","json"],
 "405B, 1,024 H100s, --top 10": ["plan","--preset","llama-3.1-405b","--gpus","1024","--gpu","h100-sxm","--seq","8192","--global-batch","2048","--format","json"],
}
for name, args in cases.items():
    res = {b: [] for b in bins}
    tops = {}
    for _ in range(5):
        for b, path in bins.items():
            out = json.loads(subprocess.run([path]+args, check=True, capture_output=True, text=True).stdout)
            res[b].append((out["seconds"], out["evaluated"], out.get("ranked_out", 0)))
            tops[b] = [(l["dp"], l["tp"], l["pp"], l["cp"], l["zero"], l["micro_batch"], l["recompute"], l.get("vpp"), json.dumps(l["peak"], sort_keys=True), l["schedule"], l["recompute_layers"], l["step_seconds"]) for l in out["layouts"]]
    print(name)
    for b in bins:
        secs = sorted(r[0] for r in res[b]); ev = res[b][0][1]; ro = res[b][0][2]
        print(f"  {b:18s} {ev:7d} layouts ({ro} ranked out): " + " ".join(f"{s*1e3:.0f}" for s in secs) + f" ms; median {statistics.median(secs)*1e3:.0f} ms, {ev/statistics.median(secs)/1e6:.2f} M/s")
    print("  same layouts ranked:", tops["before"] == tops["after"])
