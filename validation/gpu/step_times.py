#!/usr/bin/env python3
"""The replication's measured step times beside memcalc's predicted ones (plan on one GPU).

replicate.py times each run's step (the median of untimed-meter steps, synchronised); memcalc's plan
predicts a step from the work's FLOPs and bytes at the GPU's rates. Prints each run's measured and
predicted seconds and their ratio, and the ratios by model and sequence length.

  /usr/bin/python3 validation/gpu/step_times.py validation/results/gpu.json --gpu h200
"""
import argparse
import json
import statistics
import subprocess


def predicted(memcalc, run, gpu):
    attention = "flash" if run["attention"] == "sdpa" else "eager"
    command = [memcalc, "plan", "--model-file", run["model_file"], "--gpu", gpu, "--gpus", "1",
               "--seq", str(run["seq"]), "--global-batch", str(run["microbatches"]),
               "--recompute", run["recompute"], "--attention", attention, "--format", "json"]
    if run["recompute"] == "full":  # every layer, as replicate.py checkpoints them (not plan's fewest)
        command += ["--recompute-layers", "all"]
    out = subprocess.run(command, capture_output=True, text=True)
    layouts = json.loads(out.stdout)["layouts"] if out.returncode == 0 else []
    return layouts[0]["step_seconds"] if layouts else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--gpu", required=True, help="memcalc's name of the GPU the runs ran on")
    parser.add_argument("--memcalc", default="build/memcalc")
    args = parser.parse_args()
    runs = json.load(open(args.results))["runs"]
    by_shape = {}
    print("| model | seq | recompute | attention | measured (s) | predicted (s) | measured / predicted |")
    print("|---|---:|---|---|---:|---:|---:|")
    for run in runs:
        guess = predicted(args.memcalc, run, args.gpu)
        if guess is None:
            continue
        ratio = run["median_step_seconds"] / guess
        by_shape.setdefault((run["model"], run["seq"]), []).append(ratio)
        print(f"| {run['model']} | {run['seq']} | {run['recompute']} | {run['attention']} | "
              f"{run['median_step_seconds']:.4f} | {guess:.4f} | {ratio:.2f} |")
    for (model, seq), ratios in by_shape.items():
        print(f"{model} at {seq}: measured / predicted {min(ratios):.2f} to {max(ratios):.2f}, "
              f"median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
