#!/usr/bin/env python3
"""Published production layouts against plan's ranking and step time (issue 40).

For each row of layouts.json with a memcalc preset or a model file (models/): one plan over the
row's GPUs, sequence and global batch (every layout, --top large), its layouts grouped by degrees
(dp, tp, pp, cp, ep), each group at its best time; the published degrees' rank among the groups,
and the predicted tokens/s per GPU of their best row beside the published figure. What the
source pins beyond the degrees pins the search too: its ZeRO stage; a schedule other than
interleaved 1F1B, which plan tries beside 1F1B; fp8 as memcalc's fp8 recipe; and its
recomputation (torchtitan's "selective" is its per-op policy, memcalc's op), unless memcalc finds
the published degrees do not fit under it: then plan chooses, and the row says so
(recompute_pinned false).

  validation/published/layouts.py --memcalc build/memcalc [--json out.json] [--markdown out.md]
  validation/published/layouts.py --only titan-l31-8b-fsdp8 \
      --check validation/results/published-layouts.json
"""
import argparse
import csv
import io
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
DEGREES = ("dp", "tp", "pp", "cp", "ep")
TOP = 3000  # plan's best rows read: enough to hold the groups ranked above a published layout
PROFILE = {"megatron": "megatron", "titan": "torchtitan", "llama3": "megatron",
           "deepseek": "megatron"}


def profile_of(row):
    """The framework the row ran on, as a memcalc profile (Llama 3's and DeepSeek's own
    frameworks are Megatron-like: fused attention, a persistent gradient buffer)."""
    return next(p for key, p in PROFILE.items() if row["id"].startswith(key))


def recompute_mode(row):
    """The row's recomputation as memcalc names it; None where the source does not say."""
    mode = row.get("recompute")
    if mode == "selective" and profile_of(row) == "torchtitan":
        return "op"  # torchtitan's selective AC is its per-op policy
    return mode


def plan_arguments(row, pin_recompute):
    model = ["--preset", row["model"]] if row.get("model") else \
        ["--model-file", str(HERE / row["model_file"])]
    args = ["plan"] + model + ["--gpu", row["gpu"], "--gpus", str(row["gpus"]),
            "--seq", str(row["seq"]), "--global-batch", str(row["global_batch"]),
            "--profile", profile_of(row), "--format", "csv",
            "--time-limit", "60"]
    if row.get("schedule") not in (None, "interleaved"):  # plan tries interleaving beside 1F1B
        args += ["--schedule", row["schedule"]]
    if row.get("zero") is not None:
        args += ["--zero", str(row["zero"])]
    if row.get("precision") == "fp8":
        args += ["--recipe", "fp8"]
    if pin_recompute and recompute_mode(row):
        args += ["--recompute", recompute_mode(row)]
    return args


def run_plan(memcalc, args):
    """plan's rows (CSV: every fitting layout is many rows, and CSV the cheapest to write and
    read), with numbers as numbers."""
    out = subprocess.run([memcalc] + args, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    for r in rows:
        for key in DEGREES + ("micro_batch", "vpp", "zero"):
            r[key] = int(r[key])
        for key in ("step_seconds", "tokens_per_second_per_gpu"):
            r[key] = float(r[key]) if r[key] else None
    return rows, None


def degrees(layout):
    return tuple(layout[k] for k in DEGREES)


def published_degrees(row):
    return tuple(row[k] if row.get(k) is not None else 1 for k in DEGREES)


def compare(memcalc, row):
    result = {"id": row["id"], "model": row.get("model") or row["model_file"], "gpus": row["gpus"],
              "seq": row["seq"],
              "layout": " ".join(f"{k} {v}" for k, v in zip(DEGREES, published_degrees(row))),
              "published_tokens_per_second_per_gpu": row["tokens_per_second_per_gpu"],
              "precision": row.get("precision")}
    target = published_degrees(row)
    pins = [a for k, v in zip(DEGREES, target) for a in (f"--{k}", str(v))]
    pin_recompute = recompute_mode(row) is not None
    pinned, error = run_plan(memcalc, plan_arguments(row, True) + pins + ["--top", "1"])
    if pin_recompute and not (pinned and pinned[0]["step_seconds"] is not None):
        pin_recompute = False  # memcalc finds the published degrees need more recomputation
        pinned, error = run_plan(memcalc, plan_arguments(row, False) + pins + ["--top", "1"])
    result["recompute_pinned"] = pin_recompute
    plan, _ = run_plan(memcalc, plan_arguments(row, pin_recompute) + ["--top", str(TOP)])
    if plan is None or pinned is None:
        return dict(result, error=error)
    best = {}
    for layout in plan:
        if layout["step_seconds"] is None:
            continue
        key = degrees(layout)
        if key not in best or layout["step_seconds"] < best[key]["step_seconds"]:
            best[key] = layout
    ranked = sorted(best.values(), key=lambda l: l["step_seconds"])
    result["first"] = " ".join(f"{k} {v}" for k, v in zip(DEGREES, degrees(ranked[0]))) \
        if ranked else None
    result["first_tokens_per_second_per_gpu"] = \
        ranked[0]["tokens_per_second_per_gpu"] if ranked else None
    if not pinned or pinned[0]["step_seconds"] is None:
        return dict(result, error="the published degrees do not fit or are not searched")
    mine = pinned[0]
    # Plan's best TOP rows hold every row faster than the published one, unless it is slower than
    # the last of them: then its rank is at least the one counted.
    faster = [l for l in ranked if l["step_seconds"] < mine["step_seconds"] and
              degrees(l) != target]
    timed = [l["step_seconds"] for l in plan if l["step_seconds"] is not None]
    result["rank_is_lower_bound"] = len(plan) >= TOP and mine["step_seconds"] >= max(timed)
    result["rank"] = 1 + len(faster)
    predicted = mine["tokens_per_second_per_gpu"]
    result["predicted_tokens_per_second_per_gpu"] = predicted
    result["ratio"] = predicted / row["tokens_per_second_per_gpu"]
    result["best_row"] = {k: mine[k] for k in ("zero", "micro_batch", "recompute", "schedule",
                                               "vpp", "sequence_parallel", "step_seconds")}
    result["best_row"]["sequence_parallel"] = mine["sequence_parallel"] == "true"
    return result


def markdown(results):
    lines = ["| row | GPUs | seq | published layout | recompute | rank | predicted | published "
             "| ratio | plan's first |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r and "rank" not in r:
            lines.append(f"| {r['id']} | {r['gpus']} | {r['seq']} | {r['layout']} | - | - | - | "
                         f"{r['published_tokens_per_second_per_gpu']:.0f} | - | "
                         f"{r.get('first') or r['error']} |")
            continue
        lines.append(
            f"| {r['id']} | {r['gpus']} | {r['seq']} | {r['layout']} | "
            f"{r['best_row']['recompute']}{'' if r['recompute_pinned'] else ' (plan)'} | "
            f"{'>' if r['rank_is_lower_bound'] else ''}{r['rank']} | {r['predicted_tokens_per_second_per_gpu']:.0f} | "
            f"{r['published_tokens_per_second_per_gpu']:.0f} | {r['ratio']:.2f} | {r['first']} |")
    return "\n".join(lines) + "\n"


def check(results, committed):
    """1 where a row's rank or prediction moved from the committed run's, naming it; else 0."""
    by_id = {r["id"]: r for r in committed}
    failed = 0
    for r in results:
        old = by_id.get(r["id"])
        same = old is not None and old.get("rank") == r.get("rank") and (
            r.get("rank") is None or abs(old["predicted_tokens_per_second_per_gpu"] /
                                         r["predicted_tokens_per_second_per_gpu"] - 1) < 1e-3)
        print(f"{r['id']}: rank {r.get('rank')}, predicted "
              f"{r.get('predicted_tokens_per_second_per_gpu')}: "
              f"{'as committed' if same else 'differs from ' + json.dumps(old)}")
        failed |= not same
    return int(failed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memcalc", default="build/memcalc")
    parser.add_argument("--layouts", default=str(HERE / "layouts.json"))
    parser.add_argument("--json", help="write the comparison here")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--only", help="rows whose id contains this")
    parser.add_argument("--check", help="committed results: exit 1 where a row's rank or "
                        "predicted tokens/s differ (0.1%%)")
    args = parser.parse_args()
    rows = [r for r in json.load(open(args.layouts)) if r.get("model") or r.get("model_file")]
    if args.only:
        rows = [r for r in rows if args.only in r["id"]]
    results = [compare(args.memcalc, r) for r in rows]
    if args.check:
        sys.exit(check(results, json.load(open(args.check))))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    table = markdown(results)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table)
    sys.stdout.write(table)


if __name__ == "__main__":
    main()
