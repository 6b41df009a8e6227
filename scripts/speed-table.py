#!/usr/bin/env python3
"""Issue 40's five speed targets, two builds side by side in one interleaved run, as a Markdown table.

  /usr/bin/python3 scripts/speed-table.py OLD_BENCH OLD_MEMCALC NEW_BENCH NEW_MEMCALC [rounds]

OLD_BENCH and NEW_BENCH are bench/bench_memcalc.cpp of each build (g++ -std=c++17 -O3 -DNDEBUG), the
MEMCALC paths their command-line programs. Each round runs every measurement once with each build, in
turn, so that the shared machine's load falls on both; the table gives the medians of `rounds` rounds
(default 3). A benchmark the old build's bench file lacks reads "-".
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

old_bench, old_memcalc, new_bench, new_memcalc = sys.argv[1:5]
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 3
builds = {"old": (old_bench, old_memcalc), "new": (new_bench, new_memcalc)}
work = tempfile.mkdtemp()

hello = os.path.join(work, "hello")
with open(hello + ".cpp", "w") as f:
    f.write('#include <iostream>\nint main() { std::cout << "hello\\n"; }\n')
subprocess.run(["g++", "-O2", hello + ".cpp", "-o", hello], check=True)  # the shared C++ runtime

BENCHMARKS = "estimate_llama_7b$|estimate_llama_7b_new_model$|summary_llama_7b$|plan_405b_on_1024_gpus$|plan_405b_on_16384_h100s$"


def benchmarks(path):
    """{name: (ns or ms per iteration, items per second)} of one bench run."""
    out = subprocess.run([path, f"--benchmark_filter={BENCHMARKS}", "--benchmark_min_time=0.5",
                          "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    return {b["name"]: (b["cpu_time"], b.get("items_per_second")) for b in json.loads(out)["benchmarks"]}


def wall(command, runs, stdout=subprocess.DEVNULL):
    """The median wall time of `runs` runs of `command`, in seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, stdout=stdout, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


seqs = ",".join(str(8 * (i + 1)) for i in range(1000))
batches = ",".join(str(i + 1) for i in range(333))
CONFIGURATIONS = 1000 * 333 * 3


# A file in memory (tmpfs) as well as on the disk: --output fsyncs its 200 MB before the rename, so
# on disk the run waits on the machine's disk; in memory it measures memcalc's own work.
MEMORY_FOLDER = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def sweep(memcalc, folder=None):
    command = [memcalc, "--preset", "llama-7b", "--seq", seqs, "--micro-batch", batches, "--recompute",
               "all", "--format", "csv"]
    target = os.path.join(folder, f"memcalc-sweep-{os.getpid()}.csv") if folder else None
    try:
        return CONFIGURATIONS / wall(command + (["--output", target] if target else []), 1) / 1e6
    finally:
        if target and os.path.exists(target):
            os.remove(target)


def plan_16384(memcalc):
    # 1.2.0 has no --gpu: devices of 80 GB, the same search
    command = [memcalc, "plan", "--preset", "llama-3.1-405b", "--seq", "8192", "--gpus", "16384",
               "--device-memory", "80GB", "--global-batch", "2048", "--top", "3", "--format", "json"]
    return wall(command, 3) * 1e3


ESTIMATE = ["--preset", "llama-7b", "--seq", "4096", "--recompute", "selective", "--format", "csv"]
samples = {b: {} for b in builds}
for _ in range(rounds):
    for name, (bench, memcalc) in builds.items():
        s = samples[name]
        for key, (value, items) in benchmarks(bench).items():
            s.setdefault(key, []).append(value)
            if items:
                s.setdefault(key + " items", []).append(items)
        s.setdefault("sweep stdout", []).append(sweep(memcalc))
        s.setdefault("sweep file", []).append(sweep(memcalc, work))
        if MEMORY_FOLDER:
            s.setdefault("sweep memory file", []).append(sweep(memcalc, MEMORY_FOLDER))
        s.setdefault("plan cli", []).append(plan_16384(memcalc))
        hello_wall, estimate_wall = wall([hello], 20), wall([memcalc] + ESTIMATE, 20)
        s.setdefault("estimate vs hello", []).append(estimate_wall / hello_wall)


def median(build, key, scale=1.0, digits=2):
    values = samples[build].get(key)
    return f"{statistics.median(values) * scale:.{digits}f}" if values else "-"


rows = [
    ("Plan: layouts a second, 405B on 1,024 GPUs (library)", "plan_405b_on_1024_gpus items", 1e-6, 2,
     "million", ">= 5"),
    ("Plan: 405B on 16,384 H100s (library)", "plan_405b_on_16384_h100s", 1, 1, "ms", "< 50"),
    ("Plan: 405B on 16,384 GPUs of 80 GB, `memcalc plan --top 3` (wall)", "plan cli", 1, 0, "ms", "-"),
    ("Library estimate, LLaMA 7B", "estimate_llama_7b", 1e-3, 2, "us", "< 1.5"),
    ("Library estimate, each call a model the last call was not", "estimate_llama_7b_new_model", 1e-3,
     2, "us", "-"),
    ("A sweep's configuration, `Estimator::summary`", "summary_llama_7b", 1e-3, 2, "us", "-"),
    ("One estimate against a dynamically linked hello-world (wall)", "estimate vs hello", 1, 2, "x",
     "<= 1.2"),
    ("CSV sweep of 999,000 configurations to stdout", "sweep stdout", 1, 2, "million/s", ">= 3"),
    ("CSV sweep of 999,000 configurations with --output onto the disk (fsync)", "sweep file", 1, 2,
     "million/s", ">= 3"),
    ("CSV sweep of 999,000 configurations with --output into memory (tmpfs)", "sweep memory file", 1, 2,
     "million/s", ">= 3"),
]
print(f"Medians of {rounds} interleaved rounds, {time.strftime('%Y-%m-%d')}:\n")
print("| measurement | unit | old | new | target |")
print("|---|---|---:|---:|---:|")
for title, key, scale, digits, unit, target in rows:
    print(f"| {title} | {unit} | {median('old', key, scale, digits)} | {median('new', key, scale, digits)} "
          f"| {target} |")
