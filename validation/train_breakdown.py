#!/usr/bin/python3
"""What fine-tuning changes in the tensors one layer keeps for backward, storage by storage.

For one model (default llama-tiny) and one (s, b), measures layer 0 under full training and under each
other training setting given (reference_trainer.py's --train / --frozen / --lora-* flags), in each
recomputation mode, and prints every kept storage (layer 0's input and its own, as --compare counts them)
with the modules, ops and saved attributes that hold it; then what disappears and what appears compared
with full training.  A storage is named by the set of (module, op.attribute) that save it, so one whose
savers change (the norm's output, saved by q_proj in full training and by q_proj.lora_A under LoRA) shows
as one gone and one new.

  /usr/bin/python3 validation/train_breakdown.py --train frozen lora --frozen attention,mlp \\
      --lora-targets q_proj,v_proj all-linear --lora-dropout 0 0.05
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_trainer as rt  # noqa: E402

_STACK = []     # the module running now (forward pre-hook pushes, forward hook pops)
_MODULE = {}    # pack index -> module name


def _tag_modules(model):
    for name, mod in model.named_modules():
        short = name[len("layers.0."):] if name.startswith("layers.0.") else (name or "model")
        mod.register_forward_pre_hook(lambda m, i, n=short: _STACK.append(n) and None)
        mod.register_forward_hook(lambda m, i, o: _STACK.pop() and None)


_pack = rt.Recorder.pack


def _pack_tagged(self, t):
    out = _pack(self, t)
    _MODULE[out[0]] = _STACK[-1] if _STACK else "-"
    return out


rt.Recorder.pack = _pack_tagged


def storages(spec, train, s, b, mode, region="layer"):
    """Layer 0's (or the head's) kept storages, a Counter of (bytes, dtype, shape, savers)."""
    model = rt.build_model(spec, train=train)
    _tag_modules(model)
    _MODULE.clear()
    m = rt.measure(spec, model, s, b, mode)
    layer = m.layers[0] if region == "layer" else m.head
    by_key = {}
    for r in layer.rows:
        if r.category not in ("input", "layer"):
            continue
        saver = f"{_MODULE.get(r.idx, '-')}:{r.op.replace('Backward', 'Bw')}.{r.attr}"
        e = by_key.setdefault(r.key, {"savers": [], "shape": r.shape, "dtype": r.dtype, "bytes": r.storage_bytes,
                                      "cat": r.category})
        e["savers"].append(saver)
    out = Counter()
    for e in by_key.values():
        savers = ", ".join(sorted(set(e["savers"])))
        out[(e["bytes"], e["dtype"], str(e["shape"]) + (" (layer input)" if e["cat"] == "input" else ""),
             savers)] += 1
    assert sum(k[0] * n for k, n in out.items()) == layer.kept, (layer.kept, out)
    return out, layer.kept


def show(title, c):
    for (nbytes, dtype, shape, savers), n in sorted(c.items(), key=lambda kv: -kv[0][0]):
        print(f"      {title}{nbytes:>7} B {'x%d' % n if n > 1 else '  ':<3} {dtype:<8} {shape:<28} {savers}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(rt.HERE, "models", "llama-tiny.json"))
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=list(rt.MODES), choices=rt.MODES)
    ap.add_argument("--train", nargs="+", choices=("lora", "frozen"), required=True)
    ap.add_argument("--frozen", nargs="+", default=[""])
    ap.add_argument("--lora-rank", nargs="+", type=int, default=[8])
    ap.add_argument("--lora-targets", nargs="+", default=["q_proj,v_proj"])
    ap.add_argument("--lora-dropout", nargs="+", type=float, default=[0.05])
    ap.add_argument("--lora-dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--full-list", action="store_true", help="also list full training's storages")
    ap.add_argument("--region", choices=("layer", "head"), default="layer",
                    help="layer 0 (default) or the head (final norm, logits, loss; recompute none only)")
    ap.add_argument("--dropout-kernel", choices=("native", "functional"), default="functional",
                    help="as reference_trainer.py's: native is CUDA's bool mask")
    a = ap.parse_args(argv)
    rt.DROPOUT_KERNEL = a.dropout_kernel
    torch.set_num_threads(1)
    spec = rt.load_spec(a.model)
    trains = list(dict.fromkeys(rt.Train.make(m, fz, r, t, p, a.lora_dtype) for m in a.train for fz in a.frozen
                                for r in a.lora_rank for t in a.lora_targets for p in a.lora_dropout))
    s, b = a.seq, a.micro_batch
    print(f"{spec.name} [{spec.style}] {rt.describe(spec)}; s={s} b={b}; layer 0's kept storages "
          f"(torch {torch.__version__}, CPU, dropout kernel {rt.DROPOUT_KERNEL})")
    for mode in a.modes if a.region == "layer" else ["none"]:
        full, full_kept = storages(spec, rt.Train(), s, b, mode, a.region)
        print(f"\n== {a.region}, recompute {mode}: full training keeps {full_kept} B")
        if a.full_list:
            show("", full)
        for train in trains:
            c, kept = storages(spec, train, s, b, mode, a.region)
            print(f"   -- {train.label()}: {kept} B ({kept - full_kept:+d} B)")
            show("gone ", full - c)
            show("new  ", c - full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
