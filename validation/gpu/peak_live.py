#!/usr/bin/env python3
"""What a replicate.py run holds at its peak (CPU): every allocation made during the measured step and
still live when the step (or one timeline step, --step) reaches its most bytes, with the timeline step
it was made in, the autograd node and the op (with its input shapes) that made it.

  /usr/bin/python3 validation/gpu/peak_live.py --model llama-mid --seq 512 --recompute full \\
      --train lora --lora-targets all-linear --lora-dropout 0.05 [--lora-dtype fp32] [--step "backward 4"]

The profiler of torch 1.13 records no addresses, so each free is matched to the latest live allocation of
its size: the bytes live of each size are exact, which of several same-sized tensors is live (and so its
op) is a guess. "peak reached at" names the allocation that made the peak. A diagnostic: it measures what
replicate.py measures, one run, eager attention (the recipe, micro-batches, loss and logits as asked).
"""
import argparse
import collections
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import replicate as R  # noqa: E402


def live_at_peak(meter, want):
    """(bytes, step, {size: [(made in, node, op)]}, the allocation at the peak) from meter's profile."""
    cpu = torch.autograd.DeviceType.CPU
    events = [e for e in meter.profiler.profiler.kineto_results.events() if e.device_type() == cpu]
    items = sorted(((e.start_us(), e.name() == "[memory]", -e.duration_us(), i, e) for i, e in enumerate(events)),
                   key=lambda x: x[:4])
    stack, live, step, total, best = [], collections.defaultdict(list), None, meter.before, (-1, None, {}, None)
    for t, memory, _, _, e in items:
        while stack and stack[-1].start_us() + stack[-1].duration_us() < t:
            stack.pop()
        if not memory:
            if e.name().startswith("mark: "):
                step = e.name()[len("mark: "):]
            else:
                stack.append(e)
            continue
        n = e.nbytes()
        total += n
        if n > 0:
            node = next((s.name().split(": ", 1)[1] for s in stack
                         if s.name().startswith("autograd::engine::evaluate_function")), "")
            ops = [s for s in stack if not s.name().startswith("autograd::engine")]
            op = "/".join(s.name() for s in ops[-2:]) if ops else "?"
            if ops:
                op += " " + str([list(x) for x in ops[-1].shapes() if x])
            live[n].append((step, node, op))
        elif live[-n]:
            live[-n].pop()
        if (want is None or step == want) and total > best[0]:
            best = (total, step, {k: list(v) for k, v in live.items() if v}, (n, live[n][-1] if n > 0 else None))
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-tiny", help="models/NAME.json (default llama-tiny)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--recompute", choices=("none", "selective", "full", "op"), default="none")
    ap.add_argument("--train", choices=("full", "frozen", "lora"), default="full")
    ap.add_argument("--frozen", default="")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lora-targets", default="q_proj,v_proj")
    ap.add_argument("--lora-dropout", type=float, default=0.05)
    ap.add_argument("--lora-dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--recipe", default="mixed-adam", help="as replicate.py's --recipe (default mixed-adam)")
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--loss", default="fp32", help="as replicate.py's --loss")
    ap.add_argument("--logits", default="held", help="as replicate.py's --logits")
    ap.add_argument("--step", help="the peak of this timeline step (default: the whole step's)")
    ap.add_argument("--made-in", help="list only what this timeline step made")
    a = ap.parse_args(argv)
    train = R.Train.make(a.train, a.frozen, a.lora_rank, a.lora_targets, a.lora_dropout, a.lora_dtype)
    spec = json.load(open(os.path.join(HERE, "models", a.model + ".json")))
    spec["path"] = a.model
    found = {}
    original_exit, original_profile = R.Meter.__exit__, torch.profiler.profile

    def exit_(meter, *exc):
        original_exit(meter, *exc)
        found["best"] = live_at_peak(meter, a.step)
        return False

    R.Meter.__exit__ = exit_
    torch.profiler.profile = lambda **kw: original_profile(record_shapes=True, **kw)
    try:
        r = R.run(spec, a.seq, a.recompute, "eager", "cpu", 1, microbatches=a.microbatches, recipe=a.recipe,
                  loss_kernel=a.loss, logits_life=a.logits, train=train)
    finally:
        R.Meter.__exit__, torch.profiler.profile = original_exit, original_profile
    total, step, live, at = found["best"]
    print(f"{a.model} s={a.seq} {a.recompute} {train.label()}: {total:,} B at {step} (the run's peak "
          f"{r['max_memory_allocated']:,} at {r['peak_step']}); before the step {r['memory_before_step']:,}")
    print(f"peak reached at the allocation of {at[0]:,} B: {at[1]}")
    rows, made = collections.Counter(), collections.Counter()
    for n, tensors in live.items():
        for where in tensors:
            rows[where + (n,)] += 1
            made[where[0]] += n
    print("live, by the timeline step that made it:", ", ".join(f"{k}: {v:,}" for k, v in made.items()))
    for (made_in, node, op, n), count in sorted(rows.items(), key=lambda kv: -kv[0][3] * kv[1]):
        if a.made_in is None or made_in == a.made_in:
            print(f"  {n * count:>12,} = {count:>3} x {n:>11,}  {made_in or '-':<12} {node:<24} {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
