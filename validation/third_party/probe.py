#!/usr/bin/env python3
"""One run of run.py, its measured step broken into allocations: for each timeline step asked, what
the step allocated and had not freed when it ended (made_by: the autograd node and op, input shapes),
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
    a = ap.parse_args(argv)
    run_py.torch.set_num_threads(2)
    run_py.Meter = KeepingMeter
    seq, batch = run_py.SHAPES[a.size][0]
    row = run_py.run(a.program, a.size, seq, batch, a.precision, a.recompute)
    print(f"peak {row['max_memory_allocated']:,} at {row['peak_step']}; before {row['memory_before_step']:,}")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
