#!/usr/bin/env python3
"""One run of run.py, its measured step broken into allocations: for each timeline step asked,
what the step allocated and had not freed when it ended (the autograd node and op that made it),
grouped and summed, beside what it freed of earlier steps. For finding a residual against memcalc
(issue 35): run.py's run() with its Meter swapped for one that keeps the profiler's event tree
(op_live.py's reading of it, frees matched to allocations by address).

  nice /usr/bin/python3 validation/third_party/probe.py hf-gpt2 char bf16 none --steps "forward 3"
"""
import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import op_live  # noqa: E402
import run as run_py  # noqa: E402

RECORDS = []


class KeepingMeter(run_py.Meter):
    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        RECORDS.extend(op_live.from_tree(self.profiler))
        return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("program", choices=run_py.PROGRAMS)
    ap.add_argument("size", choices=tuple(run_py.SIZES))
    ap.add_argument("precision", choices=tuple(run_py.PRECISIONS))
    ap.add_argument("recompute", choices=("none", "full"))
    ap.add_argument("--steps", nargs="+", default=["forward 3"])
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--at-peak", action="store_true",
                    help="also what is live at each asked step's most bytes, by who made it")
    a = ap.parse_args(argv)
    run_py.torch.set_num_threads(2)
    run_py.Meter = KeepingMeter
    seq, batch = run_py.SHAPES[a.size][0]
    row = run_py.run(a.program, a.size, seq, batch, a.precision, a.recompute)
    print(f"peak {row['max_memory_allocated']:,} at {row['peak_step']}; "
          f"before {row['memory_before_step']:,}")
    for s in row["timeline"]:
        print(f"  {s['step']:<12} {s['max_bytes']:>14,}")
    steps = op_live.measured_steps(RECORDS, a.steps)
    for name in a.steps:
        kept, freed = collections.Counter(), collections.Counter()
        count = collections.Counter()
        for e in steps[name]:
            if e["bytes"] > 0 and not e["within_step"]:
                key = f"{e['node'] + ': ' if e['node'] else ''}{e['op']} {e['shapes']}"
                kept[key] += e["bytes"]
                count[key] += 1
            elif e["bytes"] < 0 and not e["within_step"]:
                key = f"{e['made_by']} (made in {e['made_in']})"
                freed[key] += -e["bytes"]
                count[key] += 1
        print(f"\n{name}: allocated and still live at its end {sum(kept.values()):,} B; "
              f"freed of earlier steps {sum(freed.values()):,} B")
        for key, n in kept.most_common():
            if n >= a.min_bytes:
                print(f"  + {n:>12,} x{count[key]:<3} {key[:150]}")
        for key, n in freed.most_common():
            if n >= a.min_bytes:
                print(f"  - {n:>12,} x{count[key]:<3} {key[:150]}")
    if a.at_peak:
        at_peak(a.steps, a.min_bytes)
    return 0


def at_peak(wanted, min_bytes):
    """Replays the step's allocations by address; at each wanted step's most bytes, the live ones
    made within the measured step, grouped by (made in step, node: op)."""
    live, step, total, best = {}, None, 0, {}
    for record in RECORDS:
        if record[0] == "mark":
            if record[1].startswith("mark: "):
                step = record[1][len("mark: "):]
            continue
        _, n, address, context = record
        node, op, _ = op_live.describe(context)
        if n > 0:
            live[address] = (n, step, f"{node + ': ' if node else ''}{op}")
            total += n
        elif address in live:
            total -= live.pop(address)[0]
        else:
            total += n  # made before the step
        if step in wanted and total > best.get(step, (None, -1))[1]:
            groups = collections.Counter()
            for size, made, what in live.values():
                groups[(made, what)] += size
            best[step] = (groups, total)
    for name in wanted:
        groups, total = best.get(name, ({}, 0))
        print(f"\n{name}: at its most bytes, {total:,} B above the step's start less what it freed "
              "of earlier memory; live allocations made within the measured step:")
        for (made, what), size in sorted(groups.items(), key=lambda kv: -kv[1]):
            if size >= min_bytes:
                print(f"  {size:>12,}  made in {made:<11} {what[:110]}")


if __name__ == "__main__":
    sys.exit(main())
