#!/usr/bin/env python3
"""Sets memcalc's predictions beside replicate.py's measurements.

  /usr/bin/python3 validation/gpu/compare.py RESULTS.json [--memcalc build/memcalc]

For every run: the measured peak (torch.cuda.max_memory_allocated over one step) and memory before the
step, memcalc's predicted peak and persistent state for the same model file, sequence, recomputation
and attention (--activations architecture; PyTorch's fused attention as --attention flash, mixed-adam),
the relative error, and the step time against the run without recomputation, beside the chapter's
"roughly a third more compute" for full recomputation. Results from a CPU run carry no memory figures;
the predictions and the time ratios are printed all the same.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def predict(memcalc, run, platform):
    command = [memcalc, "--model-file", os.path.join(ROOT, run["model_file"]), "--seq", str(run["seq"]),
               "--micro-batch", str(run["micro_batch"]), "--recompute", run["recompute"], "--activations",
               "architecture", "--attention", "flash" if run["attention"] == "sdpa" else "eager", "--platform", platform,
               "--optimizer-impl", run.get("optimizer_impl", "for-loop"), "--format", "json"]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    state = report["state"]
    persistent = state["weights"] + state["master_weights"] + state["optimizer_state"]
    return report["peak"]["bytes"], persistent, report["peak"]["step"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--memcalc", default=os.path.join(ROOT, "build", "memcalc"))
    ap.add_argument("--tolerance", type=float, default=0.05, help="relative error that counts as a miss (5%%)")
    a = ap.parse_args(argv)
    results = json.load(open(a.results))
    print(f"{results['device']} ({results['device_name']}), torch {results['torch']}, {results['date']}")
    print(f"{'model':<24} {'seq':>5} {'attention':<9} {'recompute':<9} {'measured':>14} {'predicted':>14} "
          f"{'error':>7} {'before step':>14} {'predicted':>14} {'step ms':>9} {'vs none':>8}")
    base = {(r["model"], r["seq"], r["attention"]): r["median_step_seconds"] for r in results["runs"]
            if r["recompute"] == "none"}
    errors, misses, cost = [], [], {"selective": [], "full": []}
    for r in results["runs"]:
        peak, persistent, step = predict(a.memcalc, r, "cpu" if results["device"] == "cpu" else "cuda")
        measured = r["max_memory_allocated"]
        error = "n/a"
        if measured:
            e = (peak - measured) / measured
            errors.append(abs(e))
            error = f"{100 * e:+.1f}%"
            if abs(e) > a.tolerance:
                misses.append(f"{r['model']} seq {r['seq']} {r['attention']} {r['recompute']}: {error}")
        ratio = r["median_step_seconds"] / base[(r["model"], r["seq"], r["attention"])]
        if r["recompute"] in cost:
            cost[r["recompute"]].append(ratio)
        before = r["memory_before_step"]
        print(f"{r['model']:<24} {r['seq']:>5} {r['attention']:<9} {r['recompute']:<9} "
              f"{measured if measured else 'n/a':>14} {peak:>14} {error:>7} {before if before else 'n/a':>14} "
              f"{persistent:>14} {1e3 * r['median_step_seconds']:>9.1f} {ratio:>8.2f}")
    for mode, ratios in cost.items():
        if ratios:
            print(f"step time with {mode} recomputation: {statistics.median(ratios):.2f}x the step without "
                  f"(median of {len(ratios)}; the chapter: full costs roughly a third more)")
    if errors:
        print(f"peak error: median {100 * statistics.median(errors):.1f}%, largest {100 * max(errors):.1f}%; "
              f"{len(misses)} of {len(errors)} runs beyond {100 * a.tolerance:.0f}%")
        for m in misses:
            print("  miss:", m)
    else:
        print("no memory figures in these results (a CPU run): predictions only")
    for line in results.get("skipped", []):
        print("not run:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
