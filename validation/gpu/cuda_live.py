#!/usr/bin/env python3
"""What a replicate.py run holds on CUDA at its peak: the caching allocator's history of one run
(torch.cuda.memory._record_memory_history, torch 2.1 and later) replayed block by block. It prints
the peak of the measured step and the timeline step it falls in, every block live there grouped by
the step that made it, its size and the Python line that asked for it (backward's blocks are made
on autograd's thread, which has no Python line: their size names them), the blocks live before the
step (the workspaces among them), and the allocations and frees around the peak.

  python3 validation/gpu/cuda_live.py --model llama-1b --seq 4096 --attention eager --recompute full

The timeline is marked by allocations of a size nothing else asks for, (3001 + i) x 512 + 1 bytes,
freed at once; their blocks are left out of every figure. A diagnostic, for a GPU machine.
"""
import argparse
import collections
import gzip
import json
import os
import pickle
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import replicate as R  # noqa: E402

FIRST_MARK = 3001
MARKS = []


def mark_sizes(i):
    """The sizes the history may give mark i: as asked for, or as the 512-byte block it got."""
    return ((FIRST_MARK + i) * 512 + 1, (FIRST_MARK + i + 1) * 512)


class MarkedMeter(R.Meter):
    """replicate.py's Meter, each step's start also left in the allocator's history."""

    def _mark(self, name):
        MARKS.append(name)
        torch.empty((FIRST_MARK + len(MARKS) - 1) * 512 + 1, dtype=torch.uint8, device="cuda")

    def __enter__(self):
        entered = super().__enter__()
        self._mark("before step")
        return entered

    def mark(self, step):
        super().mark(step)
        self._mark(step)

    def __exit__(self, *exc):
        self._mark("after step")
        return super().__exit__(*exc)


def where(frames):
    """The innermost line of this project's code, and the innermost torch function under it."""
    own = [f for f in frames if "/validation/" in f["filename"]]
    torch_fn = next((f["name"] for f in frames if "/torch/" in f["filename"]), "")
    if not own:
        return "(no Python frame: autograd's thread, or C++)" if not frames else torch_fn
    f = own[0]
    return f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" + (f" > {torch_fn}" if torch_fn else "")


def replay(trace, base):
    """Walks the history: (peak bytes, its index, the mark it falls after, live blocks there, live
    blocks at the 'before step' mark, {mark: index})."""
    marks = {size: name for i, name in enumerate(MARKS) for size in mark_sizes(i)}
    live, total, step, at = {}, base, "setup", {}
    best = (-1, None, None, None)
    before = None
    for i, e in enumerate(trace):
        size = e["size"]
        if e["action"] == "alloc":
            if size in marks and marks[size] not in at:
                step = marks[size]
                at[step] = i
                if step == "before step":
                    before = dict(live)
                if step == "after step":
                    break
                continue
            live[e["addr"]] = (size, step, where(e.get("frames", [])))
            total += size
            if "before step" in at and total > best[0]:
                best = (total, i, step, dict(live))
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    return best, before or {}, at


def grouped(blocks, top):
    groups = collections.defaultdict(lambda: [0, 0])
    for size, step, line in blocks.values():
        g = groups[(step, size, line)]
        g[0] += 1
        g[1] += size
    rows = sorted(groups.items(), key=lambda kv: -kv[1][1])
    lines = [f"  {n:>4} x {size:>14,} = {b:>15,}  made in {step:<16} {line}"
             for (step, size, line), (n, b) in rows[:top]]
    rest = sum(b for _, (_, b) in rows[top:])
    return lines + ([f"  ... and {rest:,} B in {len(rows) - top} more groups"] if rest else [])


def around(trace, index, width):
    out = []
    for e in trace[max(0, index - width):index + 2]:
        if e["action"] in ("alloc", "free_completed"):
            sign = "+" if e["action"] == "alloc" else "-"
            out.append(f"  {sign}{e['size']:>14,}  {where(e.get('frames', []))}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    ap.add_argument("--recompute", default="none", choices=("none", "selective", "full"))
    ap.add_argument("--recipe", default="mixed-adam", choices=("mixed-adam", "bf16-adam", "amp-adam"))
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--around", type=int, default=40, help="history entries shown before the peak")
    ap.add_argument("--dump", metavar="FILE.pickle.gz",
                    help="also the allocator's whole snapshot (segments and history, gzipped pickle of plain "
                         "lists and dicts: read without torch), for the reserved figure's replay")
    a = ap.parse_args()
    path = os.path.join(HERE, "models", a.model + ".json")
    spec = json.load(open(path))
    spec["path"] = os.path.relpath(path, os.path.dirname(os.path.dirname(HERE)))
    R.Meter = MarkedMeter
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")
    r = R.run(spec, a.seq, a.recompute, a.attention, "cuda", 1, recipe=a.recipe)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    if a.dump:
        with gzip.open(a.dump, "wb") as f:
            pickle.dump(dict(snapshot, marks=MARKS), f)
    trace = snapshot["device_traces"][0]
    (peak, index, step, live), before, at = replay(trace, base)
    print(f"== {a.model} seq {a.seq} {a.attention} {a.recompute} {a.recipe}: measured peak "
          f"{r['max_memory_allocated']:,} at {r['peak_step']}; history peak {peak:,} in {step} "
          f"(entry {index} of {len(trace)}); before the step {r['memory_before_step']:,}; reserved "
          f"{r.get('max_memory_reserved', 0):,} in {r.get('segments', 0)} segments")
    print("live at the peak:")
    print("\n".join(grouped(live, a.top)))
    print(f"live before the step ({sum(s for s, _, _ in before.values()):,} B):")
    print("\n".join(grouped(before, a.top)))
    print("the history before the peak (+ allocated, - freed):")
    print("\n".join(around(trace, index, a.around)))


if __name__ == "__main__":
    main()
