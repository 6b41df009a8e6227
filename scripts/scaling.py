#!/usr/bin/env python3
"""Start-up cost and memory growth, measured side by side in one run.

  /usr/bin/python3 scripts/scaling.py [build/memcalc]

1. Start-up: a C++ hello-world built as memcalc is (g++ -O2, a static PIE), the same with only
   the C++ runtime linked statically (memcalc's previous build), with the shared runtime (g++ -O2 alone),
   `memcalc --version` and one estimate, as
   instructions under callgrind (repeatable on a shared machine; skipped without valgrind) and as
   wall-clock medians of interleaved runs. Ratios are to the first.
2. Memory: the most resident memory (ru_maxrss) of CSV sweeps of a 100,000-layer model at 12, 120 and
   1,200 configurations, and of `plan --top 3` over growing clusters: it must not grow with the count.
"""
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
memcalc = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "memcalc"))
work = tempfile.mkdtemp()
hello = os.path.join(work, "hello")
with open(hello + ".cpp", "w") as f:
    f.write('#include <iostream>\nint main() { std::cout << "hello\\n"; }\n')
subprocess.run(["g++", "-O2", "-static-pie", hello + ".cpp", "-o", hello], check=True)
subprocess.run(["g++", "-O2", "-static-libstdc++", "-static-libgcc", hello + ".cpp", "-o", hello + "-runtime"],
               check=True)
subprocess.run(["g++", "-O2", hello + ".cpp", "-o", hello + "-shared"], check=True)

estimate = [memcalc, "--preset", "llama-7b", "--seq", "4096", "--recompute", "selective", "--format", "csv"]
programs = {"C++ hello-world": [hello], "hello, static C++ only": [hello + "-runtime"],
            "hello, shared runtime": [hello + "-shared"],
            "memcalc --version": [memcalc, "--version"], "one estimate (CSV)": estimate}

print("start-up                 instructions    vs hello   wall median   vs hello")
counts, walls = {}, {name: [] for name in programs}
for name, command in programs.items():
    if shutil.which("valgrind"):
        out = os.path.join(work, "callgrind.out")
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        counts[name] = int(run.stderr.split("Collected : ")[1].split()[0])
for _ in range(100):  # interleaved, so the machine's drift hits every program alike
    for name, command in programs.items():
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL)
        walls[name].append(time.perf_counter() - start)
base_count, base_wall = counts.get("C++ hello-world"), statistics.median(walls["C++ hello-world"])
for name in programs:
    wall = statistics.median(walls[name])
    count = f"{counts[name]:>12,}  {counts[name] / base_count:>8.2f}x" if counts else f"{'-':>12}  {'-':>9}"
    print(f"{name:<22} {count}   {wall * 1e3:>8.2f} ms  {wall / base_wall:>8.2f}x")


def max_rss_kb(command):
    """The most resident memory of one run of `command`, in kB (Linux's ru_maxrss)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        sys.exit(f"{' '.join(command)} failed: {process.stderr.read().decode()}")
    return usage.ru_maxrss


deep = os.path.join(work, "deep.json")
with open(deep, "w") as f:
    f.write('{"name": "deep", "hidden": 64, "layers": 100000, "heads": 4, "ffn": 256, "vocab": 1000}\n')
print("\nmemory                                              configurations   max resident")
for points in (12, 120, 1200):
    seqs = ",".join(str(64 * (i + 1)) for i in range(points // 3))
    rss = max_rss_kb([memcalc, "--model-file", deep, "--seq", seqs, "--recompute", "all", "--format", "csv"])
    print(f"CSV sweep of a 100,000-layer model              {points:>14,}   {rss / 1024:>8.1f} MiB")
for gpus in (4096, 65536, 1048576):
    command = [memcalc, "plan", "--preset", "llama-3.1-405b", "--gpus", str(gpus), "--device-memory", "80GB",
               "--seq", "8192", "--global-batch", "16384", "--top", "3", "--format", "json"]
    rss = max_rss_kb(command)
    evaluated = subprocess.run(command, capture_output=True, text=True).stdout.split('"evaluated": ')[1].split(",")[0]
    print(f"plan --top 3, Llama 3.1 405B on {gpus:>9,} GPUs      {int(evaluated):>14,}   {rss / 1024:>8.1f} MiB")
shutil.rmtree(work)
