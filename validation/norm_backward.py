#!/usr/bin/env python3
"""Every allocation and free of llama2.c's final RMSNorm, its head and the cross-entropy, forward
and backward, on CPU (torch's profiler), in units of u = s*b*h bytes, each with the innermost op
around it: the evidence for blocks/norm.hpp's rmsnorm_backward_work (the weight's product holds
3 tensors of x_norm's dtype, x * rsqrt 3 fp32, pow(x, 2) 5 fp32) and for the loss step ending with
the final norm's backward (validation/results/cpu-third-party-llama2c.json).

Usage: /usr/bin/python3 validation/norm_backward.py [bf16|autocast] [--vocab V]
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "third_party", "llama2c"))
from model import RMSNorm  # noqa: E402  (llama2.c's own, vendored unchanged)


def events(mode, s, b, h, V):
    torch.manual_seed(0)
    norm, head = RMSNorm(h, 1e-5), nn.Linear(h, V, bias=False)
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    norm, head = norm.to(dtype), head.to(dtype)
    x0 = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, V, (b, s))
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                      profile_memory=True)
    with profiler:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            x = x0 * 1  # the last layer's output: not a leaf
            logits = head(norm(x))
            loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-1)
        with torch.profiler.record_function("backward starts"):
            pass
        loss.backward()
    return list(profiler.profiler.kineto_results.events())


def innermost(ops, t):
    around = [o for o in ops if o.start_us() <= t <= o.start_us() + o.duration_us()]
    return min(around, key=lambda o: o.duration_us()).name() if around else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="bf16", choices=["bf16", "autocast"])
    parser.add_argument("--vocab", type=int, default=65)
    args = parser.parse_args()
    s, b, h = 256, 2, 384
    u = s * b * h
    found = events(args.mode, s, b, h, args.vocab)
    ops = [e for e in found if e.name() != "[memory]"]
    start = next(o.start_us() for o in ops if o.name() == "backward starts")
    live, base, peak, where = 0, None, 0, ""
    for e in sorted((e for e in found if e.name() == "[memory]"), key=lambda e: e.start_us()):
        if e.device_type() != torch.autograd.DeviceType.CPU or abs(e.nbytes()) < u // 100:
            live += e.nbytes() if e.device_type() == torch.autograd.DeviceType.CPU else 0
            continue
        if base is None and e.start_us() >= start:
            base = live
            print(f"--- backward starts: {base / u:.3f}u live")
        live += e.nbytes()
        op = innermost(ops, e.start_us())
        if base is not None and live - base > peak:
            peak, where = live - base, op
        print(f"{e.nbytes() / u:+8.3f}u  live {live / u:8.3f}u  {op}")
    print(f"backward's peak: {peak / u:.3f}u ({peak:,} B) above its start, in {where}; "
          f"u = s b h = {u:,} B (s {s}, b {b}, h {h}, V {args.vocab}, {args.mode})")


if __name__ == "__main__":
    main()
