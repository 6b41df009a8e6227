#!/usr/bin/env python3
"""The Memory chapter's notebook 10, replicated: peak memory and step time of real training steps.

Trains one step at a time of a GPT-style and a LLaMA-style model (validation/gpu/models/*.json, the
same files memcalc reads) in bf16 mixed precision with Adam: bf16 weights and gradients, an fp32
master copy and fp32 moments (stepped by torch.optim.AdamW's own for-loop, reading the bf16 gradients),
the loss in fp32, as memcalc's mixed-adam recipe counts them. Every
model runs at three sequence lengths, with no, selective (the core attention checkpointed) and full
(each layer checkpointed) recomputation, and on request torchtitan's op-level policy (--modes op), with
eager attention and with PyTorch's fused scaled_dot_product_attention where this PyTorch has it.

For each run it records, after a warm-up step: the memory before the step (weights, master copy,
moments), torch.cuda.max_memory_allocated over one step and its largest value within each step of
memcalc's timeline (forward 1..L, loss, backward L..1, optimizer), and the median step time, as JSON.

  /usr/bin/python3 validation/gpu/replicate.py --device cuda --out validation/results/gpu.json
  /usr/bin/python3 validation/gpu/replicate.py --device cpu --tiny --out /tmp/cpu.json   # what CI runs

  /usr/bin/python3 validation/gpu/replicate.py --device cpu --models gpt2-mid llama-mid --seqs 256 512 1024 \
      --steps 1 --out validation/results/cpu.json                                      # the CPU figures
  /usr/bin/python3 validation/gpu/replicate.py --rerun validation/results/cpu.json --out /tmp/cpu.json
                                                       # the same runs again, after this script changed

Fine-tuning (--train frozen --frozen PARTS, or --train lora with --lora-rank, --lora-targets, --lora-dropout and
--lora-dtype; memcalc's flags of the same names, which compare.py passes on): the parts are frozen, or every base
parameter and each target linear wrapped in reference_trainer.py's LoraLinear (peft's lora.Linear), before the
cast to bf16 (fp32 adapters are upcast after it, as peft's get_peft_model does); the optimizer (the recipe's,
as for full training) gets the parameters that require grad and no others, so a frozen tensor keeps its bf16
weights alone; and a forward hook on the token embedding sets requires_grad on its output, as transformers'
enable_input_require_grads does (what PEFT and gradient checkpointing over frozen embeddings call), so the first
layer's input requires grad whatever trains. An fp32 adapter is its own master copy (MixedAdam's .float() of
it is the tensor itself), as with torch's AdamW over fp32 parameters. Each JSON row records its setting.

  /usr/bin/python3 validation/gpu/replicate.py --device cpu --models llama-mid --seqs 256 512 --steps 1 \
      --train full lora frozen --frozen attention,mlp --lora-targets q_proj,v_proj all-linear \
      --lora-dropout 0 0.05 --lora-dtype bf16 fp32 --out /tmp/lora-step.json

On CPU the same figures come from the profiler's record of every allocation (PyTorch's CPU allocator
does not round, so they are the bytes the tensors need), and only PyTorch's fused attention is missing
before torch 2.0. Then validation/gpu/compare.py sets memcalc's predictions beside the measurements.
"""
import argparse
import collections
import gc
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPE = torch.bfloat16
sys.path.insert(0, os.path.dirname(HERE))
from activation_functions import FUNCTIONS  # noqa: E402  each activation as its modeling code writes it
# Fine-tuning as the reference trainer does it: the setting (parsed, normalised, as memcalc's flags and
# JSON fields) and peft's lora.Linear.
from reference_trainer import LoraLinear, PROJECTIONS, Train, add_train_arguments, trains_from  # noqa: E402



class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm: normalise in fp32, scale in the model's dtype."""

    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(mean_of_squares(y) + self.eps)
        return self.weight * y.to(x.dtype)


def _torch_version():
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in torch.__version__.split(".")[:2])


# Fused attention over k and v at their own width (torch >= 2.5), as transformers calls it; older
# versions get k and v repeated to every query head first.
SDPA_GQA = _torch_version() >= (2, 5)


class _MeanKeepingSizes(torch.autograd.Function):
    """mean over the last axis as PyTorch 2.2 and later run it: it keeps only sizes (PR #109935), and
    its backward makes the expanded gradient divided by the count, a whole tensor (mean_backward:
    sum_backward(...) / n). sum() / n, used before, keeps the same but its gradient is an expanded view:
    4 s b h bytes fewer at pow's backward than 2.2 allocates (validation/norm_backward.py)."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.mean(-1, keepdim=True)

    @staticmethod
    def backward(ctx, grad):
        return grad.expand(ctx.shape) / ctx.shape[-1]


def mean_of_squares(y):
    """mean(y^2) over the last axis, saving and allocating in backward what PyTorch 2.2 and later do.

    Before 2.2, mean() kept its input (here y^2, 4 s b h bytes per RMSNorm); older versions run
    _MeanKeepingSizes instead."""
    if _torch_version() >= (2, 2):
        return y.pow(2).mean(-1, keepdim=True)
    return _MeanKeepingSizes.apply(y.pow(2))


class CachedRotary(nn.Module):
    """transformers 4.31-4.37's LlamaRotaryEmbedding, one in every attention layer (models/llama/
    modeling_llama.py): inv_freq, and cos and sin caches of max_positions x head_dim built in torch's
    default dtype, registered as non-persistent buffers, so model.to(dtype) casts them with the weights.
    Its forward returns the caches cut to the sequence and cast to x's dtype (the cut itself where the
    dtypes match); apply_rotary_pos_emb then gathers them at position_ids."""

    gathered = True

    def __init__(self, d, max_positions, base=10000):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, d, 2).float() / d)), persistent=False)
        angles = torch.outer(torch.arange(max_positions, dtype=self.inv_freq.dtype), self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_cached", angles.cos().to(torch.get_default_dtype()), persistent=False)
        self.register_buffer("sin_cached", angles.sin().to(torch.get_default_dtype()), persistent=False)

    def forward(self, x, positions):
        s = positions.shape[-1]
        return self.cos_cached[:s].to(dtype=x.dtype), self.sin_cached[:s].to(dtype=x.dtype)


class LayerRotary(nn.Module):
    """transformers 4.40-4.44's LlamaRotaryEmbedding, one in every attention layer: inv_freq alone is
    registered; each forward makes cos and sin of (1, s, head_dim) in fp32, outside autograd and
    autocast, and casts them to x's dtype."""

    gathered = False

    def __init__(self, d, max_positions, base=10000):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, d, 2).float() / d)), persistent=False)

    @torch.no_grad()
    def forward(self, x, positions):
        inv_freq = self.inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (inv_freq.float() @ positions[:, None, :].float()).transpose(1, 2)
            angles = torch.cat((freqs, freqs), dim=-1)
            cos, sin = angles.cos(), angles.sin()
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


# The model file's rotary_embedding: shared (one cos and sin per forward, the Model's), or a module per layer.
LAYER_ROTARY = {"per_layer": LayerRotary, "per_layer_cached": CachedRotary}


# torchtitan's save list for op-level selective checkpointing (pytorch/torchtitan
# torchtitan/models/llama3/infra/parallelize.py @018740b7, _op_sac_save_list): the ops of it this torch has.
# reduce_scatter, flex and varlen attention and compiled code do not occur in these single-device eager layers.
OP_SAC_SAVE_LIST = {getattr(torch.ops.aten, name).default for name in (
    "mm", "max", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_fused_attention_overrideable") if hasattr(torch.ops.aten, name)}


class OpPolicy(TorchDispatchMode):
    """torchtitan's op-level policy (torchtitan/distributed/activation_checkpoint.py @cfb93265, _apply_op_sac)
    as torch's selective checkpointing runs it (torch.utils.checkpoint's _CachingTorchDispatchMode and
    _CachedTorchDispatchMode), for a torch without create_selective_checkpoint_contexts (before 2.4): in the
    layer's forward each output of a save-list op is kept, detached, except every second aten.mm (one count
    for the forward and one for the recomputation, per checkpointed call); the recomputation pops each
    kept output in order instead of running the op again."""

    def __init__(self, call):
        super().__init__()
        self.call = call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        call, kwargs = self.call, kwargs or {}
        # torch 1.13's checkpoint detaches each saved tensor inside the mode, where a wrapped number (x / 64's
        # 64) arrives as a Python number: it stays the 0-dim tensor it was.
        if func == torch.ops.aten.detach.default and not torch.is_tensor(args[0]):
            return torch.tensor(args[0])
        if func == torch.ops.aten.mm.default:
            call["mm"][call["recompute"]] += 1
        saved = func in OP_SAC_SAVE_LIST and not (func == torch.ops.aten.mm.default and
                                                  call["mm"][call["recompute"]] % 2 == 0)
        if not saved:
            return func(*args, **kwargs)
        if call["recompute"]:
            return call["storage"][func].pop(0)
        out = func(*args, **kwargs)
        call["storage"][func].append(out.detach() if torch.is_tensor(out) else
                                     tuple(o.detach() if torch.is_tensor(o) else o for o in out))
        return out


def op_checkpoint(function, *args):
    """`function` checkpointed under the op-level policy: torch's non-reentrant checkpoint (which keeps the
    inputs and reruns `function` at the first unpack in backward), each run of it under OpPolicy."""
    call = {"mm": [0, 0], "recompute": 0, "runs": 0, "storage": collections.defaultdict(list)}

    def run(*inner):
        call["recompute"], call["runs"] = int(call["runs"] > 0), call["runs"] + 1
        with OpPolicy(call):
            return function(*inner)

    return checkpoint(run, *args, use_reentrant=False)


class Block(nn.Module):
    """One decoder layer, GPT-style (LayerNorm, GELU, learned positions) or LLaMA-style (RMSNorm,
    SwiGLU, rotary, grouped-query attention), with eager or fused attention."""

    def __init__(self, spec, attention, mode, kv_cache="off"):
        super().__init__()
        self.kv_cache = kv_cache
        h, a = spec["hidden"], spec["heads"]
        self.a, self.kv, self.d = a, spec.get("kv_heads", a), h // a
        self.llama = spec.get("norm") == "rmsnorm"
        self.attention, self.mode = attention, mode
        # torch's own F.dropout (on CPU it keeps a noise tensor of the compute dtype, on CUDA a 1-byte mask)
        self.p_attention, self.p_hidden = spec.get("attention_dropout", 0.0), spec.get("hidden_dropout", 0.0)
        self.p_mlp = spec.get("mlp_dropout", 0.0)  # inside the MLP, as nn.TransformerEncoderLayer's
        self.act = FUNCTIONS[spec.get("activation", "silu" if spec.get("mlp") == "gated" else "gelu_tanh")]
        # Which linears carry a bias, as memcalc's model files say: none, qkv (Qwen2's), attention or all.
        bias = spec.get("bias", "none")
        qkv_bias, o_bias, mlp_bias = bias != "none", bias in ("attention", "all"), bias == "all"
        self.norm1 = RMSNorm(h) if self.llama else nn.LayerNorm(h)
        self.norm2 = RMSNorm(h) if self.llama else nn.LayerNorm(h)
        self.q = nn.Linear(h, a * self.d, bias=qkv_bias)
        self.k = nn.Linear(h, self.kv * self.d, bias=qkv_bias)
        self.v = nn.Linear(h, self.kv * self.d, bias=qkv_bias)
        self.o = nn.Linear(a * self.d, h, bias=o_bias)
        f = spec["ffn"]
        self.up = nn.Linear(h, f, bias=mlp_bias)
        self.down = nn.Linear(f, h, bias=mlp_bias)
        self.gate = nn.Linear(h, f, bias=False) if spec.get("mlp") == "gated" else None
        # nanoGPT's CausalSelfAttention without flash: a max_positions^2 mask registered in every layer,
        # cast with the weights by .to(dtype), and masked_fill(bias == 0, -inf) in place of an added mask.
        self.mask_buffer = spec.get("causal_mask_buffer", "none") == "per_layer" and attention == "eager"
        if self.mask_buffer:
            n = spec["max_positions"]
            self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))
        kind = spec.get("rotary_embedding", "shared")
        rotary = spec.get("position", "rotary") == "rotary" and kind != "shared"
        self.rotary_emb = LAYER_ROTARY[kind](self.d, spec["max_positions"]) if rotary else None

    def core(self, q, k, v, mask):
        if self.attention == "sdpa" and (self.kv == self.a or SDPA_GQA):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **({"enable_gqa": True} if self.kv < self.a else {}))
        if self.kv < self.a:  # grouped-query attention: repeat k and v to every query head
            k = k.repeat_interleave(self.a // self.kv, dim=1)
            v = v.repeat_interleave(self.a // self.kv, dim=1)
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # One name rebound at each op, as transformers writes it: the scores go once softmax has run.
        if self.mask_buffer:
            s = q.shape[-2]
            weights = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.d))
            weights = weights.masked_fill(self.bias[:, :, :s, :s] == 0, float("-inf"))
        else:
            weights = (q @ k.transpose(-1, -2)) / math.sqrt(self.d) + mask  # mask: 0 or -inf, made once per step
        weights = F.softmax(weights, dim=-1, dtype=torch.float32 if self.llama else None).to(q.dtype)
        if self.p_attention > 0:
            weights = F.dropout(weights, self.p_attention, self.training)
        return weights @ v

    def rotate(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def attend(self, y, mask, cos, sin, positions=None):
        """The attention half, its temporaries freed when it returns, as transformers' attention module's are."""
        b, s, _ = y.shape
        q = self.q(y).view(b, s, self.a, self.d).transpose(1, 2)
        k = self.k(y).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v(y).view(b, s, self.kv, self.d).transpose(1, 2)
        if self.rotary_emb is not None:
            # The layer's own cos and sin, held until the attention returns as LlamaAttention.forward
            # holds them; apply_rotary_pos_emb gathers a cache at the positions (a new tensor) or
            # unsqueezes what was computed, over the heads either way.
            cos, sin = self.rotary_emb(v, positions)
            if self.rotary_emb.gathered:
                q_cos, q_sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
            else:
                q_cos, q_sin = cos.unsqueeze(1), sin.unsqueeze(1)
            q, k = self.rotate(q, q_cos, q_sin), self.rotate(k, q_cos, q_sin)
            del q_cos, q_sin
        elif cos is not None:
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        if self.mode == "selective":
            out = checkpoint(self.core, q, k, v, mask, use_reentrant=False)
        else:
            out = self.core(q, k, v, mask)
        # use_cache: k (after rotary) and v before any repeat, handed back; else freed here.
        return self.o(out.transpose(1, 2).reshape(b, s, -1)), (k, v) if self.kv_cache == "kept" else None

    def feed_forward(self, y):
        hidden = self.act(self.gate(y)) * self.up(y) if self.gate is not None else self.act(self.up(y))
        if self.p_mlp > 0:
            hidden = F.dropout(hidden, self.p_mlp, self.training)
        return self.down(hidden)

    def residual(self, y):
        return F.dropout(y, self.p_hidden, self.training) if self.p_hidden > 0 else y

    def forward(self, x, mask, cos=None, sin=None, positions=None):
        """The layer's output, and with the k/v cache kept its (k, v), as transformers' layer hands them back."""
        attended, cache = self.attend(self.norm1(x), mask, cos, sin, positions)
        h = x + self.residual(attended)
        if self.llama:  # LlamaDecoderLayer rebinds hidden_states: the attention's output goes with the add;
            del attended  # GPT2Block keeps its attn_output until it returns (memcalc: attention_output_held)
        return h + self.residual(self.feed_forward(self.norm2(h))), cache


class InPlaceCrossEntropy(torch.autograd.Function):
    """Megatron-LM's VocabParallelCrossEntropy on one tensor-parallel rank, its memory as
    megatron/core/tensor_parallel/cross_entropy.py makes it: an fp32 copy of the logits, the maximum
    subtracted, exponentiated and normalised in place and kept for backward, which writes the gradient
    over it and returns it in fp32 (autograd casts it to the logits' dtype)."""

    @staticmethod
    def forward(ctx, logits, target):
        x = logits.float()
        x.sub_(x.max(dim=-1, keepdim=True)[0])
        x.exp_()
        sum_exp = x.sum(dim=-1, keepdim=True)
        predicted = x.gather(-1, target.unsqueeze(-1))
        loss = sum_exp.log() - predicted.log()
        x.div_(sum_exp)
        ctx.save_for_backward(x, target)
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, target = ctx.saved_tensors
        softmax.scatter_add_(-1, target.unsqueeze(-1), torch.full_like(target, -1, dtype=softmax.dtype).unsqueeze(-1))
        softmax.mul_(grad / target.numel())
        return softmax, None


class FusedLinearCrossEntropy(torch.autograd.Function):
    """Liger-Kernel's LigerFusedLinearCrossEntropyFunction (linkedin/Liger-Kernel @00eba63,
    src/liger_kernel/ops/fused_linear_cross_entropy.py), its memory as its CUDA path makes it: the
    hidden states' and the weight's gradients zeroed, a loss per token (fp32) and a mask of the
    counted ones; the head over a chunk of tokens at a time into one logits buffer, bounded by the
    hidden states' size (the next power of two of tokens / ceil(V / h)); the cross-entropy kernel
    writes the chunk's gradient over its logits a row at a time (here in place, a row's values
    beside it), which mm(out=) and addmm(out=) project into the two gradients. Forward keeps those;
    backward only scales them in place."""

    @staticmethod
    def forward(ctx, hidden, weight, target):
        tokens, h = hidden.shape
        V = weight.shape[0]
        per_chunk = -(-tokens // -(-V // h))
        chunk = min(1 << (per_chunk - 1).bit_length(), tokens)
        grad_input, grad_weight = torch.zeros_like(hidden), torch.zeros_like(weight)
        loss_1d = torch.zeros(tokens, dtype=torch.float32, device=hidden.device)
        counted = int((target != -100).sum().item())
        storage = torch.empty((chunk, V), dtype=hidden.dtype, device=hidden.device)
        for start in range(0, tokens, chunk):
            end = min(start + chunk, tokens)
            logits, rows = storage[: end - start], target[start:end]
            torch.mm(hidden[start:end], weight.t(), out=logits)
            for i in range(end - start):  # liger_cross_entropy_kernel: one program a row
                row = logits[i]
                top = row.max()
                row.sub_(top).exp_()
                total = row.sum()
                loss_1d[start + i] = total.float().log() - row[rows[i]].float().log()
                row.div_(total)
                row[rows[i]] -= 1
                row.div_(counted)
            torch.mm(logits, weight, out=grad_input[start:end])
            grad_weight.addmm_(logits.t(), hidden[start:end])
        del storage
        ctx.save_for_backward(grad_input, grad_weight)
        return loss_1d.sum() / counted

    @staticmethod
    def backward(ctx, grad):
        grad_input, grad_weight = ctx.saved_tensors
        if not torch.equal(grad, torch.tensor(1.0, device=grad.device)):  # element_mul_kernel
            grad_input.mul_(grad.to(grad_input.dtype))
            grad_weight.mul_(grad.to(grad_weight.dtype))
        return grad_input, grad_weight, None


def chunked_loss(hidden, weight, ids, chunks):
    """torchtune's TransformerDecoder.chunked_output and CEWithChunkedOutputLoss (pytorch/torchtune
    @10ff7cd, torchtune/modules/loss/ce_chunked_output_loss.py): the head over each chunk of the
    sequence, the logits a list; each chunk upcast and scored in turn, eagerly. The head is an
    nn.Linear: autocast casts its weight, a leaf, once for every chunk (its cache)."""
    logits = [F.linear(part, weight) for part in hidden.tensor_split(chunks, dim=1)]
    labels = [part.reshape(-1) for part in ids.tensor_split(chunks, dim=1)]
    total = 0.0
    for part, target in zip(logits, labels):
        total += F.cross_entropy(part.reshape(-1, part.size(-1)).float(), target, reduction="sum")
    return total / ids.numel(), logits


class Model(nn.Module):
    def __init__(self, spec, attention, mode, loss="fp32", kv_cache="off", recompute_layers=None,
                 loss_chunks=8):
        super().__init__()
        self.spec, self.mode, self.loss, self.kv_cache = spec, mode, loss, kv_cache
        self.loss_chunks = loss_chunks
        # Partial recomputation (Megatron-LM's block method): only the first N layers checkpointed under full.
        self.recompute_layers = recompute_layers
        h, V = spec["hidden"], spec["vocab"]
        self.embed = nn.Embedding(V, h)
        self.positions = nn.Embedding(spec["max_positions"], h) if spec.get("position") == "learned" else None
        self.blocks = nn.ModuleList(Block(spec, attention, mode, kv_cache) for _ in range(spec["layers"]))
        self.norm = self.blocks[0].norm1.__class__(h)
        self.head = None if spec.get("tied_embeddings") else nn.Linear(h, V, bias=False)

    def rotary(self, s, device, dtype):
        """cos and sin of the rotary angles, as transformers' rotary embedding returns them."""
        d = self.spec["hidden"] // self.spec["heads"]
        freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
        angles = torch.outer(torch.arange(s, device=device).float(), freq)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, ids, meter=None, microbatch=1):
        # memcalc names every micro-batch after the first "micro-batch 2": from there on they are alike.
        of = " of micro-batch 2" if microbatch > 1 else ""
        mark = (lambda step: meter.mark(step + of)) if meter else (lambda step: None)
        b, s = ids.shape
        mark("forward 1")
        x = self.embed(ids)
        cos = sin = None
        if self.positions is not None:
            x = x + self.positions(torch.arange(s, device=ids.device))
        if self.spec.get("hidden_dropout", 0.0) > 0:
            x = F.dropout(x, self.spec["hidden_dropout"], self.training)
        elif self.spec.get("position", "rotary") == "rotary" and self.blocks[0].rotary_emb is None:
            cos, sin = self.rotary(s, ids.device, DTYPE)  # transformers casts them to v's dtype: bf16 under autocast too
        # Each layer's own rotary embedding reads LlamaModel's position_ids, (1, s) whatever the batch.
        positions = torch.arange(s, device=ids.device).unsqueeze(0) if self.blocks[0].rotary_emb is not None else None
        mask = None  # fused attention masks inside; eager adds 0 or -inf, built once per forward as transformers does
        if self.blocks[0].attention == "eager" and not self.blocks[0].mask_buffer:
            mask = torch.full((s, s), float("-inf"), device=ids.device, dtype=x.dtype).triu(1)
        cache = []  # kept: each layer's (k, v) in the output, as use_cache keeps them
        for i, block in enumerate(self.blocks, start=1):
            if i > 1:
                mark(f"forward {i}")
            if self.mode == "full" and (self.recompute_layers is None or i <= self.recompute_layers):
                x, kv = checkpoint(block, x, mask, cos, sin, positions, use_reentrant=False)
            elif self.mode == "op":  # torchtitan's: every layer checkpointed under its op-level policy
                x, kv = op_checkpoint(block, x, mask, cos, sin, positions)
            else:
                x, kv = block(x, mask, cos, sin, positions)
            if kv is not None:
                cache.append(kv)
            del kv
            if meter:  # this layer's backward step starts when the gradient of its output arrives
                x.register_hook(lambda grad, i=i: mark(f"backward {i}"))
        mark("loss")
        weight = self.embed.weight if self.head is None else self.head.weight
        if self.loss == "chunked":
            loss, logits = chunked_loss(self.norm(x), weight, ids, self.loss_chunks)
            return loss, logits, cache
        if self.loss == "fused-linear":  # no logits
            hidden = self.norm(x)
            return FusedLinearCrossEntropy.apply(hidden.view(-1, hidden.shape[-1]), weight, ids.view(-1)), None, cache
        logits = self.norm(x) @ weight.t()
        if self.loss == "fp32-inplace":  # Megatron-LM's
            return InPlaceCrossEntropy.apply(logits.view(-1, logits.shape[-1]), ids.view(-1)), logits, cache
        # fp32: transformers' loss, over an fp32 copy; bf16: nanoGPT's call, on the logits as they are.
        scored = logits.float() if self.loss == "fp32" else logits
        return F.cross_entropy(scored.view(-1, logits.shape[-1]), ids.view(-1)), logits, cache


class Meter:
    """Allocated bytes over one training step, and their maximum within each step of memcalc's timeline
    (forward 1..L, loss, backward L..1, optimizer). CUDA: the caching allocator's own counters. CPU: the
    profiler's record of every allocation and free (PyTorch's CPU allocator does not round), replayed in
    order; what was live before the step is every tensor the garbage collector can reach."""

    def __init__(self, device):
        self.cuda = device == "cuda"
        self.steps, self.marks = [], []

    def __enter__(self):
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            storages = {}
            for o in gc.get_objects():
                if torch.is_tensor(o) and not o.is_meta:
                    try:
                        storages[o.storage().data_ptr()] = o.storage().nbytes()
                    except RuntimeError:  # torch.compile's fake tensors hold no memory
                        pass
            self.before = sum(storages.values())
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            self.profiler.__enter__()
        return self

    def mark(self, step):
        """The training step enters `step` (the previous one ends here)."""
        if self.cuda:
            if self.steps:
                self.steps[-1]["max_bytes"] = torch.cuda.max_memory_allocated()
                self.steps[-1]["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            self.steps.append({"step": step})
        else:
            with torch.profiler.record_function("mark: " + step):
                pass
            self.steps.append({"step": step})

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.steps[-1]["max_bytes"] = torch.cuda.max_memory_allocated()
            self.steps[-1]["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
            return False
        self.profiler.__exit__(*exc)
        events = self.profiler.profiler.kineto_results.events()
        start = (lambda e: e.start_ns()) if events and hasattr(events[0], "start_ns") else (
            lambda e: e.start_us())  # torch 2's events give nanoseconds
        timed = sorted((start(e), i, e) for i, e in enumerate(events)
                       if e.name() == "[memory]" or e.name().startswith("mark: "))
        live, step = self.before, -1
        for _, _, e in timed:
            if e.name() != "[memory]":
                step += 1
                self.steps[step]["max_bytes"] = live
            elif e.device_type() == torch.autograd.DeviceType.CPU:
                live += e.nbytes()
                if step >= 0:
                    self.steps[step]["max_bytes"] = max(self.steps[step]["max_bytes"], live)
        return False

    def peak(self):
        top = max(self.steps, key=lambda s: s["max_bytes"])
        return top["max_bytes"], top["step"]


def adamw_tensor(param, grad, exp_avg, exp_avg_sq, step_t, lr, betas, eps, weight_decay):
    """One tensor of torch 1.13's _single_tensor_adamw, op for op (so its temporaries too): written out
    because later torch's lerp_ refuses a bf16 gradient into fp32 moments (torch 2.11 on the H200)."""
    beta1, beta2 = betas
    step_t += 1
    param.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step = step_t.item()
    denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1 ** step))


class MixedAdam:
    """Adam on an fp32 master copy of bf16 weights: 2 + 2 + 4 + 8 bytes per parameter. Its step is
    torch 1.13's AdamW for-loop (adamw_tensor, as foreach=False) over the master copy, reading the
    bf16 gradients as they are; then each weight takes its master's new value. `persistent`: the step
    zeroes the gradients instead of dropping them (zero_grad(set_to_none=False)), so they live for the
    whole run and backward accumulates into them."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, persistent=False):
        self.persistent = persistent
        self.params = list(params)
        self.master = [p.detach().float() for p in self.params]
        self.m = [torch.zeros_like(p) for p in self.master]
        self.v = [torch.zeros_like(p) for p in self.master]
        self.steps = [torch.tensor(0.0) for _ in self.master]  # as torch.optim.AdamW keeps each tensor's
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay

    @torch.no_grad()
    def step(self):
        for w, p, m, v, t in zip(self.master, self.params, self.m, self.v, self.steps):
            adamw_tensor(w, p.grad, m, v, t, self.lr, self.betas, self.eps, self.weight_decay)
        for p, w in zip(self.params, self.master):
            p.copy_(w)
            if self.persistent:
                p.grad.zero_()
            else:
                p.grad = None


class TorchAdamW:
    """torch's own AdamW on the bf16 parameters, one tensor at a time (foreach=False), its state bf16
    too; like MixedAdam, each step drops the gradients (lazy) or zeroes and keeps them (persistent)."""

    def __init__(self, params, persistent=False):
        self.adamw = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), foreach=False)
        self.persistent = persistent

    def step(self):
        self.adamw.step()
        self.adamw.zero_grad(set_to_none=not self.persistent)


class SteppedAdamW:
    """The optimizer in backward, as torchtune's optimizer_in_bwd runs it (training.
    register_optim_in_bwd_hooks): torch's AdamW per parameter (foreach=False here), stepped by a
    post-accumulate-grad hook once the gradient is whole, which it then drops (torch >= 2.1);
    step() has nothing left to step. memcalc's --grad-buffer stepped."""

    def __init__(self, params, persistent=False):
        assert not persistent, "the optimizer in backward drops each gradient"
        self.optimizers, self.hooks = {}, []
        for p in params:
            self.optimizers[p] = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), foreach=False)
            self.hooks.append(p.register_post_accumulate_grad_hook(self._step))

    def _step(self, p):
        self.optimizers[p].step()
        self.optimizers[p].zero_grad(set_to_none=True)

    def step(self):
        pass

    def close(self):
        """The hooks hold this optimizer from the parameters' C++ side: without this the run's
        model outlives it, in the next run's memory."""
        for hook in self.hooks:
            hook.remove()


def make_optimizer(recipe, model, grad_buffer):
    """mixed-adam: this script's MixedAdam (an fp32 master copy and moments); bf16-adam and amp-adam:
    TorchAdamW on the model's own parameters (bf16, or fp32 under autocast); grad_buffer stepped:
    SteppedAdamW (bf16-adam alone). Each steps only the parameters that require grad (all of them
    under full training)."""
    if grad_buffer == "stepped":
        if recipe != "bf16-adam" or _torch_version() < (2, 1):
            raise SystemExit("--grad-buffer stepped: bf16-adam on torch >= 2.1 "
                             "(post-accumulate-grad hooks)")
        return SteppedAdamW([p for p in model.parameters() if p.requires_grad])
    optimizer = MixedAdam if recipe == "mixed-adam" else TorchAdamW
    # As a fine-tuning loop builds it: the parameters that train, and no others.
    return optimizer([p for p in model.parameters() if p.requires_grad], persistent=grad_buffer == "persistent")


# This script's names for the linears of a Block, as transformers names them (what --frozen and
# --lora-targets say).
PROJECTION_OF = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
                 "down": "down_proj"}


def parameter_parts(model):
    """Every parameter of this script's Model as (name, parameter, part, projection name or ''), the
    parts being reference_trainer.py's: embeddings (token and position tables), attention, mlp, norms
    (both of each layer and the final one), head."""
    out = []
    for name, p in model.named_parameters():
        comps = name.split(".")
        if comps[0] in ("embed", "positions"):
            part, proj = "embeddings", ""
        elif comps[0] == "head":
            part, proj = "head", ""
        elif comps[0] == "norm" or (comps[0] == "blocks" and comps[2] in ("norm1", "norm2")):
            part, proj = "norms", ""
        elif comps[0] == "blocks" and comps[2] in PROJECTION_OF:
            proj = PROJECTION_OF[comps[2]]
            part = "attention" if comps[2] in ("q", "k", "v", "o") else "mlp"
        else:
            raise AssertionError(f"unclassified parameter {name}")
        out.append((name, p, part, proj))
    return out


def apply_training(model, spec, train):
    """reference_trainer.py's apply_training on this script's Model: freeze the parts (frozen), or every
    base parameter and wrap each target linear in reference_trainer's LoraLinear (lora). Raises ValueError
    for a part or target the model has not."""
    parts = parameter_parts(model)
    if train.mode == "frozen":
        for what in train.frozen:
            hit = [p for name, p, part, proj in parts if what in (part, proj)
                   or (what == "head" and model.head is None and name == "embed.weight")]  # the tied table
            if not hit:
                raise ValueError(f"--frozen {what}: no such {'tensor' if what in PROJECTIONS else 'part'} in {spec['name']}")
            for p in hit:
                p.requires_grad_(False)
        return
    for _, p, _, _ in parts:
        p.requires_grad_(False)
    present = {PROJECTION_OF[n] for n in PROJECTION_OF if getattr(model.blocks[0], n) is not None}
    targets = present if train.lora_targets == ("all-linear",) else set(train.lora_targets)
    missing = sorted(targets - present, key=PROJECTIONS.index)
    if missing:
        raise ValueError(f"--lora-targets: {spec['name']} has no {', '.join(missing)}")
    for block in model.blocks:
        for attr, proj in PROJECTION_OF.items():
            if proj in targets:
                setattr(block, attr, LoraLinear(getattr(block, attr), train.lora_rank, train.lora_dropout))


def cuda_device_fields(meter):
    """max_memory_reserved over the measured step, the allocator's segments now, and nvidia-smi's
    used memory for this device (None where nvidia-smi cannot say)."""
    import subprocess
    used = None
    try:
        index = str(torch.cuda.current_device())
        text = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                               "-i", index], capture_output=True, text=True, check=True).stdout
        used = int(text.strip().splitlines()[0]) * 2**20
    except (OSError, ValueError, IndexError, subprocess.CalledProcessError):
        pass
    return {"max_memory_reserved": max(s.get("max_reserved_bytes", 0) for s in meter.steps),
            "segments": len(torch.cuda.memory_snapshot()), "nvidia_smi_used_bytes": used}

def training_fields(train):
    """The setting as each JSON row records it (reference_trainer.py's fields; lora_dtype always, since
    memcalc's default is fp32 and the reference trainer's bf16)."""
    fields = train.row_fields()
    if train.mode == "lora":
        fields["lora_dtype"] = train.lora_dtype
    return fields


def run(spec, seq, mode, attention, device, steps, microbatches=1, grad_buffer="lazy", recipe="mixed-adam",
        loss_kernel="fp32", logits_life="held", kv_cache="off", train=Train(), recompute_layers=None,
        loss_chunks=8):
    torch.manual_seed(0)
    # amp-adam: an fp32 model whose forward runs under torch.autocast (nanoGPT's train.py, transformers'
    # Trainer(bf16=True)); backward runs outside it, as PyTorch's AMP recipe says.
    weights = torch.float32 if recipe == "amp-adam" else DTYPE
    if _torch_version() >= (2, 0):  # initialise on the device itself: a billion weights take seconds on a CPU
        with torch.device(device):
            model = Model(spec, attention, mode, loss_kernel, kv_cache, recompute_layers, loss_chunks)
            if train.mode != "full":  # after the base initialisation, before the cast: bf16 adapters
                apply_training(model, spec, train)
        model = model.to(dtype=weights)
    else:
        model = Model(spec, attention, mode, loss_kernel, kv_cache, recompute_layers, loss_chunks)
        if train.mode != "full":
            apply_training(model, spec, train)
        model = model.to(device=device, dtype=weights)
    if train.mode == "lora" and train.lora_dtype == "fp32":
        for module in model.modules():  # peft's get_peft_model(autocast_adapter_dtype=True) upcasts them
            if isinstance(module, LoraLinear):
                module.lora_A.float()
                module.lora_B.float()
    if train.mode != "full":
        # transformers' enable_input_require_grads (what PEFT and gradient checkpointing over frozen
        # embeddings call): a forward hook on the input embeddings sets requires_grad on their output, so
        # the first layer's input requires grad whatever trains before it.
        model.embed.register_forward_hook(lambda module, inputs, output: output.requires_grad_(True))
    autocast = lambda: torch.autocast(device_type=device, dtype=DTYPE, enabled=recipe == "amp-adam")
    optimizer = make_optimizer(recipe, model, grad_buffer)
    ids = torch.randint(0, spec["vocab"], (1, seq), device=device)

    def step(meter=None):
        # Gradient accumulation as nanoGPT's train.py writes it: each micro-batch's logits live until the
        # next forward returns its own (the last ones to the end of the step), its gradients add up.
        # Freed: the loop keeps the loss alone, as transformers' Trainer does.
        for microbatch in range(1, microbatches + 1):
            with autocast():
                if logits_life == "held":  # the output's k/v cache with them
                    loss, logits, cache = model(ids, meter, microbatch)
                else:
                    loss = model(ids, meter, microbatch)[0]
            (loss / microbatches).backward()
        if meter:
            meter.mark("optimizer")
        optimizer.step()

    step()  # warm-up: the optimiser state exists from here on
    with Meter(device) as meter:
        step(meter)
    peak, peak_step = meter.peak()
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    # What the device shows beside it (issue 37): the allocator's reserved peak and segments, and
    # nvidia-smi's used memory, before the cache is emptied.
    device_fields = cuda_device_fields(meter) if device == "cuda" else {}
    if hasattr(optimizer, "close"):
        optimizer.close()
    del model, optimizer, ids
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"model": spec["name"], "model_file": spec["path"], "seq": seq, "micro_batch": 1,
            "microbatches": microbatches, "grad_buffer": grad_buffer, "recompute": mode,
            "attention": attention, "optimizer_impl": "for-loop", "recipe": recipe, "loss": loss_kernel,
            "optimizer_state": "eager" if recipe == "mixed-adam" else "lazy",  # MixedAdam's is built
            "logits": logits_life, "kv_cache": kv_cache, **training_fields(train), "memory_before_step": meter.before, "max_memory_allocated": peak,
            **device_fields, "peak_step": peak_step, "timeline": meter.steps,
            "median_step_seconds": statistics.median(times), "steps_timed": steps,
            **({"recompute_layers": recompute_layers} if recompute_layers is not None else {}),
            **({"loss_chunks": loss_chunks} if loss_kernel == "chunked" else {})}


def cpu_name():
    """The processor's model name, as Linux reports it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.processor() or "cpu"


def rerun(earlier, out, device, steps):
    """Every run of `earlier` measured again: when this script changes how it trains, the committed
    results follow it rather than stay as an older loop measured them."""
    root = os.path.dirname(os.path.dirname(HERE))
    previous = json.load(open(earlier))
    result = {"date": time.strftime("%Y-%m-%d"), "device": device,
              "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_name(),
              "torch": torch.__version__, "runs": [], "skipped": previous.get("skipped", [])}
    for row in previous["runs"]:
        spec = json.load(open(os.path.join(root, row["model_file"])))
        spec["path"] = row["model_file"]
        r = run(spec, row["seq"], row["recompute"], row["attention"], device, steps, row.get("microbatches", 1),
                row.get("grad_buffer", "lazy"), row.get("recipe", "mixed-adam"), row.get("loss", "fp32"),
                row.get("logits", "held"), row.get("kv_cache", "off"), Train.from_row(row), row.get("recompute_layers"),
                row.get("loss_chunks", 8))
        result["runs"].append(r)
        print(f"{row['model']} seq {row['seq']} {row['recompute']} M {r['microbatches']}: peak "
              f"{r['max_memory_allocated']:,} B at {r['peak_step']} (was {row['max_memory_allocated']:,} at "
              f"{row['peak_step']})", flush=True)
    with open(out + ".part", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(out + ".part", out)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="CPU-sized models and sequences (what CI runs)")
    ap.add_argument("--out", required=True, help="where to write the results (JSON)")
    ap.add_argument("--models", nargs="+", metavar="NAME",
                    help="models/NAME.json to run (default gpt2-small llama-1b; tiny: gpt2-tiny llama-tiny)")
    ap.add_argument("--seqs", nargs="+", type=int, metavar="S", help="sequence lengths (default 1024 2048 4096; tiny: 32 64 128)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (default 5, tiny 2)")
    ap.add_argument("--microbatches", nargs="+", type=int, default=[1], metavar="M",
                    help="micro-batches per step, accumulated (default 1)")
    ap.add_argument("--grad-buffer", nargs="+", choices=("lazy", "persistent", "stepped"), default=["lazy"],
                    help="gradients dropped by each step (lazy, the default), zeroed and kept (persistent) "
                         "or stepped in backward, each dropped once stepped (stepped: torch >= 2.1)")
    ap.add_argument("--recipe", nargs="+", choices=("mixed-adam", "bf16-adam", "amp-adam"),
                    default=["mixed-adam"],
                    help="mixed-adam (default: fp32 master copy and moments), bf16-adam (torch.optim.AdamW "
                         "on the bf16 model, foreach=False) or amp-adam (torch.optim.AdamW on the fp32 model, "
                         "its forward under torch.autocast(bfloat16))")
    ap.add_argument("--loss", nargs="+", choices=("fp32", "bf16", "fp32-inplace", "chunked", "fused-linear"),
                    default=["fp32"],
                    help="cross_entropy over logits.float() (fp32, default), over the bf16 logits (bf16), "
                         "Megatron-LM's in-place softmax of an fp32 copy (fp32-inplace), torchtune's "
                         "CEWithChunkedOutputLoss (chunked, --loss-chunks) or Liger's fused linear "
                         "cross-entropy (fused-linear)")
    ap.add_argument("--loss-chunks", type=int, default=8, metavar="N",
                    help="with --loss chunked: the chunks of the sequence (torchtune's default 8)")
    ap.add_argument("--logits", nargs="+", choices=("held", "freed"), default=["held"],
                    help="the loop keeps the logits through backward (held, default) or only the loss (freed)")
    ap.add_argument("--kv-cache", nargs="+", choices=("off", "kept"), default=["off"],
                    help="the model's output keeps each layer's k and v (kept: use_cache on) or not (off, default)")
    ap.add_argument("--modes", nargs="+", choices=("none", "selective", "full", "op"), default=["none", "selective", "full"],
                    help="recomputation modes (default none, selective and full; op: torchtitan's op-level selective "
                         "checkpointing, emulated where torch has no create_selective_checkpoint_contexts)")
    ap.add_argument("--recompute-layers", nargs="+", type=int, metavar="N",
                    help="with --modes full: runs that checkpoint only the first N layers (memcalc's "
                         "--recompute-layers; default: every layer)")
    ap.add_argument("--attentions", nargs="+", choices=("eager", "sdpa"), default=["eager", "sdpa"],
                    help="attention kernels (default both, sdpa where this torch has it)")
    add_train_arguments(ap, ", as validation/reference_trainer.py builds them; the optimizer gets the trainable "
                            "parameters alone, and the first layer's input requires grad (transformers' "
                            "enable_input_require_grads)")
    ap.add_argument("--rerun", metavar="RESULTS.json",
                    help="measure every run of an earlier results file again, with this script as it is now (what "
                         "it ran, in its order; of the other options only --device, --out and --steps apply)")
    a = ap.parse_args(argv)
    if a.rerun:
        return rerun(a.rerun, a.out, a.device, a.steps or 1)
    try:
        trains = trains_from(a)
    except ValueError as e:
        ap.error(str(e))
    names = a.models or (("gpt2-tiny", "llama-tiny") if a.tiny else ("gpt2-small", "llama-1b"))
    seqs = a.seqs or ((32, 64, 128) if a.tiny else (1024, 2048, 4096))
    steps = a.steps or (2 if a.tiny else 5)
    sdpa = hasattr(F, "scaled_dot_product_attention")
    result = {"date": time.strftime("%Y-%m-%d"), "device": a.device,
              "device_name": torch.cuda.get_device_name() if a.device == "cuda" else cpu_name(),
              "torch": torch.__version__, "runs": [], "skipped": []}
    runs, skipped = result["runs"], result["skipped"]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    def save():  # after every run, so that a run cut short still leaves what it measured
        with open(a.out + ".part", "w") as f:
            json.dump(result, f, indent=2)
        os.replace(a.out + ".part", a.out)

    for name in names:
        path = os.path.join(HERE, "models", name + ".json")
        spec = json.load(open(path))
        spec["path"] = os.path.relpath(path, os.path.dirname(os.path.dirname(HERE)))
        for seq in seqs:
            for attention in a.attentions:
                if attention == "sdpa" and not sdpa:
                    skipped.append(f"{name} seq {seq}: torch {torch.__version__} has no scaled_dot_product_attention")
                    continue
                for train, mode, microbatches, buffer, recipe, loss, logits, kv_cache, partial in itertools.product(
                        trains, a.modes, a.microbatches, a.grad_buffer, a.recipe, a.loss, a.logits, a.kv_cache,
                        [None] + (a.recompute_layers or [])):
                    if partial is not None and mode != "full":
                        continue
                    try:
                        r = run(spec, seq, mode, attention, a.device, steps, microbatches, buffer, recipe, loss,
                                logits, kv_cache, train, partial, a.loss_chunks)
                    except ValueError as e:  # a part or target this model has not
                        sys.exit(f"replicate.py: {e}")
                    runs.append(r)
                    save()
                    print(f"{name:<12} seq {seq:>5} {attention:<5} {mode:<9} M {microbatches} {buffer:<10} "
                          f"{recipe:<10} loss {loss} logits {logits:<5} k/v {kv_cache:<4} "
                          f"peak {r['max_memory_allocated']:>13,} B at {r['peak_step']:<12} "
                          f"step {r['median_step_seconds'] * 1e3:.1f} ms  {train.label()}", flush=True)
    save()
    for line in skipped:
        print("skipped:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
