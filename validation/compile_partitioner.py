"""What a compiled layer keeps for backward: torch 1.13's AOTAutograd min-cut partitioner
(functorch.compile.min_cut_rematerialization_partition, compiler="inductor": the partition
torch.compile's inductor backend asks for) beside eager autograd, one layer of each third-party
program in validation/third_party/, in bf16 on CPU. On PyTorch 2 torch.compile itself runs, with
inductor (validation/third_party/README.md: Debian trixie's torch 2.6 in a chroot).

A layer's saved bytes: the distinct storages its forward hands to backward (autograd's saved
tensors in eager; the forward graph's extra outputs when partitioned), parameters, buffers, the
tables the model passes every layer (llama2.c's rotary cos and sin) and 0-d scalars left out, the
layer's own input counted when kept. Beside each: memcalc's kept bytes of one layer
(activations.kept_layer_bytes) for the run's model file with --compile none and --compile layers.
Measuring needs python3-networkx (the partitioner imports it); --committed runs memcalc alone.

    /usr/bin/python3 validation/compile_partitioner.py --out validation/results/cpu-compile-saved.json \
        --memcalc build/memcalc
    /usr/bin/python3 validation/compile_partitioner.py --committed validation/results/cpu-compile-saved.json \
        --memcalc build/memcalc --check
"""
import argparse
import functools
import json
import os
import subprocess
import sys

import torch
import torch.nn as nn
from functorch.compile import aot_module, min_cut_rematerialization_partition

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "third_party"))
import run as third_party  # noqa: E402  the programs and sizes run.py trains

MIN_CUT = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
# PyTorch 2 runs torch.compile itself (its decompositions, inductor's partition); 1.13's
# torch.compile cannot, so there the partitioner runs through aot_module.
INDUCTOR = int(torch.__version__.split(".")[0]) >= 2


def memcalc_kept(memcalc, row, compile_mode):
    """memcalc's kept bytes of one layer for the row's program, eager or compiled."""
    command = [memcalc, "--model-file", os.path.join(ROOT, row["model_file"]),
               "--seq", str(row["seq"]), "-b", str(row["micro_batch"]), "--activations",
               "architecture", "--platform", "cpu", "--attention", row.get("attention", "eager"),
               "--recipe", "bf16-adam", "--torch-version", row["torch_release"],
               "--compile", compile_mode, "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["activations"]["kept_layer_bytes"]


def compare(rows, memcalc):
    """Each row's measured and predicted bytes; returns the largest relative miss and the number
    of layers memcalc puts under the measurement."""
    worst, under = 0.0, 0
    print(f"{'layer':24} {'eager':>12} {'memcalc':>12} {'compiled':>12} {'memcalc':>12} {'error':>8}")
    for row in rows:
        eager, compiled = memcalc_kept(memcalc, row, "none"), memcalc_kept(memcalc, row, "layers")
        errors = (eager / row["eager"] - 1, compiled / row["compiled"] - 1)
        worst = max(worst, *map(abs, errors))
        under += any(e < 0 for e in errors)
        print(f"{row['program'] + '-' + row['size']:24} {row['eager']:>12,} {eager:>12,} "
              f"{row['compiled']:>12,} {compiled:>12,} {errors[1]:>+8.3%}")
    return worst, under


class FirstOutput(nn.Module):
    """A layer called as its program calls it, returning only the hidden states."""

    def __init__(self, layer, extra):
        super().__init__()
        self.layer, self.extra = layer, extra

    def forward(self, x):
        out = self.layer(x, **self.extra)
        return out[0] if isinstance(out, tuple) else out


def layer_call(program, size, seq, batch, layer):
    """The layer's keyword arguments as its model passes them at (seq, batch)."""
    c = third_party.SIZES[size]
    if program == "llama2c":
        model = third_party.llama2c
        cos, sin = model.precompute_freqs_cis(c["n_embd"] // c["n_head"], seq)
        return {"freqs_cos": cos, "freqs_sin": sin}
    if program == "torch-layers":
        mask = nn.Transformer.generate_square_subsequent_mask(seq).to(torch.bfloat16)
        return {"src_mask": mask}
    if program == "hf-llama":  # LlamaModel's 4-d causal mask and position ids, no cache
        mask = torch.full((seq, seq), torch.finfo(torch.bfloat16).min).triu(1)
        return {"attention_mask": mask[None, None].expand(batch, 1, seq, seq).to(torch.bfloat16),
                "position_ids": torch.arange(seq)[None], "use_cache": False}
    if program == "hf-gpt2":
        return {"use_cache": False}
    return {}


def storages(tensors, left_out):
    sizes = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.storage().data_ptr() not in left_out:
            key = t.storage().data_ptr()
            sizes[key] = max(sizes.get(key, 0), t.storage().nbytes())
    return sum(sizes.values())


def held_elsewhere(module):
    """Storages the layer does not make: its weights, buffers and the tables passed to it."""
    tables = [t for t in module.extra.values() if isinstance(t, torch.Tensor)]
    held = list(module.parameters()) + list(module.buffers()) + tables
    return {t.storage().data_ptr() for t in held}


def eager_saved(module, x):
    got = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (got.append(t), t)[1], lambda t: t):
        y = module(x)
    saved = storages(got, held_elsewhere(module))
    y.float().sum().backward()
    return saved


def partitioned_saved(module, x):
    left_out, report = held_elsewhere(module), {}

    def forward_compiler(graph, _):
        def run(*args):
            outs = graph(*args)
            report["saved"] = storages(outs[1:], left_out)  # one user output: the hidden states
            return outs
        return run

    compiled = aot_module(module, fw_compiler=forward_compiler, bw_compiler=lambda g, _: g,
                          partition_fn=MIN_CUT)
    compiled(x).float().sum().backward()
    return report["saved"]


def inductor_saved(module, x):
    """torch.compile(module) on PyTorch 2 with inductor: its forward graph's extra outputs, as
    inductor's own decompositions and partition leave them (the first output is the hidden
    states)."""
    from inductor_capture import compile_watching_forward
    left_out, report = held_elsewhere(module), {}

    def saved(outs):
        report["saved"] = storages(outs[1:], left_out)

    compile_watching_forward(module, saved)(x).float().sum().backward()
    return report["saved"]


def measure(program, size, seq, batch):
    torch.manual_seed(0)
    _, blocks, _ = third_party.build(program, size)
    layer = blocks[0].to(torch.bfloat16).train()
    module = FirstOutput(layer, layer_call(program, size, seq, batch, layer))
    h = third_party.SIZES[size]["n_embd"]
    x = torch.randn(batch, seq, h, dtype=torch.bfloat16, requires_grad=True)
    return {"program": program, "size": size, "seq": seq, "micro_batch": batch,
            "model_file": f"validation/third_party/models/{program}-{size}.json",
            "torch": torch.__version__, "torch_release": third_party.TORCH_RELEASE,
            # PyTorch 2's F.scaled_dot_product_attention, which nanoGPT, llama2.c and
            # MultiheadAttention (need_weights=False) call where it exists: a fused kernel's rows.
            "attention": "flash" if INDUCTOR else "eager",
            "eager": eager_saved(module, x),
            "compiled": (inductor_saved if INDUCTOR else partitioned_saved)(module, x)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--programs", help="comma-separated (default: every third-party program)")
    ap.add_argument("--committed", help="compare this file's rows with memcalc, measuring nothing")
    ap.add_argument("--memcalc", help="memcalc's program, to set its figures beside")
    ap.add_argument("--check", action="store_true", help="exit 1 when memcalc misses a row")
    ap.add_argument("--tolerance", type=float, default=0.0, help="relative (default exact)")
    args = ap.parse_args()
    if args.committed:
        with open(args.committed) as f:
            rows = json.load(f)["rows"]
    else:
        rows = []
        for program in (args.programs or ",".join(third_party.PROGRAMS)).split(","):
            for size, shapes in third_party.SHAPES.items():
                for seq, batch in shapes:
                    rows.append(measure(program, size, seq, batch))
        if args.out:
            with open(args.out, "w") as f:
                partitioner = ("torch.compile(backend='inductor'): its decompositions and partition"
                               if INDUCTOR else
                               "min_cut_rematerialization_partition(compiler='inductor')")
                json.dump({"partitioner": partitioner, "rows": rows}, f, indent=1)
    if not args.memcalc:
        for row in rows:
            print(f"{row['program']}-{row['size']}: eager {row['eager']:,} B, "
                  f"compiled {row['compiled']:,} B")
        return 0
    worst, under = compare(rows, args.memcalc)
    print(f"largest miss {worst:.3%} over {len(rows)} layers; {under} under")
    return 1 if args.check and (worst > args.tolerance or under) else 0


if __name__ == "__main__":
    sys.exit(main())
