#!/usr/bin/env python3
"""memcalc's error on each hf-llama and hf-gpt2 run, at the measured peak step, set against the
program facts found behind it (transformers/../README.md, "hf-llama and hf-gpt2: what memcalc
misses"), each as a byte count from the run's shape; what is left is printed beside.

  /usr/bin/python3 validation/third_party/hf_residuals.py \\
      validation/results/cpu-third-party-hf.json --memcalc build/memcalc

Signs: + memcalc counts more than the program holds, - less.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "gpu"))
import compare  # noqa: E402

# layers, hidden, vocabulary, max_positions (run.py's SIZES)
SIZES = {"char": (6, 384, 65, 256), "gpt2vocab": (6, 384, 50304, 512), "long": (4, 256, 8192, 1024)}


def causes(run, step):
    """{cause: bytes} at `step` of one run."""
    L, h, V, P = SIZES[run["size"]]
    s, b = run["seq"], run["batch"]
    w = 2 if run["precision"] == "bf16" else 4  # the weights' (and buffers') bytes
    full = run["recompute"] == "full"
    out = {}
    if run["program"] == "hf-gpt2":
        out["G1 bias buffer is bool"] = L * P * P * (w - 1)
        if step in ("loss", f"backward {L}"):
            layers = 0 if full else L
        else:
            layers = 1 if full and step.startswith("backward") else 0
        out["G2 torch.where: no comparison"] = s * s * layers
        if not full and b > 1:
            held = 3 * s * b * h * 2 * L
            if step == f"backward {L}":
                held -= 2 * s * b * h * 2
            out["G3 cache holds c_attn's output"] = -held
        if step == "loss":
            out["G4 loss over s-1 rows"] = 3 * b * V * w
    else:
        out["L1 logits held in fp32"] = -2 * b * s * V
        if step == "loss":
            out["L3 loss over s-1 rows"] = 3 * b * V * 4
        if full:
            out["L2 kept mask is s x s, not b x s x s"] = (b - 1) * s * s * w
    if full and step.startswith("backward"):
        out["R1 reentrant: recomputed output held"] = -s * b * h * w
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--memcalc", default=os.path.join(compare.ROOT, "build", "memcalc"))
    a = ap.parse_args(argv)
    results = json.load(open(a.results))
    for run in results["runs"]:
        if run["program"] not in ("hf-llama", "hf-gpt2"):
            continue
        report = compare.predict(a.memcalc, run, "cpu")
        step, measured = run["peak_step"], run["max_memory_allocated"]
        predicted = next(t["bytes"] for t in report["timeline"] if t["step"] == step)
        found = causes(run, step)
        error, explained = predicted - measured, sum(found.values())
        left = error - explained
        print(f"{run['model']:<27} {run['recompute']:<4} at {step:<11} memcalc - measured "
              f"{error:>+12,} ({100 * error / measured:+.2f}%); causes {explained:>+12,}; "
              f"left {left:>+9,} ({100 * left / measured:+.2f}%)")
        for name, n in found.items():
            if n:
                print(f"    {name:<40} {n:>+12,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
