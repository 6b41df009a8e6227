#!/usr/bin/env python3
"""mllama's cross-attention layer with images, measured on CPU beside memcalc's kept bytes.

  /usr/bin/python3 validation/cross_attention_saved.py --memcalc build/memcalc [--json FILE]
      [--seq 16 32] [--micro-batch 1 2] [--images 1 2 3]

The layer is MllamaCrossAttentionDecoderLayer and MllamaTextCrossAttention of transformers v4.53.0
(modeling_mllama.py; eager_attention_forward, MllamaTextRMSNorm, MllamaTextMLP), written out line
by line for torch 1.13 (that file needs transformers 4.45+): bf16, eager attention, q and k normed
per head, k and v repeated to every query head, the fp32 softmax cast back, tanh gates on both
branches and the MLP's output times the full-text-row mask. It reads random cross-attention
states of each sequence's image tokens: ceil(images / b) images, each padded to max_num_tiles
tiles of (image_size / patch_size)^2 + 1 tokens, as memcalc's --images counts them.

Measured: the bytes of every distinct storage autograd saves (saved_tensors_hooks), less the
parameters, the layer's input and the cross-attention states (memcalc keeps those once on the
input side, beside the tower), and less the scores' scale, a Python float that torch 1.13's mul
saves as a 0-dim float64 tensor (8 bytes, not counted by memcalc in any eager attention).
memcalc's: its cross_attention kind's kept_layer_bytes under --recompute none, --attention eager
--platform cpu --torch-version 1.13. Exit 1 on a difference.
--committed FILE checks memcalc against the measured figures of a --json file, without torch
(results/cpu-cross-attention.json; ctest committed_cross_attention_results_agree).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

# A small mllama: 4 query heads and 2 key/value heads of 16, an MLP of 160; its tower's tiles are
# 3 of 28 x 28 pixels in 14-pixel patches: 2 x 2 patches and a class token each.
TEXT = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
        "cross_attention_layers": [1], "rms_norm_eps": 1e-5}
VISION = {"hidden_size": 32, "attention_heads": 4, "intermediate_size": 48,
          "num_hidden_layers": 3, "num_global_layers": 2, "image_size": 28, "patch_size": 14,
          "max_num_tiles": 3, "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]],
          "intermediate_layers_indices": [0, 2], "vision_output_dim": 96}
CONFIG = {"model_type": "mllama", "text_config": TEXT, "vision_config": VISION}


def image_tokens(images, b):
    tile = (VISION["image_size"] // VISION["patch_size"]) ** 2 + 1
    return math.ceil(images / b) * VISION["max_num_tiles"] * tile


def build_layer():
    import torch
    from torch import nn

    h, a, k = TEXT["hidden_size"], TEXT["num_attention_heads"], TEXT["num_key_value_heads"]
    d, f, eps = h // a, TEXT["intermediate_size"], TEXT["rms_norm_eps"]

    class RMSNorm(nn.Module):  # MllamaTextRMSNorm
        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            input_dtype = x.dtype
            x = x.to(torch.float32)
            variance = x.pow(2).mean(-1, keepdim=True)
            x = x * torch.rsqrt(variance + eps)
            return self.weight * x.to(input_dtype)

    class CrossLayer(nn.Module):  # MllamaCrossAttentionDecoderLayer
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(h), RMSNorm(h)
            self.q_proj = nn.Linear(h, a * d, bias=False)
            self.k_proj = nn.Linear(h, k * d, bias=False)
            self.v_proj = nn.Linear(h, k * d, bias=False)
            self.o_proj = nn.Linear(a * d, h, bias=False)
            self.q_norm, self.k_norm = RMSNorm(d), RMSNorm(d)
            self.gate_proj = nn.Linear(h, f, bias=False)
            self.up_proj = nn.Linear(h, f, bias=False)
            self.down_proj = nn.Linear(f, h, bias=False)
            # Their initial zeros would make every gradient through the gates zero: any value.
            self.cross_attn_attn_gate = nn.Parameter(torch.full((1,), 0.5))
            self.cross_attn_mlp_gate = nn.Parameter(torch.full((1,), 0.5))

        def attention(self, x, states, mask):  # MllamaTextCrossAttention, eager
            bsz, q_len, _ = x.size()
            q = self.q_proj(x).view(bsz, q_len, a, d).transpose(1, 2)
            q = self.q_norm(q)
            key = self.k_proj(states).view(bsz, -1, k, d).transpose(1, 2)
            value = self.v_proj(states).view(bsz, -1, k, d).transpose(1, 2)
            key = self.k_norm(key)
            # repeat_kv
            key = key[:, :, None].expand(bsz, k, a // k, -1, d).reshape(bsz, a, -1, d)
            value = value[:, :, None].expand(bsz, k, a // k, -1, d).reshape(bsz, a, -1, d)
            weights = torch.matmul(q, key.transpose(2, 3)) * d ** -0.5
            weights = weights + mask[:, :, :, : key.shape[-2]]
            weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(weights, value).transpose(1, 2).contiguous()
            return self.o_proj(out.reshape(bsz, q_len, -1))

        def forward(self, x, states, mask, full_text_row_masked_out_mask):
            residual = x
            x = self.input_layernorm(x)
            x = self.attention(x, states, mask)
            x = residual + self.cross_attn_attn_gate.tanh() * x
            residual = x
            x = self.post_attention_layernorm(x)
            x = self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
            x = full_text_row_masked_out_mask[:, 0] * x
            return residual + self.cross_attn_mlp_gate.tanh() * x

    return CrossLayer().to(torch.bfloat16)


def saved_bytes(run, excluded):
    """The distinct storages autograd saves while `run()` runs its forward, in bytes, less those
    whose data `excluded` holds and less the scores' scale: a Python float that torch 1.13's mul
    saves as a 0-dim float64 tensor (8 bytes of every eager attention, which memcalc leaves out).
    The backward runs after, so that every storage counted is one it reads."""
    import torch

    storages = {}

    def pack(t):
        st = t.storage()
        wrapped_scalar = t.dim() == 0 and t.dtype == torch.float64
        if st.data_ptr() not in excluded and not wrapped_scalar:
            storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    out.float().sum().backward()
    return sum(storages.values())


def measure(s, b, images):
    """The layer's saved bytes, less its parameters, its input and the cross-attention states."""
    import torch

    torch.manual_seed(0)
    layer = build_layer()
    n = image_tokens(images, b)
    x = torch.randn(b, s, TEXT["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    states = torch.randn(b, n, TEXT["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    mask = torch.zeros(b, 1, s, n, dtype=torch.bfloat16)  # every token sees every image token
    full_text = torch.ones(b, 1, s, 1, dtype=torch.bfloat16)
    excluded = {p.data_ptr() for p in layer.parameters()} | {x.data_ptr(), states.data_ptr()}
    return saved_bytes(lambda: layer(x, states, mask, full_text), excluded)


def memcalc_activations(memcalc, args):
    """memcalc's "activations" for the small mllama with `args`: eager attention on CPU as
    torch 1.13 runs it, no recomputation."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as config:
        json.dump(CONFIG, config)
        config.flush()
        cmd = [memcalc, "--config", config.name, *args, "--recompute", "none", "--activations",
               "architecture", "--attention", "eager", "--platform", "cpu", "--torch-version",
               "1.13", "--format", "json"]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"memcalc failed: {run.stderr.strip()}")
    return json.loads(run.stdout)["activations"]


def predicted(memcalc, s, b, images):
    kinds = memcalc_activations(memcalc, ["--seq", str(s), "--micro-batch", str(b),
                                          "--images", str(images)])["layer_kinds"]
    return next(k["kept_layer_bytes"] for k in kinds if k["name"] == "cross_attention")


def report(rows, predict, json_path, what):
    """Each (settings, measured) row beside memcalc's `predict(**settings)`; 1 on a difference."""
    out, bad = [], 0
    for settings, measured in rows:
        memcalc = predict(**settings)
        bad += measured != memcalc
        named = " ".join(f"{k} {v}" for k, v in settings.items())
        print(f"{named}: measured {measured:>10,}  memcalc {memcalc:>10,}"
              f"  {'ok' if measured == memcalc else 'DIFFERS'}")
        out.append({**settings, "measured": measured, "memcalc": memcalc})
    print(f"{len(rows) - bad} of {len(rows)} agree to the byte")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"measured": what, "torch": "1.13 CPU", "rows": out}, f, indent=1)
            f.write("\n")
    return 1 if bad else 0


def committed_rows(path, keys):
    with open(path, encoding="utf-8") as f:
        return [({k: r[k] for k in keys}, r["measured"]) for r in json.load(f)["rows"]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memcalc", required=True)
    ap.add_argument("--seq", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--micro-batch", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--images", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--json", metavar="FILE", help="write every row, measured and predicted")
    ap.add_argument("--committed", metavar="FILE", help="take the measured bytes from FILE")
    a = ap.parse_args(argv)
    keys = ("seq", "micro_batch", "images")
    rows = (committed_rows(a.committed, keys) if a.committed else
            [(dict(zip(keys, (s, b, i))), measure(s, b, i))
             for s in a.seq for b in a.micro_batch for i in a.images])
    return report(rows, lambda seq, micro_batch, images: predicted(a.memcalc, seq, micro_batch,
                                                                   images),
                  a.json, "MllamaCrossAttentionDecoderLayer (transformers v4.53.0), eager, bf16")


if __name__ == "__main__":
    sys.exit(main())
