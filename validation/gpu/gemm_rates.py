#!/usr/bin/env python3
"""Matrix products at the shapes training runs, timed: what share of the GPU's peak each reaches.

memcalc times every matrix product at one share of the bf16 peak (hardware.hpp's gemm_efficiency,
0.7, from NVIDIA's CUTLASS figures at 8192^3). The published layouts' compute alone comes to 0.62-0.85
of their published steps (docs/fit-and-plan.md), so this measures the products themselves: for each
published model's linears on one tensor-parallel rank (q/k/v, o, the MLP's up and gate, down; the
forward product, and backward's two with their transposes), at a micro-batch of `--tokens` tokens,
bf16, inputs drawn from a normal distribution (zeros run faster under a power limit), the median of
`--repeats` CUDA-event timings after a warm-up, and 8192^3 beside them. Writes JSON: each product's
M, N, K, seconds and TFLOP/s, and its share of `--peak` where given.

  python3 validation/gpu/gemm_rates.py --device cuda --peak 989.4e12 --out validation/results/gemm-rates.json
  /usr/bin/python3 validation/gpu/gemm_rates.py --device cpu --scale 64 --repeats 1 --out /tmp/gemm.json  # CI
"""
import argparse
import json
import platform
import statistics
import time

import torch

# Published models' widths (memcalc's presets and validation/published/models): hidden, ffn,
# heads, key/value heads, head size; and the tensor-parallel degrees their layouts ran.
MODELS = {
    "megatron-gpt-1.7b": (2048, 8192, 16, 16, 128, (1,)),
    "llama-3-8b": (4096, 14336, 32, 8, 128, (1, 2)),
    "llama-3-70b": (8192, 28672, 64, 8, 128, (2, 8)),
    "llama-3.1-405b": (16384, 53248, 128, 8, 128, (8,)),
}


def linears(hidden, ffn, heads, kv_heads, head, tp):
    """(name, K, N) of one rank's forward products: input width K, output width N."""
    return [("qkv", hidden, (heads + 2 * kv_heads) * head // tp), ("o", heads * head // tp, hidden),
            ("up_gate", hidden, 2 * ffn // tp), ("down", ffn // tp, hidden)]


def products(tokens, k, n):
    """A linear's three products (forward, input gradient, weight gradient) as (pass, M, K, N)."""
    return [("forward", tokens, k, n), ("input_grad", tokens, n, k), ("weight_grad", k, tokens, n)]


def timed(device, m, k, n, repeats):
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    torch.matmul(a, b)  # warm-up: the library picks its kernel
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            begun = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - begun)
    return statistics.median(times)


def row(device, args, model, tp, name, shape):
    what, m, k, n = shape
    m, k, n = (max(1, x // args.scale) for x in (m, k, n))
    seconds = timed(device, m, k, n, args.repeats)
    rate = 2 * m * k * n / seconds
    out = {"model": model, "tp": tp, "linear": name, "pass": what, "m": m, "k": k, "n": n,
           "seconds": seconds, "tflops": rate / 1e12}
    if args.peak:
        out["share_of_peak"] = rate / args.peak
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tokens", type=int, default=8192, help="a micro-batch's tokens (M)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--scale", type=int, default=1, help="every side divided by this (CPU checks)")
    parser.add_argument("--peak", type=float, help="the GPU's dense bf16 FLOP/s, for the shares")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = [row(args.device, args, "square", 1, "8192^3", ("forward", 8192, 8192, 8192))]
    for model, (hidden, ffn, heads, kv, head, tps) in MODELS.items():
        for tp in tps:
            for name, k, n in linears(hidden, ffn, heads, kv, head, tp):
                rows += [row(args.device, args, model, tp, name, shape)
                         for shape in products(args.tokens, k, n)]
    name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    result = {"device": args.device, "device_name": name, "torch": torch.__version__,
              "tokens": args.tokens, "scale": args.scale, "peak": args.peak, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for r in rows:
        share = f" {r['share_of_peak']:.2f} of peak" if "share_of_peak" in r else ""
        print(f"{r['model']} tp {r['tp']} {r['linear']} {r['pass']} {r['m']}x{r['k']}x{r['n']}: "
              f"{r['tflops']:.1f} TFLOP/s{share}")


if __name__ == "__main__":
    main()
