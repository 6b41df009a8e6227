#!/usr/bin/env python3
"""CSV sweep throughput: configurations per second of one `memcalc` sweep, from start to last byte.

  /usr/bin/python3 scripts/sweep-throughput.py [build/memcalc] [runs]

LLaMA 7B, 1,000 sequence lengths x 333 micro-batches x 3 recomputation modes = 999,000
configurations, printed as CSV to /dev/null (the whole run: start-up, parsing, the closed-form peaks,
the rows, the spool and its copy to stdout) and written with --output; the median of `runs` runs,
interleaved, as the machine is shared.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
memcalc = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "memcalc"))
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
seqs = ",".join(str(8 * (i + 1)) for i in range(1000))
batches = ",".join(str(i + 1) for i in range(333))
sweep = [memcalc, "--preset", "llama-7b", "--seq", seqs, "--micro-batch", batches, "--recompute", "all",
         "--format", "csv"]
configurations = 1000 * 333 * 3
out = os.path.join(tempfile.mkdtemp(), "sweep.csv")
ways = {"CSV to stdout (/dev/null)": (sweep, subprocess.DEVNULL), "CSV to a file (--output)": (sweep + ["--output", out], None)}
# --output fsyncs the file before renaming it into place: on a disk the run waits on the disk, so a file
# in memory (tmpfs) shows memcalc's own cost beside it.
in_memory = f"/dev/shm/memcalc-sweep-{os.getpid()}.csv"
if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
    ways["CSV to a file in memory (tmpfs)"] = (sweep + ["--output", in_memory], None)
walls = {name: [] for name in ways}
for _ in range(runs):
    for name, (command, stdout) in ways.items():
        start = time.perf_counter()
        subprocess.run(command, stdout=stdout, check=True)
        walls[name].append(time.perf_counter() - start)
rows = sum(1 for _ in open(out)) - 1
assert rows == configurations, f"{rows} rows, expected {configurations}"
print(f"memcalc sweep, LLaMA 7B: {configurations:,} configurations ({os.path.getsize(out) / 1e6:.0f} MB of CSV), "
      f"median of {runs} runs")
for name, times in walls.items():
    wall = statistics.median(times)
    print(f"  {name:<32} {wall:6.2f} s   {configurations / wall / 1e6:5.2f} million configurations per second")
os.remove(out)
if os.path.exists(in_memory):
    os.remove(in_memory)
