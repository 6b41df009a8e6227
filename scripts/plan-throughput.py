#!/usr/bin/env python3
"""Prints how many layouts per second `memcalc plan` evaluates: Llama 3.1 405B on 1,024 GPUs.

Usage: scripts/plan-throughput.py [path/to/memcalc] [runs]
Each run reports its own count and time (--format json); the script prints every run and the median.
The time includes building the workloads, enumerating the layouts and ranking them.
"""
import json
import os
import statistics
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
memcalc = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "memcalc")
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
command = [memcalc, "plan", "--preset", "llama-3.1-405b", "--gpus", "1024", "--device-memory", "80GB",
           "--seq", "8192", "--global-batch", "2048", "--format", "json"]
rates = []
for _ in range(runs):
    out = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    seconds = out.get("seconds") or 0
    rates.append((out["evaluated"], seconds))
print("memcalc plan, Llama 3.1 405B on 1,024 GPUs, seq 8192, global batch 2048")
for evaluated, seconds in rates:
    print(f"  {evaluated} layouts in {seconds * 1e3:.2f} ms: {evaluated / seconds / 1e6:.2f} million per second")
median = statistics.median(e / s for e, s in rates)
print(f"median: {median / 1e6:.2f} million layouts per second")
