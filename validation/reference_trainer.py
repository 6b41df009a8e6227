#!/usr/bin/python3
"""Reference trainer: measures the bytes autograd keeps for backward, per transformer layer.

Builds small bf16 models (parameters and activations torch.bfloat16, no autocast) from a memcalc
model JSON file, following the op sequence of HuggingFace transformers' EAGER implementations:

  llama    LlamaDecoderLayer: RMSNorm (fp32 upcast), q/k/v/o Linear, rotary (cos/sin computed once per
           model, as HF >= 4.45 does), repeat_kv for grouped-query attention, QK^T * scaling, + mask,
           softmax in fp32 then cast back, dropout, @V; gated MLP down(act(gate(x)) * up(x)).
  qwen2    llama with q/k/v biases ("bias": "qkv"; "attention" adds the o_proj bias, "all" the MLP's).
  mixtral  llama attention + MixtralSparseMoeBlock (router Linear, fp32 softmax, top-k, renormalise,
           loop over hit experts with torch.where / index / index_add_).  With "shared_ffn" it is
           Qwen2MoeSparseMoeBlock: a shared expert of that width over every token, scaled by
           sigmoid(shared_expert_gate(x)) when "shared_expert_gate", added to the routed output;
           "renormalize_topk": false is norm_topk_prob False (the top-k probabilities used as they are).
  gpt2     GPT2Block: LayerNorm, fused c_attn Conv1D (addmm), QK^T / full([], sqrt(d)), torch.where with
           the per-layer causal buffer, softmax in bf16 (no upcast), attn dropout, @V, c_proj, resid
           dropout; MLP c_fc, activation, c_proj, dropout.  The chapter's "decoder" preset is this style.
  deepseek DeepseekV3Attention (and V2's, whose complex rotary saves the same): q_a_proj, q_a_layernorm,
           q_b_proj (or q_proj), kv_a_proj_with_mqa split into the latent and k's rope part,
           kv_a_layernorm, kv_b_proj split into k's nope part and v, rotary on the rope parts, q and k
           concatenated (k's rope part expanded to every head), eager attention; llama's norms and MLP.
  falcon   FalconDecoderLayer with parallel_attn: one LayerNorm feeding attention and MLP
           (norms_per_layer 1; 2 means ln_attn + ln_mlp), fused query_key_value, multi-query split,
           rotary, q @ k^T (broadcast over heads), in-place /= sqrt(d), softmax(scores + mask) in bf16,
           @ v, dense; MLP dense_h_to_4h, GELU, dense_4h_to_h; mlp_output += attention_output;
           dropout_add(hidden_dropout).

  olmo2    Olmo2DecoderLayer ("norm_position": "post"): no norm before attention or the MLP, an RMSNorm
           on each branch's output before its residual add; "qk_norm": "whole" normalises q_proj's and
           k_proj's whole outputs (a*d, k*d) before rotary; "rmsnorm_fp32_scale" is Olmo2RMSNorm's
           (weight * x_normalised).to(input dtype), which keeps the normalised x in fp32.
  gpt-oss  "stacked_experts": GptOssMLP's training path: a biased router Linear, top-k of the logits and
           a softmax over those k; a loop over the hit experts that indexes the stacked gate_up_proj and
           down_proj (copies) and their biases, clamps gate and up, (up + 1) * gate * sigmoid(1.702 gate).
  llama4   "expert_dispatch": "every_token": Llama4TextMoe in training: a bias-free router Linear, top-k of
           the logits scattered into -inf, an fp32 sigmoid; every token repeated for every expert and
           multiplied by its score; one bmm with the stacked gate_up_proj, act(gate) * up, a bmm with
           down_proj, summed over the experts; the shared expert (a gated MLP of "shared_ffn") beside.
           Llama4TextAttention: "qk_norm": "l2" is Llama4TextL2Norm on q and k after rotary (x.float(),
           x * rsqrt(mean(x^2) + eps), cast back; no weight); "position": "none" with
           "attention_temperature" scales q by log1p(floor((pos + 1) / 8192)) * 0.1 + 1 (fp32, (1, s, 1, 1)
           expanded) before the cast back; "attention_chunk" makes the mask block-diagonal causal
           (create_chunked_causal_mask: still s x s); "softmax_fp32": false softmaxes in bf16 (Llama 4's
           eager_attention_forward).  Its rotary (complex multiply by freqs_cis) keeps only the shared
           table per model, as cos/sin here do.
  phimoe   "router": "sparsemixer": PhimoeSparseMoeBlock's router in training (two masked softmaxes, Gumbel-
           sampled experts, gathered weights and MultiplierProcessor's Heun correction), "input_jitter" its
           in-place multiplication of the block's input by uniform noise; Mixtral's loop over the experts.
  mamba    "mixer": "mamba": JambaMambaMixer's slow path (use_mamba_kernels false) in place of attention:
           in_proj, depthwise causal conv1d and SiLU, x_proj into dt, B and C (RMSNormed with
           "mamba_inner_norms"), dt_proj, softplus, the discretised A and B in fp32, the recurrence one
           step at a time (each state kept), + u D, gated by SiLU(z), out_proj; then the style's MLP or experts.
  sinks    GptOssAttention's eager_attention_forward ("attention_sinks": true): a learnable logit per
           head joins the scores as a column, the row max is subtracted, softmax in the scores' dtype
           over s + 1 columns, the sink column dropped by a view before @V.

Style: parallel_attention -> falcon; else kv_lora_rank -> deepseek; else experts -> mixtral (llama4 with
"expert_dispatch": "every_token"); else layernorm without rotary -> gpt2;
else llama (qwen2 when bias is qkv).  norm, mlp, activation, bias, position, norms_per_layer (4 =
post-attention and post-MLP norms as well, Gemma 2's sandwich), embedding_norm and the dropouts are
taken from the file for every style.  Unknown keys are ignored.

How it counts.  Every layer's forward runs under torch.autograd.graph.saved_tensors_hooks; the pack
hook records each saved tensor's untyped storage (keyed by data_ptr; the graph keeps every saved
tensor alive, so a pointer is never reused during the measurement).  Storages of parameters and
buffers are excluded.  Each storage is counted once per layer, at its storage nbytes (a saved view
keeps its whole base storage alive).  Categories:

  input   the layer's input (the previous layer's output)
  layer   storages allocated inside the layer
  tiny    one-element tensors of one-element storages (Python numbers wrapped as 0-dim fp64 tensors,
          torch.full([]) constants, 1-element index tensors): listed, NOT in "kept"
  shared  tensors made once per model and passed to every layer (rotary cos/sin, causal mask,
          position ids): listed, NOT in "kept" (they are counted once per model, not per layer)
  param   parameters and buffers (e.g. GPT-2's bool causal buffer): listed, excluded

  kept = input + layer     (this is what --compare checks against memcalc's kept_layer_bytes)

The per-op breakdown walks the layer's autograd graph (grad_fn.next_functions, stopping at the layer
input's node) and reads every node's _saved_* attributes; it is cross-checked against the hooks.

Modes: none; selective (the core attention QK^T, scale, mask, softmax, dropout, @V -- with repeat_kv
where the family has it, as in HF's eager_attention_forward -- wrapped in torch.utils.checkpoint,
use_reentrant=True); full (the whole layer in torch.utils.checkpoint, use_reentrant=True, called
with the arguments HF's gradient checkpointing passes: hidden_states, causal mask, position ids and
the (cos, sin) tuple).

Fine-tuning (--train frozen / lora; memcalc's flags of the same names, passed on by --compare):
  frozen  --frozen PARTS: the parameters of each part get requires_grad_(False) when the model is built.
          Parts: embeddings (token and position tables), attention, mlp (experts and shared expert too),
          norms (every RMSNorm/LayerNorm, the final one included), head (lm_head; with tied embeddings the
          token table, so "head" and "embeddings" then freeze the same tensor), router (the MoE gate,
          Qwen2-MoE's shared_expert_gate, gpt-oss's router); or projections by name (q_proj, k_proj,
          v_proj, o_proj, gate_proj, up_proj, down_proj: every nn.Linear of that name, experts' too).
  lora    every base parameter frozen; each target nn.Linear wrapped as peft's lora.Linear does it
          (LoraLinear below): result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling with
          lora_A = Linear(in, r), lora_B = Linear(r, out), no biases, dropout nn.Dropout(p) (p > 0) or
          nn.Identity (p = 0), adapters bf16 and trainable.  --lora-targets all-linear wraps every
          projection above (attention, MLP, experts, shared expert) and, as peft's all-linear, the MoE
          router (and shared_expert_gate); a style whose layers have other projections (GPT-2's Conv1D, Falcon's fused
          query_key_value, latent attention's, gpt-oss's stacked experts) is refused, as is any target
          or part the style does not have.  peft's get_peft_model upcasts bf16 adapters to fp32 by
          default (autocast_adapter_dtype); --lora-dtype fp32 measures that.
  The ASSUMPTION, for both: the first layer's input requires grad, as it does when anything before it
  trains, or under transformers' enable_input_require_grads (which PEFT and gradient checkpointing with
  frozen embeddings use): Model.forward sets requires_grad on the embedding output when nothing did.
  Without it layer 0 would keep less (no op before the first adapter would need a gradient), and under
  full recomputation the reentrant checkpoint's output would not require grad: backward fails ("element 0
  of tensors does not require grad"), the failure enable_input_require_grads exists for.
  validation/train_breakdown.py lists, storage by storage, what each setting removes and adds.

Usage:
  /usr/bin/python3 validation/reference_trainer.py --measure [--model FILE ...] [--breakdown]
  /usr/bin/python3 validation/reference_trainer.py --compare --memcalc build/memcalc [--model FILE ...]
  ... [--train full lora frozen] [--frozen attention,mlp ...] [--lora-targets q_proj,v_proj all-linear ...]
      [--lora-dropout 0 0.05] [--lora-rank 8]        (each setting in turn; --json rows carry their own)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from activation_functions import FUNCTIONS

DTYPE = torch.bfloat16
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_MODELS = [
    os.path.join(HERE, "models", "llama-tiny.json"),
    os.path.join(HERE, "models", "qwen2-tiny.json"),
    os.path.join(HERE, "models", "mixtral-tiny.json"),
    os.path.join(HERE, "models", "qwen2-moe-tiny.json"),
    os.path.join(HERE, "models", "qwen2-moe-tiny-renorm.json"),
    os.path.join(HERE, "models", "gpt2-tiny.json"),
    os.path.join(HERE, "models", "falcon-tiny.json"),
    os.path.join(HERE, "models", "falcon40b-tiny.json"),
    os.path.join(HERE, "models", "gpt2-tiny-gelu-new.json"),
    os.path.join(HERE, "models", "llama-tiny-quick-gelu.json"),
    os.path.join(HERE, "models", "opt-tiny-relu-dropout.json"),
    os.path.join(HERE, "models", "deepseek-v3-tiny.json"),
    os.path.join(HERE, "models", "deepseek-v32-tiny.json"),
    os.path.join(HERE, "models", "deepseek-v2-lite-tiny.json"),
    os.path.join(HERE, "models", "olmo2-tiny.json"),
    os.path.join(HERE, "models", "sinks-tiny.json"),
    os.path.join(HERE, "models", "gpt-oss-tiny.json"),
    os.path.join(HERE, "models", "mamba-tiny.json"),
    os.path.join(HERE, "models", "jamba-tiny.json"),
    os.path.join(REPO, "presets", "decoder.json"),
]
MODES = ("none", "selective", "full")
# Megatron-LM's recompute_modules, each checkpointed with torch.utils.checkpoint around its module
# (validation/recompute_modules.py sets it): "layernorm" (both norms), "mlp", "moe", "moe_act" (an
# expert's activation and gate x up product).
RECOMPUTE_MODULES: frozenset = frozenset()
DEFAULT_SEQS = (16, 32)
DEFAULT_BATCHES = (1, 2)

# The documented differences between what this script measures (torch 1.13 on CPU) and what memcalc
# predicts (current CUDA PyTorch, 2.2 or later).  --compare passes a row only when measured - predicted
# equals exactly the sum of the effects that apply to it; every other difference fails the run.
# Each entry: (reason, applies(spec, mode, region), bytes(spec, s, b) = measured - predicted).
def _rms(spec, region):
    """The widths (in units of h, as a Fraction) of the RMSNorms of a region."""
    if spec.norm != "rmsnorm":
        return 0
    if region == "head":
        return 1
    qk = Fraction(spec.heads * spec.head_dim + spec.kv_heads * spec.head_dim, spec.hidden) \
        if spec.qk_norm in ("whole", "l2") else 0
    return spec.norms_per_layer + qk


def _latent_norm_width(spec, region):
    """The widths latent attention's RMSNorms normalise (q_a_layernorm, kv_a_layernorm), and a Mamba mixer's
    (dt_layernorm, b_layernorm, c_layernorm), in a layer."""
    if region != "layer":
        return 0
    mamba = spec.mamba_dt_rank + 2 * spec.mamba_state if spec.mixer == "mamba" and spec.mamba_inner_norms else 0
    return spec.q_lora_rank + spec.kv_lora_rank + mamba


KNOWN_EFFECTS = [
    ("torch < 2.2: mean() saves its input, so each RMSNorm also keeps x^2 in fp32, 4 s b h bytes "
     "(4 s b r for latent attention's norms of a latent r wide, 4 s b (a + k) d for q/k norms, and for a Mamba "
     "mixer's norms of dt, B and C, r + 2N wide; PyTorch PR #109935 keeps only the sizes; "
     "memcalc models the newer behaviour)",
     lambda spec, mode, region: mode != "full" and _rms(spec, region) > 0,
     lambda spec, s, b, region: int(4 * s * b * (spec.hidden * _rms(spec, region) + _latent_norm_width(spec, region)))),
    ("micro-batch 1 with one KV head: torch.matmul broadcasts K and V over the heads as a view; memcalc "
     "counts the repeated copies that b >= 2 (and repeat_kv) materialise, 2 x 2 s (heads - 1) head_dim bytes",
     lambda spec, mode, region: region == "layer" and mode == "none" and spec.kv_heads == 1 and spec.heads > 1,
     lambda spec, s, b, region: -4 * s * (spec.heads - 1) * spec.head_dim if b == 1 else 0),
    ("Falcon's code (with more than one KV head) repeats k and v to every query head before the core attention, so selective "
     "recomputation's checkpoint keeps the repeated copies; memcalc repeats them inside the core attention "
     "(as Megatron-LM and transformers' LLaMA do) and keeps k and v at their own width: 2 x 2 s b (heads - "
     "kv_heads) head_dim bytes",
     lambda spec, mode, region: region == "layer" and mode == "selective" and spec.style == "falcon"
     and 1 < spec.kv_heads < spec.heads,
     lambda spec, s, b, region: 4 * s * b * (spec.heads - spec.kv_heads) * spec.head_dim),
    ("gpt-oss's router (top-k of the logits, a bf16 softmax over those k) is counted as Mixtral's (an fp32 "
     "softmax over all E, top-k, an fp32 renormalisation and its sum), which leans high: (4 E + 2 k + 4) s b "
     "bytes",
     lambda spec, mode, region: region == "layer" and mode != "full" and spec.stacked_experts,
     lambda spec, s, b, region: -(4 * spec.experts + 2 * spec.experts_per_token + 4) * s * b),
    ("gpt-oss's loop copies the weights of the experts that got tokens; memcalc counts all E: 2 x 3 h f bytes "
     "and an 8-byte id less per expert left without tokens, and 2 bytes less per expert given one slot, whose "
     "gathered routing weight is a one-element tensor the hooks class as a scalar",
     lambda spec, mode, region: region == "layer" and mode != "full" and spec.stacked_experts,
     lambda spec, s, b, region: -sum(6 * spec.hidden * spec.ffn + 8 for n in spec.routing if n == 0)
     - sum(2 for n in spec.routing if n == 1)),
    ("an expert given exactly one token-slot: its gathered routing weight is a one-element tensor, which the "
     "hooks class as a scalar: 2 bytes less per such expert (memcalc counts every slot's weight)",
     lambda spec, mode, region: region == "layer" and mode != "full" and spec.experts > 0 and not spec.stacked_experts,
     lambda spec, s, b, region: -sum(2 for n in spec.routing if n == 1)),
    ("micro-batch 1: transformers pads the labels to s + 1 and shifts them; one row is already contiguous, so "
     "the loss keeps a view of the padded storage, 8 bytes more than memcalc's s b int64 targets",
     lambda spec, mode, region: region == "head",
     lambda spec, s, b, region: 8 if b == 1 else 0),
]


def explained_difference(spec, mode, s, b, region):
    """The exact measured - predicted difference the documented effects account for, and their reasons."""
    effects = [(name, f(spec, s, b, region)) for name, applies, f in KNOWN_EFFECTS if applies(spec, mode, region)]
    effects = [(n, v) for n, v in effects if v]
    return sum(v for _, v in effects), [n for n, _ in effects]


# "functional": torch's own F.dropout as it runs on CPU, which multiplies by a noise tensor of the
# input's dtype (2 bytes per element in bf16): what memcalc --platform cpu predicts.  "native":
# torch.native_dropout, the kernel F.dropout dispatches to on CUDA (a bool mask, 1 byte per element),
# to see CUDA's figure on a CPU (--measure only).
DROPOUT_KERNEL = "functional"


# --------------------------------------------------------------------------------------------------
# Model file
# --------------------------------------------------------------------------------------------------

@dataclass
class Spec:
    path: str
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_positions: int
    mlp: str
    norm: str
    bias: str
    position: str
    tied_embeddings: bool
    experts: int
    experts_per_token: int
    activation: str
    parallel_attention: bool
    norms_per_layer: int
    attention_dropout: float
    hidden_dropout: float
    mlp_dropout: float = 0.0
    embedding_norm: bool = False
    shared_ffn: int = 0
    shared_expert_gate: bool = False
    renormalize_topk: bool = True
    q_lora_rank: int = 0       # latent attention (DeepSeek); kv_lora_rank 0: none
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    index_n_heads: int = 0     # DeepSeek-V3.2's sparse-attention indexer; 0: none
    index_head_dim: int = 0
    index_topk: int = 0
    norm_position: str = "pre"
    qk_norm: str = "none"
    rmsnorm_fp32_scale: bool = False
    attention_sinks: bool = False
    stacked_experts: bool = False
    softmax_fp32: bool = True
    attention_chunk: int = 0
    attention_temperature: bool = False
    expert_dispatch: str = "routed"
    router: str = "softmax_topk"
    input_jitter: float = 0.0
    mixer: str = "attention"   # "mamba": JambaMambaMixer's slow path in place of attention
    mamba_inner: int = 0
    mamba_state: int = 0
    mamba_conv: int = 0
    mamba_dt_rank: int = 0
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_inner_norms: bool = False
    style: str = ""
    routing: List[int] = field(default_factory=list)  # slots per expert of layer 0's last forward (gpt-oss)


def _choice(doc, key, allowed, default):
    v = doc.get(key, default)
    if v not in allowed:
        raise ValueError(f"'{key}' must be one of {', '.join(allowed)} (got {v!r})")
    return v


def load_spec(path: str) -> Spec:
    with open(path) as f:
        doc = json.load(f)
    for k in ("hidden", "layers", "heads", "ffn", "vocab"):
        if k not in doc:
            raise ValueError(f"{path}: missing required key '{k}'")
    mlp = _choice(doc, "mlp", ("gated", "plain"), "gated")
    parallel = bool(doc.get("parallel_attention", False))
    heads = int(doc["heads"])
    spec = Spec(
        path=path,
        name=str(doc.get("name", os.path.splitext(os.path.basename(path))[0])),
        hidden=int(doc["hidden"]),
        layers=int(doc["layers"]),
        heads=heads,
        kv_heads=int(doc.get("kv_heads", heads)),
        head_dim=int(doc.get("head_dim", int(doc["hidden"]) // heads)),
        ffn=int(doc["ffn"]),
        vocab=int(doc["vocab"]),
        max_positions=int(doc.get("max_positions", 0) or 0),
        mlp=mlp,
        norm=_choice(doc, "norm", ("rmsnorm", "layernorm"), "rmsnorm"),
        bias=_choice(doc, "bias", ("none", "qkv", "attention", "all"), "none"),
        position=_choice(doc, "position", ("rotary", "learned", "none"), "rotary"),
        tied_embeddings=bool(doc.get("tied_embeddings", False)),
        experts=int(doc.get("experts", 0) or 0),
        experts_per_token=int(doc.get("experts_per_token", 0) or 0),
        activation=_choice(doc, "activation", tuple(FUNCTIONS), "silu" if mlp == "gated" else "gelu_tanh"),
        parallel_attention=parallel,
        norms_per_layer=int(doc.get("norms_per_layer", 2)),  # memcalc's default, parallel or not
        attention_dropout=float(doc.get("attention_dropout", 0.0)),
        hidden_dropout=float(doc.get("hidden_dropout", 0.0)),
        mlp_dropout=float(doc.get("mlp_dropout", 0.0)),
        embedding_norm=bool(doc.get("embedding_norm", False)),
        shared_ffn=int(doc.get("shared_ffn", 0) or 0),
        shared_expert_gate=bool(doc.get("shared_expert_gate", False)),
        renormalize_topk=bool(doc.get("renormalize_topk", True)),
        q_lora_rank=int(doc.get("q_lora_rank", 0) or 0),
        kv_lora_rank=int(doc.get("kv_lora_rank", 0) or 0),
        qk_nope_head_dim=int(doc.get("qk_nope_head_dim", 0) or 0),
        qk_rope_head_dim=int(doc.get("qk_rope_head_dim", 0) or 0),
        v_head_dim=int(doc.get("v_head_dim", 0) or 0),
        index_n_heads=int(doc.get("index_n_heads", 0) or 0),
        index_head_dim=int(doc.get("index_head_dim", 0) or 0),
        index_topk=int(doc.get("index_topk", 0) or 0),
        norm_position=_choice(doc, "norm_position", ("pre", "post"), "pre"),
        qk_norm=_choice(doc, "qk_norm", ("none", "whole", "l2"), "none"),
        rmsnorm_fp32_scale=bool(doc.get("rmsnorm_fp32_scale", False)),
        attention_sinks=bool(doc.get("attention_sinks", False)),
        stacked_experts=bool(doc.get("stacked_experts", False)),
        softmax_fp32=bool(doc.get("softmax_fp32", True)),
        attention_chunk=int(doc.get("attention_chunk", 0) or 0),
        attention_temperature=bool(doc.get("attention_temperature", False)),
        expert_dispatch=_choice(doc, "expert_dispatch", ("routed", "every_token"), "routed"),
        router=_choice(doc, "router", ("softmax_topk", "sparsemixer"), "softmax_topk"),
        input_jitter=float(doc.get("input_jitter", 0.0)),
        mixer=_choice(doc, "mixer", ("attention", "mamba"), "attention"),
        mamba_inner=int(doc.get("mamba_inner", 0) or 0),
        mamba_state=int(doc.get("mamba_state", 0) or 0),
        mamba_conv=int(doc.get("mamba_conv", 0) or 0),
        mamba_dt_rank=int(doc.get("mamba_dt_rank", 0) or 0),
        mamba_conv_bias=bool(doc.get("mamba_conv_bias", True)),
        mamba_proj_bias=bool(doc.get("mamba_proj_bias", False)),
        mamba_inner_norms=bool(doc.get("mamba_inner_norms", False)),
    )
    if spec.mixer == "mamba" and bool(doc.get("mamba_kernels", True)):
        raise ValueError(f"{path}: mamba_kernels true (mamba_ssm's CUDA kernels) cannot run here; set it false")
    if spec.kv_lora_rank:  # q and k heads are d_n + d_r wide; rotary turns d_r
        spec.head_dim = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    if spec.heads % spec.kv_heads:
        raise ValueError(f"{path}: heads ({spec.heads}) must be a multiple of kv_heads ({spec.kv_heads})")
    if spec.experts and not (0 < spec.experts_per_token <= spec.experts):
        raise ValueError(f"{path}: experts_per_token must be in 1..experts")
    if parallel and spec.norms_per_layer not in (1, 2):
        raise ValueError(f"{path}: parallel attention takes norms_per_layer 1 or 2")
    if not parallel and spec.norms_per_layer not in (2, 4):
        raise ValueError(f"{path}: sequential layers take norms_per_layer 2 or 4")
    if parallel:
        spec.style = "falcon"
    elif spec.kv_lora_rank:
        spec.style = "deepseek"
    elif spec.experts:
        spec.style = "llama4" if spec.expert_dispatch == "every_token" else "mixtral"
    elif spec.norm == "layernorm" and spec.position != "rotary":
        spec.style = "gpt2"
    else:
        spec.style = "qwen2" if spec.bias == "qkv" else "llama"
    if spec.mixer == "mamba":  # a label only: the layer's MLP or experts are those of the style above
        spec.style = "mamba"
    if spec.style == "gpt2" and spec.kv_heads != spec.heads:
        raise ValueError(f"{path}: GPT-2 style attention has no grouped-query variant")
    return spec


# --------------------------------------------------------------------------------------------------
# Building blocks (HF eager op sequences)
# --------------------------------------------------------------------------------------------------

def dropout(x, p, training=True):
    if p <= 0 or not training:
        return x  # F.dropout returns its input unchanged for p == 0
    if DROPOUT_KERNEL == "native":
        return torch.native_dropout(x, p, True)[0]
    return F.dropout(x, p, True)


def act_fn(name):
    return FUNCTIONS[name]  # as the modeling code writes each (validation/activation_functions.py)


class RMSNorm(nn.Module):
    """transformers LlamaRMSNorm; fp32_scale: Olmo2RMSNorm / GptOssRMSNorm (weight times the fp32 result)."""

    def __init__(self, h, eps=1e-6, fp32_scale=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps
        self.fp32_scale = fp32_scale

    def forward(self, x):
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if self.fp32_scale:
            return (self.weight * x).to(input_dtype)
        return self.weight * x.to(input_dtype)


def make_norm(spec, width=None):
    if spec.norm == "rmsnorm":
        return RMSNorm(width or spec.hidden, fp32_scale=spec.rmsnorm_fp32_scale)
    return nn.LayerNorm(spec.hidden, eps=1e-5)


@dataclass
class Ctx:
    """Tensors made once per model forward and shared by every layer."""
    mask: Optional[torch.Tensor] = None
    cos: Optional[torch.Tensor] = None
    sin: Optional[torch.Tensor] = None
    position_ids: Optional[torch.Tensor] = None


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(x, n_rep):
    b, kv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class GatedMLP(nn.Module):
    """LlamaMLP / MixtralBlockSparseTop2MLP: down(act(gate(x)) * up(x))."""

    def __init__(self, spec, bias):
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden, spec.ffn, bias=bias)
        self.up_proj = nn.Linear(spec.hidden, spec.ffn, bias=bias)
        self.down_proj = nn.Linear(spec.ffn, spec.hidden, bias=bias)
        self.act = act_fn(spec.activation)
        self.p = spec.mlp_dropout
        self.expert = False  # SparseMoE marks its experts

    def forward(self, x):
        if self.expert and "moe_act" in RECOMPUTE_MODULES:
            glu = _ckpt(lambda g, u: self.act(g) * u, self.gate_proj(x), self.up_proj(x))
            return self.down_proj(dropout(glu, self.p))
        return self.down_proj(dropout(self.act(self.gate_proj(x)) * self.up_proj(x), self.p))


class PlainMLP(nn.Module):
    """fc2(act(fc1(x))) with nn.Linear (Falcon's FalconLinear is input @ W.T, the same ops)."""

    def __init__(self, spec, bias):
        super().__init__()
        self.fc1 = nn.Linear(spec.hidden, spec.ffn, bias=bias)
        self.fc2 = nn.Linear(spec.ffn, spec.hidden, bias=bias)
        self.act = act_fn(spec.activation)
        self.p = spec.mlp_dropout

    def forward(self, x):
        return self.fc2(dropout(self.act(self.fc1(x)), self.p))


def make_mlp(spec, bias):
    return GatedMLP(spec, bias) if spec.mlp == "gated" else PlainMLP(spec, bias)


class HeunCorrection(torch.autograd.Function):
    """PhimoeSparseMoeBlock's MultiplierProcessor: keeps the gathered weight, the sampled index and the
    softmax for its backward, returns weight x mask_for_one; the gradient goes to the logits alone."""

    @staticmethod
    def forward(ctx, scores, weight, index, probs, mask_for_one):
        ctx.save_for_backward(weight, index, probs)
        return weight * mask_for_one

    @staticmethod
    def backward(ctx, grad):
        weight, index, probs = ctx.saved_tensors
        grad = grad * weight
        grad_scores = probs * grad.mul(-1)
        grad_scores.scatter_add_(dim=-1, index=index, src=grad)
        return grad_scores, None, None, None, None


def sparsemixer(scores, eps):
    """Phi-3.5-MoE's router in training: two passes of a masked softmax, a Gumbel-sampled expert, its
    gathered weight and the Heun correction; the first pass's expert masked out of the second."""
    weights, picks = [], []
    masked_scores = scores
    for n in range(2):
        with torch.no_grad():
            best, _ = masked_scores.max(dim=-1, keepdim=True)
            factor = scores.abs().clamp(min=best)
            far = ((best - scores) / factor) > (2 * eps)
        gates = masked_scores.masked_fill(far, float("-inf"))
        noise = torch.empty_like(gates, memory_format=torch.legacy_contiguous_format).exponential_().log()
        pick = (gates - noise).max(dim=-1)[1].unsqueeze(-1)
        probs = torch.softmax(gates, dim=-1)
        weight = probs.gather(dim=-1, index=pick)
        with torch.no_grad():  # transformers' max here builds a node whose values die at once, freeing its indices
            top, top_ind = probs.max(dim=-1, keepdim=True)
        mask_for_one = torch.logical_or(pick == top_ind, torch.rand_like(top) > 0.75)
        mask_for_one = torch.add(0.3333, mask_for_one, alpha=0.6667).type_as(probs)
        weights.append(HeunCorrection.apply(scores, weight, pick, probs, mask_for_one))
        picks.append(pick)
        if n == 0:
            masked_scores = torch.scatter(scores, -1, pick, float("-inf"))
    return torch.concat(weights, dim=-1), torch.concat(picks, dim=-1)


class SparseMoE(nn.Module):
    """transformers MixtralSparseMoeBlock (loop over the experts that got tokens); with a shared expert,
    Qwen2MoeSparseMoeBlock."""

    def __init__(self, spec):
        super().__init__()
        self.E, self.k, self.h = spec.experts, spec.experts_per_token, spec.hidden
        self.renormalize = spec.renormalize_topk
        self.sparsemixer, self.input_jitter = spec.router == "sparsemixer", spec.input_jitter
        self.slots = [0] * self.E  # slots per expert in the last forward (for the compare's routing effect)
        self.gate = nn.Linear(spec.hidden, spec.experts, bias=False)
        self.experts = nn.ModuleList([make_mlp(spec, spec.bias == "all") for _ in range(spec.experts)])
        self.shared_expert = make_mlp(replace(spec, ffn=spec.shared_ffn), False) if spec.shared_ffn else None
        self.shared_expert_gate = nn.Linear(spec.hidden, 1, bias=False) if spec.shared_expert_gate else None
        for expert in self.experts:
            expert.expert = True

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        if self.input_jitter > 0:  # PhimoeSparseMoeBlock: in place, in training
            hidden_states *= torch.empty_like(hidden_states).uniform_(1.0 - self.input_jitter, 1.0 + self.input_jitter)
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        if self.sparsemixer:
            routing_weights, selected_experts = sparsemixer(router_logits, 0.01)
        else:
            routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
            routing_weights, selected_experts = torch.topk(routing_weights, self.k, dim=-1)
            if self.renormalize:
                routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final_hidden_states = torch.zeros((batch_size * sequence_length, hidden_dim),
                                          dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.E).permute(2, 1, 0)
        # One sum, as transformers' block makes: the slots per expert (for the compare's effects) read
        # from the same tensor as the experts hit (kernel_launches.py counts this block's kernels).
        per_expert = expert_mask.sum(dim=(-1, -2))
        self.slots = per_expert.tolist()
        expert_hit = (per_expert > 0).nonzero(as_tuple=True)[0].tolist()
        for expert_idx in expert_hit:
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        if self.shared_expert is not None:
            shared_expert_output = self.shared_expert(hidden_states)
            if self.shared_expert_gate is not None:
                shared_expert_output = torch.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output  # F.sigmoid in transformers: the same op
            final_hidden_states = final_hidden_states + shared_expert_output
        return final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)


class GptOssMoE(nn.Module):
    """transformers GptOssMLP in training: GptOssTopKRouter (biased Linear, top-k of the logits, softmax
    over those k, scattered into E columns) and GptOssExperts' loop over the hit experts, which indexes
    the stacked gate_up_proj / down_proj (and their biases) with a tensor per expert."""

    def __init__(self, spec):
        super().__init__()
        E, h, f = spec.experts, spec.hidden, spec.ffn
        self.E, self.k, self.h = E, spec.experts_per_token, h
        self.router_weight = nn.Parameter(torch.empty(E, h))
        self.router_bias = nn.Parameter(torch.zeros(E))
        self.gate_up_proj = nn.Parameter(torch.empty(E, h, 2 * f))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(E, 2 * f))
        self.down_proj = nn.Parameter(torch.empty(E, f, h))
        self.down_proj_bias = nn.Parameter(torch.zeros(E, h))
        self.alpha, self.limit = 1.702, 7.0
        self.slots = [0] * E  # slots per expert in the last forward (for the compare's routing effect)

    def forward(self, x):
        batch_size = x.shape[0]
        hidden_states = x.reshape(-1, self.h)
        router_logits = F.linear(hidden_states, self.router_weight, self.router_bias)
        top_value, router_indices = torch.topk(router_logits, self.k, dim=-1)
        top_value = F.softmax(top_value, dim=1, dtype=top_value.dtype)
        routing_weights = torch.zeros_like(router_logits).scatter_(1, router_indices, top_value)
        next_states = torch.zeros_like(hidden_states)
        with torch.no_grad():
            expert_mask = F.one_hot(router_indices, num_classes=self.E).permute(2, 1, 0)
            expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        self.slots = [0] * self.E
        for expert_idx in expert_hit[:]:
            with torch.no_grad():
                _, token_idx = torch.where(expert_mask[expert_idx[0]])
            self.slots[int(expert_idx[0])] = len(token_idx)
            current_state = hidden_states[token_idx]
            gate_up = current_state @ self.gate_up_proj[expert_idx] + self.gate_up_proj_bias[expert_idx]
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate = gate.clamp(min=None, max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            glu = gate * torch.sigmoid(gate * self.alpha)
            out = ((up + 1) * glu) @ self.down_proj[expert_idx] + self.down_proj_bias[expert_idx]
            weighted = out[0] * routing_weights[token_idx, expert_idx, None]
            next_states.index_add_(0, token_idx, weighted.to(hidden_states.dtype))
        return next_states.view(batch_size, -1, self.h)


class Llama4MoE(nn.Module):
    """transformers Llama4TextMoe in training: every expert over every token, the router's sigmoid scores
    multiplied into the repeated input, two bmm with the stacked weights, the shared expert beside."""

    def __init__(self, spec):
        super().__init__()
        E, h, f = spec.experts, spec.hidden, spec.ffn
        self.E, self.k, self.h = E, spec.experts_per_token, h
        self.router = nn.Linear(h, E, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(E, h, 2 * f))
        self.down_proj = nn.Parameter(torch.empty(E, f, h))
        self.act = act_fn(spec.activation)
        self.shared_expert = make_mlp(replace(spec, ffn=spec.shared_ffn), False)

    def forward(self, x):
        shape = x.shape
        hidden_states = x.reshape(-1, self.h)
        router_logits = self.router(hidden_states)
        top_value, router_indices = torch.topk(router_logits, self.k, dim=1)
        router_scores = torch.full_like(router_logits, float("-inf")).scatter_(1, router_indices, top_value)
        router_scores = torch.sigmoid(router_scores.float()).to(router_scores.dtype)
        routed_in = hidden_states.repeat(self.E, 1)
        routed_in = routed_in * router_scores.transpose(0, 1).reshape(-1, 1)
        states = routed_in.view(self.E, -1, self.h)
        gate, up = torch.bmm(states, self.gate_up_proj).chunk(2, dim=-1)
        routed_out = torch.bmm(up * self.act(gate), self.down_proj).view(-1, self.h)
        out = self.shared_expert(hidden_states)
        out.add_(routed_out.reshape(self.E, -1, self.h).sum(dim=0))
        return out.view(shape)


def _ckpt(fn, *args):
    return checkpoint(fn, *args, use_reentrant=True)


class LlamaAttention(nn.Module):
    """LlamaAttention + eager_attention_forward (also Mistral/Mixtral/Qwen2)."""

    def __init__(self, spec):
        super().__init__()
        H, kv, d, h = spec.heads, spec.kv_heads, spec.head_dim, spec.hidden
        qkv_bias = spec.bias in ("qkv", "attention", "all")
        self.q_proj = nn.Linear(h, H * d, bias=qkv_bias)
        self.k_proj = nn.Linear(h, kv * d, bias=qkv_bias)
        self.v_proj = nn.Linear(h, kv * d, bias=qkv_bias)
        self.o_proj = nn.Linear(H * d, h, bias=spec.bias in ("attention", "all"))
        self.head_dim, self.n_rep = d, H // kv
        self.scaling = d ** -0.5
        self.p = spec.attention_dropout
        self.rotary = spec.position == "rotary"
        self.qk_norm = spec.qk_norm == "whole"
        if self.qk_norm:  # Olmo2Attention: over the whole projections
            self.q_norm = make_norm(spec, H * d)
            self.k_norm = make_norm(spec, kv * d)
        self.sinks = nn.Parameter(torch.zeros(H)) if spec.attention_sinks else None
        self.l2_norm = spec.qk_norm == "l2"  # Llama4TextL2Norm, after rotary, no weight
        self.temperature = spec.attention_temperature and not self.rotary
        self.softmax_fp32 = spec.softmax_fp32

    @staticmethod
    def l2(x, eps=1e-5):
        return (lambda f: f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps))(x.float()).type_as(x)

    def core(self, query, key, value, mask):
        key_states = repeat_kv(key, self.n_rep)
        value_states = repeat_kv(value, self.n_rep)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * self.scaling
        if mask is not None:
            attn_weights = attn_weights + mask[:, :, :, : key_states.shape[-2]]
        if self.sinks is not None:  # gpt-oss: a sink column, the row max off, softmax over s + 1, column dropped
            sinks = self.sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
            combined = torch.cat([attn_weights, sinks], dim=-1)
            combined = combined - combined.max(dim=-1, keepdim=True).values
            probs = F.softmax(combined, dim=-1, dtype=combined.dtype)
            attn_weights = dropout(probs[..., :-1], self.p, self.training)
            return torch.matmul(attn_weights, value_states)
        if self.softmax_fp32:
            attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        else:  # Llama 4's eager_attention_forward: in the scores' dtype
            attn_weights = F.softmax(attn_weights, dim=-1)
        attn_weights = dropout(attn_weights, self.p, self.training)
        return torch.matmul(attn_weights, value_states)

    def forward(self, x, ctx: Ctx, selective: bool):
        input_shape = x.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q, k = self.q_proj(x), self.k_proj(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.temperature:  # Llama 4's NoPE layers: per-position scales, (1, s, 1, 1) fp32 over the batch
            with torch.no_grad():
                pos = torch.arange(input_shape[-1], dtype=torch.float32)
                scales = torch.log1p(torch.floor((pos + 1.0) / 8192.0)) * 0.1 + 1.0
                scales = scales.view((1, input_shape[-1], 1, 1)).expand((*input_shape, 1, 1))
            q = (q.view(hidden_shape) * scales).to(q.dtype)
        q = q.view(hidden_shape).transpose(1, 2)
        k = k.view(hidden_shape).transpose(1, 2)
        v = self.v_proj(x).view(hidden_shape).transpose(1, 2)
        if self.rotary:
            q, k = apply_rotary_pos_emb(q, k, ctx.cos, ctx.sin)
        if self.l2_norm and self.rotary:
            q, k = self.l2(q), self.l2(k)
        if selective:
            out = _ckpt(self.core, q, k, v, ctx.mask)
        else:
            out = self.core(q, k, v, ctx.mask)
        out = out.transpose(1, 2).contiguous()
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out)


class SparseIndexer(nn.Module):
    """transformers DeepseekV32Indexer (modeling_deepseek_v32.py): each query's top-k keys, scored
    at index_n_heads heads from the query latent and one k, under torch.no_grad."""

    def __init__(self, spec):
        super().__init__()
        self.heads, self.dim, self.rope = spec.index_n_heads, spec.index_head_dim, spec.qk_rope_head_dim
        self.topk = spec.index_topk
        self.wq_b = nn.Linear(spec.q_lora_rank, self.heads * self.dim, bias=False)
        self.wk = nn.Linear(spec.hidden, self.dim, bias=False)
        self.k_norm = nn.LayerNorm(self.dim, eps=1e-6)
        self.weights_proj = nn.Linear(spec.hidden, self.heads, bias=False)

    @torch.no_grad()
    def forward(self, x, q_latent, cos, sin, mask):
        b, s, _ = x.shape
        q = self.wq_b(q_latent).view(b, s, self.heads, self.dim)
        q_rot, q_pass = torch.split(q, [self.rope, self.dim - self.rope], dim=-1)
        k = self.k_norm(self.wk(x)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [self.rope, self.dim - self.rope], dim=-1)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # apply_rotary_pos_emb(..., unsqueeze_dim=2)
        q_rot = (q_rot * cos) + (rotate_half(q_rot) * sin)
        k_rot = (k_rot * cos) + (rotate_half(k_rot) * sin)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.dim ** -0.5
        scores = F.relu(scores)
        weights = self.weights_proj(x.to(self.weights_proj.weight.dtype)).float() * self.heads ** -0.5
        index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
        index_scores = index_scores + mask
        return index_scores.topk(min(self.topk, s), dim=-1).indices.to(torch.int32)


class LatentAttention(nn.Module):
    """transformers DeepseekV3Attention + eager_attention_forward (multi-head latent attention)."""

    def __init__(self, spec):
        super().__init__()
        H, h = spec.heads, spec.hidden
        self.nope, self.rope, self.v_dim = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
        self.qk, self.latent = self.nope + self.rope, spec.kv_lora_rank
        self.sinks, self.softmax_fp32 = None, True  # LlamaAttention's core, which it reuses, reads them
        bias = spec.bias == "attention"  # attention_bias
        self.q_lora = spec.q_lora_rank > 0
        if self.q_lora:
            self.q_a_proj = nn.Linear(h, spec.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(spec.q_lora_rank)
            self.q_b_proj = nn.Linear(spec.q_lora_rank, H * self.qk, bias=False)
        else:
            self.q_proj = nn.Linear(h, H * self.qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.latent + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.latent)
        self.kv_b_proj = nn.Linear(self.latent, H * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(H * self.v_dim, h, bias=bias)
        self.scaling, self.n_rep = self.qk ** -0.5, 1  # one key/value group: k and v at every head
        self.p = spec.attention_dropout
        self.indexer = SparseIndexer(spec) if spec.index_n_heads else None

    core = LlamaAttention.core  # eager_attention_forward

    def up(self, b, s, q_in, kv_in, k_rot, cos, sin):
        """q_b_proj (or q_proj), kv_b_proj, rotary and the concatenations: Megatron-LM's mla_up_proj."""
        q = self.q_b_proj(q_in) if self.q_lora else self.q_proj(q_in)
        q = q.view(b, s, -1, self.qk).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [self.nope, self.rope], dim=-1)
        ctx = Ctx(cos=cos, sin=sin)
        k_pass = self.kv_b_proj(kv_in).view(b, s, -1, self.nope + self.v_dim).transpose(1, 2)
        k_pass, value = torch.split(k_pass, [self.nope, self.v_dim], dim=-1)
        k_rot = k_rot.view(b, 1, s, self.rope)
        q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, ctx.cos, ctx.sin)
        k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
        query = torch.cat((q_pass, q_rot), dim=-1)
        key = torch.cat((k_pass, k_rot), dim=-1)
        return query, key, value

    def forward(self, x, ctx: Ctx, selective: bool):
        b, s = x.shape[:-1]
        q_in = self.q_a_layernorm(self.q_a_proj(x)) if self.q_lora else x
        compressed_kv = self.kv_a_proj_with_mqa(x)
        k_pass, k_rot = torch.split(compressed_kv, [self.latent, self.rope], dim=-1)
        kv_in = self.kv_a_layernorm(k_pass)
        if "mla_up_proj" in RECOMPUTE_MODULES:  # Megatron-LM's: the up projections and rotary, checkpointed
            query, key, value = _ckpt(lambda *a: self.up(b, s, *a), q_in, kv_in, k_rot, ctx.cos, ctx.sin)
        else:
            query, key, value = self.up(b, s, q_in, kv_in, k_rot, ctx.cos, ctx.sin)
        mask = ctx.mask
        if self.indexer is not None:  # DeepseekV32Attention (eager): the top-k as an additive mask
            top = self.indexer(x, q_in, ctx.cos, ctx.sin, mask[:, 0])
            index_mask = top.new_ones((b, s, s), dtype=torch.bool).scatter(-1, top.long(), False)
            mask = mask.masked_fill(index_mask.unsqueeze(1), torch.finfo(x.dtype).min)
        out = _ckpt(self.core, query, key, value, mask) if selective else self.core(query, key, value, mask)
        out = out.transpose(1, 2).contiguous()
        return self.o_proj(out.reshape(b, s, -1).contiguous())


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D (weight stored in x out)."""

    def __init__(self, nf, nx, bias):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf)) if bias else None

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        if self.bias is not None:
            x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        else:
            x = torch.mm(x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class GPT2Attention(nn.Module):
    def __init__(self, spec):
        super().__init__()
        H, d, h = spec.heads, spec.head_dim, spec.hidden
        mp = spec.max_positions
        self.register_buffer("bias", torch.tril(torch.ones((mp, mp), dtype=torch.bool)).view(1, 1, mp, mp),
                             persistent=False)
        self.c_attn = Conv1D(3 * H * d, h, spec.bias in ("qkv", "attention", "all"))
        self.c_proj = Conv1D(h, H * d, spec.bias in ("attention", "all"))
        self.H, self.d = H, d
        self.p_attn, self.p_resid = spec.attention_dropout, spec.hidden_dropout

    def core(self, query, key, value):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype,
                                                 device=attn_weights.device)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length: key_length, :key_length]
        mask_value = torch.full([], torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        attn_weights = F.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(value.dtype)
        attn_weights = dropout(attn_weights, self.p_attn, self.training)
        return torch.matmul(attn_weights, value)

    def forward(self, x, ctx: Ctx, selective: bool):
        query, key, value = self.c_attn(x).split(self.H * self.d, dim=2)
        shape = (*x.shape[:-1], -1, self.d)
        query = query.view(shape).transpose(1, 2)
        key = key.view(shape).transpose(1, 2)
        value = value.view(shape).transpose(1, 2)
        out = _ckpt(self.core, query, key, value) if selective else self.core(query, key, value)
        out = out.transpose(1, 2)
        out = out.reshape(*out.shape[:-2], -1).contiguous()
        out = self.c_proj(out)
        return dropout(out, self.p_resid, self.training)


class GPT2MLP(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.c_fc = Conv1D(spec.ffn, spec.hidden, spec.bias == "all")
        self.c_proj = Conv1D(spec.hidden, spec.ffn, spec.bias == "all")
        self.act = act_fn(spec.activation)
        self.p, self.p_mlp = spec.hidden_dropout, spec.mlp_dropout

    def forward(self, x):
        return dropout(self.c_proj(dropout(self.act(self.c_fc(x)), self.p_mlp)), self.p, self.training)


class FalconAttention(nn.Module):
    def __init__(self, spec):
        super().__init__()
        H, kv, d, h = spec.heads, spec.kv_heads, spec.head_dim, spec.hidden
        self.H, self.kv, self.d = H, kv, d
        self.multi_query = kv == 1
        self.new_arch = 1 < kv < H
        self.query_key_value = nn.Linear(h, (H + 2 * kv) * d, bias=spec.bias in ("qkv", "attention", "all"))
        self.dense = nn.Linear(H * d, h, bias=spec.bias in ("attention", "all"))
        self.rotary = spec.position == "rotary"
        self.p = spec.attention_dropout  # HF's non-alibi eager path applies none; applied here if > 0

    def _split_heads(self, fused_qkv):
        b, s, _ = fused_qkv.shape
        if self.new_arch:
            qkv = fused_qkv.view(b, s, -1, self.H // self.kv + 2, self.d)
            query = qkv[:, :, :, :-2]
            key = torch.broadcast_to(qkv[:, :, :, [-2]], query.shape)
            value = torch.broadcast_to(qkv[:, :, :, [-1]], query.shape)
            return [t.flatten(2, 3) for t in (query, key, value)]
        if not self.multi_query:
            fused_qkv = fused_qkv.view(b, s, self.H, 3, self.d)
            return fused_qkv[..., 0, :], fused_qkv[..., 1, :], fused_qkv[..., 2, :]
        fused_qkv = fused_qkv.view(b, s, self.H + 2, self.d)
        return fused_qkv[..., :-2, :], fused_qkv[..., [-2], :], fused_qkv[..., [-1], :]

    def core(self, query_layer, key_layer, value_layer, mask):
        attention_scores = query_layer @ key_layer.transpose(-1, -2)
        attention_scores /= math.sqrt(self.d)
        attention_scores = F.softmax(attention_scores + mask, dim=-1, dtype=query_layer.dtype)
        attention_scores = dropout(attention_scores, self.p, self.training)
        return attention_scores @ value_layer

    def forward(self, x, ctx: Ctx, selective: bool):
        fused_qkv = self.query_key_value(x)
        num_kv_heads = self.H if self.new_arch else self.kv
        query_layer, key_layer, value_layer = self._split_heads(fused_qkv)
        b, s, _, _ = query_layer.shape
        query_layer = query_layer.transpose(1, 2).reshape(b, self.H, s, self.d)
        key_layer = key_layer.transpose(1, 2).reshape(b, num_kv_heads, s, self.d)
        value_layer = value_layer.transpose(1, 2).reshape(b, num_kv_heads, s, self.d)
        if self.rotary:
            query_layer, key_layer = apply_rotary_pos_emb(query_layer, key_layer, ctx.cos, ctx.sin)
        mask = ctx.mask[:, :, :, : key_layer.shape[-2]]
        if selective:
            out = _ckpt(self.core, query_layer, key_layer, value_layer, mask)
        else:
            out = self.core(query_layer, key_layer, value_layer, mask)
        out = out.view(b, self.H, s, self.d).permute(0, 2, 1, 3).reshape(b, s, self.H * self.d)
        return self.dense(out)


class MambaMixer(nn.Module):
    """transformers JambaMambaMixer.slow_forward (use_mamba_kernels False; MambaMixer's without the inner
    norms), in training with no cache and no padding mask: in_proj, depthwise causal conv1d, SiLU, x_proj
    split into dt, B, C (RMSNormed when mamba_inner_norms), dt_proj, softplus, the discretised A and B in
    fp32, the recurrence a step at a time, + u D, gated by SiLU(z), out_proj."""

    def __init__(self, spec):
        super().__init__()
        h, di, n, r, k = spec.hidden, spec.mamba_inner, spec.mamba_state, spec.mamba_dt_rank, spec.mamba_conv
        self.di, self.n, self.r = di, n, r
        self.in_proj = nn.Linear(h, 2 * di, bias=spec.mamba_proj_bias)
        self.conv1d = nn.Conv1d(di, di, k, groups=di, padding=k - 1, bias=spec.mamba_conv_bias)
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)[None, :].expand(di, -1).contiguous()))
        self.D = nn.Parameter(torch.ones(di))
        self.out_proj = nn.Linear(di, h, bias=spec.mamba_proj_bias)
        self.norms = spec.mamba_inner_norms
        if self.norms:
            self.dt_layernorm, self.b_layernorm, self.c_layernorm = RMSNorm(r), RMSNorm(n), RMSNorm(n)

    def forward(self, x, ctx: Ctx, selective: bool):
        b, s, _ = x.shape
        dtype = x.dtype
        projected = self.in_proj(x).transpose(1, 2)
        u, gate = projected.chunk(2, dim=1)
        u = F.silu(self.conv1d(u)[..., :s])
        dt, B, C = torch.split(self.x_proj(u.transpose(1, 2)), [self.r, self.n, self.n], dim=-1)
        if self.norms:
            dt, B, C = self.dt_layernorm(dt), self.b_layernorm(B), self.c_layernorm(C)
        delta = F.softplus(self.dt_proj(dt)).transpose(1, 2)
        A = -torch.exp(self.A_log.float())
        dA = torch.exp(A[None, :, None, :] * delta[:, :, :, None])
        dB = delta[:, :, :, None] * B[:, None, :, :].float()
        dBu = dB * u[:, :, :, None].float()
        state = torch.zeros((b, self.di, self.n), dtype=dtype)
        ys = []
        for i in range(s):
            state = dA[:, :, i, :] * state + dBu[:, :, i, :]
            ys.append(torch.matmul(state.to(dtype), C[:, i, :].unsqueeze(-1))[:, :, 0])
        y = torch.stack(ys, dim=-1)
        y = y + u * self.D[None, :, None]
        y = y * F.silu(gate)
        return self.out_proj(y.transpose(1, 2))


class SequentialLayer(nn.Module):
    """Pre-norm layer: llama, qwen2, mixtral, gpt2 (norms_per_layer 4 adds post-branch norms)."""

    def __init__(self, spec):
        super().__init__()
        self.gpt2 = spec.style == "gpt2"
        self.pre = spec.norm_position == "pre"  # OLMo 2's post: no norm before the branches
        self.norm1 = make_norm(spec) if self.pre else nn.Identity()
        self.norm2 = make_norm(spec) if self.pre else nn.Identity()
        self.sandwich = spec.norms_per_layer == 4 or not self.pre
        if self.sandwich:
            self.post_attn_norm = make_norm(spec)
            self.post_mlp_norm = make_norm(spec)
        if self.gpt2:
            self.attn = GPT2Attention(spec)
            self.mlp = GPT2MLP(spec) if spec.mlp == "plain" else make_mlp(spec, spec.bias == "all")
        else:
            self.attn = MambaMixer(spec) if spec.mixer == "mamba" else \
                LatentAttention(spec) if spec.style == "deepseek" else LlamaAttention(spec)
            self.mlp = (GptOssMoE(spec) if spec.stacked_experts else Llama4MoE(spec)
                        if spec.expert_dispatch == "every_token" else SparseMoE(spec)) if spec.experts \
                else make_mlp(spec, spec.bias == "all")
        # GPT-2's dropouts live inside its attention (resid) and MLP modules.
        self.p_hidden = 0.0 if (self.gpt2 and spec.mlp == "plain") else spec.hidden_dropout
        self.p_attn_out = 0.0 if self.gpt2 else spec.hidden_dropout

    def forward(self, x, ctx: Ctx, selective: bool = False):
        def norm(module, t):
            return _ckpt(module, t) if "layernorm" in RECOMPUTE_MODULES else module(t)

        moe = isinstance(self.mlp, (SparseMoE, Llama4MoE))
        checkpoint_mlp = ("moe" if moe else "mlp") in RECOMPUTE_MODULES
        residual = x
        a = self.attn(norm(self.norm1, x), ctx, selective)
        if self.sandwich:
            a = self.post_attn_norm(a)
        a = dropout(a, self.p_attn_out, self.training)
        x = residual + a
        residual = x
        h = norm(self.norm2, x)
        m = _ckpt(self.mlp, h) if checkpoint_mlp else self.mlp(h)
        if self.sandwich:
            m = self.post_mlp_norm(m)
        m = dropout(m, self.p_hidden, self.training)
        return residual + m


class ParallelLayer(nn.Module):
    """FalconDecoderLayer with parallel_attn (norms_per_layer 1: input_layernorm; 2: ln_attn + ln_mlp)."""

    def __init__(self, spec):
        super().__init__()
        self.two_norms = spec.norms_per_layer == 2
        self.ln_attn = make_norm(spec)
        if self.two_norms:
            self.ln_mlp = make_norm(spec)
        self.self_attention = FalconAttention(spec)
        self.mlp = SparseMoE(spec) if spec.experts else make_mlp(spec, spec.bias == "all")
        self.p = spec.hidden_dropout

    def forward(self, x, ctx: Ctx, selective: bool = False):
        residual = x
        attention_layernorm_out = self.ln_attn(x)
        mlp_layernorm_out = self.ln_mlp(x) if self.two_norms else attention_layernorm_out
        attention_output = self.self_attention(attention_layernorm_out, ctx, selective)
        mlp_output = self.mlp(mlp_layernorm_out)
        mlp_output += attention_output
        return residual + dropout(mlp_output, self.p, self.training)  # dropout_add


class Model(nn.Module):
    def __init__(self, spec: Spec):
        super().__init__()
        self.spec = spec
        self.wte = nn.Embedding(spec.vocab, spec.hidden)
        if spec.position == "learned":
            self.wpe = nn.Embedding(spec.max_positions, spec.hidden)
        if spec.embedding_norm:  # e.g. Bloom's word_embeddings_layernorm
            self.emb_norm = make_norm(spec)
        layer_cls = ParallelLayer if spec.parallel_attention else SequentialLayer
        self.layers = nn.ModuleList([layer_cls(spec) for _ in range(spec.layers)])
        self.norm_f = make_norm(spec)
        if not spec.tied_embeddings:
            self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.position == "rotary":
            d = spec.qk_rope_head_dim if spec.kv_lora_rank else spec.head_dim
            self.register_buffer("inv_freq", 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)),
                                 persistent=False)

    def make_ctx(self, b, s, device) -> Ctx:
        spec = self.spec
        ctx = Ctx()
        with torch.no_grad():
            ctx.position_ids = torch.arange(s, device=device).unsqueeze(0)
            if spec.position == "rotary":  # LlamaRotaryEmbedding.forward, once per model (HF >= 4.45)
                inv = self.inv_freq.float()[None, :, None].expand(ctx.position_ids.shape[0], -1, 1)
                pos = ctx.position_ids[:, None, :].float()
                freqs = (inv @ pos).transpose(1, 2)
                emb = torch.cat((freqs, freqs), dim=-1)
                ctx.cos, ctx.sin = emb.cos().to(DTYPE), emb.sin().to(DTYPE)
            if spec.style != "gpt2":  # HF _update_causal_mask (eager): 4-D additive bf16 mask
                m = torch.full((s, s), torch.finfo(DTYPE).min, dtype=DTYPE, device=device).triu(1)
                if spec.attention_chunk:  # create_chunked_causal_mask: each query within its own chunk, s x s
                    chunk = torch.arange(s, device=device) // spec.attention_chunk
                    m = m.masked_fill(chunk[:, None] != chunk[None, :], torch.finfo(DTYPE).min)
                ctx.mask = m[None, None, :, :].expand(b, 1, -1, -1)
        return ctx

    def run_layer(self, i, x, ctx: Ctx, mode: str):
        layer = self.layers[i]
        if mode == "full":
            if ctx.mask is None:  # GPT2Model: checkpoint(block, hidden_states, None, ...)
                return _ckpt(lambda h: layer(h, ctx, False), x)

            def fn(h, mask, position_ids, position_embeddings):
                c = Ctx(mask=mask, cos=position_embeddings[0], sin=position_embeddings[1],
                        position_ids=position_ids)
                return layer(h, c, False)
            return _ckpt(fn, x, ctx.mask, ctx.position_ids, (ctx.cos, ctx.sin))
        return layer(x, ctx, mode == "selective")

    def forward(self, input_ids, labels, mode, rec=None):
        spec = self.spec
        b, s = input_ids.shape
        set_region = (lambda r: setattr(rec, "region", r)) if rec else (lambda r: None)
        set_region("embedding")
        ctx = self.make_ctx(b, s, input_ids.device)
        x = self.wte(input_ids)
        if not x.requires_grad:  # frozen embeddings: transformers' enable_input_require_grads (see the docstring)
            x.requires_grad_(True)
        if spec.position == "learned":
            x = x + self.wpe(ctx.position_ids)
        if spec.embedding_norm:
            x = self.emb_norm(x)
        if spec.style == "gpt2":
            x = dropout(x, spec.hidden_dropout, self.training)  # GPT2Model.drop (embd_pdrop)
        ios = []
        for i in range(len(self.layers)):
            set_region(f"layer{i}")
            x_in = x
            x = self.run_layer(i, x, ctx, mode)
            ios.append((x_in, x))
        set_region("head")
        h = self.norm_f(x)
        weight = self.wte.weight if spec.tied_embeddings else self.lm_head.weight
        logits = F.linear(h, weight)
        # transformers ForCausalLMLoss: upcast, shift labels by padding, cross-entropy (mean)
        logits_f = logits.float()
        labels = F.pad(labels, (0, 1), value=-100)
        shift_labels = labels[..., 1:].contiguous()
        loss = F.cross_entropy(logits_f.view(-1, spec.vocab), shift_labels.view(-1), ignore_index=-100)
        set_region(None)
        return loss, logits, ctx, ios


def build_model(spec: Spec, seed=0, train: Optional["Train"] = None) -> Model:
    torch.manual_seed(seed)
    m = Model(spec)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
        for mod in m.modules():  # logits wide enough that every expert gets tokens, as memcalc counts
            if isinstance(mod, GptOssMoE):
                mod.router_weight.normal_(0.0, 1.0)

    if train is not None and train.mode != "full":
        apply_training(m, spec, train)  # after the base initialisation: the base weights are full's
    m = m.to(DTYPE).train()
    if train is not None and train.mode == "lora" and train.lora_dtype == "fp32":
        for mod in m.modules():  # peft's get_peft_model(autocast_adapter_dtype=True) upcasts bf16 adapters
            if isinstance(mod, LoraLinear):
                mod.lora_A.float()
                mod.lora_B.float()
                if mod.magnitude is not None:
                    mod.magnitude.data = mod.magnitude.data.float()
    return m


# --------------------------------------------------------------------------------------------------
# Fine-tuning: frozen parts and LoRA adapters (memcalc's --train, --frozen, --lora-*)
# --------------------------------------------------------------------------------------------------

PARTS = ("embeddings", "attention", "mlp", "norms", "head", "router")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Train:
    """One fine-tuning setting, normalised: fields that do not apply to the mode keep their defaults, so
    two settings that train the same way compare (and key) equal."""
    mode: str = "full"                      # full | frozen | lora
    frozen: Tuple[str, ...] = ()            # frozen: parts and/or projection names
    lora_rank: int = 8
    lora_targets: Tuple[str, ...] = ("q_proj", "v_proj")  # or ("all-linear",)
    lora_dropout: float = 0.05
    lora_dtype: str = "bf16"                # fp32: peft's default upcast of bf16 adapters
    lora_variant: str = "lora"              # dora: peft's use_dora=True

    @staticmethod
    def make(mode="full", frozen="", lora_rank=8, lora_targets="q_proj,v_proj", lora_dropout=0.05,
             lora_dtype="bf16", lora_variant="lora") -> "Train":
        def names(v):
            return tuple(x.strip() for x in (v.split(",") if isinstance(v, str) else v) if x.strip())
        if mode == "full":
            return Train()
        if mode == "frozen":
            parts = names(frozen)
            if not parts:
                raise ValueError("--train frozen needs --frozen PARTS")
            for x in parts:
                if x not in PARTS + PROJECTIONS:
                    raise ValueError(f"--frozen: unknown part '{x}' (parts: {', '.join(PARTS)}; "
                                     f"tensors: {', '.join(PROJECTIONS)})")
            return Train("frozen", frozen=tuple(sorted(set(parts), key=(PARTS + PROJECTIONS).index)))
        if mode == "lora":
            targets = names(lora_targets)
            if targets != ("all-linear",):
                for x in targets:
                    if x not in PROJECTIONS:
                        raise ValueError(f"--lora-targets: unknown linear '{x}' (names: {', '.join(PROJECTIONS)}; "
                                         "or all-linear)")
                targets = tuple(sorted(set(targets), key=PROJECTIONS.index))
            if not targets:
                raise ValueError("--lora-targets is empty")
            if int(lora_rank) < 1:
                raise ValueError("--lora-rank must be at least 1")
            if not 0 <= float(lora_dropout) < 1:
                raise ValueError("--lora-dropout must be in [0, 1)")
            if lora_variant not in ("lora", "dora"):
                raise ValueError(f"--lora-variant: unknown '{lora_variant}' (lora, dora)")
            return Train("lora", lora_rank=int(lora_rank), lora_targets=targets, lora_dropout=float(lora_dropout),
                         lora_dtype=lora_dtype, lora_variant=lora_variant)
        raise ValueError(f"--train: unknown mode '{mode}' (full, lora, frozen)")

    def label(self) -> str:
        if self.mode == "frozen":
            return f"frozen {','.join(self.frozen)}"
        if self.mode == "lora":
            return (f"lora r={self.lora_rank} targets={','.join(self.lora_targets)} dropout={self.lora_dropout:g}"
                    + (" fp32 adapters" if self.lora_dtype != "bf16" else "")
                    + (" dora" if self.lora_variant != "lora" else ""))
        return "full"

    def memcalc_flags(self) -> List[str]:
        if self.mode == "frozen":
            return ["--train", "frozen", "--frozen", ",".join(self.frozen)]
        if self.mode == "lora":
            return ["--train", "lora", "--lora-rank", str(self.lora_rank), "--lora-targets",
                    ",".join(self.lora_targets), "--lora-dropout", f"{self.lora_dropout:g}", "--lora-dtype",
                    self.lora_dtype] + (["--lora-variant", self.lora_variant] if self.lora_variant != "lora" else [])
        return []  # full: memcalc's default, no flag (so older builds still answer)

    def row_fields(self) -> dict:
        if self.mode == "frozen":
            return {"train": "frozen", "frozen": ",".join(self.frozen)}
        if self.mode == "lora":
            fields = {"train": "lora", "lora_rank": self.lora_rank, "lora_targets": ",".join(self.lora_targets),
                      "lora_dropout": self.lora_dropout}
            if self.lora_dtype != "bf16":  # rows written before it existed are bf16
                fields["lora_dtype"] = self.lora_dtype
            if self.lora_variant != "lora":  # rows written before it existed are plain LoRA
                fields["lora_variant"] = self.lora_variant
            return fields
        return {"train": "full"}

    @staticmethod
    def from_row(r: dict) -> "Train":
        """A --json row's setting; rows written before these fields existed are full training."""
        return Train.make(r.get("train", "full"), r.get("frozen", ""), r.get("lora_rank", 8),
                          r.get("lora_targets", "q_proj,v_proj"), r.get("lora_dropout", 0.05),
                          r.get("lora_dtype", "bf16"), r.get("lora_variant", "lora"))


def add_train_arguments(ap, how: str):
    """The fine-tuning options, memcalc's --train, --frozen and --lora-* (this script's and
    gpu/replicate.py's), each taking several values, run in turn; `how` adds what the script does with
    them to --train's help."""
    ap.add_argument("--train", nargs="+", choices=("full", "frozen", "lora"), default=["full"],
                    help="what trains (memcalc's --train; default full): frozen parts (--frozen) or LoRA adapters "
                         "beside a frozen base (--lora-*)" + how + "; several: each in turn")
    ap.add_argument("--frozen", nargs="+", metavar="PARTS", default=[""],
                    help="with --train frozen: a comma list of parts (" + ", ".join(PARTS) + ") and/or tensors ("
                    + ", ".join(PROJECTIONS) + ") whose parameters get requires_grad False; several lists: each in turn")
    ap.add_argument("--lora-rank", nargs="+", type=int, metavar="R", default=[8], help="LoRA rank (default 8)")
    ap.add_argument("--lora-targets", nargs="+", metavar="LIST", default=["q_proj,v_proj"],
                    help="the nn.Linear names LoRA wraps, a comma list, or all-linear (every projection of "
                    "attention and MLP/experts, and the MoE router, as peft's); default q_proj,v_proj; several lists: each in turn")
    ap.add_argument("--lora-dropout", nargs="+", type=float, metavar="P", default=[0.05],
                    help="LoRA dropout (default 0.05; 0: peft's nn.Identity)")
    ap.add_argument("--lora-dtype", nargs="+", choices=("bf16", "fp32"), default=["bf16"],
                    help="the adapters' dtype: bf16 as the base (default), or fp32 as peft's get_peft_model "
                         "leaves them by default (autocast_adapter_dtype); memcalc's --lora-dtype alike")
    ap.add_argument("--lora-variant", nargs="+", choices=("lora", "dora"), default=["lora"],
                    help="lora (default) or dora, as peft's use_dora=True runs it (LoraLinear); memcalc's --lora-variant")


def trains_from(a) -> List["Train"]:
    """Every setting add_train_arguments' options name, once each, in order (ValueError for a bad one)."""
    return list(dict.fromkeys(Train.make(m, fz, r, t, p, d, v) for m in a.train for fz in a.frozen for r in a.lora_rank
                              for t in a.lora_targets for p in a.lora_dropout for d in a.lora_dtype
                              for v in a.lora_variant))


class LoraLinear(nn.Module):
    """peft's lora.Linear around a frozen nn.Linear (one adapter, no DoRA, lora_bias False):
    result = base_layer(x); x = x.to(lora_A.weight.dtype) (peft's _cast_input_dtype, a no-op when both are
    bf16); result = result + lora_B(lora_A(dropout(x))) * scaling; result.to(result's dtype).  dropout is
    nn.Dropout(p) for p > 0 and nn.Identity() for p == 0; scaling = lora_alpha / r, a Python float
    (peft's default lora_alpha 8).  lora_A kaiming-uniform, lora_B zeros, as peft initialises them."""

    def __init__(self, base: nn.Linear, r: int, p: float, alpha: float = 8.0, dora: bool = False):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.p = p
        self.scaling = alpha / r
        # DoRA (peft's use_dora): a magnitude per output row, ||W + scaling B A|| at the start (B is zero).
        self.magnitude = nn.Parameter(torch.linalg.norm(base.weight.detach().float(), dim=1)) if dora else None

    def forward(self, x):
        result = self.base_layer(x)
        result_dtype = result.dtype
        x = x if x.dtype == self.lora_A.weight.dtype else x.to(self.lora_A.weight.dtype)
        if self.magnitude is None:
            x = dropout(x, self.p, self.training)  # nn.Dropout is F.dropout; p == 0: nn.Identity
            result = result + self.lora_B(self.lora_A(x)) * self.scaling
        else:
            result = result + self.dora(x, result)
        return result.to(result_dtype)

    def dora(self, x, result):
        """peft's DoraLinearVariant.forward and DoraLinearLayer.forward: with a dropout x is dropped out and
        the base output recomputed from it, F.linear(x, W in x's dtype); without, the base output is reused.
        B A is made by running the adapter over an in x in identity and only its detached norm is used:
        peft's graph for it is freed when the forward returns, so it is made here without one (what
        backward keeps is the same; its bytes are a forward workspace, memcalc's 'DoRA weight norm')."""
        base_result = result
        if self.p > 0 and self.training:
            x = dropout(x, self.p, self.training)
            base_result = None
        weight = self.base_layer.weight.to(x.dtype)
        with torch.no_grad():
            eye = torch.eye(self.base_layer.in_features, device=x.device).to(x.dtype)  # no bf16 eye on CPU in 1.13
            lora_weight = self.lora_B(self.lora_A(eye)).T
            norm = torch.linalg.norm(weight + self.scaling * lora_weight, dim=1).to(weight.dtype)
        scale = (self.magnitude / norm).view(1, -1)
        lora_result = self.lora_B(self.lora_A(x))
        if base_result is None:
            base_result = F.linear(x, weight)
        return (scale - 1) * base_result + scale * lora_result * self.scaling


_NORMS = (RMSNorm, nn.LayerNorm)
_ATTENTION = (LlamaAttention, LatentAttention, GPT2Attention, FalconAttention)


def parameter_parts(model: Model):
    """Every parameter as (qualified name, parameter, part, projection name or ''): norms are every RMSNorm /
    LayerNorm (the final one and q/k norms too), embeddings the token and position tables, head lm_head
    (with tied embeddings the same tensor as the token table), router the MoE gate (and Qwen2-MoE's
    shared_expert_gate, gpt-oss's router), attention and mlp the rest of those modules."""
    out = []
    mods = dict(model.named_modules())
    for mname, mod in mods.items():
        for pname, p in mod.named_parameters(recurse=False):
            comps = mname.split(".") if mname else []
            ancestors = [mods[".".join(comps[:i])] for i in range(1, len(comps))]
            parent = ancestors[-1] if ancestors else model
            if isinstance(mod, _NORMS):
                part = "norms"
            elif isinstance(mod, nn.Embedding):
                part = "embeddings"
            elif mname == "lm_head":
                part = "head"
            elif (isinstance(parent, SparseMoE) and comps[-1] in ("gate", "shared_expert_gate")) or \
                    (isinstance(mod, GptOssMoE) and pname.startswith("router")):
                part = "router"
            elif isinstance(mod, _ATTENTION) or any(isinstance(a, _ATTENTION) for a in ancestors):
                part = "attention"
            elif isinstance(mod, (GatedMLP, PlainMLP, GPT2MLP, SparseMoE, GptOssMoE)) or \
                    any(isinstance(a, (GatedMLP, PlainMLP, GPT2MLP, SparseMoE, GptOssMoE)) for a in ancestors):
                part = "mlp"
            else:
                raise AssertionError(f"unclassified parameter {mname}.{pname}")
            proj = comps[-1] if comps and isinstance(mod, nn.Linear) and comps[-1] in PROJECTIONS else ""
            out.append((f"{mname}.{pname}" if mname else pname, p, part, proj))
    return out


def apply_training(model: Model, spec: Spec, train: "Train"):
    """Freeze the parts (frozen) or every base parameter and wrap the targets in LoRA adapters (lora).
    Raises ValueError, in one line, when a part or target does not exist in this style of layer."""
    parts = parameter_parts(model)
    if train.mode == "frozen":
        for what in train.frozen:
            hit = [p for name, p, part, proj in parts if what in (part, proj)
                   or (what == "head" and spec.tied_embeddings and name == "wte.weight")]  # the tied table
            if not hit:
                raise ValueError(f"--frozen {what}: no such {'tensor' if what in PROJECTIONS else 'part'} "
                                 f"in {spec.name} ({spec.style} style)")
            for p in hit:
                p.requires_grad_(False)
        return
    for _, p, _, _ in parts:
        p.requires_grad_(False)
    layer_linears = [(name, mod) for name, mod in model.layers.named_modules() if isinstance(mod, nn.Linear)]
    if train.lora_targets == ("all-linear",):
        router = {name for name, _, part, _ in parts if part == "router"}
        other = [f"layers.{n}" for n, m in layer_linears if n.split(".")[-1] not in PROJECTIONS
                 and f"layers.{n}.weight" not in router]
        if other or spec.style in ("gpt2", "falcon") or spec.stacked_experts:
            raise ValueError(f"--lora-targets all-linear: {spec.name} ({spec.style} style) has projections "
                             f"other than {', '.join(PROJECTIONS)} (e.g. {other[0] if other else 'fused or stacked'})")
        # peft's all-linear: every nn.Linear but the output layer, the MoE router (gate) among them.
        targets = set(PROJECTIONS) | {n.split(".")[-1] for n, _ in layer_linears if f"layers.{n}.weight" in router}
    else:
        targets = set(train.lora_targets)
        present = {n.split(".")[-1] for n, _ in layer_linears}
        missing = sorted(targets - present, key=PROJECTIONS.index)
        if missing:
            raise ValueError(f"--lora-targets: {spec.name} ({spec.style} style) has no {', '.join(missing)}")
    for name, mod in layer_linears:
        comps = name.split(".")
        if comps[-1] in targets:
            parent = model.layers.get_submodule(".".join(comps[:-1]))
            setattr(parent, comps[-1], LoraLinear(mod, train.lora_rank, train.lora_dropout,
                                                  dora=train.lora_variant == "dora"))


# --------------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------------

def storage_key(t: torch.Tensor) -> Tuple[int, int]:
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return st.data_ptr(), st.nbytes()


@dataclass
class SavedRec:
    idx: int
    region: Optional[str]
    key: Tuple[int, int]
    shape: Tuple[int, ...]
    dtype: torch.dtype
    tensor_bytes: int
    storage_bytes: int
    numel: int
    device: str


class Recorder:
    def __init__(self):
        self.region: Optional[str] = None
        self.saved: List[SavedRec] = []
        self.unpacked: List[int] = []

    def pack(self, t):
        i = len(self.saved)
        key = storage_key(t)
        self.saved.append(SavedRec(i, self.region, key, tuple(t.shape), t.dtype, t.numel() * t.element_size(),
                                   key[1], t.numel(), str(t.device)))
        return (i, t)

    def unpack(self, packed):
        self.unpacked.append(packed[0])
        return packed[1]


@dataclass
class Row:
    idx: Optional[int]        # pack order (None: not seen by the hooks)
    op: str
    attr: str
    shape: Tuple[int, ...]
    dtype: str
    tensor_bytes: int
    storage_bytes: int
    category: str
    counted: int = 0          # bytes this row adds to its category (first sight of the storage)
    same_as: Optional[int] = None
    key: Tuple[int, int] = (0, 0)


@dataclass
class RegionResult:
    by_cat: Dict[str, int] = field(default_factory=dict)    # unique-storage bytes per category (hooks)
    count_by_cat: Dict[str, int] = field(default_factory=dict)
    rows: List[Row] = field(default_factory=list)          # per-op breakdown (graph walk)
    extra: List[str] = field(default_factory=list)         # ctx attributes the hooks do not see
    walk_mismatch: str = ""

    @property
    def kept(self):
        return self.by_cat.get("input", 0) + self.by_cat.get("layer", 0)


def classify(key, numel, input_key, shared_keys, param_keys):
    if key in param_keys:
        return "param"
    if key == input_key:
        return "input"
    if key in shared_keys:
        return "shared"
    if numel <= 1 and key[1] <= 8:  # one element of its own; a one-element view of more (an index row) counts
        return "tiny"
    return "layer"


def _dtype_name(dt):
    return str(dt).replace("torch.", "")


def walk_region(rec: Recorder, root, stop_nodes, input_key, shared_keys, param_keys) -> Tuple[List[Row], List[str]]:
    rows: List[Row] = []
    extra: List[str] = []
    seen = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = node.name()
        if node in stop_nodes or name == "torch::autograd::AccumulateGrad":
            continue
        stack.extend(n for n, _ in node.next_functions)
        tensors = []
        if hasattr(node, "saved_tensors") and not any(a.startswith("_saved_") for a in dir(node)):
            rec.unpacked.clear()
            sts = node.saved_tensors  # custom Function (checkpoint): ctx.save_for_backward
            for j, t in enumerate(sts):
                if isinstance(t, torch.Tensor):
                    tensors.append((f"saved_tensors[{j}]", t, rec.unpacked[j] if j < len(rec.unpacked) else None))
            for a in ("fwd_cpu_state",):
                v = getattr(node, a, None)
                if isinstance(v, torch.Tensor):
                    extra.append(f"{name}.{a}: {tuple(v.shape)} {_dtype_name(v.dtype)} on {v.device}, "
                                 f"{v.numel() * v.element_size()} bytes (ctx attribute; no hook sees it)")
            inputs = getattr(node, "inputs", None)
            if inputs:
                for j, a in enumerate(inputs):
                    if isinstance(a, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in a):
                        extra.append(f"{name}.inputs[{j}]: non-tensor argument holding tensors "
                                     f"{[tuple(t.shape) for t in a if isinstance(t, torch.Tensor)]} "
                                     f"(Python reference in ctx.inputs; no hook sees it)")
        else:
            for a in sorted(dir(node)):
                if not a.startswith("_saved_"):
                    continue
                rec.unpacked.clear()
                v = getattr(node, a)
                if isinstance(v, torch.Tensor):
                    tensors.append((a[len("_saved_"):], v, rec.unpacked[-1] if rec.unpacked else None))
                elif isinstance(v, (list, tuple)):
                    k = 0
                    for j, t in enumerate(v):
                        if isinstance(t, torch.Tensor):
                            tensors.append((f"{a[len('_saved_'):]}[{j}]", t,
                                            rec.unpacked[k] if k < len(rec.unpacked) else None))
                            k += 1
        for attr, t, idx in tensors:
            key = storage_key(t)
            rows.append(Row(idx, name, attr, tuple(t.shape), _dtype_name(t.dtype), t.numel() * t.element_size(),
                            key[1], classify(key, t.numel(), input_key, shared_keys, param_keys), key=key))
    rows.sort(key=lambda r: (r.idx is None, r.idx if r.idx is not None else 0))
    first: Dict[Tuple[int, int], int] = {}
    for n, r in enumerate(rows):
        if r.key in first:
            r.same_as = first[r.key]
        else:
            first[r.key] = r.idx if r.idx is not None else -1
            if r.category != "param":
                r.counted = r.storage_bytes
    return rows, extra


@dataclass
class Measurement:
    spec: Spec
    s: int
    b: int
    mode: str
    layers: List[RegionResult]
    head: RegionResult
    embedding: RegionResult
    shared_bytes: int
    model_union_bytes: int
    logits_bytes: int
    seconds: float


def measure(spec: Spec, model: Model, s: int, b: int, mode: str, seed: int = 1) -> Measurement:
    t0 = time.time()
    torch.manual_seed(seed)
    input_ids = torch.randint(0, spec.vocab, (b, s))
    labels = input_ids.clone()
    rec = Recorder()
    param_keys = {storage_key(p) for p in model.parameters()} | {storage_key(t) for t in model.buffers()}
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        loss, logits, ctx, ios = model(input_ids, labels, mode, rec)
    shared = [t for t in (ctx.mask, ctx.cos, ctx.sin, ctx.position_ids) if t is not None]
    shared_keys = {storage_key(t) for t in shared}

    def region_result(region, root, stop_nodes, input_key):
        res = RegionResult()
        uniq: Dict[Tuple[int, int], SavedRec] = {}
        for r in rec.saved:
            if r.region == region and r.key not in uniq:
                uniq[r.key] = r
        for key, r in uniq.items():
            cat = classify(key, r.numel, input_key, shared_keys, param_keys)
            res.by_cat[cat] = res.by_cat.get(cat, 0) + r.storage_bytes
            res.count_by_cat[cat] = res.count_by_cat.get(cat, 0) + 1
        if root is not None:
            res.rows, res.extra = walk_region(rec, root, stop_nodes, input_key, shared_keys, param_keys)
            walked = {r.key for r in res.rows}
            hooked = set(uniq)
            if walked != hooked:
                res.walk_mismatch = (f"graph walk and hooks disagree: walk-only {len(walked - hooked)}, "
                                     f"hooks-only {len(hooked - walked)} storages")
            for r in res.rows:
                if r.idx is not None and rec.saved[r.idx].region != region:
                    res.walk_mismatch += f" row {r.op}.{r.attr} was saved in region {rec.saved[r.idx].region};"
        return res

    layers = []
    for i, (x_in, x_out) in enumerate(ios):
        stops = {x_in.grad_fn} if x_in.grad_fn is not None else set()
        layers.append(region_result(f"layer{i}", x_out.grad_fn, stops, storage_key(x_in)))
    last = ios[-1][1] if ios else None
    head = region_result("head", loss.grad_fn, {last.grad_fn} if last is not None else set(),
                         storage_key(last) if last is not None else None)
    emb = region_result("embedding", ios[0][0].grad_fn if ios else None, set(), None)

    union: Dict[Tuple[int, int], int] = {}
    for r in rec.saved:
        if r.key not in param_keys:
            union[r.key] = r.storage_bytes
    shared_bytes = sum(v for k, v in union.items() if k in shared_keys)

    loss.backward()  # the graph is valid (and frees the saved tensors)
    return Measurement(spec, s, b, mode, layers, head, emb, shared_bytes, sum(union.values()),
                       logits.numel() * logits.element_size(), time.time() - t0)


def seq_grid(spec: Spec, seqs=None):
    seqs = list(seqs or DEFAULT_SEQS)
    mp = spec.max_positions
    if mp and max(seqs) > mp:
        seqs = sorted({max(1, mp // 2), mp})
    return seqs


def fit_sb(points: List[Tuple[int, int, int]]):
    """Exact fit kept = A*s*b + B*s^2*b.

    Fitted on the points of the largest micro-batch (b = 1 is special in torch.matmul: a K or V that
    is broadcast over heads stays a view when the batch is 1 and is materialised when it is larger).
    Returns (A, B, deviations) with deviations = [(s, b, measured - fit)] for points off the fit, or
    None when there is one sequence length only.
    """
    pts = {(s, b): v for s, b, v in points}
    bmax = max(b for _, b in pts)
    base = sorted((s, v) for (s, b), v in pts.items() if b == bmax)
    if len(base) < 2:
        return None
    (s1, v1), (s2, v2) = base[0], base[-1]
    r1, r2 = Fraction(v1, s1 * bmax), Fraction(v2, s2 * bmax)
    B = (r2 - r1) / (s2 - s1)
    A = r1 - B * s1
    dev = [(s, b, v - (A * s * b + B * s * s * b)) for (s, b), v in sorted(pts.items())
           if v != A * s * b + B * s * s * b]
    return A, B, dev


def _frac(f: Fraction) -> str:
    return str(f.numerator) if f.denominator == 1 else f"{float(f):.3f}"


# --------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------

def describe(spec: Spec) -> str:
    parts = [f"h={spec.hidden}", f"heads={spec.heads}", f"kv_heads={spec.kv_heads}", f"head_dim={spec.head_dim}",
             f"f={spec.ffn}", f"V={spec.vocab}", f"mlp={spec.mlp}/{spec.activation}", f"norm={spec.norm}",
             f"bias={spec.bias}", f"pos={spec.position}", f"norms/layer={spec.norms_per_layer}"]
    if spec.experts:
        parts.append(f"E={spec.experts} k={spec.experts_per_token}")
    if spec.attention_dropout or spec.hidden_dropout:
        parts.append(f"dropout attn={spec.attention_dropout} hidden={spec.hidden_dropout} ({DROPOUT_KERNEL})")
    return " ".join(parts)


def print_rows(res: RegionResult, indent="    "):
    print(f"{indent}{'#':>4} {'op (grad_fn)':<28} {'saved':<16} {'shape':<22} {'dtype':<9} "
          f"{'tensor B':>9} {'storage B':>9} {'category':<8} {'counted':>8}")
    for r in res.rows:
        same = f"(=#{r.same_as})" if r.same_as is not None else ""
        idx = "-" if r.idx is None else str(r.idx)
        counted = str(r.counted) if r.same_as is None else same
        print(f"{indent}{idx:>4} {r.op:<28} {r.attr:<16} {str(r.shape):<22} {r.dtype:<9} "
              f"{r.tensor_bytes:>9} {r.storage_bytes:>9} {r.category:<8} {counted:>8}")
    cats = ", ".join(f"{c} {res.by_cat[c]} B ({res.count_by_cat[c]})" for c in sorted(res.by_cat))
    print(f"{indent}unique storages by category (hooks): {cats}")
    for e in res.extra:
        print(f"{indent}also held: {e}")
    if res.walk_mismatch:
        print(f"{indent}WARNING: {res.walk_mismatch}")


def run_measure(specs: List[Spec], seqs, batches, breakdown: bool,
                trains: Optional[List["Train"]] = None) -> Dict[str, List[Measurement]]:
    out: Dict[str, List[Measurement]] = {}
    for spec, train in [(sp, t) for sp in specs for t in (trains or [Train()])]:
        model = build_model(spec, train=train)
        ms: List[Measurement] = []
        grid = [(s, b) for s in seq_grid(spec, seqs) for b in batches]
        for s, b in grid:
            for mode in MODES:
                ms.append(measure(spec, model, s, b, mode))
        out[spec.path if train.mode == "full" else f"{spec.path} [{train.label()}]"] = ms
        print(f"== {spec.name} [{spec.style}]  {describe(spec)}" + (f"\n   training: {train.label()}"
                                                                     if train.mode != "full" else ""))
        print(f"   {'s':>4} {'b':>2} {'mode':<9} {'kept/layer':>10} {'input':>7} {'layer':>8} {'tiny':>5} "
              f"{'shared':>7} {'layers equal':>12} {'head':>8} {'embed':>6} {'logits bf16':>11}")
        for m in ms:
            l0 = m.layers[0]
            equal = all(l.kept == l0.kept for l in m.layers)
            print(f"   {m.s:>4} {m.b:>2} {m.mode:<9} {l0.kept:>10} {l0.by_cat.get('input', 0):>7} "
                  f"{l0.by_cat.get('layer', 0):>8} {l0.by_cat.get('tiny', 0):>5} {m.shared_bytes:>7} "
                  f"{'yes' if equal else 'NO':>12} {m.head.kept + m.head.by_cat.get('tiny', 0):>8} "
                  f"{m.embedding.kept + m.embedding.by_cat.get('tiny', 0):>6} {m.logits_bytes:>11}")
            for i, l in enumerate(m.layers):
                if l.walk_mismatch:
                    print(f"      WARNING layer{i}: {l.walk_mismatch}")
        for mode in MODES:
            pts = [(m.s, m.b, m.layers[0].kept) for m in ms if m.mode == mode]
            fit = fit_sb(pts)
            if fit is None:
                print(f"   fit {mode:<9}: (one sequence length: no fit)")
                continue
            A, B, dev = fit
            off = "; ".join(f"s={s} b={b}: {'+' if d > 0 else ''}{_frac(d)} B" for s, b, d in dev)
            print(f"   fit {mode:<9}: kept = {_frac(A)}*s*b + {_frac(B)}*s^2*b  "
                  f"(= s*b*h*{_frac(A / spec.hidden)} + {_frac(B / spec.heads)}*heads*s^2*b)  "
                  f"{'exact at all points' if not dev else 'off the fit at ' + off}")
        if breakdown:
            s0, b0 = grid[0]
            for mode in MODES:
                m = next(x for x in ms if x.s == s0 and x.b == b0 and x.mode == mode)
                print(f"   -- breakdown layer0, mode {mode}, s={s0} b={b0}: kept {m.layers[0].kept} B")
                print_rows(m.layers[0], "      ")
            m = next(x for x in ms if x.s == s0 and x.b == b0 and x.mode == "none")
            print(f"   -- breakdown head (final norm, logits, fp32 cross-entropy), s={s0} b={b0}")
            print_rows(m.head, "      ")
            print(f"      (not saved by autograd: bf16 logits {m.logits_bytes} B, alive while the caller holds them)")
            print(f"   -- breakdown embedding, s={s0} b={b0}")
            print_rows(m.embedding, "      ")
        print()
    return out


def memcalc_prediction(memcalc: str, path: str, s: int, b: int, mode: str, train: Optional["Train"] = None):
    """memcalc's (one layer's kept bytes, the head's saved bytes, error) for one configuration (and training
    setting: memcalc's --train / --frozen / --lora-* flags, none for full training)."""
    cmd = [memcalc, "--model-file", path, "--seq", str(s), "--micro-batch", str(b), "--recompute", mode,
           "--activations", "architecture", "--attention", "eager", "--platform", "cpu", "--format", "json"]
    cmd += train.memcalc_flags() if train is not None else []
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, None, f"cannot run memcalc: {e}"
    if p.returncode != 0:
        return None, None, (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}").splitlines()[0]
    try:
        a = json.loads(p.stdout)["activations"]
        return int(a["kept_layer_bytes"]), int(a["head_bytes"]), ""
    except (ValueError, KeyError, TypeError) as e:
        return None, None, f"unreadable memcalc JSON ({e})"


def run_compare(specs: List[Spec], memcalc: str, seqs, batches, json_out: Optional[str] = None,
                committed: Optional[str] = None, trains: Optional[List["Train"]] = None) -> int:
    """Measure each configuration (or, with `committed`, read the measured bytes from that JSON) and
    compare with memcalc; `json_out` writes every row, measured and predicted.  Each model runs under each
    training setting of `trains` (full training by default); a committed file's rows carry their own."""
    failed = 0
    total = 0
    reasons: List[str] = []
    rows: List[dict] = []
    recorded = {}
    cases = [(spec, train) for spec in specs for train in (trains or [Train()])]
    if committed:
        with open(committed) as f:
            doc = json.load(f)
        for r in doc["rows"]:  # keyed by the training setting too (rows without one: full training)
            recorded[(r["model_file"], Train.from_row(r), r["seq"], r["micro_batch"], r["recompute"])] = r
        loaded = {p: load_spec(os.path.join(REPO, p)) for p in dict.fromkeys(r["model_file"] for r in doc["rows"])}
        cases = [(loaded[k[0]], k[1]) for k in dict.fromkeys(k[:2] for k in recorded)]
    print(f"{'model':<14} {'style':<8} {'s':>4} {'b':>2} {'what':<15} {'measured':>10} {'predicted':>10} "
          f"{'difference':>10}  verdict")

    def verdict(spec, region, mode, s, b, measured, pred):
        nonlocal failed
        diff = measured - pred
        expected, names = explained_difference(spec, mode, s, b, region)
        if diff == expected:
            if not names:
                return "ok"
            notes = []
            for n in names:
                if n not in reasons:
                    reasons.append(n)
                notes.append(f"[{reasons.index(n) + 1}]")
            return "explained " + " ".join(notes)
        failed += 1
        return f"MISMATCH (the documented effects explain {expected:+d})"

    for spec, train in cases:
        model = None if committed else build_model(spec, train=train)
        model_file = os.path.relpath(os.path.abspath(spec.path), REPO)
        grid = sorted({(k[2], k[3]) for k in recorded if k[:2] == (model_file, train)}) if committed else \
            [(s, b) for s in seq_grid(spec, seqs) for b in batches]
        if train.mode != "full":
            print(f"-- {spec.name}, training: {train.label()}")
        for s, b in grid:
                for mode in MODES:
                    total += 1
                    if committed:
                        r = recorded[(model_file, train, s, b, mode)]
                        measured, head = r["measured_layer_bytes"], r.get("measured_head_bytes")
                        spec.routing = r.get("routing", [])  # slots per expert as measured, for the effects
                    else:
                        m = measure(spec, model, s, b, mode)
                        measured = m.layers[0].kept
                        head = m.head.by_cat.get("layer", 0) + m.head.by_cat.get("input", 0)
                        spec.routing = getattr(model.layers[0].mlp, "slots", [])  # layer 0's, for the effects
                    pred, head_pred, err = memcalc_prediction(memcalc, spec.path, s, b, mode, train)
                    rows.append({"model_file": model_file, "seq": s, "micro_batch": b, "recompute": mode,
                                 "measured_layer_bytes": measured, "predicted_layer_bytes": pred,
                                 "measured_head_bytes": head if mode == "none" else None,
                                 "predicted_head_bytes": head_pred if mode == "none" else None,
                                 **({"routing": list(spec.routing)} if spec.routing else {}),
                                 **train.row_fields()})
                    label = f"{spec.name:<14} {spec.style:<8} {s:>4} {b:>2}"
                    if pred is None:
                        failed += 1
                        print(f"{label} {'layer ' + mode:<15} {measured:>10} {'-':>10} {'-':>10}  FAILED: {err}")
                        continue
                    result = verdict(spec, 'layer', mode, s, b, measured, pred)
                    print(f"{label} {'layer ' + mode:<15} {measured:>10} {pred:>10} {measured - pred:>+10}  {result}")
                    if mode == "none":  # the head does not depend on the layers' recomputation
                        total += 1
                        print(f"{label} {'head + loss':<15} {head:>10} {head_pred:>10} {head - head_pred:>+10}  "
                              f"{verdict(spec, 'head', mode, s, b, head, head_pred)}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"torch": torch.__version__, "device": "cpu", "dtype": "bfloat16", "attention": "eager",
                       "command": " ".join(["validation/reference_trainer.py"] + sys.argv[1:]), "rows": rows}, f, indent=1)
            f.write("\n")
    print(f"\n{total - failed}/{total} rows agree exactly or by a documented effect; {failed} failed")
    for n, reason in enumerate(reasons, 1):
        print(f"  [{n}] {reason}")
    print("  Not compared: one-element scalars (e.g. the attention scale, a few bytes a layer) and the tensors made\n"
          "  once per model and shared by every layer (rotary cos/sin, the mask, position ids), which memcalc\n"
          "  counts once on the embedding side.")
    return 1 if failed else 0


def main(argv=None) -> int:
    global DROPOUT_KERNEL
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--measure", action="store_true", help="print measured tables")
    g.add_argument("--compare", action="store_true", help="compare with memcalc's predictions")
    ap.add_argument("--model", nargs="+", metavar="FILE", help="model JSON files (default: the validation set)")
    ap.add_argument("--breakdown", action="store_true", help="per-op breakdown (first seq/batch of the grid)")
    ap.add_argument("--memcalc", metavar="PATH", help="memcalc executable (for --compare)")
    ap.add_argument("--seq", type=int, nargs="+", help=f"sequence lengths (default {DEFAULT_SEQS})")
    ap.add_argument("--micro-batch", type=int, nargs="+", help=f"micro-batches (default {DEFAULT_BATCHES})")
    ap.add_argument("--dropout-kernel", choices=("native", "functional"), default="functional",
                    help="functional: torch's F.dropout, on CPU a noise tensor (default); native: the bool mask "
                         "CUDA's F.dropout keeps (--measure only: memcalc --platform cpu predicts the CPU kernel)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--json", metavar="FILE", help="--compare: write every row, measured and predicted, to FILE")
    ap.add_argument("--committed", metavar="FILE", help="--compare: take the measured bytes from FILE (a --json "
                    "output) instead of measuring, and check memcalc against them")
    add_train_arguments(ap, "")
    a = ap.parse_args(argv)
    DROPOUT_KERNEL = a.dropout_kernel
    if a.compare and DROPOUT_KERNEL != "functional":
        ap.error("--compare measures torch's own F.dropout (memcalc --platform cpu predicts it): drop --dropout-kernel")
    torch.set_num_threads(a.threads)
    try:
        trains = trains_from(a)
        specs = [load_spec(p) for p in (a.model or DEFAULT_MODELS)]
        for spec in specs:  # refuse, in one line, a part or target the style does not have
            for train in trains:
                build_model(spec, train=train)
    except ValueError as e:
        print(f"reference_trainer.py: {e}", file=sys.stderr)
        return 2
    batches = a.micro_batch or list(DEFAULT_BATCHES)
    t0 = time.time()
    if a.measure:
        print(f"torch {torch.__version__}, CPU, bf16 parameters and activations, train mode, "
              f"dropout kernel {DROPOUT_KERNEL}; bytes per layer (layer 0)\n")
        run_measure(specs, a.seq, batches, a.breakdown, trains)
        print(f"({time.time() - t0:.1f} s)")
        return 0
    if not a.memcalc:
        ap.error("--compare needs --memcalc PATH")
    rc = run_compare(specs, a.memcalc, a.seq, batches, a.json, a.committed, trains)
    print(f"({time.time() - t0:.1f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
