#!/usr/bin/env python3
"""The replication's measured step times beside memcalc's predicted ones (plan on one GPU).

replicate.py times each run's step (the median of untimed-meter steps, synchronised); memcalc's plan
predicts a step from the work's FLOPs and bytes at the GPU's rates, and from its kernel launches at
the host's launch_seconds each (what bounds a small model's step). Prints each run's measured and
predicted seconds and their ratio, and the ratios by model and sequence length.

  /usr/bin/python3 validation/gpu/step_times.py validation/results/gpu.json --gpu h200

--fit MODEL finds the launch_seconds at which MODEL's runs' median ratio is 1 (bisection, plan run
with a GPU file that differs from --gpu in that alone), then prints every run at it: the other
models' runs are held out.

  /usr/bin/python3 validation/gpu/step_times.py validation/results/gpu.json --gpu h200 \\
      --fit gpt2-small-replication
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def predicted(memcalc, run, gpu, gpu_file=None):
    attention = "flash" if run["attention"] == "sdpa" else "eager"
    device = ["--gpu-file", gpu_file] if gpu_file else ["--gpu", gpu]
    command = [memcalc, "plan", "--model-file", run["model_file"], *device, "--gpus", "1",
               "--seq", str(run["seq"]), "--global-batch", str(run["microbatches"]),
               "--recompute", run["recompute"], "--attention", attention, "--format", "json",
               # the program as it ran: its layers op by op, its optimiser's loop
               "--activations", "architecture", "--optimizer-impl", run.get("optimizer_impl", "for-loop")]
    if run["recompute"] == "full":  # every layer, as replicate.py checkpoints them (not plan's fewest)
        command += ["--recompute-layers", "all"]
    out = subprocess.run(command, capture_output=True, text=True)
    layouts = json.loads(out.stdout)["layouts"] if out.returncode == 0 else []
    return layouts[0]["step_seconds"] if layouts else None


def gpu_file_with(memcalc, gpu, launch_seconds, directory):
    """A GPU file of `gpu`'s row but its launch_seconds."""
    rows = json.loads(subprocess.run([memcalc, "gpus", "--format", "json"], capture_output=True,
                                     text=True, check=True).stdout)
    row = next(r for r in rows if r["name"] == gpu)
    row = {k: v for k, v in row.items() if v is not None}
    row["launch_seconds"] = launch_seconds
    path = os.path.join(directory, f"{gpu}-{launch_seconds:.9f}.json")
    with open(path, "w") as f:
        json.dump(row, f)
    return path


def median_ratio(memcalc, runs, gpu, gpu_file):
    return statistics.median(r["median_step_seconds"] / predicted(memcalc, r, gpu, gpu_file) for r in runs)


def fit(memcalc, runs, gpu, model, directory):
    """The launch_seconds at which `model`'s runs' median measured / predicted is 1."""
    chosen = [r for r in runs if r["model"] == model]
    low, high = 0.0, 1e-4
    for _ in range(14):  # to within 0.01 us
        middle = (low + high) / 2
        if median_ratio(memcalc, chosen, gpu, gpu_file_with(memcalc, gpu, middle, directory)) > 1:
            low = middle
        else:
            high = middle
    return round((low + high) / 2, 8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--gpu", required=True, help="memcalc's name of the GPU the runs ran on")
    parser.add_argument("--memcalc", default="build/memcalc")
    parser.add_argument("--fit", metavar="MODEL", help="fit launch_seconds on this model's runs")
    args = parser.parse_args()
    runs = json.load(open(args.results))["runs"]
    with tempfile.TemporaryDirectory() as directory:
        gpu_file = None
        if args.fit:
            launch = fit(args.memcalc, runs, args.gpu, args.fit, directory)
            print(f"launch_seconds fitted on {args.fit}: {launch * 1e6:.2f} us")
            gpu_file = gpu_file_with(args.memcalc, args.gpu, launch, directory)
        report(args.memcalc, runs, args.gpu, gpu_file)


def report(memcalc, runs, gpu, gpu_file):
    by_shape = {}
    print("| model | seq | recompute | attention | measured (s) | predicted (s) | measured / predicted |")
    print("|---|---:|---|---|---:|---:|---:|")
    for run in runs:
        guess = predicted(memcalc, run, gpu, gpu_file)
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
