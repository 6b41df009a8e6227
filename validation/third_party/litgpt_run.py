#!/usr/bin/env python3
"""Whole-step peaks of lit-gpt's LoRA fine-tuning (Lightning-AI/lit-gpt @8641822, the commit LitGPT's
published resource tables name), on CPU beside memcalc.

lit-gpt's model files (lit_gpt/model.py, lora.py, config.py, rmsnorm.py, utils.py) run unchanged
from litgpt/ (litgpt/README.md: not in this repository, how to lay them down), with shims for the
packages they import and this machine lacks (litgpt/shims/). The loop is finetune/lora.py's at that
commit, as LitGPT's table ran it (--precision bf16-true, one device): the model in bf16, only the
LoRA weights trained (mark_only_lora_as_trainable), torch.optim.AdamW on them, the rope cache
rebuilt for the longest sample (model.max_seq_length = longest, outside any dtype context: fp32),
then each iteration (`model` Fabric's wrapper, which hands the output back in fp32)

    logits = model(input_ids, lm_head_chunk_size=128)      # a list of fp32 chunks, held to the end
    logits[-1] = logits[-1][..., :-1, :]
    loss = chunked_cross_entropy(logits, targets[..., 1:])
    fabric.backward(loss / gradient_accumulation_iters)
    optimizer.step(); optimizer.zero_grad()                  # torch 2.1: set_to_none=True

torch 1.13 has no F.scaled_dot_product_attention, which model.py calls (is_causal, no mask): it is
given FLASH_STAND_IN, which keeps for backward what torch 2.1's flash kernel keeps
(derivatives.yaml's _scaled_dot_product_flash_attention: query, key and value as passed, the output
and the fp32 log-sum-exp), makes its output in q's layout as FlashAttention-2's mha_fwd does
(empty_like(q)), and allocates in backward what torch's _flash_attention_backward and
FlashAttention-2's backward do (the output copied batch-first, an fp32 dq accumulator, a row sum per
query, dq, dk, dv); it computes by blocks of query rows, so it never makes an s x s tensor. A call
with a boolean mask (the adapters' prompt attention) is given MEM_EFFICIENT_STAND_IN, torch 2.1's
memory-efficient kernel as it holds memory. What lit-gpt's own code keeps around the kernels is
what is measured.

--method adapter / adapter_v2 trains lit-gpt's LLaMA-Adapter (lit_gpt/adapter.py, adapter_v2.py)
instead, as finetune/adapter.py runs it: a sanity-check validation under no_grad first, which caches
each layer's prompt keys and values (adapter_kv_cache) without a graph, reused by every step.

    /usr/bin/python3 validation/third_party/litgpt_run.py --out validation/results/cpu-third-party-litgpt.json
    /usr/bin/python3 validation/gpu/compare.py validation/results/cpu-third-party-litgpt.json \\
        --memcalc build/memcalc --markdown
"""
import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
LITGPT = os.path.join(HERE, "litgpt")
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "gpu"))
from replicate import Meter, cpu_name  # noqa: E402  the CPU measurement validation/gpu/ uses

LITGPT_COMMIT = "8641822b3249bb94f068c254aa5d13decbc9f0a0"
FILES = ("model.py", "lora.py", "config.py", "rmsnorm.py", "utils.py", "adapter.py", "adapter_v2.py")
TORCH_RELEASE = ".".join(torch.__version__.split("+")[0].split(".")[:2])
QUERY_BLOCK = 16  # the stand-in's query rows per block (of one head)
LM_HEAD_CHUNK = 128  # finetune/lora.py: model(input_ids, lm_head_chunk_size=128)
BITSANDBYTES = "0.41.1"  # the release LitGPT's resource tables ran, whose MatMul4Bit the stand-in is


class FlashStandIn(torch.autograd.Function):
    """Causal attention keeping what torch 2.1's _scaled_dot_product_flash_attention keeps."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        b, heads, s, d = q.shape
        out = torch.empty_like(q)  # q's layout, as FlashAttention-2's mha_fwd makes it
        lse = torch.empty(b, heads, s, dtype=torch.float32)
        for n, h, rows in _blocks(q):
            probs, lse[n, h, rows] = _block_probs(q[n, h], k[n, h], scale, rows, None)
            out[n, h, rows] = (probs @ v[n, h, : rows.stop].float()).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        b, heads, s, d = q.shape
        # torch's _flash_attention_backward hands the kernel out.contiguous() batch-first
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
        # FlashAttention-2's backward: an fp32 dq accumulator, a row sum per query, dq, dk, dv
        dq_accum = torch.zeros(b, s, heads, d, dtype=torch.float32).transpose(1, 2)
        row_sums = torch.empty(b, heads, s, dtype=torch.float32)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for n, h, rows in _blocks(q):
            g = grad_out[n, h, rows].float()
            row_sums[n, h, rows] = (g * out[n, h, rows].float()).sum(-1)
            probs, _ = _block_probs(q[n, h], k[n, h], ctx.scale, rows, lse[n, h, rows])
            dv[n, h, : rows.stop] += (probs.t() @ g).to(v.dtype)
            dscores = probs * (g @ v[n, h, : rows.stop].float().t() - row_sums[n, h, rows, None])
            dscores *= ctx.scale
            dq_accum[n, h, rows] = dscores @ k[n, h, : rows.stop].float()
            dk[n, h, : rows.stop] += (dscores.t() @ q[n, h, rows].float()).to(k.dtype)
        dq = dq_accum.to(q.dtype)
        return dq, dk, dv, None


def _blocks(q):
    """(batch, head, query rows) blocks: one head's few rows at a time, so that what the stand-in
    makes for itself stays far below a layer's tensors."""
    b, heads, s, _ = q.shape
    for n, h, start in itertools.product(range(b), range(heads), range(0, s, QUERY_BLOCK)):
        yield n, h, slice(start, min(start + QUERY_BLOCK, s))


def _block_probs(q, k, scale, rows, lse):
    """One head's softmax for a block of query rows over the keys they see (causal), fp32, and its
    log-sum-exp; with `lse` given (the block's), the probabilities rebuilt from it."""
    keys = k[: rows.stop].float()
    scores = (q[rows].float() @ keys.t()) * scale
    scores.masked_fill_(torch.arange(rows.stop)[None, :] > torch.arange(rows.start, rows.stop)[:, None],
                        float("-inf"))
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)
        return torch.exp(scores - lse[:, None]), lse
    return torch.exp(scores - lse[:, None]), None


class MemEfficientStandIn(torch.autograd.Function):
    """Attention over a bias, keeping what torch 2.1's _scaled_dot_product_efficient_attention keeps
    (query, key and value as passed, the bias, the output written batch-first, a log-sum-exp per
    query row padded to 32 rows, fp32) and allocating in backward dq, dk, dv and a row sum per query."""

    @staticmethod
    def forward(ctx, q, k, v, bias, scale):
        b, heads, s, d = q.shape
        out = q.new_empty(b, s, heads, d).transpose(1, 2)  # at::empty({B, M, num_heads, Kv})
        lse = torch.empty(b, heads, -(-s // 32) * 32, dtype=torch.float32)
        for n, h, rows in _blocks(q):
            kn = min(n, k.shape[0] - 1)  # the prompt's k and v: one batch row, broadcast
            scores = (q[n, h, rows].float() @ k[kn, h].float().t()) * scale + bias[rows].float()
            lse[n, h, rows] = torch.logsumexp(scores, dim=-1)
            out[n, h, rows] = (torch.softmax(scores, dim=-1) @ v[kn, h].float()).to(q.dtype)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, out, lse = ctx.saved_tensors
        b, heads, s, d = q.shape
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = torch.empty(b, heads, s, dtype=torch.float32)
        for n, h, rows in _blocks(q):
            kn = min(n, k.shape[0] - 1)
            g = grad_out[n, h, rows].float()
            delta[n, h, rows] = (g * out[n, h, rows].float()).sum(-1)
            scores = (q[n, h, rows].float() @ k[kn, h].float().t()) * ctx.scale + bias[rows].float()
            probs = torch.exp(scores - lse[n, h, rows, None])
            dv[kn, h] += (probs.t() @ g).to(v.dtype)
            dscores = probs * (g @ v[kn, h].float().t() - delta[n, h, rows, None]) * ctx.scale
            dq[n, h, rows] = (dscores @ k[kn, h].float()).to(q.dtype)
            dk[kn, h] += (dscores.t() @ q[n, h, rows].float()).to(k.dtype)
        return dq, dk, dv, None, None


def flash_stand_in(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """F.scaled_dot_product_attention as lit-gpt calls it in training: causal without a mask (the
    flash kernel), or a boolean mask (the adapters' prompt: the memory-efficient kernel), no dropout."""
    scale = scale or query.shape[-1] ** -0.5
    if attn_mask is None and is_causal and not dropout_p:
        return FlashStandIn.apply(query, key, value, scale)
    if attn_mask is None or attn_mask.dtype != torch.bool or is_causal or dropout_p:
        raise NotImplementedError("the stand-ins run causal attention or a boolean mask, no dropout")
    # torch 2.1: the mask made an additive bias in q's dtype, its last dim padded to 16 (pad_bias)
    rows, keys = attn_mask.shape[-2:]
    padded = torch.zeros(rows, -(-keys // 16) * 16, dtype=query.dtype)
    padded[:, :keys].masked_fill_(~attn_mask, float("-inf"))
    return MemEfficientStandIn.apply(query, key, value, padded[:, :keys], scale)


@functools.lru_cache(maxsize=None)
def load_litgpt():
    """lit-gpt's modules from litgpt/lit_gpt (its package __init__ not run: it imports the tokenizer
    and insists on lightning 2.1), the shims on the path."""
    missing = [f for f in FILES if not os.path.exists(os.path.join(LITGPT, "lit_gpt", f))]
    if missing:
        sys.exit(f"litgpt_run.py: {', '.join(missing)} missing under {LITGPT}/lit_gpt: "
                 "see validation/third_party/litgpt/README.md")
    sys.path.insert(0, os.path.join(LITGPT, "shims"))
    package = types.ModuleType("lit_gpt")
    package.__path__ = [os.path.join(LITGPT, "lit_gpt")]
    sys.modules["lit_gpt"] = package
    # utils.py imports torch.utils._device (torch 2.0's) and never uses it: an empty stand-in
    sys.modules.setdefault("torch.utils._device", types.ModuleType("torch.utils._device"))
    if not hasattr(F, "scaled_dot_product_attention"):  # torch < 2.0
        F.scaled_dot_product_attention = flash_stand_in
    import lit_gpt.model  # first, as the package __init__ does: model.py and config.py import each other
    import lit_gpt.adapter
    import lit_gpt.adapter_v2
    import lit_gpt.lora
    import lit_gpt.utils
    return lit_gpt.lora, lit_gpt.utils, {"adapter": lit_gpt.adapter, "adapter_v2": lit_gpt.adapter_v2}


# Sizes: each published model's kind at a CPU's scale (lit_gpt/config.py's keys). llama: Llama 2's
# (RMSNorm, LLaMAMLP, full rotary, sequential residual, no biases); neox: StableLM Alpha's
# (LayerNorm, GELU MLP, a quarter of each head rotated, parallel residual, biases); phi: phi-1.5's
# (neox's with one norm shared by both branches, half of each head rotated, tanh GELU, a head bias).
SIZES = {
    "llama": dict(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, padding_multiple=64,
                  block_size=512, rotary_percentage=1.0, parallel_residual=False, bias=False,
                  _norm_class="RMSNorm", _mlp_class="LLaMAMLP", intermediate_size=688),
    "neox": dict(n_layer=4, n_embd=256, n_head=8, vocab_size=1000, padding_multiple=512,
                 block_size=512),
    "phi": dict(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, padding_multiple=512,
                block_size=512, rotary_percentage=0.5, shared_attention_norm=True,
                lm_head_bias=True, gelu_approximate="tanh"),
}
# finetune/lora.py's LoRA: rank 8, alpha 16, dropout 0.05, on the query and value parts of the
# fused qkv linear
LORA = dict(r=8, alpha=16, dropout=0.05, to_query=True, to_key=False, to_value=True,
            to_projection=False, to_mlp=False, to_head=False)
# finetune/adapter.py's (and adapter_v2.py's) Config defaults
ADAPTER = dict(adapter_prompt_length=10, adapter_start_layer=2)
SHAPES = [(300, 1), (300, 2)]  # (longest sample, micro-batch): three head chunks, the last short


class MatMul4BitStandIn(torch.autograd.Function):
    """bitsandbytes 0.41.1's MatMul4Bit (autograd/_functions.py) as it holds memory: forward
    dequantises the weight to the dtype it was quantised from (fp16: Lightning's _quantize_weight),
    casts that to the input's dtype in the same expression, so the fp16 copy goes before the product,
    and keeps its input and the packed weight in ctx.tensors whenever either needs a gradient;
    backward dequantises again for the input's gradient."""

    @staticmethod
    def forward(ctx, A, B, bias, layer):
        output = F.linear(A, layer.dequantize().to(A.dtype), bias)
        ctx.layer = layer
        ctx.tensors = (A, B) if any(ctx.needs_input_grad[:2]) else (None, None)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        grad_A = None
        if ctx.needs_input_grad[0]:
            grad_A = torch.matmul(grad_output, ctx.layer.dequantize().to(grad_output.dtype))
        return grad_A, None, None, None


DYNAMIC_MAP = {}  # bitsandbytes' name2qmap["dynamic"]: one 256-entry fp32 code for every tensor


class Linear4bitStandIn(torch.nn.Module):
    """An nn.Linear as Lightning's BitsandbytesPrecision leaves it (lightning@71aed751 _NF4Linear,
    _NF4DQLinear over bitsandbytes 0.41.1's Linear4bit): the weight's storage as quantize_4bit makes
    it (two values a byte; an fp32 absmax per 64, or with double quantisation a byte per 64, an fp32
    offset and an fp32 absmax per 256 of those), a 16-entry fp32 code, the bias as it was."""

    def __init__(self, linear, double_quant):
        super().__init__()
        out_features, in_features = linear.weight.shape
        n = out_features * in_features
        blocks = -(-n // 64)
        self.shape = (out_features, in_features)
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", torch.zeros((n + 1) // 2, 1, dtype=torch.uint8))
        self.register_buffer("code", torch.zeros(16))
        self.double_quant = double_quant
        if double_quant:
            DYNAMIC_MAP.setdefault("dynamic", torch.zeros(256))
            self.register_buffer("absmax", torch.zeros(blocks, dtype=torch.uint8))
            self.register_buffer("offset", torch.zeros(()))
            self.register_buffer("absmax2", torch.zeros(-(-blocks // 256)))
        else:
            self.register_buffer("absmax", torch.zeros(blocks))
        self.bias = linear.bias

    def dequantize(self):
        """F.dequantize_4bit's output, fp16; with double quantisation its fp32 absmax made first."""
        absmax = self.absmax.float() + self.offset if self.double_quant else self.absmax
        out = torch.empty(self.shape, dtype=torch.float16)
        out.fill_(0.01)  # any value: memory is what is measured; absmax lives until here, as there
        return out

    def forward(self, x):
        return MatMul4BitStandIn.apply(x, self.packed, self.bias, self)


def quantize(module, double_quant):
    """Lightning's _convert_layers: every nn.Linear below `module`, the head's too, replaced."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Linear4bitStandIn(child, double_quant))
        else:
            quantize(child, double_quant)


def fabric_output(output):
    """What Fabric's module wrapper hands back under bf16-true (lightning@71aed75, the commit lit-gpt's
    requirements.txt pins: _FabricModule.forward, HalfPrecision.convert_output): every floating
    tensor of the output converted to the default dtype, fp32, the list built whole before the bf16
    one is let go."""
    return [chunk.to(torch.get_default_dtype()) for chunk in output]


def build(lora, size, seq, quantized=None, adapter=None):
    torch.manual_seed(0)
    if adapter:  # finetune/adapter.py's Config: a 10-token prompt in every layer from the third
        model = adapter.GPT(adapter.Config(**SIZES[size], **ADAPTER)).to(torch.bfloat16)
    else:
        model = lora.GPT(lora.Config(**SIZES[size], **LORA)).to(torch.bfloat16)
    if quantized:  # --quantize bnb.nf4 / bnb.nf4-dq: every linear made 4-bit before training
        quantize(model, double_quant=quantized == "bnb.nf4-dq")
    mark = getattr(adapter, "mark_only_adapter_v2_as_trainable", None) or getattr(
        adapter, "mark_only_adapter_as_trainable", None) or lora.mark_only_lora_as_trainable
    mark(model)
    model.max_seq_length = seq  # train(): the rope cache made again, in the default dtype (fp32)
    if adapter:  # the sanity-check validate(), under no_grad: the prompt's k and v cached, no graph
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, 8, dtype=torch.long))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=3e-4, weight_decay=0.01)
    return model, optimizer


def hook_timeline(model, get_meter):
    """memcalc's timeline marked from outside the program: forward i at block i's pre-hook, loss at
    the final norm's, backward i when the gradient of block i's output arrives."""
    blocks = model.transformer.h

    def forward_mark(i):
        return lambda module, args: get_meter().mark(f"forward {i}") if get_meter() and i > 1 else None

    def backward_mark(i):
        def hook(module, args, out):
            if get_meter() and out.requires_grad:
                out.register_hook(lambda grad: get_meter().mark(f"backward {i}"))
        return hook

    for i, block in enumerate(blocks, start=1):
        block.register_forward_pre_hook(forward_mark(i))
        block.register_forward_hook(backward_mark(i))
    model.transformer.ln_f.register_forward_pre_hook(
        lambda module, args: get_meter().mark("loss") if get_meter() else None)


def run(size, seq, batch, steps=1, quantized=None, method="lora"):
    lora, utils, adapters = load_litgpt()
    model, optimizer = build(lora, size, seq, quantized, adapters.get(method))
    vocab = model.config.vocab_size
    input_ids = torch.randint(0, vocab, (batch, seq))
    targets = torch.randint(0, vocab, (batch, seq))
    state = {"meter": None}
    hook_timeline(model, lambda: state["meter"])

    def step(meter=None):
        state["meter"] = meter
        if meter:
            meter.mark("forward 1")
        logits = fabric_output(model(input_ids, lm_head_chunk_size=LM_HEAD_CHUNK))
        logits[-1] = logits[-1][..., :-1, :]
        loss = utils.chunked_cross_entropy(logits, targets[..., 1:])
        (loss / 1).backward()  # fabric.backward(loss / gradient_accumulation_iters)
        if meter:
            meter.mark("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss

    step()  # warm-up: the optimiser's state exists from here on
    with Meter("cpu") as m:
        step(m)
    peak, peak_step = m.peak()
    state["meter"], times = None, []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    name = f"litgpt-{size}"
    return {"program": "litgpt", "size": size, "batch": batch, "precision": "bf16",
            "model": f"{name} bf16", "model_file": f"validation/third_party/models/{name}.json",
            "seq": seq, "micro_batch": batch, "microbatches": 1, "grad_buffer": "lazy",
            "recompute": "none", "attention": "sdpa", "optimizer_impl": "for-loop",
            "optimizer_state": "lazy", "recipe": "bf16-adam",
            # chunked_cross_entropy over the head's 128-token chunks, in the logits' dtype
            "loss": "chunked-bf16", "loss_chunk_tokens": LM_HEAD_CHUNK, "logits": "held",
            "kv_cache": "off", "torch_version": TORCH_RELEASE,
            "memory_before_step": m.before, "max_memory_allocated": peak, "peak_step": peak_step,
            "timeline": m.steps, "median_step_seconds": statistics.median(times),
            "steps_timed": steps, **training_record(method), **qlora_record(quantized, method)}


def training_record(method):
    """What trains, as memcalc's options name it (compare.py's training_flags)."""
    if method == "lora":  # LoRAQKVLinear on the query and value parts: memcalc's merged adapter
        return {"train": "lora", "lora_rank": LORA["r"], "lora_targets": "q_proj,v_proj",
                "lora_variant": "merged", "lora_dropout": LORA["dropout"], "lora_dtype": "bf16"}
    return {"train": method.replace("_", "-"), "adapter_prompt_tokens": ADAPTER["adapter_prompt_length"],
            "adapter_start_layer": ADAPTER["adapter_start_layer"]}


def qlora_record(quantized, method="lora"):
    """A quantised run's keys, as memcalc's options name them (compare.py's QLORA_KEYS)."""
    if not quantized:
        return {}
    return {"train": "qlora" if method == "lora" else "q" + method.replace("_", "-"),
            "qlora_quantizer": "lightning", "bitsandbytes_version": BITSANDBYTES,
            "qlora_double_quant": "true" if quantized == "bnb.nf4-dq" else "false"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="where to write the rows (JSON)")
    ap.add_argument("--sizes", nargs="+", choices=tuple(SIZES), default=list(SIZES))
    ap.add_argument("--steps", type=int, default=1, help="timed steps per run, after the measured one")
    ap.add_argument("--quantize", nargs="+", choices=("none", "bnb.nf4", "bnb.nf4-dq"), default=["none"],
                    help="finetune/lora.py's --quantize: the base's linears as bitsandbytes' 4-bit "
                         "stand-in (Linear4bitStandIn)")
    ap.add_argument("--method", nargs="+", choices=("lora", "adapter", "adapter_v2"), default=["lora"],
                    help="finetune/lora.py's LoRA, or adapter.py's or adapter_v2.py's LLaMA-Adapter")
    a = ap.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    result = {"date": time.strftime("%Y-%m-%d"), "device": "cpu", "device_name": cpu_name(),
              "torch": torch.__version__, "litgpt_commit": LITGPT_COMMIT, "runs": [], "skipped": []}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    for method, quantized, size, (seq, batch) in itertools.product(a.method, a.quantize, a.sizes, SHAPES):
        r = run(size, seq, batch, a.steps, None if quantized == "none" else quantized, method)
        result["runs"].append(r)
        with open(a.out + ".part", "w") as f:  # after every run: a run cut short keeps the rest
            json.dump(result, f, indent=2)
        os.replace(a.out + ".part", a.out)
        print(f"litgpt {method:<10} {size:<6} {quantized:<10} s={seq:<5} b={batch} peak {r['max_memory_allocated']:>13,} B at "
              f"{r['peak_step']:<12} ({r['median_step_seconds']:.2f} s/step)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
