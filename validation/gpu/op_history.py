#!/usr/bin/env python3
"""Each kernel's own allocations on a GPU: a few ops run forward and backward on one tensor of
N elements, the caching allocator's history recorded (torch 2.1 and later), and every allocation
and free printed in bytes per element of N, in order. It names what a training step's history
(cuda_live.py) shows only by size: which op of a chain makes which temporary.

  python3 validation/gpu/op_history.py [--elements N]

A diagnostic, for a GPU machine; its output is validation/results/gpu-op-history.txt.
"""
import argparse

import torch
import torch.nn.functional as F


def softmax_fp32_of_bf16(x):
    """Eager LLaMA's scores: F.softmax(bf16, dtype=float32), cast back to bf16."""
    return F.softmax(x, dim=-1, dtype=torch.float32).to(torch.bfloat16)


def softmax_fp32_only(x):
    return F.softmax(x, dim=-1, dtype=torch.float32)


def softmax_of_fp32(x):
    return F.softmax(x.float(), dim=-1)


def cast_fp32_to_bf16(x):
    return x.float().to(torch.bfloat16)


def softmax_bf16(x):
    return F.softmax(x, dim=-1)


def rmsnorm_transformers(x):
    """transformers' LlamaRMSNorm without its weight: an fp32 copy, its mean square, the product."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)


def layer_norm_bf16(x):
    return F.layer_norm(x, x.shape[-1:])


CASES = [softmax_fp32_of_bf16, softmax_fp32_only, softmax_of_fp32, cast_fp32_to_bf16, softmax_bf16,
         rmsnorm_transformers, layer_norm_bf16]


def history(case, rows, cols):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    start = len(torch.cuda.memory._snapshot()["device_traces"][0])
    y = case(x)
    marker = len(torch.cuda.memory._snapshot()["device_traces"][0])
    y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    return trace[start:], marker - start, y.dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16 * 1024)
    ap.add_argument("--cols", type=int, default=2048)
    a = ap.parse_args()
    n = a.rows * a.cols
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; x: {a.rows} x {a.cols} bf16, "
          f"sizes in bytes per element; backward starts with its incoming gradient (ones_like)")
    for case in CASES:
        trace, marker, dtype = history(case, a.rows, a.cols)
        steps = []
        for i, e in enumerate(trace):
            if e["action"] not in ("alloc", "free_completed") or e["size"] < n // 2:
                continue
            phase = "forward" if i < marker else "backward"
            sign = "+" if e["action"] == "alloc" else "-"
            steps.append(f"{phase[0]}{sign}{e['size'] / n:g}")
        print(f"{case.__name__:<22} out {str(dtype):<15} {' '.join(steps)}")


if __name__ == "__main__":
    main()
