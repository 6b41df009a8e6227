#!/usr/bin/python3
"""Activation offload on the reference trainer's models (CPU, torch >= 1.10): what each layer's
torch.autograd.graph.save_on_cpu would copy to host memory, beside what memcalc's --offload activations
puts there for that layer (its kept bytes: unique storages, as the reference trainer counts them).

save_on_cpu's pack hook copies every tensor autograd saves inside its context, one copy per save:
numel x element size (a view copies its own elements; a tensor saved by three ops is copied three
times; parameters are copied too). On a CPU the copy is the tensor itself, so this script counts what
the hook would copy instead of calling it. Per layer it prints

  copied      every saved tensor's bytes (what save_on_cpu moves)
  params      the part of it that is parameters (the weights matmuls save)
  shared      the part that is per-model tensors passed to every layer (mask, rotary cos/sin, position ids)
  unique      the layer's kept bytes without parameters or shared tensors, each storage once
  memcalc     memcalc's host bytes / layers under --offload activations (the same settings)

Usage: /usr/bin/python3 validation/activation_offload.py --memcalc BUILD/memcalc [--model FILE ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_trainer as rt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class CopyCounter:
    """saved_tensors_hooks that note each save as save_on_cpu would copy it, by region."""

    def __init__(self):
        self.region = None
        self.saves = []  # (region, bytes, storage key)

    def pack(self, t):
        self.saves.append((self.region, t.numel() * t.element_size(), rt.storage_key(t)))
        return t

    def unpack(self, t):
        return t


def measure(spec, s, b, mode):
    model = rt.build_model(spec)
    torch.manual_seed(1)
    ids = torch.randint(0, spec.vocab, (b, s))
    rec = CopyCounter()
    params = {rt.storage_key(p) for p in model.parameters()} | {rt.storage_key(t) for t in model.buffers()}
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        loss, _, ctx, ios = model(ids, ids.clone(), mode, rec)
    shared = {rt.storage_key(t) for t in (ctx.mask, ctx.cos, ctx.sin, ctx.position_ids) if t is not None}
    layers = []
    for i in range(len(ios)):
        saves = [(n, k) for region, n, k in rec.saves if region == f"layer{i}"]
        unique = {k: k[1] for _, k in saves if k not in params and k not in shared}
        layers.append({"copied": sum(n for n, _ in saves),
                       "params": sum(n for n, k in saves if k in params),
                       "shared": sum(n for n, k in saves if k in shared),
                       "unique": sum(unique.values())})
    loss.backward()
    return layers


def memcalc_host_per_layer(memcalc, path, spec, s, b, mode):
    cmd = [memcalc, "--model-file", path, "--seq", str(s), "--micro-batch", str(b), "--recompute", mode,
           "--activations", "architecture", "--attention", "eager", "--platform", "cpu", "--offload", "activations",
           "--format", "json"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return out["ranks"][0]["host_bytes"] // spec.layers


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memcalc", required=True)
    ap.add_argument("--model", nargs="+", default=[os.path.join(HERE, "models", f)
                                                   for f in ("llama-tiny.json", "gpt2-tiny.json", "mixtral-tiny.json")])
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=2)
    a = ap.parse_args()
    print(f"{'model':<14} {'mode':<5} {'layer':>5} {'copied':>9} {'params':>9} {'shared':>7} {'unique':>9} {'memcalc':>9}")
    for path in a.model:
        spec = rt.load_spec(path)
        for mode in ("none", "full"):
            predicted = memcalc_host_per_layer(a.memcalc, path, spec, a.seq, a.micro_batch, mode)
            for i, r in enumerate(measure(spec, a.seq, a.micro_batch, mode)):
                print(f"{spec.name:<14} {mode:<5} {i:>5} {r['copied']:>9} {r['params']:>9} {r['shared']:>7} "
                      f"{r['unique']:>9} {predicted:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
