#!/usr/bin/env python3
"""mllama's tiled vision tower and projector, measured on CPU beside memcalc's input-side rows.

  /usr/bin/python3 validation/tiled_tower_saved.py --memcalc build/memcalc [--json FILE]
      [--images 1 2 3]

The tower is MllamaVisionModel of transformers v4.53.0 (modeling_mllama.py: the patch convolution,
the gated pre-tile, position and tile, and post-tile embeddings, the class token, layernorm_pre,
each tile's tokens padded to a multiple of 8, the aspect-ratio attention mask, the local blocks
with output_hidden_states, layernorm_post, the gated global blocks, the intermediate outputs
stacked and concatenated) and MllamaModel's multi_modal_projector, written out for torch 1.13
(that file needs transformers 4.45+): bf16, eager attention, every image padded to max_num_tiles.

Measured: the bytes of every distinct storage autograd saves (saved_tensors_hooks), less the
parameters and the pixels the processor gives (memcalc's "pixel values" row), and less the scores'
scale, a Python float torch 1.13's mul saves as a 0-dim float64 tensor (8 bytes a block, which
memcalc leaves out of every eager attention). memcalc's: its input-side rows of the tower (all but
the token embedding's, rotary's, the pixels' and the cross-attention rows), --recompute none,
--attention eager --platform cpu. Exit 1 on a difference. --committed FILE checks memcalc against
the measured figures of a --json file, without torch (results/cpu-tiled-tower.json).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The same small mllama, its measurement and its memcalc run.
from cross_attention_saved import (TEXT, VISION, committed_rows, memcalc_activations,  # noqa: E402
                                   report, saved_bytes)

NOT_THE_TOWER = {"token embedding", "rotary embedding", "pixel values", "cross-attention states",
                 "cross-attention mask"}


def build_tower():
    import torch
    from torch import nn

    h, heads, f = VISION["hidden_size"], VISION["attention_heads"], VISION["intermediate_size"]
    P, S, T = VISION["patch_size"], VISION["image_size"], VISION["max_num_tiles"]
    rows, N = len(VISION["supported_aspect_ratios"]) + 1, (S // P) ** 2 + 1
    dh = h // heads

    class Block(nn.Module):  # MllamaVisionEncoderLayer with MllamaVisionAttention, eager
        def __init__(self, gated):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
                nn.Linear(h, h, bias=False) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(h, f), nn.Linear(f, h)
            self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(h), nn.LayerNorm(h)
            self.gated = gated
            if gated:
                self.gate_attn = nn.Parameter(torch.full((1,), 0.7))
                self.gate_ffn = nn.Parameter(torch.full((1,), 0.7))

        def attention(self, x, mask):
            b, n, _ = x.shape
            q = self.q_proj(x).view(b, n, heads, dh).transpose(1, 2)
            k = self.k_proj(x).view(b, n, heads, dh).transpose(1, 2)
            v = self.v_proj(x).view(b, n, heads, dh).transpose(1, 2)
            w = torch.matmul(q, k.transpose(2, 3)) * dh ** -0.5
            w = w + mask[:, :, :, : k.shape[-2]]
            w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(w, v).transpose(1, 2).contiguous()
            return self.o_proj(out.reshape(b, n, -1).contiguous())

        def forward(self, x, mask):
            residual = x
            x = self.attention(self.input_layernorm(x), mask)
            if self.gated:
                x = self.gate_attn.tanh() * x
            x = residual + x
            residual = x
            x = self.fc2(nn.functional.gelu(self.fc1(self.post_attention_layernorm(x))))
            if self.gated:
                x = self.gate_ffn.tanh() * x
            return residual + x

    class Tower(nn.Module):  # MllamaVisionModel and the projector
        def __init__(self):
            super().__init__()
            self.patch_embedding = nn.Conv2d(3, h, P, stride=P, bias=False)
            self.class_embedding = nn.Parameter(torch.randn(h))
            self.pos_gate = nn.Parameter(torch.full((1,), 0.3))
            self.pos_embedding = nn.Parameter(torch.randn(N, h))
            self.tile_embedding = nn.Embedding(rows, T * N * h)
            self.pre_tile, self.post_tile = nn.Embedding(rows, T * h), nn.Embedding(rows, T * h)
            self.pre_gate = nn.Parameter(torch.full((1,), 0.3))
            self.post_gate = nn.Parameter(torch.full((1,), 0.3))
            self.layernorm_pre, self.layernorm_post = nn.LayerNorm(h), nn.LayerNorm(h)
            self.local = nn.ModuleList(Block(False) for _ in range(VISION["num_hidden_layers"]))
            self.glob = nn.ModuleList(Block(True) for _ in range(VISION["num_global_layers"]))
            self.projector = nn.Linear(VISION["vision_output_dim"], TEXT["hidden_size"])

        def forward(self, pixels, ids, ratio_mask):
            B = pixels.shape[0]
            x = pixels.reshape(B * T, 3, S, S).to(self.patch_embedding.weight.dtype)
            x = self.patch_embedding(x)
            x = x.flatten(2).transpose(1, 2)
            x = x.reshape(B, T, -1, h)
            x = x + self.pre_tile(ids).reshape(-1, T, 1, h) * self.pre_gate.tanh()
            x = x.reshape(B * T, N - 1, h)
            x = torch.cat([self.class_embedding.expand(B * T, 1, h), x], dim=1)
            x = x.reshape(B, T, N, h)
            x = x + ((1 - self.pos_gate.tanh()) * self.pos_embedding).view(1, 1, N, h)
            x = x + self.pos_gate.tanh() * self.tile_embedding(ids).reshape(B, T, N, h)
            x = self.layernorm_pre(x)
            pad = (8 - x.shape[-2] % 8) % 8
            x = nn.functional.pad(x, (0, 0, 0, pad))
            mask = ratio_mask.view(B, T, 1, 1).to(x.dtype).repeat(1, 1, N + pad, 1)
            if pad:
                mask[:, :, -pad:] = 0
            mask = (1 - mask).reshape(B, T * (N + pad), 1)
            mask = (mask @ mask.transpose(-1, -2) * torch.finfo(x.dtype).min).unsqueeze(1)
            x = x.view(B, -1, h)
            states = []
            for block in self.local:  # output_hidden_states: every block's input and the last
                states.append(x)
                x = block(x, mask)
            states.append(x)
            x = self.layernorm_post(x)
            x = x.reshape(B, T, N + pad, h)
            x = x + self.post_tile(ids).reshape(-1, T, 1, h) * self.post_gate.tanh()
            x = x.reshape(B, T * (N + pad), h)
            for block in self.glob:
                x = block(x, mask)
            x = x.reshape(B, T, N + pad, h)[:, :, : N]
            inter = torch.stack([states[i] for i in [0, 2]], dim=-1)
            inter = inter.reshape(B, T, N + pad, -1)[:, :, : N]
            return self.projector(torch.cat([x, inter], dim=-1))

    return Tower().to(torch.bfloat16)


def measure(images):
    """The tower's and projector's saved bytes, less their parameters and the pixels."""
    import torch

    torch.manual_seed(0)
    tower = build_tower()
    T, S = VISION["max_num_tiles"], VISION["image_size"]
    pixels = torch.randn(images, T, 3, S, S)  # the processor's, fp32
    ids = torch.randint(1, len(VISION["supported_aspect_ratios"]) + 1, (images, 1))
    ratio_mask = torch.ones(images, T, dtype=torch.long)
    ratio_mask[:, -1] = 0  # a padded tile, as a smaller image has
    excluded = {p.data_ptr() for p in tower.parameters()} | {pixels.data_ptr()}
    return saved_bytes(lambda: tower(pixels, ids, ratio_mask), excluded)


def predicted(memcalc, images):
    rows = memcalc_activations(memcalc, ["--seq", "16", "--images", str(images)])
    return sum(r["bytes"] for r in rows["input_side_tensors"] if r["op"] not in NOT_THE_TOWER)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memcalc", required=True)
    ap.add_argument("--images", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--json", metavar="FILE", help="write every row, measured and predicted")
    ap.add_argument("--committed", metavar="FILE", help="take the measured bytes from FILE")
    a = ap.parse_args(argv)
    rows = (committed_rows(a.committed, ("images",)) if a.committed else
            [({"images": i}, measure(i)) for i in a.images])
    return report(rows, lambda images: predicted(a.memcalc, images), a.json,
                  "MllamaVisionModel and multi_modal_projector (transformers v4.53.0), eager, bf16")


if __name__ == "__main__":
    sys.exit(main())
