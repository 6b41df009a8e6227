#!/usr/bin/env python3
"""Sets memcalc's predictions beside replicate.py's measurements.

  /usr/bin/python3 validation/gpu/compare.py RESULTS.json [RESULTS.json ...] [--memcalc build/memcalc]
                                            [--steps] [--check] [--plot FILE.svg]

For every run: the measured peak (the most bytes allocated at once over one training step) and the
step it falls in, memcalc's predicted peak and step for the same model file, sequence, recomputation
and attention (--activations architecture; PyTorch's fused attention as --attention flash; the
script's one-tensor-at-a-time Adam as --optimizer-impl for-loop; --platform cpu for a CPU run), the
relative error, the memory before the step beside memcalc's persistent state, and the step time
against the run without recomputation, beside the chapter's "roughly a third more compute" for full
recomputation.

--steps adds, per run, every step of the timeline measured and predicted. --check exits 1 when a
run's peak misses by more than --tolerance. --plot draws measured against predicted peaks.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


SWITCH_DEFAULTS = {"recipe": "mixed-adam", "loss": "fp32", "logits": "held", "kv_cache": "off",
                   "torch_version": "2.2", "checkpoint": "non-reentrant"}


def training_flags(run):
    """memcalc's --train, --frozen and --lora-* flags for the setting a run records (replicate.py --train;
    runs from before it trained every parameter, and get no flag, so that an older memcalc still runs).
    --lora-dtype always: memcalc's default is fp32 adapters, the run records its own."""
    train = run.get("train", "full")
    if train == "frozen":
        return ["--train", "frozen", "--frozen", run["frozen"]]
    if train in ("lora", "qlora"):
        return ["--train", train, "--lora-rank", str(run["lora_rank"]), "--lora-targets", run["lora_targets"],
                "--lora-dropout", f"{run['lora_dropout']:g}", "--lora-dtype", run.get("lora_dtype", "bf16")] + \
            (["--lora-variant", run["lora_variant"]] if "lora_variant" in run else []) + \
            [flag for key, option in QLORA_KEYS if key in run for flag in (option, str(run[key]))]
    if train in ("adapter", "qadapter", "adapter-v2", "qadapter-v2"):
        return ["--train", train, "--adapter-prompt-tokens", str(run["adapter_prompt_tokens"]),
                "--adapter-start-layer", str(run["adapter_start_layer"])] + \
            [flag for key, option in QLORA_KEYS if key in run for flag in (option, str(run[key]))]
    return []


# A QLoRA run's record of its 4-bit base: quantiser, double quantisation, bitsandbytes' release.
QLORA_KEYS = (("qlora_quantizer", "--qlora-quantizer"), ("qlora_double_quant", "--qlora-double-quant"),
              ("bitsandbytes_version", "--bitsandbytes-version"))


def training_label(run):
    """The setting in a few characters: full, frozen PARTS, lora r8 TARGETS p0.05 bf16."""
    train = run.get("train", "full")
    if train == "frozen":
        return f"frozen {run['frozen']}"
    if train in ("lora", "qlora"):
        base = f" {'nf4-dq' if run.get('qlora_double_quant') == 'true' else 'nf4'}" if train == "qlora" else ""
        return (f"{train} r{run['lora_rank']} {run['lora_targets']} p{run['lora_dropout']:g} "
                f"{run.get('lora_dtype', 'bf16')}{base}")
    if train in ("adapter", "qadapter", "adapter-v2", "qadapter-v2"):
        base = f" {'nf4-dq' if run.get('qlora_double_quant') == 'true' else 'nf4'}" if train == "qadapter" else ""
        return f"{train} p{run['adapter_prompt_tokens']} from {run['adapter_start_layer']}{base}"
    return "full"


def predict(memcalc, run, platform, older=False, defaults=False):
    """memcalc's report (JSON) for one measured run. `older`: a memcalc from before --microbatches
    and --grad-buffer counted anything, asked what a user of it could ask (one lazy micro-batch)."""
    command = predict_command(memcalc, run, platform, older, defaults)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"compare.py: {' '.join(command)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


# nvidia-smi's card names and memcalc's --gpu for them: on a GPU the measured figure is the caching
# allocator's, which counts the cuBLAS workspaces (one per matmul thread, by the card's generation).
GPU_NAMES = (("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80gb"))


def gpu_of(device_name):
    return next((gpu for name, gpu in GPU_NAMES if name in device_name), None)


def predicted_peak(report, run):
    """The tensors' peak on CPU; on a GPU, the allocator's allocated figure (its rounding and the
    workspaces it hands out, which torch.cuda.max_memory_allocated counts)."""
    if run.get("gpu"):  # set for CUDA runs on a card memcalc knows
        return report["peak"]["reserved"]["allocated_bytes"]
    return report["peak"]["bytes"]


def workspaces(report, run):
    """What the allocator hands out beside the tensors at every step (the cuBLAS workspaces)."""
    if not run.get("gpu"):
        return 0
    return sum(o["bytes"] * o["count"] for o in report["peak"].get("outside", []) if o["in_allocator"])


def optimizer_state(run):
    """When the run's optimiser made its moments: replicate.py's MixedAdam when it is built, torch's
    AdamW (bf16-adam, amp-adam, the third-party programs) at its first step."""
    made_when_built = run.get("recipe", "mixed-adam") == "mixed-adam"
    return run.get("optimizer_state", "eager" if made_when_built else "lazy")


def predict_command(memcalc, run, platform, older=False, defaults=False):
    """The memcalc command line (a list, --format json) that predicts one measured run (predict's)."""
    if older:
        run = dict(run, microbatches=1, grad_buffer="lazy")
    command = [memcalc, "--model-file", os.path.join(ROOT, run["model_file"]), "--seq", str(run["seq"]),
               "--micro-batch", str(run["micro_batch"]), "--recompute", run["recompute"], "--activations",
               "architecture", "--attention", "flash" if run["attention"] == "sdpa" else "eager", "--platform", platform,
               "--optimizer-impl", run.get("optimizer_impl", "for-loop"), "--format", "json"]
    # Only when they differ from the defaults, so that a memcalc from before them still runs.
    if run.get("microbatches", 1) > 1:
        command += ["--microbatches", str(run["microbatches"])]
    if run.get("grad_buffer", "lazy") != "lazy":
        command += ["--grad-buffer", run["grad_buffer"]]
    if "loss_chunks" in run:  # --loss chunked's
        command += ["--loss-chunks", str(run["loss_chunks"])]
    if "loss_chunk_tokens" in run:  # lit-gpt's lm_head_chunk_size (--loss chunked-bf16)
        command += ["--loss-chunk-tokens", str(run["loss_chunk_tokens"])]
    if "recompute_layers" in run:  # partial recomputation: the first N layers checkpointed
        command += ["--recompute-layers", str(run["recompute_layers"])]
    for key, default in SWITCH_DEFAULTS.items():  # recorded since replicate.py measured them; else the defaults
        if run.get(key, default) != default and not defaults:
            command += ["--" + key.replace("_", "-"), run[key]]
    command += training_flags(run)
    if run.get("gpu") and not older:
        command += ["--gpu", run["gpu"], "--optimizer-state", optimizer_state(run)]
    return command


def tied(run, step):
    """Whether the measured step `step` reached the measured peak within 0.01%: a tie the
    measurement cannot order (gpt2-small's backward 1 and optimizer step, 2 bytes apart)."""
    reached = {s["step"]: s["max_bytes"] for s in run.get("timeline", [])}.get(step, 0)
    return reached >= run["max_memory_allocated"] * (1 - 1e-4)


def plot(path, points, title):
    """Two panels: measured against predicted peak (log-log, the diagonal and 5% off it), and each
    run's relative error against the 5% band. One dot per run, coloured by recomputation mode."""
    w, h, top, bottom = 900, 470, 50, 60
    colours = {"none": "#e15759", "selective": "#4e79a7", "full": "#59a14f", "op": "#76b7b2"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>', f'<text x="70" y="24" font-size="14">{title}</text>']

    # Left: predicted against measured.
    left, right = 80, 440
    lo = min(min(m, p) for m, p, _, _ in points) / 1.3
    hi = max(max(m, p) for m, p, _, _ in points) * 1.3
    span = math.log(hi) - math.log(lo)
    x = lambda v: left + (math.log(v) - math.log(lo)) / span * (right - left)
    y = lambda v: h - bottom - (math.log(v) - math.log(lo)) / span * (h - top - bottom)
    for f, dash in ((1.0, ""), (1.05, ' stroke-dasharray="4 3"'), (0.95, ' stroke-dasharray="4 3"')):
        out.append(f'<line class="guide" x1="{x(lo):.1f}" y1="{y(lo * f):.1f}" x2="{x(hi):.1f}" y2="{y(hi * f):.1f}" '
                   f'stroke="#999"{dash}/>')
    decade = 10 ** math.floor(math.log10(lo))
    while decade <= hi:
        for k in (1, 2, 5):
            v = decade * k
            if lo <= v <= hi:
                label = f"{v / 1e9:g} GB" if v >= 1e9 else f"{v / 1e6:g} MB"
                out.append(f'<text x="{x(v):.1f}" y="{h - bottom + 18}" text-anchor="middle">{label}</text>')
                out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{label}</text>')
        decade *= 10
    out.append(f'<text x="{(left + right) / 2}" y="{h - 16}" text-anchor="middle">measured peak</text>')
    out.append(f'<text x="18" y="{(top + h - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {(top + h - bottom) / 2})">predicted peak</text>')
    for measured, predicted, mode, label in points:
        out.append(f'<circle class="run" data-run="{label}" cx="{x(measured):.1f}" cy="{y(predicted):.1f}" r="4" '
                   f'fill="{colours[mode]}" fill-opacity="0.8"><title>{label}</title></circle>')

    # Right: each run's error, in measurement order, within the 5% band.
    left, right, limit = 530, 800, 6.0
    ex = lambda i: left + (i + 0.5) / len(points) * (right - left)
    ey = lambda e: top + (limit - max(-limit, min(limit, e))) / (2 * limit) * (h - top - bottom)
    out.append(f'<rect x="{left}" y="{ey(5):.1f}" width="{right - left}" height="{ey(-5) - ey(5):.1f}" fill="#f2f2f2"/>')
    for e in (-5, 0, 5):
        dash = "" if e == 0 else ' stroke-dasharray="4 3"'
        out.append(f'<line x1="{left}" y1="{ey(e):.1f}" x2="{right}" y2="{ey(e):.1f}" stroke="#999"{dash}/>')
        out.append(f'<text x="{left - 6}" y="{ey(e) + 4:.1f}" text-anchor="end">{e:+d}%</text>')
    out.append(f'<text x="{(left + right) / 2}" y="{h - 16}" text-anchor="middle">runs, in measurement order</text>')
    out.append(f'<text x="{left - 40}" y="{(top + h - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 {left - 40} {(top + h - bottom) / 2})">predicted / measured - 1</text>')
    for i, (measured, predicted, mode, label) in enumerate(points):
        e = 100 * (predicted - measured) / measured
        out.append(f'<circle class="error" data-run="{label}" cx="{ex(i):.1f}" cy="{ey(e):.1f}" r="3.5" '
                   f'fill="{colours[mode]}"><title>{label}: {e:+.2f}%</title></circle>')

    for i, (mode, colour) in enumerate(colours.items()):
        out.append(f'<circle cx="{w - 80}" cy="{top + 20 + 20 * i}" r="5" fill="{colour}"/>'
                   f'<text x="{w - 68}" y="{top + 24 + 20 * i}">{mode}</text>')
    out.append(f'<text x="{w - 86}" y="{top + 90}" fill="#666">shaded: 5%</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="replicate.py's output; several files are compared as one set")
    ap.add_argument("--memcalc", default=os.path.join(ROOT, "build", "memcalc"))
    ap.add_argument("--tolerance", type=float, default=0.05, help="relative error that counts as a miss (5%%)")
    ap.add_argument("--steps", action="store_true", help="also every step of each run's timeline")
    ap.add_argument("--check", action="store_true", help="exit 1 when a run misses by more than --tolerance")
    ap.add_argument("--check-step", action="store_true", help="with --check: a run whose peak falls in another step misses too")
    ap.add_argument("--check-timeline", action="store_true",
                    help="with --check: every step of every run within --tolerance, not only the peak")
    ap.add_argument("--plot", metavar="FILE.svg", help="draw measured against predicted peaks")
    ap.add_argument("--markdown", action="store_true", help="also the runs as a Markdown table (docs/validation.md's)")
    ap.add_argument("--before", metavar="MEMCALC", help="with --markdown: another memcalc's predictions beside")
    ap.add_argument("--defaults", action="store_true",
                    help="predict every run with memcalc's default recipe, loss and logits, as if those were "
                         "not said (what memcalc could be asked before it had them)")
    a = ap.parse_args(argv)
    files = [json.load(open(path)) for path in a.results]
    for f in files:
        print(f"{f['device']} ({f['device_name']}), torch {f['torch']}, {f['date']}: {len(f['runs'])} runs")
    for f in files:  # each run remembers where it was measured
        for r in f["runs"]:
            r["platform"] = "cpu" if f["device"] == "cpu" else "cuda"
            r["gpu"] = gpu_of(f["device_name"]) if r["platform"] == "cuda" else None
    results = dict(files[0], runs=[r for f in files for r in f["runs"]], skipped=[x for f in files for x in f["skipped"]])
    for r in results["runs"]:  # runs from before micro-batches were measured had one, lazily made
        r.setdefault("microbatches", 1)
        r.setdefault("grad_buffer", "lazy")
    loop = lambda r: f"{r['microbatches']}{'p' if r['grad_buffer'] == 'persistent' else ''}"
    print(f"{'model':<24} {'seq':>5} {'attention':<9} {'recompute':<9} {'M':>3} {'measured':>13} {'at':<28} "
          f"{'predicted':>13} {'at':<28} {'error':>7} {'before step':>12} {'predicted':>12} {'step ms':>8} {'vs none':>7}"
          f"  recipe loss logits k/v training")
    print("M: micro-batches per step, accumulated; p: gradients zeroed and kept (--grad-buffer persistent)")
    key = lambda r: (r["model"], r["seq"], r["attention"], r["microbatches"], r["grad_buffer"], training_label(r))
    base = {key(r): r["median_step_seconds"] for r in results["runs"] if r["recompute"] == "none"}
    errors, misses, points, cost, details = [], [], [], {"selective": [], "full": [], "op": []}, []
    table = ["| model | seq | recompute | M | measured peak (B) | at |" + (" before (B) | error |" if a.before else "") +
             " predicted (B) | at | error |", "|---|---|---|---|---|---|" + ("---|---|" if a.before else "") + "---|---|---|"]
    for r in results["runs"]:
        report = predict(a.memcalc, r, r["platform"], defaults=a.defaults)
        state = report["state"]
        persistent = state["weights"] + state["master_weights"] + state["optimizer_state"]
        if r["grad_buffer"] == "persistent":
            persistent += state["gradients"]
        peak, peak_step = predicted_peak(report, r), report["peak"]["step"]
        measured = r["max_memory_allocated"]
        e = (peak - measured) / measured
        errors.append(abs(e))
        label = f"{r['model']} s={r['seq']} {r['attention']} {r['recompute']} M={loop(r)}"
        if r.get("train", "full") != "full":
            label += f" {training_label(r)}"
        points.append((measured, peak, r["recompute"], label))
        if abs(e) > a.tolerance:
            misses.append(f"{label}: {100 * e:+.1f}%")
        elif a.check_step and peak_step != r["peak_step"] and not tied(r, peak_step):
            misses.append(f"{label}: the peak at {peak_step}, measured at {r['peak_step']}")
        ratio = r["median_step_seconds"] / base[key(r)]
        if a.markdown:
            row = f"| {r['model'].replace('-replication', '')} | {r['seq']} | {r['recompute']} | {loop(r)} | {measured:,} | {r['peak_step']} |"
            if a.before:
                old = predict(a.before, r, r["platform"], older=True)["peak"]["bytes"]
                row += f" {old:,} | {100 * (old - measured) / measured:+.1f}% |"
            table.append(row + f" {peak:,} | {peak_step} | {100 * e:+.2f}% |")
        if r["recompute"] in cost:
            cost[r["recompute"]].append(ratio)
        print(f"{r['model']:<24} {r['seq']:>5} {r['attention']:<9} {r['recompute']:<9} {loop(r):>3} {measured:>13,} "
              f"{r['peak_step']:<28} {peak:>13,} {peak_step:<28} {100 * e:>+6.2f}% {r['memory_before_step']:>12,} "
              f"{persistent:>12,} {1e3 * r['median_step_seconds']:>8.1f} {ratio:>7.2f}"
              f"  {' '.join(r.get(k, d) for k, d in SWITCH_DEFAULTS.items())} {training_label(r)}")
        if a.steps or a.check_timeline:
            predicted = {s["step"]: s["bytes"] + workspaces(report, r) for s in report["timeline"]}
            for s in r["timeline"]:
                p = predicted[s["step"]]
                if a.check_timeline and abs(p - s["max_bytes"]) > a.tolerance * s["max_bytes"]:
                    misses.append(f"{label} {s['step']}: {100 * (p - s['max_bytes']) / s['max_bytes']:+.2f}%")
                if not a.steps:
                    continue
                details.append(f"  {label:<40} {s['step']:<28} "
                               f"measured {s['max_bytes']:>13,} predicted {p:>13,} "
                               f"{100 * (p - s['max_bytes']) / s['max_bytes']:+6.2f}%")
    for mode, ratios in cost.items():
        if ratios:
            print(f"step time with {mode} recomputation: {statistics.median(ratios):.2f}x the step without "
                  f"(median of {len(ratios)}; the chapter: full costs roughly a third more)")
    print(f"peak error: median {100 * statistics.median(errors):.2f}%, largest {100 * max(errors):.2f}%; "
          f"{len(misses)} of {len(errors)} runs beyond {100 * a.tolerance:g}%")
    print("memory before the step also holds the batch's token ids (8 s b bytes), which memcalc counts from forward 1")
    for m in misses:
        print("  miss:", m)
    for line in results.get("skipped", []):
        print("not run:", line)
    if a.markdown:
        print("\n" + "\n".join(table))
    if details:
        print("\nevery step: the most bytes allocated at once within it, measured and predicted")
        print("\n".join(details))
    if a.plot:
        plot(a.plot, points, f"memcalc against {results['device_name']}, torch {results['torch']} ({results['date']})")
    return 1 if a.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
