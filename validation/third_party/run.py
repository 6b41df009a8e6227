#!/usr/bin/env python3
"""Whole-step peaks of training code nobody here wrote, on CPU: nanoGPT's model.py (vendored unchanged,
nanogpt/), llama2.c's model.py (vendored unchanged, llama2c/) and a GPT of torch's own
nn.TransformerEncoderLayer (torch_layers.py).

Each run trains one step at a time of one program at one size, in pure bf16 (the model cast to bf16,
torch.optim.AdamW on it: memcalc's bf16-adam) or under CPU autocast (an fp32 model whose forward and
loss run inside torch.autocast("cpu", dtype=torch.bfloat16), AdamW on the fp32 weights: amp-adam),
with no recomputation or with every block checkpointed (torch.utils.checkpoint, non-reentrant). After
a warm-up step (the optimiser state exists from there on) it measures one step with
validation/gpu/replicate.py's Meter: the profiler's record of every CPU allocation replayed in order,
and its maximum within each step of memcalc's timeline (forward 1..L, loss, backward L..1,
optimizer). The loop is nanoGPT's train.py: logits, loss = model(X, Y); loss.backward();
optimizer.step(); optimizer.zero_grad(set_to_none=True). llama2.c's train.py calls its model as
logits = model(X, Y); loss = raw_model.last_loss (the logits held through backward the same way).

Rows are replicate.py's (so that validation/gpu/compare.py reads them), with the program, size,
batch and precision beside:

  /usr/bin/python3 validation/third_party/run.py --out validation/results/cpu-third-party.json
  /usr/bin/python3 validation/gpu/compare.py validation/results/cpu-third-party.json \
      --memcalc build/memcalc --markdown
"""
import argparse
import contextlib
import importlib.util
import io
import itertools
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "gpu"))
sys.path.insert(0, os.path.join(HERE, "nanogpt"))
sys.path.insert(0, HERE)
from replicate import Meter, cpu_name  # noqa: E402  the CPU measurement validation/gpu/ uses
from model import GPT, GPTConfig  # noqa: E402  nanoGPT's model.py, unchanged
from torch_layers import TorchLayersGPT  # noqa: E402
sys.path.insert(0, os.path.dirname(HERE))
from reference_trainer import LoraLinear  # noqa: E402  peft's lora.Linear, as replicate.py wraps


def _load(name, path):
    """A module from a file, under a name of its own (llama2.c's model.py beside nanoGPT's)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # importable by name, as torch.compile's tracing imports it
    spec.loader.exec_module(module)
    return module


llama2c = _load("llama2c_model", os.path.join(HERE, "llama2c", "model.py"))  # llama2.c's, unchanged
LLAMA2C_COMMIT = "350e04fe35433e6d2941dce5a1f53308f87058eb"
LLAMA2C_MULTIPLE_OF = 32  # llama2.c's train.py: multiple_of = 32

# HuggingFace transformers' LLaMA and GPT-2 (modeling_llama.py, modeling_gpt2.py and the small
# files they import, unchanged, with shims for transformers' plumbing: transformers/README.md).
# Imported when asked for: the vendored files are not in the repository (transformers/README.md
# says how to lay them down).
TRANSFORMERS_COMMIT = "0864dd3beb238b7bec3528a3d1d6c17a28f51a51"
TRANSFORMERS_SRC = os.path.join(HERE, "transformers", "src")
HF_PROGRAMS = ("hf-llama", "hf-gpt2")


def _transformers():
    """The vendored modelling code: (LlamaConfig, LlamaForCausalLM, GPT2Config, GPT2LMHeadModel)."""
    missing = [f for f in ("models/llama/modeling_llama.py", "models/gpt2/modeling_gpt2.py")
               if not os.path.exists(os.path.join(TRANSFORMERS_SRC, "transformers", f))]
    if missing:
        sys.exit(f"run.py: {', '.join(missing)} missing under {TRANSFORMERS_SRC}/transformers: "
                 "see validation/third_party/transformers/README.md")
    if TRANSFORMERS_SRC not in sys.path:
        sys.path.insert(0, TRANSFORMERS_SRC)
    from transformers.models.gpt2.configuration_gpt2 import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2LMHeadModel
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM
    return LlamaConfig, LlamaForCausalLM, GPT2Config, GPT2LMHeadModel


def llama2c_ffn(dim, multiple_of=LLAMA2C_MULTIPLE_OF):
    """llama2.c's hidden_dim rule (model.py:170-173): 2/3 of 4 dim, up to a multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)

# Sizes: nanoGPT's shakespeare_char model (config/train_shakespeare_char.py: 6 x 384, 6 heads,
# block 256, vocab 65, dropout 0 here), the same with GPT-2's padded vocabulary, and a narrower,
# longer one whose block (1024) is twice the sequence it trains.
SIZES = {
    "char": {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab": 65, "block_size": 256},
    "gpt2vocab": {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab": 50304, "block_size": 512},
    "long": {"n_layer": 4, "n_head": 4, "n_embd": 256, "vocab": 8192, "block_size": 1024},
}
# llama2c's grouped k/v heads per size (n_kv_heads; the other programs have one per query head).
KV_HEADS = {"char": 2, "gpt2vocab": 2, "long": 2}
PROGRAMS = ("nanogpt", "torch-layers", "llama2c") + HF_PROGRAMS
# The programs whose rows record the running PyTorch release for memcalc's --torch-version (what
# autograd keeps changes with it: llama2.c's RMSNorm).
VERSIONED = ("llama2c",) + HF_PROGRAMS
TORCH_RELEASE = ".".join(torch.__version__.split("+")[0].split(".")[:2])
# (sequence, micro-batch) per size
SHAPES = {"char": [(256, 2)], "gpt2vocab": [(512, 1)], "long": [(512, 2)]}
PRECISIONS = {"bf16": "bf16-adam", "autocast": "amp-adam"}


def build(program, size):
    """The model, its blocks (a ModuleList the forward iterates) and its final norm."""
    c = SIZES[size]
    if program == "nanogpt":
        config = GPTConfig(block_size=c["block_size"], vocab_size=c["vocab"], n_layer=c["n_layer"],
                           n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0, bias=True)
        with contextlib.redirect_stdout(io.StringIO()):  # its parameter count and slow-attention warning
            model = GPT(config)
        return model, model.transformer.h, model.transformer.ln_f
    if program == "llama2c":
        args = llama2c.ModelArgs(dim=c["n_embd"], n_layers=c["n_layer"], n_heads=c["n_head"],
                                 n_kv_heads=KV_HEADS[size], vocab_size=c["vocab"],
                                 multiple_of=LLAMA2C_MULTIPLE_OF, max_seq_len=c["block_size"],
                                 dropout=0.0)
        with contextlib.redirect_stdout(io.StringIO()):  # its slow-attention warning per layer
            model = llama2c.Transformer(args)
        return model, model.layers, model.norm
    if program == "hf-llama":  # transformers' defaults otherwise: untied head, use_cache True
        LlamaConfig, LlamaForCausalLM, _, _ = _transformers()
        config = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["n_embd"],
                             intermediate_size=llama2c_ffn(c["n_embd"]),
                             num_hidden_layers=c["n_layer"], num_attention_heads=c["n_head"],
                             num_key_value_heads=KV_HEADS[size],
                             max_position_embeddings=c["block_size"], attention_dropout=0.0)
        model = LlamaForCausalLM(config)
        return model, model.model.layers, model.model.norm
    if program == "hf-gpt2":  # transformers' defaults otherwise: gelu_new, tied, use_cache True
        _, _, GPT2Config, GPT2LMHeadModel = _transformers()
        config = GPT2Config(vocab_size=c["vocab"], n_positions=c["block_size"],
                            n_embd=c["n_embd"], n_layer=c["n_layer"], n_head=c["n_head"],
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(config)
        return model, model.transformer.h, model.transformer.ln_f
    model = TorchLayersGPT(c["vocab"], c["block_size"], c["n_layer"], c["n_head"], c["n_embd"])
    return model, model.h, model.ln_f


class Checkpointed(nn.Module):
    """A block whose forward is checkpointed (full recomputation): only its input is kept."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def optimizer_for(program, model, device):
    """nanoGPT's own configure_optimizers (two AdamW groups, weight decay on the matrices; fused only
    on CUDA), or torch's AdamW over every parameter. torch 1.13's default on CPU is the for-loop step."""
    if program in ("nanogpt", "llama2c"):  # llama2.c's is nanoGPT's, as train.py calls it
        with contextlib.redirect_stdout(io.StringIO()):
            return model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device)
    return torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)


def attention_path(program):
    """nanoGPT and llama2.c take F.scaled_dot_product_attention where torch has it (torch 2.0 on)."""
    flash = program in ("nanogpt", "llama2c") and hasattr(F, "scaled_dot_product_attention")
    return "sdpa" if flash else "eager"


def optimizer_impl(program, device):
    """torch 1.13 on CPU steps one tensor at a time; on CUDA nanoGPT asks for fused AdamW, and torch
    2.x's AdamW defaults to foreach there."""
    if device == "cpu":
        return "for-loop"
    return "fused" if program in ("nanogpt", "llama2c") else "foreach"


# What peft targets by default in each program --lora runs (its
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: gpt2's c_attn, llama's q_proj and v_proj,
# which are llama2.c's wq and wv): the attribute path of each adapted linear in a block, and the
# linear's name in memcalc's --lora-targets.
LORA_TARGETS = {"nanogpt": ((("attn", "c_attn"), "c_attn"),),
                "llama2c": ((("attention", "wq"), "q_proj"), (("attention", "wv"), "v_proj")),
                "hf-llama": ((("self_attn", "q_proj"), "q_proj"), (("self_attn", "v_proj"), "v_proj"))}


def lora_targets(program):
    """memcalc's --lora-targets for the linears LORA_TARGETS adapts."""
    return ",".join(name for _, name in LORA_TARGETS[program])


def adapt(program, model, blocks, rank, p):
    """peft's LoRA as its users run it: every base parameter frozen, each block's targeted linears
    wrapped in reference_trainer's LoraLinear (peft's lora.Linear). nanoGPT's c_attn is fused: one
    adapter whose B is r x 3h for q, k and v."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for block in blocks:
        for (*parents, name), _ in LORA_TARGETS[program]:
            owner = block
            for parent in parents:
                owner = getattr(owner, parent)
            setattr(owner, name, LoraLinear(getattr(owner, name), rank, p))


def run(program, size, seq, batch, precision, recompute, steps=1, device="cpu", lora=(0, 0.0)):
    torch.manual_seed(0)
    model, blocks, final_norm = build(program, size)
    if lora[0]:
        adapt(program, model, blocks, *lora)
    model = model.to(device=device, dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    model.train()
    hf = program in HF_PROGRAMS
    if recompute == "full" and hf:
        # transformers' own path: every decoder layer through self._gradient_checkpointing_func,
        # functools.partial(torch.utils.checkpoint.checkpoint) with no keywords: torch 1.13's
        # default, the reentrant checkpoint. It also turns use_cache off
        # (modeling_llama.py:896-901, modeling_gpt2.py:849-854).
        model.gradient_checkpointing_enable()
    elif recompute == "full":
        for i in range(len(blocks)):
            blocks[i] = Checkpointed(blocks[i])
    optimizer = optimizer_for(program, model, device)
    ids = torch.randint(0, SIZES[size]["vocab"], (batch, seq), device=device)
    meter = None

    # memcalc's timeline, marked from outside the programs: a block's forward step starts at its
    # forward pre-hook, the loss step at the final norm's, a block's backward step when the gradient
    # of its output arrives. Hooks on the checkpointing wrapper, so that recomputation marks nothing.
    def forward_mark(i):
        return lambda module, args: meter.mark(f"forward {i}") if meter and i > 1 else None

    def backward_mark(i):
        def hook(module, args, out):
            if meter and out.requires_grad:
                out.register_hook(lambda grad: meter.mark(f"backward {i}"))
        return hook

    # transformers' layers return tuples, and its reentrant checkpoint runs a layer's forward again
    # (its hooks too) inside backward, where the layer's own output is not the graph's. So for them
    # the gradient of layer i's output is caught on the next module's input (layer i+1's, or the
    # final norm's), hooked in the forward only; `backward_phase` keeps recomputation from marking.
    backward_phase = False

    def hf_mark(name, i_before):
        def hook(module, args):
            if not meter or backward_phase:
                return
            if name:
                meter.mark(name)
            if i_before and args[0].requires_grad:
                args[0].register_hook(lambda grad: meter.mark(f"backward {i_before}"))
        return hook

    if hf:
        for i, block in enumerate(blocks, start=1):
            block.register_forward_pre_hook(hf_mark(f"forward {i}" if i > 1 else None, i - 1))
        final_norm.register_forward_pre_hook(hf_mark("loss", len(blocks)))
    else:
        for i, block in enumerate(blocks, start=1):
            block.register_forward_pre_hook(forward_mark(i))
            block.register_forward_hook(backward_mark(i))
        final_norm.register_forward_pre_hook(
            lambda module, args: meter.mark("loss") if meter else None)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "autocast")

    def step(m=None):
        nonlocal meter, backward_phase
        meter = m
        backward_phase = False
        if meter:
            meter.mark("forward 1")
        if hf:  # a transformers user's loop: outputs (logits, past_key_values) held to the end
            with autocast:
                outputs = model(input_ids=ids, labels=ids)
            backward_phase = True
            outputs.loss.backward()
            if meter:
                meter.mark("optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del outputs
            return
        with autocast:
            if program == "llama2c":  # its train.py: logits = model(X, Y); loss = raw_model.last_loss
                logits = model(ids, ids)
                loss = model.last_loss
            else:
                logits, loss = model(ids, ids)  # train.py: logits, loss = model(X, Y), both held
        loss.backward()
        if meter:
            meter.mark("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss

    step()  # warm-up
    with Meter(device) as m:
        step(m)
    peak, peak_step = m.peak()
    meter, times = None, []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    name = f"{program}-{size}"
    return {"program": program, "size": size, "batch": batch, "precision": precision,
            "model": f"{name} {precision}", "model_file": f"validation/third_party/models/{name}.json",
            "seq": seq, "micro_batch": batch, "microbatches": 1, "grad_buffer": "lazy", "recompute": recompute,
            "attention": attention_path(program), "optimizer_impl": optimizer_impl(program, device),
            "optimizer_state": "lazy", "recipe": PRECISIONS[precision],
            # LlamaForCausalLM: logits.float() before the loss (modeling_llama.py:1056); the others'
            # cross_entropy takes the logits as they are
            "loss": "fp32" if program == "hf-llama" else "bf16", "logits": "held",
            # transformers' use_cache (True by default) returns every layer's k and v, unless
            # gradient checkpointing turned it off
            "kv_cache": "kept" if hf and recompute == "none" else "off",
            # gradient_checkpointing_enable() calls torch 1.13's default, the reentrant checkpoint;
            # run.py's own Checkpointed the non-reentrant one
            **({"checkpoint": "reentrant"} if hf and recompute == "full" else {}),
            "memory_before_step": m.before, "max_memory_allocated": peak,
            "peak_step": peak_step, "timeline": m.steps, "median_step_seconds": statistics.median(times),
            "steps_timed": steps,
            **({"torch_version": TORCH_RELEASE} if program in VERSIONED else {}),
            # the adapters in the model's dtype: bf16 beside a bf16 model, fp32 under autocast
            **({"train": "lora", "lora_rank": lora[0], "lora_targets": lora_targets(program),
                "lora_dropout": lora[1], "lora_dtype": "bf16" if precision == "bf16" else "fp32"}
               if lora[0] else {})}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="where to write the rows (JSON)")
    ap.add_argument("--programs", nargs="+", choices=PROGRAMS,
                    default=["nanogpt", "torch-layers"],  # cpu-third-party.json's; llama2c: its own file
                    help="programs to run (default: nanogpt torch-layers)")
    ap.add_argument("--sizes", nargs="+", choices=tuple(SIZES), default=list(SIZES))
    ap.add_argument("--precisions", nargs="+", choices=tuple(PRECISIONS), default=list(PRECISIONS))
    ap.add_argument("--recompute", nargs="+", choices=("none", "full"), default=["none", "full"])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where to train (default cpu; cuda: the programs' GPU paths, flash attention among them)")
    ap.add_argument("--steps", type=int, default=1, help="timed steps per run, after the measured one")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK",
                    help="LoRA of this rank where peft puts it by default (nanoGPT's fused c_attn, "
                         "LLaMA's q_proj and v_proj: llama2.c's wq and wv), the base frozen")
    ap.add_argument("--lora-dropout", type=float, default=0.05, help="the adapters' dropout (with --lora)")
    a = ap.parse_args(argv)
    if a.lora and not set(a.programs) <= set(LORA_TARGETS):
        ap.error("--lora adapts " + " and ".join(LORA_TARGETS) + " only: give --programs among them")
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    name = torch.cuda.get_device_name() if a.device == "cuda" else cpu_name()
    result = {"date": time.strftime("%Y-%m-%d"), "device": a.device, "device_name": name,
              "torch": torch.__version__, "nanogpt_commit": "3adf61e154c3fe3fca428ad6bc3818b27a3b8291",
              "llama2c_commit": LLAMA2C_COMMIT,
              **({"transformers_commit": TRANSFORMERS_COMMIT}
                 if set(a.programs) & set(HF_PROGRAMS) else {}),
              "runs": [], "skipped": []}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    for program, size, precision, recompute in itertools.product(a.programs, a.sizes, a.precisions, a.recompute):
        for seq, batch in SHAPES[size]:
            r = run(program, size, seq, batch, precision, recompute, a.steps, a.device,
                    (a.lora, a.lora_dropout))
            result["runs"].append(r)
            with open(a.out + ".part", "w") as f:  # after every run: a run cut short keeps the rest
                json.dump(result, f, indent=2)
            os.replace(a.out + ".part", a.out)
            print(f"{program:<13} {size:<10} s={seq:<5} b={batch} {precision:<9} {recompute:<5} peak "
                  f"{r['max_memory_allocated']:>13,} B at {r['peak_step']:<12} "
                  f"({r['median_step_seconds']:.2f} s/step)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
