#!/usr/bin/env python3
"""Every SVG memcalc writes is well-formed XML with the series it should have.

Usage: tests/check_svg.py path/to/memcalc   (ctest runs it; exits non-zero on the first failure)
"""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

memcalc = sys.argv[1]
NS = "{http://www.w3.org/2000/svg}"
failures = []


def plot(args, name):
    path = os.path.join(tempfile.mkdtemp(), name)
    run = subprocess.run([memcalc, *args, "--plot", path], capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"{args}: exit {run.returncode}: {run.stderr.strip()}")
        return None
    root = ET.parse(path).getroot()  # raises on malformed XML
    if root.tag != NS + "svg":
        failures.append(f"{args}: root element is {root.tag}")
    if [f for f in os.listdir(os.path.dirname(path)) if f != name]:
        failures.append(f"{args}: left a temporary file beside the plot")
    return root


def series(root):
    return [e.get("data-series") for e in root.iter() if e.get("class") == "series"]


def has(root, cls):
    return any(e.get("class") == cls for e in root.iter())


def expect(condition, message):
    if not condition:
        failures.append(message)


# One configuration: stacked areas by category, the peak, and the device memory when given.
root = plot(["--preset", "llama-7b", "--seq", "4096", "--recompute", "selective", "--device-memory", "141GB"], "t.svg")
if root is not None:
    found = series(root)
    for category in ["weights", "master_weights", "optimizer_state", "gradients", "kept_activations",
                     "rebuilt_activations", "logits", "activation_gradient"]:
        expect(category in found, f"timeline: no {category} series (found {found})")
    expect(has(root, "peak"), "timeline: no peak marker")
    expect(has(root, "device-memory"), "timeline: no device-memory line")

# No device memory given: no line. A pipeline's most loaded stage; ZeRO-3 adds gathered weights.
root = plot(["--preset", "llama-2-70b", "--seq", "4096", "--tp", "8", "--pp", "4", "--dp", "2", "--zero", "3",
             "--activations", "architecture"], "p.svg")
if root is not None:
    expect(not has(root, "device-memory"), "pipeline: a device-memory line without --device-memory")
    expect("gathered_weights" in series(root), "pipeline: no gathered_weights series under ZeRO-3")
    expect("workspace" in series(root), "pipeline: no workspace series under the architecture model")

# A sweep over the sequence: one line per recomputation mode, one marker per size.
root = plot(["--preset", "llama-7b", "--seq", "1024,2048,4096", "--recompute", "all", "--device-memory", "80GB"], "s.svg")
if root is not None:
    expect(series(root) == ["none", "selective", "full"], f"seq sweep: series {series(root)}")
    for g in root.iter(NS + "g"):
        if g.get("class") == "series":
            expect(len(list(g.iter(NS + "circle"))) == 3, f"seq sweep: {g.get('data-series')} has not 3 points")

# A sweep over the micro-batch alone.
root = plot(["--preset", "gpt2", "--seq", "1024", "-b", "1,2,4,8", "--recompute", "selective"], "b.svg")
if root is not None:
    expect(series(root) == ["selective"], f"micro-batch sweep: series {series(root)}")

# A plot that cannot be written fails cleanly: nothing on stdout, no partial file.
run = subprocess.run([memcalc, "--preset", "gpt2", "--plot", "/nonexistent-dir/x.svg"], capture_output=True, text=True)
expect(run.returncode == 1 and run.stdout == "" and "cannot write" in run.stderr,
       f"unwritable plot: exit {run.returncode}, stdout {run.stdout[:40]!r}, stderr {run.stderr.strip()!r}")

for f in failures:
    print("FAILED:", f)
print(f"{len(failures)} failures" if failures else "4 plots and an unwritable path checked: well-formed, with their series")
sys.exit(1 if failures else 0)
