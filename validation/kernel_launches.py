#!/usr/bin/python3
"""Counts the kernels one layer launches, forward and backward, beside memcalc's count.

memcalc's step time is at least its kernel launches times the host's cost of dispatching one
(launch_seconds): include/memcalc/launches.hpp counts each op's, each layer's blocks add them up.
This runs one layer of each of the replication's models (validation/gpu/models, replicate.py's Block:
LayerNorm or transformers' RMSNorm, GELU or SwiGLU, rotary or learned positions, masks, dropouts) on
the CPU in bf16 and counts every aten op it dispatches, forward and backward (a TorchDispatchMode),
but views and what launches nothing (empty, is_same_size, .item()); then reads memcalc's
compute.layer_launches for the same model file (--platform cpu: CPU's dropout draws, scales and
multiplies) and checks they agree.

replicate.py repeats grouped k and v with repeat_interleave (three kernels forward, two backward
each); here they are repeated as transformers' repeat_kv does, which memcalc counts: expanded and
reshaped, one copy (its backward one sum).

transformers' blocks that the replication lacks (--reference) are counted in
validation/reference_trainer.py's layers: each sparse MoE block beside its dense twin (the same model
file without experts), the difference being the block's kernels less a dense MLP's, set against
memcalc's difference for the same two files (Mixtral's loop: torch.where, index, the expert, the
weighting, index_add_ for each expert it hits, at 2, 4 and 8 experts; Qwen2-MoE's shared expert and
its gate; top-k renormalised; Phi-3.5-MoE's sparsemixer and input jitter); and DeepSeek's latent
attention layers whole (V2-Lite's, V3's with the query latent, V3.2's with its indexer).

  /usr/bin/python3 validation/kernel_launches.py --memcalc build/memcalc            # every model
  /usr/bin/python3 validation/kernel_launches.py --ops                              # each op alone
  /usr/bin/python3 validation/kernel_launches.py --reference                        # MoE, MLA
"""
import argparse
import collections
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gpu"))
sys.path.insert(0, HERE)
import replicate  # noqa: E402  the replication's layer, as its GPU and CPU runs ran it

ROOT = os.path.dirname(HERE)
LAUNCH_NOTHING = {"view", "_unsafe_view", "t", "transpose", "expand", "permute", "as_strided", "slice",
                  "select", "unsqueeze", "squeeze", "split", "split_with_sizes", "detach", "alias",
                  "reshape", "unbind", "_reshape_alias", "empty", "empty_like", "empty_strided",
                  "lift_fresh", "_local_scalar_dense", "is_same_size", "new_empty_strided", "new_empty"}
MODELS = ["gpt2-tiny", "gpt2-mid", "gpt2-mid-dropout", "gpt2-mid-gelu-new", "gpt2-mid-mlp-dropout",
          "gpt2-mid-nanogpt-mask", "llama-tiny", "llama-mid", "llama-mid-mha", "llama-mid-qkv-bias",
          "llama-mid-quick-gelu", "llama-mid-registered-mask", "llama-mid-rotary-cached",
          "llama-mid-rotary-per-layer"]
SEQ = 32
# Reference-trainer models (validation/models), each with the changes it is counted with, beside its
# twin: "dense" (its experts' keys dropped) or the same model with other changes. gpt-oss's twin has
# fewer experts: its loop is counted exactly, its router (Mixtral's rows) is not.
TWINS = [("mixtral-tiny", {"experts": 2}, "dense"), ("mixtral-tiny", {"experts": 4}, "dense"),
         ("mixtral-tiny", {"experts": 8}, "dense"), ("qwen2-moe-tiny", {}, "dense"),
         ("qwen2-moe-tiny-renorm", {}, "dense"), ("phimoe-tiny", {}, "dense"),
         ("gpt-oss-tiny", {"experts": 8}, {"experts": 2}), ("sinks-tiny", {}, {"attention_sinks": False})]
LATENT_MODELS = ["deepseek-v2-lite-tiny", "deepseek-v3-tiny", "deepseek-v32-tiny"]
MOE_KEYS = ["experts", "experts_per_token", "router", "input_jitter", "renormalize_topk", "shared_ffn",
            "shared_expert_gate", "router_bias", "stacked_experts", "expert_dispatch"]


class Counter(TorchDispatchMode):
    """Kernel-launching aten ops, by pass."""

    def __init__(self):
        super().__init__()
        self.ops = {"forward": collections.Counter(), "backward": collections.Counter()}
        self.current = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in LAUNCH_NOTHING:
            self.ops[self.current][name] += 1
        return func(*args, **(kwargs or {}))


def count(run, *inputs):
    """Kernels `run` launches on `inputs` (made to require grad), forward and backward."""
    inputs = [i.detach().requires_grad_(i.is_floating_point()) for i in inputs]
    counter = Counter()
    with counter:
        out = run(*inputs)
    grad = torch.ones_like(out)
    counter.current = "backward"
    with counter:
        out.backward(grad)
    return counter.ops


def repeat_kv(x, repeats, dim=None):
    """transformers' repeat_kv in place of replicate.py's repeat_interleave: expand, then reshape."""
    b, heads, s, d = x.shape
    return x[:, :, None].expand(b, heads, repeats, s, d).reshape(b, heads * repeats, s, d)


def layer_count(name):
    """One layer of model file `name`, eager attention, no recomputation: its kernels by pass."""
    path = os.path.join(HERE, "gpu", "models", name + ".json")
    spec = json.load(open(path))
    torch.manual_seed(0)
    model = replicate.Model(spec, "eager", "none").to(dtype=replicate.DTYPE)
    block = model.blocks[0]
    x = torch.randn(1, SEQ, spec["hidden"], dtype=replicate.DTYPE)
    mask = None if block.mask_buffer else torch.full((SEQ, SEQ), float("-inf"), dtype=x.dtype).triu(1)
    cos = sin = positions = None
    if spec.get("position", "rotary") == "rotary":
        if block.rotary_emb is None:
            cos, sin = model.rotary(SEQ, "cpu", replicate.DTYPE)
        else:
            positions = torch.arange(SEQ).unsqueeze(0)
    interleave = torch.Tensor.repeat_interleave
    torch.Tensor.repeat_interleave = repeat_kv
    try:
        ops = count(lambda y: block(y, mask, cos, sin, positions)[0], x)
    finally:
        torch.Tensor.repeat_interleave = interleave
    return ops, path


def memcalc_count(memcalc, path):
    out = subprocess.run([memcalc, "--model-file", path, "--seq", str(SEQ), "--activations", "architecture",
                          "--attention", "eager", "--platform", "cpu", "--format", "json"],
                         capture_output=True, text=True, check=True)
    kind = json.loads(out.stdout)["compute"]["layer_launches"][0]
    return (kind["matmul_forward"] + kind["other_forward"], kind["matmul_backward"] + kind["other_backward"])


def layers(memcalc):
    misses = 0
    print(f"{'model':28s} {'measured':>15s} {'memcalc':>15s}  (forward, backward)")
    for name in MODELS:
        ops, path = layer_count(name)
        measured = (sum(ops["forward"].values()), sum(ops["backward"].values()))
        predicted = memcalc_count(memcalc, path)
        same = measured == tuple(int(n) for n in predicted)
        misses += not same
        print(f"{name:28s} {measured[0]:7d} {measured[1]:7d} {int(predicted[0]):7d} {int(predicted[1]):7d}"
              f"  {'' if same else 'MISS ' + str(dict(ops['forward'])) + ' | ' + str(dict(ops['backward']))}")
    print(f"{len(MODELS) - misses} of {len(MODELS)} layers counted alike")
    return misses


def reference_layer_count(path):
    """One layer of reference_trainer.py's model for `path`, eager, no recomputation."""
    import reference_trainer  # noqa: E402  (imports torch's extras only when asked)
    spec = reference_trainer.load_spec(path)
    model = reference_trainer.build_model(spec).to(reference_trainer.DTYPE)
    ctx = model.make_ctx(1, SEQ, "cpu")
    x = torch.randn(1, SEQ, spec.hidden, dtype=reference_trainer.DTYPE)
    ops = count(lambda y: model.layers[0](y, ctx, False), x)
    return sum(ops["forward"].values()), sum(ops["backward"].values())


def reference_blocks(memcalc):
    """Each MoE block's kernels less its dense twin's, and each latent attention layer's, measured
    and memcalc's."""
    import tempfile
    misses = 0
    work = tempfile.mkdtemp()
    print(f"{'model':28s} {'experts':>7s} {'measured':>15s} {'memcalc':>15s}  (forward, backward)")
    for name in LATENT_MODELS:
        path = os.path.join(HERE, "models", name + ".json")
        measured = list(reference_layer_count(path))
        predicted = [int(n) for n in memcalc_count(memcalc, path)]
        misses += measured != predicted
        print(f"{name:28s} {'-':>7s} {measured[0]:7d} {measured[1]:7d} {predicted[0]:7d} {predicted[1]:7d}"
              f"  {'' if measured == predicted else 'MISS'}")
    for n, (name, changes, twin) in enumerate(TWINS):  # less the twin's
        spec = dict(json.load(open(os.path.join(HERE, "models", name + ".json"))), **changes)
        other = {k: v for k, v in spec.items() if k not in MOE_KEYS} if twin == "dense" else dict(spec, **twin)
        paths = []
        for tag, doc in (("model", spec), ("twin", other)):
            paths.append(os.path.join(work, f"{n}-{tag}.json"))
            json.dump(doc, open(paths[-1], "w"))
        measured = [a - b for a, b in zip(*(reference_layer_count(p) for p in paths))]
        predicted = [int(a - b) for a, b in zip(*(memcalc_count(memcalc, p) for p in paths))]
        misses += measured != predicted
        print(f"{name:28s} {spec.get('experts', 0):7d} {measured[0]:7d} {measured[1]:7d} {predicted[0]:7d} "
              f"{predicted[1]:7d}  less {twin if twin == 'dense' else json.dumps(twin)}"
              f"{'' if measured == predicted else ' MISS'}")
    total = len(LATENT_MODELS) + len(TWINS)
    print(f"{total - misses} of {total} blocks counted alike")
    return misses


def each_op():
    """The ops of include/memcalc/launches.hpp's table, each alone."""
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    heads = torch.randn(2, 4, 8, 16, dtype=torch.bfloat16)
    mask = torch.full((8, 8), float("-inf"), dtype=torch.bfloat16).triu(1)
    cos = torch.randn(8, 16, dtype=torch.bfloat16)
    block = replicate.Block({"hidden": 64, "heads": 4, "ffn": 128, "norm": "rmsnorm", "mlp": "gated",
                             "max_positions": 8}, "eager", "none")

    def core(q, k, v, fp32=False):
        weights = (q @ k.transpose(-1, -2)) / math.sqrt(16) + mask
        return F.softmax(weights, dim=-1, dtype=torch.float32 if fp32 else None).to(q.dtype) @ v

    rows = {"layer_norm": (torch.nn.LayerNorm(64).to(torch.bfloat16), x),
            "rmsnorm (its casts among them)": (replicate.RMSNorm(64).to(torch.bfloat16), x),
            "rotary (q or k)": (lambda q: block.rotate(q, cos, cos), heads),
            "repeat_kv (expand, reshape)": (lambda k: k[:, :, None].expand(2, 4, 2, 8, 16).reshape(2, 8, 8, 16),
                                            heads),
            "eager_core": (core, heads, heads, heads),
            "eager_core, softmax in fp32": (lambda q, k, v: core(q, k, v, True), heads, heads, heads),
            "merge_heads": (lambda o: o.transpose(1, 2).reshape(2, 8, -1), heads),
            "gated_product": (lambda g, u: g * u, x, x),
            "residual_add (no fork)": (lambda a, b: a + b, x, x),
            "dropout (CPU)": (lambda a: F.dropout(a, 0.1, True), x),
            "cross_entropy (fp32)": (lambda logits: F.cross_entropy(logits.float().view(-1, 64),
                                                                      torch.zeros(16, dtype=torch.long)), x)}
    for name, (run, *inputs) in rows.items():
        ops = count(run, *inputs)
        print(f"{name:32s} forward {sum(ops['forward'].values()):2d} backward {sum(ops['backward'].values()):2d}"
              f"  {dict(ops['forward'])} | {dict(ops['backward'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memcalc", default=os.path.join(ROOT, "build", "memcalc"))
    ap.add_argument("--ops", action="store_true", help="each op of memcalc's table alone, not the layers")
    ap.add_argument("--reference", action="store_true",
                    help="transformers' MoE and latent attention blocks (reference_trainer.py), not the layers")
    args = ap.parse_args()
    if args.ops:
        each_op()
        return 0
    if args.reference:
        return 1 if reference_blocks(args.memcalc) else 0
    return 1 if layers(args.memcalc) else 0


if __name__ == "__main__":
    sys.exit(main())
