#!/usr/bin/python3
"""Measures what each MLP activation function keeps for backward, as the modeling code writes it.

For every implementation memcalc has a row for (`memcalc activation-functions`), this runs the
function once on a bf16 tensor of s x f elements on the CPU and records, in tensors of s x f:

  kept       the storages autograd keeps for backward (torch.autograd.graph.saved_tensors_hooks,
             each storage once), other than the function's output and its one-element scalars
             (Python numbers wrapped as 0-dim fp64 tensors, 8 bytes each); with their dtypes
  output     whether the function itself keeps its output (ReLU does)
  forward    the largest temporary over the forward pass beyond what it keeps and its output
  backward   the largest amount allocated during its backward pass beyond what was live when the
             backward started: the incoming gradient (made by the op after it, as a down projection's
             backward makes it) and every gradient the chain makes, less what it frees meanwhile

Allocations are read from the profiler's record of every allocation and free (PyTorch's CPU allocator
does not round), as validation/gpu/replicate.py reads a whole step.

  /usr/bin/python3 validation/activation_functions.py                              # the measured table
  /usr/bin/python3 validation/activation_functions.py --compare build/memcalc      # against memcalc's rows
"""
import argparse
import json
import math
import subprocess
import sys

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16
S, F_WIDTH = 64, 96  # any shape: every figure is a whole number of s x f tensors


# Each as its source writes it (transformers' src/transformers/activations.py for the ops chains).
def gelu_new(x):  # NewGELUActivation, GPT-2's "gelu_new"
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x):  # FastGELUActivation, "gelu_fast"
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def quick_gelu(x):  # QuickGELUActivation, "quick_gelu"
    return x * torch.sigmoid(1.702 * x)


def relu2(x):  # ReLUSquaredActivation, "relu2" (Nemotron-H's MLP)
    return torch.square(F.relu(x))


def clamped_swiglu(x):  # GptOssExperts' gate half: gate.clamp(max=limit) * sigmoid(gate * alpha)
    gate = x.clamp(min=None, max=7.0)
    return gate * torch.sigmoid(gate * 1.702)


FUNCTIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "gelu_new": gelu_new,
    "gelu_fast": gelu_fast,
    "quick_gelu": quick_gelu,
    "clamped_swiglu": clamped_swiglu,
    "relu2": relu2,
}


def replay(events, start_name, end_name=None):
    """Live bytes over the recorded allocations: (live when `start_name` was marked, the most until
    `end_name` or the end). One-element scalars (a few bytes each) are left out."""
    mark = {e.name(): e.start_us() for e in events if e.name() in (start_name, end_name)}
    end_us = mark.get(end_name, math.inf)
    live, start, peak = 0, None, 0
    for e in sorted((e for e in events if e.name() == "[memory]" and abs(e.nbytes()) >= 64), key=lambda e: e.start_us()):
        if e.start_us() >= end_us:
            break
        if start is None and e.start_us() >= mark[start_name]:
            start, peak = live, live
        live += e.nbytes()
        if start is not None:
            peak = max(peak, live)
    return (live, live) if start is None else (start, peak)


def measure(name):
    fn = FUNCTIONS[name]
    unit = S * F_WIDTH * torch.tensor([], dtype=DTYPE).element_size()
    storages = {}

    def pack(t):
        if t.numel() > 1:
            storages[t.storage().data_ptr()] = (t.storage().nbytes(), t.dtype)
        return t

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        x = torch.randn(S, F_WIDTH, dtype=DTYPE, requires_grad=True)
        with torch.profiler.record_function("forward"):
            pass
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = fn(x)
        with torch.profiler.record_function("forward done"):
            pass
        output_kept = y.storage().data_ptr() in storages
        storages.pop(y.storage().data_ptr(), None)
        # The op after it (a down projection) keeps the output and hands back a gradient of its width:
        # here a product with a Python number, which keeps nothing and makes the gradient in backward.
        loss = (y * 1.0).sum()
        if not output_kept:
            del y
        with torch.profiler.record_function("backward"):
            pass
        loss.backward()
    events = list(prof.profiler.kineto_results.events())
    kept_bytes = sum(n for n, _ in storages.values())
    # Forward: the input was live before; at its end the kept tensors and the output are.
    _, forward_peak = replay(events, "forward", "forward done")
    done, _ = replay(events, "forward done")
    start, backward_peak = replay(events, "backward")
    dtypes = sorted({str(dt).replace("torch.", "") for _, dt in storages.values()})
    return {
        "name": name,
        "kept": kept_bytes / unit,
        "kept_dtypes": dtypes,
        "keeps_output": output_kept,
        "forward_workspace": (forward_peak - done) / unit,
        "backward_workspace": (backward_peak - start) / unit,
    }


def memcalc_rows(memcalc):
    out = subprocess.run([memcalc, "activation-functions", "--format", "json"], capture_output=True, text=True,
                         check=True).stdout
    return {row["name"]: row for row in json.loads(out)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", metavar="MEMCALC", help="check memcalc's rows against the measurements")
    a = ap.parse_args(argv)
    print(f"torch {torch.__version__}, CPU, {DTYPE}; figures in tensors of s x f elements of {DTYPE}")
    print(f"{'function':<14} {'kept':>5} {'output':>7} {'forward':>8} {'backward':>9}  verdict")
    predicted = memcalc_rows(a.compare) if a.compare else {}
    failed = 0
    names = list(FUNCTIONS)
    for extra in sorted(set(predicted) - set(names)):
        print(f"{extra:<11} memcalc has a row this script cannot run")
        failed += 1
    for name in names:
        m = measure(name)
        verdict = ""
        if a.compare:
            p = predicted.get(name)
            # memcalc models no forward temporary: every chain measured keeps all it makes
            expect = None if p is None else (float(p["kept_tensors"]), p["keeps_output"] == "yes", 0.0,
                                             float(p["backward_workspace_tensors"]))
            got = (m["kept"], m["keeps_output"], m["forward_workspace"], m["backward_workspace"])
            ok = got == expect
            verdict = "ok" if ok else f"MISMATCH (memcalc: {expect})"
            failed += not ok
        print(f"{name:<14} {m['kept']:>5g} {'yes' if m['keeps_output'] else 'no':>7} {m['forward_workspace']:>8g} "
              f"{m['backward_workspace']:>9g}  {verdict}  {', '.join(m['kept_dtypes'])}")
    if a.compare:
        print(f"\n{len(names) - failed}/{len(names)} functions agree with memcalc's rows exactly")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
