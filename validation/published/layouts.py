#!/usr/bin/env python3
"""Published production layouts against plan's ranking and step time (issue 40).

For each row of layouts.json with a memcalc preset: one plan over the row's GPUs, sequence and
global batch (every layout, --top large), its layouts grouped by degrees (dp, tp, pp, cp, ep),
each group at its best time; the published degrees' rank among the groups, and the predicted
tokens/s per GPU of their best row beside the published figure. What the source pins beyond the
degrees (schedule, ZeRO, recomputation, micro-batch) pins the search too.

  validation/published/layouts.py --memcalc build/memcalc [--json out.json] [--markdown out.md]
  validation/published/layouts.py --only titan-l31-8b-fsdp8 \
      --check validation/results/published-layouts.json
"""
import argparse
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
DEGREES = ("dp", "tp", "pp", "cp", "ep")
PROFILE = {"megatron": "megatron", "titan": "torchtitan", "llama3": "megatron",
           "deepseek": "megatron"}


def profile_of(row):
    """The framework the row ran on, as a memcalc profile (Llama 3's and DeepSeek's own
    frameworks are Megatron-like: fused attention, a persistent gradient buffer)."""
    return next(p for key, p in PROFILE.items() if row["id"].startswith(key))


def plan_arguments(row):
    args = ["plan", "--preset", row["model"], "--gpu", row["gpu"], "--gpus", str(row["gpus"]),
            "--seq", str(row["seq"]), "--global-batch", str(row["global_batch"]),
            "--profile", profile_of(row), "--format", "json", "--top", "1000000",
            "--time-limit", "60"]
    if row.get("schedule") in ("dualpipe", "zb-v"):
        args += ["--schedule", row["schedule"]]
    if row.get("zero") is not None:
        args += ["--zero", str(row["zero"])]
    return args


def run_plan(memcalc, args):
    out = subprocess.run([memcalc] + args, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return json.loads(out.stdout), None


def degrees(layout):
    return tuple(layout[k] for k in DEGREES)


def published_degrees(row):
    return tuple(row[k] if row.get(k) is not None else 1 for k in DEGREES)


def compare(memcalc, row):
    result = {"id": row["id"], "model": row["model"], "gpus": row["gpus"], "seq": row["seq"],
              "layout": " ".join(f"{k} {v}" for k, v in zip(DEGREES, published_degrees(row))),
              "published_tokens_per_second_per_gpu": row["tokens_per_second_per_gpu"],
              "precision": row.get("precision")}
    plan, error = run_plan(memcalc, plan_arguments(row))
    if plan is None:
        return dict(result, error=error)
    best = {}
    for layout in plan["layouts"]:
        if layout["step_seconds"] is None:
            continue
        key = degrees(layout)
        if key not in best or layout["step_seconds"] < best[key]["step_seconds"]:
            best[key] = layout
    ranked = sorted(best.values(), key=lambda l: l["step_seconds"])
    target = published_degrees(row)
    mine = best.get(target)
    result["layouts_fitting"] = plan["fitting"]
    result["degree_groups"] = len(ranked)
    result["first"] = " ".join(f"{k} {v}" for k, v in zip(DEGREES, degrees(ranked[0]))) \
        if ranked else None
    result["first_tokens_per_second_per_gpu"] = \
        ranked[0]["tokens_per_second_per_gpu"] if ranked else None
    if mine is None:
        return dict(result, error="the published degrees do not fit or are not searched")
    result["rank"] = 1 + sum(1 for l in ranked if l["step_seconds"] < mine["step_seconds"])
    predicted = mine["tokens_per_second_per_gpu"]
    result["predicted_tokens_per_second_per_gpu"] = predicted
    result["ratio"] = predicted / row["tokens_per_second_per_gpu"]
    result["best_row"] = {k: mine[k] for k in ("zero", "micro_batch", "recompute", "schedule",
                                               "vpp", "sequence_parallel", "step_seconds")}
    return result


def markdown(results):
    lines = ["| row | GPUs | seq | published layout | rank | predicted | published | ratio "
             "| plan's first |",
             "|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r and "rank" not in r:
            lines.append(f"| {r['id']} | {r['gpus']} | {r['seq']} | {r['layout']} | - | - | "
                         f"{r['published_tokens_per_second_per_gpu']:.0f} | - | "
                         f"{r.get('first') or r['error']} |")
            continue
        lines.append(
            f"| {r['id']} | {r['gpus']} | {r['seq']} | {r['layout']} | {r['rank']} of "
            f"{r['degree_groups']} | {r['predicted_tokens_per_second_per_gpu']:.0f} | "
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
    rows = [r for r in json.load(open(args.layouts)) if r.get("model")]
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
