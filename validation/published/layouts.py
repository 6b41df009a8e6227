#!/usr/bin/env python3
"""Published production layouts against plan's ranking and step time (issue 40).

For each row of layouts.json with a memcalc preset or a model file (models/): one plan over the
row's GPUs, sequence and global batch (every layout, --top large), its layouts grouped by degrees
(dp, tp, pp, cp, ep), each group at its best time; the published degrees' rank among the groups,
and the predicted tokens/s per GPU of their best row beside the published figure. What the
source pins beyond the degrees pins the search too: its ZeRO stage; a schedule other than
interleaved 1F1B, which plan tries beside 1F1B; fp8 as memcalc's fp8 recipe; sequence
parallelism on or off where the row has tensor parallelism and says which; and its recomputation
(torchtitan's "selective" is its per-op policy, memcalc's op; full of every layer, with
--recompute-layers all, where the program checkpoints each layer), unless memcalc finds the
published degrees do not fit under it: then plan chooses, and the row says so (recompute_pinned
false).

--layouts layouts-extended.json ({"schema": 1, "layouts": [...]}) scores that file's rows, each
converted to the row dict above: its pins (zero, schedule, recipe, profile, recomputation and its
modules or layers, attention, compile, uneven first/last stages, MTP layers, data-parallel
overlap) read from its memcalc_plan_command, and its program_pins (flags of the program every
layout searched runs under); its published tokens/s per GPU as published, else global batch x seq
/ step_seconds / GPUs, else none (TFLOP/s or MFU alone: ranked, no ratio); its sequence_parallel
as a layouts.json row's sp. Micro-batch and VPP are left to plan's search unless pinned.

  validation/published/layouts.py --memcalc build/memcalc [--json out.json] [--markdown out.md]
  validation/published/layouts.py --layouts validation/published/layouts-extended.json \
      [--time-limit S] ...
  validation/published/layouts.py --only titan-l31-8b-fsdp8 \
      --check validation/results/published-layouts.json
"""
import argparse
import csv
import io
import json
import pathlib
import shlex
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
DEGREES = ("dp", "tp", "pp", "cp", "ep")
TOP = 3000  # plan's best rows read: enough to hold the groups ranked above a published layout
PROFILE = {"megatron": "megatron", "titan": "torchtitan", "llama3": "megatron",
           "deepseek": "megatron"}


def profile_of(row):
    """The framework the row ran on, as a memcalc profile (Llama 3's and DeepSeek's own
    frameworks are Megatron-like: fused attention, a persistent gradient buffer); an extended
    row's is its command's --profile."""
    if row.get("profile"):
        return row["profile"]
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
            "--time-limit", str(row.get("time_limit", 60))]
    if row.get("schedule") not in (None, "interleaved"):  # plan tries interleaving beside 1F1B
        args += ["--schedule", row["schedule"]]
    if row.get("zero") is not None:
        args += ["--zero", str(row["zero"])]
    if row.get("recipe"):
        args += ["--recipe", row["recipe"]]
    elif row.get("precision") == "fp8":
        args += ["--recipe", "fp8"]
    if pin_recompute and recompute_mode(row):
        args += ["--recompute", recompute_mode(row)] + row.get("recompute_pins", [])
    # Sequence parallelism as the program ran it, where it had tensor parallelism to run it with
    # (a tp 1 row's says nothing of the program at tp > 1).
    if (row.get("tp") or 1) > 1 and row.get("sp") is not None:
        args += ["--sp" if row["sp"] else "--no-sp"]
    return args + row.get("pins", [])


# Extended rows (layouts-extended.json): the memcalc_plan_command flags taken as pins, and what
# each becomes (a field of the row dict compare() reads, or plan arguments passed through).
COMMAND_VALUE_FLAGS = ("--preset", "--model-file", "--gpu", "--gpus", "--seq", "--global-batch",
                       "--tp", "--pp", "--cp", "--dp", "--ep", "--vpp", "--schedule", "--zero",
                       "--recompute", "--recompute-modules", "--recompute-layers", "-b",
                       "--recipe", "--profile", "--attention", "--first-stage-layers",
                       "--last-stage-layers", "--mtp-layers", "--compile", "--dp-overlap")
PASSED_THROUGH = ("--attention", "--first-stage-layers", "--last-stage-layers", "--mtp-layers",
                  "--compile", "--dp-overlap")
WITH_RECOMPUTE = ("--recompute-modules", "--recompute-layers")


def command_flags(command):
    """An extended row's memcalc_plan_command as {flag: value} (True for a bare flag)."""
    words = shlex.split(command)
    assert words[:2] == ["memcalc", "plan"], command
    flags, i = {}, 2
    while i < len(words):
        if words[i] in COMMAND_VALUE_FLAGS:
            flags[words[i]] = words[i + 1]
            i += 2
        else:
            flags[words[i]] = True
            i += 1
    return flags


def published_tokens(row):
    """An extended row's published tokens/s per GPU: as published, else from its step time;
    None where it gives neither (TFLOP/s or MFU alone: ranked only)."""
    published = row["published"]
    if published.get("tokens_per_second_per_gpu") is not None:
        return published["tokens_per_second_per_gpu"]
    if published.get("step_seconds"):
        return row["global_batch_sequences"] * row["seq"] / published["step_seconds"] / \
            row["gpus"]
    return None


def extended_row(row, time_limit):
    """An extended row as the row dict compare() reads, or (None, why) where it cannot be run.
    Zero, schedule, recipe, profile, recomputation and the stage/attention flags are the row's
    memcalc_plan_command's, not re-derived from its prose."""
    flags = command_flags(row["memcalc_plan_command"])
    out = {"id": row["name"], "gpu": row["memcalc_gpu"], "gpus": row["gpus"], "seq": row["seq"],
           "global_batch": row["global_batch_sequences"], "vpp": row.get("vpp"),
           "tokens_per_second_per_gpu": published_tokens(row), "time_limit": time_limit}
    if row.get("memcalc_preset"):
        out["model"] = row["memcalc_preset"]
    elif row.get("model_file") and (HERE / "models" / pathlib.Path(row["model_file"]).name
                                    ).is_file():
        out["model_file"] = "models/" + pathlib.Path(row["model_file"]).name
    else:
        return None, f"no memcalc preset and no model file {row.get('model_file')}"
    for key in DEGREES:
        out[key] = row.get(key)
        pinned = flags.get("--" + key)
        if pinned is not None and int(pinned) != (out[key] if out[key] is not None else 1):
            return None, f"--{key} {pinned} in its command, {out[key]} in the row"
    out["schedule"] = flags.get("--schedule")
    out["sp"] = row.get("sequence_parallel")
    out["zero"] = int(flags["--zero"]) if "--zero" in flags else None
    out["recipe"] = flags.get("--recipe")
    out["precision"] = "fp8" if out["recipe"] == "fp8" else row.get("precision")
    out["profile"] = flags.get("--profile")
    out["recompute"] = flags.get("--recompute")
    out["recompute_pins"] = [a for f in WITH_RECOMPUTE if f in flags for a in (f, flags[f])]
    out["pins"] = [a for f in PASSED_THROUGH if f in flags for a in (f, flags[f])]
    # What the program could run, for every layout searched: no context parallelism before it
    # existed, torchtitan's micro-batch count and interleaving by default.
    out["pins"] += row.get("program_pins", [])
    if not out["profile"]:  # layouts.json's profile for its source, where it has one
        out["profile"] = next((p for key, p in PROFILE.items() if out["id"].startswith(key)),
                              None)
        if out["profile"] is None:
            return None, "its command names no --profile"
    return out, None


def load_rows(path, time_limit):
    """The rows of layouts.json (a list) or of layouts-extended.json ({"schema": 1, "layouts":
    [...]}, converted), and the (id, why) of those skipped."""
    data = json.load(open(path))
    if isinstance(data, list):
        return [r for r in data if r.get("model") or r.get("model_file")], []
    assert data.get("schema") == 1, f"{path}: unknown schema {data.get('schema')}"
    rows, skipped = [], []
    for r in data["layouts"]:
        converted, why = extended_row(r, time_limit)
        if converted is None:
            skipped.append((r["name"], why))
        else:
            rows.append(converted)
    return rows, skipped


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


CAUSES = ("compute", "communication", "bubble", "optimizer", "offload", "host_optimizer", "dispatch")


def seconds_by_cause(memcalc, args):
    """The top row of plan `args` as JSON: its step's seconds by cause (the CSV has the step alone)."""
    args = ["json" if i and args[i - 1] == "--format" else a for i, a in enumerate(args)]
    out = subprocess.run([memcalc] + args, capture_output=True, text=True)
    layouts = json.loads(out.stdout)["layouts"] if out.returncode == 0 else []
    return {k: layouts[0][k + "_seconds"] for k in CAUSES} if layouts else None


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
    program = plan_arguments(row, True)  # its program pins may pin a degree already (--cp 1)
    pins = [a for k, v in zip(DEGREES, target) if f"--{k}" not in program
            for a in (f"--{k}", str(v))]
    pin_recompute = recompute_mode(row) is not None
    pinned_args = program + pins + ["--top", "1"]
    pinned, error = run_plan(memcalc, pinned_args)
    if pin_recompute and not (pinned and pinned[0]["step_seconds"] is not None):
        pin_recompute = False  # memcalc finds the published degrees need more recomputation
        pinned_args = plan_arguments(row, False) + pins + ["--top", "1"]
        pinned, error = run_plan(memcalc, pinned_args)
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
    result["ratio"] = predicted / row["tokens_per_second_per_gpu"] \
        if row["tokens_per_second_per_gpu"] else None
    result["best_row"] = {k: mine[k] for k in ("zero", "micro_batch", "recompute", "schedule",
                                               "vpp", "sequence_parallel", "step_seconds")}
    result["best_row"]["sequence_parallel"] = mine["sequence_parallel"] == "true"
    result["best_row"]["seconds"] = seconds_by_cause(memcalc, pinned_args)
    return result


def number(value, form):
    return "-" if value is None else format(value, form)


def markdown(results):
    lines = ["| row | GPUs | seq | published layout | recompute | rank | predicted | published "
             "| ratio | plan's first |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r and "rank" not in r:
            lines.append(f"| {r['id']} | {r['gpus']} | {r['seq']} | {r['layout']} | - | - | - | "
                         f"{number(r['published_tokens_per_second_per_gpu'], '.0f')} | - | "
                         f"{r.get('first') or r['error']} |")
            continue
        lines.append(
            f"| {r['id']} | {r['gpus']} | {r['seq']} | {r['layout']} | "
            f"{r['best_row']['recompute']}{'' if r['recompute_pinned'] else ' (plan)'} | "
            f"{'>' if r['rank_is_lower_bound'] else ''}{r['rank']} | {r['predicted_tokens_per_second_per_gpu']:.0f} | "
            f"{number(r['published_tokens_per_second_per_gpu'], '.0f')} | "
            f"{number(r['ratio'], '.2f')} | {r['first']} |")
    return "\n".join(lines) + "\n\n" + step_causes(results)


def step_causes(results):
    """Where each published layout's predicted step goes, beside the published step (the same
    tokens at the published rate)."""
    lines = ["| row | published step (s) | predicted | compute | communication | bubble | other "
             "| compute / published |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        seconds = r.get("best_row", {}).get("seconds")
        if not seconds or not r.get("ratio"):
            continue
        step = r["best_row"]["step_seconds"]
        published = step * r["ratio"]
        other = step - seconds["compute"] - seconds["communication"] - seconds["bubble"]
        lines.append(f"| {r['id']} | {published:.3f} | {step:.3f} | {seconds['compute']:.3f} | "
                     f"{seconds['communication']:.3f} | {seconds['bubble']:.3f} | {other:.3f} | "
                     f"{seconds['compute'] / published:.2f} |")
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
    parser.add_argument("--time-limit", type=int, default=60,
                        help="plan's --time-limit for extended rows (layouts.json's: 60)")
    args = parser.parse_args()
    rows, skipped = load_rows(args.layouts, args.time_limit)
    if args.only:
        rows = [r for r in rows if args.only in r["id"]]
        skipped = [s for s in skipped if args.only in s[0]]
    for name, why in skipped:
        print(f"skipped {name}: {why}", file=sys.stderr)
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
